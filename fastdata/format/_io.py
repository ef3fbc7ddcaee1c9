"""Small I/O helpers shared by the shard backends: positional reads, atomic finishing, hashing."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from ..errors import CorruptShardError

_HASH_BLOCK = 8 << 20


def pread_into(fd: int, out: np.ndarray, offset: int, where: str) -> None:
    """Fill the C-contiguous array ``out`` with bytes at ``offset``; a short read is corruption."""
    view = memoryview(out.reshape(-1).view(np.uint8))
    want = len(view)
    got = 0
    while got < want:
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            raise CorruptShardError(f"{where}: shard ends early (wanted {want} bytes at offset {offset}, got {got})")
        got += n


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    buf = bytearray(_HASH_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def finish_file(tmp: Path, final: Path) -> None:
    """fsync a completely written file and move it to its final name."""
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)


def runs(local: np.ndarray, dest: np.ndarray) -> list[tuple[int, int, int]]:
    """Split parallel index arrays into runs ``(local0, dest0, length)`` consecutive in both."""
    n = len(local)
    if n == 0:
        return []
    breaks = np.flatnonzero((np.diff(local) != 1) | (np.diff(dest) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [n]))
    return [(int(local[s]), int(dest[s]), int(e - s)) for s, e in zip(starts, ends)]


def check_size_unchanged(fd: int, expected: int, where: str) -> None:
    """A shard truncated or rewritten after it was opened must raise here, not SIGBUS in a
    memory-mapped read later (HDF5 small-row columns and LMDB both read through maps)."""
    size = os.fstat(fd).st_size
    if size != expected:
        raise CorruptShardError(f"{where}: file is now {size} bytes, the manifest says {expected} "
                                "(truncated or rewritten while open)")
