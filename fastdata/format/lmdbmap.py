"""This process's view of an LMDB shard file: one shared read-only environment per file, and
:class:`Located`, where each record lies in the file and a map of the file to copy it from."""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

# py-lmdb refuses to open a file that this process already has open, so every reader of one
# shard file shares one environment: reference-counted, keyed by the file's identity (a file
# replaced at the same path is a new file). A forked child closes the parent's copies.
_envs_lock = threading.RLock()  # reentrant: a finalizer (GC) may release an environment mid-acquire
_envs: dict[tuple[int, int], list[Any]] = {}  # (st_dev, st_ino) -> [environment, users]


def acquire_env(path: Path, st: os.stat_result) -> lmdb.Environment:
    key = (st.st_dev, st.st_ino)
    with _envs_lock:
        entry = _envs.get(key)
        if entry is None:
            env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=False,
                            meminit=False, max_readers=1024, max_dbs=0)
            entry = _envs[key] = [env, 0]
        entry[1] += 1
        return entry[0]


def release_env(env: lmdb.Environment) -> None:
    with _envs_lock:
        for key, entry in list(_envs.items()):
            if entry[0] is env:
                entry[1] -= 1
                if entry[1] <= 0:
                    del _envs[key]
                    env.close()
                return


def _reset_envs_in_child() -> None:
    global _envs_lock
    _envs_lock = threading.RLock()  # another thread may have held it at fork time
    for env, _ in _envs.values():
        try:
            env.close()
        except lmdb.Error:
            pass
    _envs.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_envs_in_child)


class Located:
    """Where each record of one shard lies in the file, learned the first time it is read through
    LMDB (or, for schemas with ragged fields, when the record index is built), and this process's
    own read-only map of the file to copy it from.

    py-lmdb touches every page of a value it returns (to take page faults without the GIL); a
    record whose place is known is copied straight from the map instead, like an HDF5 column:
    batches of 196 KB records faster on 2 threads (``benchmarks/bench_choices.py``, choice 5). Linux only: LMDB's own
    mapping of the file is found in ``/proc/self/maps`` to turn a value's address into its offset.
    """

    def __init__(self, fd: int, count: int) -> None:
        st = os.fstat(fd)
        self.inode = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        self.mem = np.frombuffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ), dtype=np.uint8)
        self.mv = memoryview(self.mem)  # type: ignore[arg-type]
        self.offsets = np.full(count, -1, dtype=np.int64)  # -1: not read yet in this process
        self.sizes: np.ndarray | None = None  # every record's size, when its place came from the tree
        self._lmdb_map: tuple[int, int, int] | None = None  # start, end, file offset of start
        # LMDB's map not found in /proc/self/maps (a filesystem that names another device or inode
        # there than fstat does): looked up once, then records are read through LMDB as before
        self.lost = False

    def note(self, local: int, buf: memoryview | bytes) -> None:
        """Record ``local`` is ``buf`` (a value LMDB returned): remember where it lies in the file."""
        if self.lost:
            return
        off = self.offset_of(np.frombuffer(buf, dtype=np.uint8).ctypes.data)
        if off is not None and 0 <= off <= len(self.mem) - len(buf):
            self.offsets[local] = off

    def offset_of(self, address: int) -> int | None:
        """The file offset of ``address`` inside LMDB's map of this file (None if not found)."""
        m = self._lmdb_map
        if m is None or not m[0] <= address < m[1]:
            m = self._find_map(address)
            if m is None:
                self.lost = True
                return None
            self._lmdb_map = m
        return address - m[0] + m[2]

    def _find_map(self, address: int) -> tuple[int, int, int] | None:
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) < 5:
                        continue
                    lo, hi = (int(v, 16) for v in parts[0].split("-"))
                    major, minor = (int(v, 16) for v in parts[3].split(":"))
                    if lo <= address < hi and (major, minor, int(parts[4])) == self.inode:
                        return lo, hi, int(parts[2], 16)
        except (OSError, ValueError):
            pass
        return None


__all__ = ["Located", "acquire_env", "release_env"]
