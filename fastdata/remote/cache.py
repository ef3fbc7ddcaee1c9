"""The node's shard cache: one directory shared by every process and rank, bounded in bytes, files named by content.
One process downloads a file at a time; readers pin files (:class:`Pin`) and eviction goes needed-last first."""

from __future__ import annotations

import errno
import fcntl
import logging
import math
import os
import re
import shutil
import socket
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

from fastdata._units import fmt_bytes
from fastdata.errors import CacheFullError, CorruptShardError, RemoteError, UsageError
from fastdata.fileio import file_checksum, lock_holder, record_holder, try_lock, unlock
from fastdata.remote import gave_up, trouble

log = logging.getLogger("fastdata.remote")
_NAME = r"[a-z0-9_]+-[0-9a-f]{32,128}\.[A-Za-z0-9]+"  # cache_name(): <algorithm>-<digest><ext>
_FINAL = re.compile(rf"^{_NAME}$")
_PART = re.compile(rf"^({_NAME})\.\d+\.part$")
_EVICT_LOCK = ".evict.lock"
_EVICT_WAIT_S = 60.0  # how long a repair or a count waits for the eviction lock
CHECKSUM_ATTEMPTS = 3

__all__ = ["CacheFullError", "Pin", "Priority", "ShardCache", "lock", "pid_alive"]

Priority = Callable[[str], float]  # next use of a cached file by name: smaller is sooner; inf: never


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock(path: Path, deadline: float, what: str, *, record: bool = True) -> int:
    """Wait (until the monotonic ``deadline``) for the lock on ``path``; TimeoutError names its holder. With
    ``record``, the file names this process, and a previous holder it named (dead: a killed download) is logged
    as stale, its lock taken over."""
    delay = 0.01
    while True:
        fd = try_lock(path)
        if fd is not None:
            if record:
                _note_stale(record_holder(fd), path)
            return fd
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: still locked by {lock_holder(path) or 'a fastdata process'} ({path})")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _note_stale(prev: Any, path: Path) -> None:
    if not isinstance(prev, dict) or not isinstance(prev.get("pid"), int) or prev["pid"] == os.getpid():
        return
    dead = prev.get("host") == socket.gethostname() and not pid_alive(prev["pid"])
    log.info("%s: cleared a stale lock left by pid %s on %s%s", path, prev["pid"], prev.get("host"),
             " (no longer running)" if dead else "")


def _drop_pin(fd: int, pid: int) -> None:
    try:
        if os.getpid() == pid:  # a forked child must not drop its parent's lock
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _open_locked(path: Path, how: int) -> tuple[int, os.stat_result] | None:
    """``path`` opened and ``flock``ed (``how``) while it still names the file opened: (fd, its stat); None
    when it is not there, was replaced meanwhile (evicted, perhaps downloaded again) or is locked (LOCK_NB)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, how)
        st = os.fstat(fd)
        if os.stat(path).st_ino == st.st_ino:
            return fd, st
    except (BlockingIOError, FileNotFoundError):
        pass
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


@dataclass
class Pin:
    """A shared lock on a cached shard: it is not evicted until :meth:`release`. A pin dropped
    without ``release`` (its dataset garbage-collected unclosed) is released by a finalizer."""

    fd: int
    ino: int
    pid: int
    _final: "weakref.finalize[Any, Any]" = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._final = weakref.finalize(self, _drop_pin, self.fd, self.pid)

    def release(self) -> None:
        """Unlock and close, once (later calls do nothing)."""
        self._final()


class ShardCache:
    """Cached shard files under ``root``, at most ``limit`` bytes (and never more than the disk holds)."""

    def __init__(self, root: Path, limit: int) -> None:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"{root}: cannot create the shard cache: {e.strerror}") from None
        if not os.access(root, os.W_OK):
            raise UsageError(f"{root}: the shard cache is not writable (set RemoteOptions.cache_dir)")
        self.root = root
        self.limit = limit

    def path(self, name: str) -> Path:
        return self.root / name

    # --- reading -------------------------------------------------------------------------

    def pin(self, name: str, size: int) -> Pin | None:
        """A pin on the cached file ``name`` when it is there whole; None when it is not cached."""
        got = _open_locked(self.path(name), fcntl.LOCK_SH)  # an evictor holds its exclusive lock only to unlink
        if got is None:
            return None
        fd, st = got
        if st.st_size != size:  # only a person editing the cache gets here: remove the file
            log.warning("%s: cached file is %d bytes, expected %d; downloading it again", self.path(name),
                        st.st_size, size)
            try:
                self._remove_bad(name, st.st_ino)
            finally:
                os.close(fd)
            return None
        os.utime(fd)  # oldest-used goes first among equals
        return Pin(fd, st.st_ino, os.getpid())

    # --- downloading ---------------------------------------------------------------------

    def fetch(self, name: str, size: int, checksum: str, fill: Callable[[BinaryIO], object], *, where: str,
              deadline: float, priority: Priority | None = None, bound: float | None = None) -> bool:
        """Make sure ``name`` is cached, ``fill(f)`` writing its bytes; with ``bound`` (prefetch) only files needed
        after ``bound`` are evicted, else False; without it CacheFullError once ``deadline`` passes without room."""
        if self.path(name).exists():
            return True
        if size > self.limit:  # any file, the keys file too: an error now, not after the wait for room
            raise CacheFullError(f"{where}: the shard is {fmt_bytes(size)}, larger than the cache limit "
                                 f"{fmt_bytes(self.limit)} of {self.root}; raise RemoteOptions.cache_limit")
        lock_path = self.path(name + ".lock")
        asked = time.monotonic()
        try:
            fd = lock(lock_path, deadline, f"{where}: waiting for another process's download")
        except TimeoutError as e:
            raise RemoteError(trouble(where, asked) or str(e)) from None
        except OSError as e:  # the lock file could not be written: a full cache disk, most likely
            raise self._write_error(where, lock_path, e) from None
        try:
            if self.path(name).exists():
                return True  # another process downloaded it while we waited
            failed = trouble(where, asked)
            if failed is not None:  # another thread of ours gave up on it while we waited: its cause is ours
                raise RemoteError(failed)
            for p in self.root.glob(name + ".*.part"):  # left by a process that died: we hold the lock
                p.unlink(missing_ok=True)
            try:
                return self._download(name, size, checksum, fill, where, deadline, priority, bound)
            except RemoteError as e:
                gave_up(where, str(e))
                raise
        finally:
            unlock(fd, lock_path)

    def _download(self, name: str, size: int, checksum: str, fill: Callable[[BinaryIO], object], where: str,
                  deadline: float, priority: Priority | None, bound: float | None) -> bool:
        part = self.path(f"{name}.{os.getpid()}.part")
        try:
            with open(part, "w+b") as f:
                if not self._reserve(f, name, size, where, deadline, priority, bound):
                    return False
                for attempt in range(1, CHECKSUM_ATTEMPTS + 1):
                    f.seek(0)
                    fill(f)
                    got = f.tell()
                    f.truncate(got)
                    f.flush()
                    digest = file_checksum(part, checksum.partition(":")[0]) if got == size else None
                    if digest == checksum:
                        break
                    differs = f"{got} bytes, expected {size}" if digest is None else f"checksum {digest}, expected {checksum}"
                    log.warning("%s: download %d of %d does not match the manifest (%s)",
                                where, attempt, CHECKSUM_ATTEMPTS, differs)
                else:
                    raise CorruptShardError(
                        f"{where}: the downloaded bytes do not match the manifest's size and checksum "
                        f"({CHECKSUM_ATTEMPTS} attempts): the object is corrupt or was replaced; "
                        "convert it again or restore the object")
                f.flush()
                os.fsync(f.fileno())
            # under the eviction lock: a listing racing the rename would see neither name and overshoot the limit
            with self._evicting(deadline, where):
                os.replace(part, self.path(name))
            return True
        except OSError as e:
            raise self._write_error(where, part, e) from None
        finally:
            part.unlink(missing_ok=True)

    def _write_error(self, where: str, path: Path, e: OSError) -> RemoteError:
        """The one-line error for a cache file that could not be written: CacheFullError for a full disk."""
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return CacheFullError(f"{where}: the cache disk is full ({self.root}): free space there, or "
                                  "lower RemoteOptions.cache_limit below the free space")
        return RemoteError(f"{where}: cannot write the cache file {path}: {e.strerror}")

    def _reserve(self, f: BinaryIO, name: str, size: int, where: str, deadline: float,
                 priority: Priority | None, bound: float | None) -> bool:
        """Room for ``size`` bytes (evicting as allowed), claimed by growing ``f`` to ``size``."""
        wait_until = min(deadline, time.monotonic() + 60.0)
        while True:
            with self._evicting(deadline, where):
                used, unwritten = self._usage()
                free = shutil.disk_usage(self.root).free - unwritten
                room = min(self.limit - used, free)
                if room < size:
                    room += self._evict(size - room, name, priority, bound)
                if room >= size:
                    os.ftruncate(f.fileno(), size)  # visible to every other process's _usage
                    return True
            if bound is not None:
                return False
            if time.monotonic() > wait_until:
                raise CacheFullError(
                    f"{where}: the cache {self.root} has no room for this shard ({fmt_bytes(size)}): limit "
                    f"{fmt_bytes(self.limit)}, {fmt_bytes(used)} held by shards being read or downloaded, "
                    f"{fmt_bytes(max(free, 0))} free on the disk; raise RemoteOptions.cache_limit, lower "
                    "prefetch_shards, or use shuffle='shards' so fewer shards are read at once")
            time.sleep(0.1)

    def _usage(self) -> tuple[int, int]:
        """(bytes held by cached files and downloads, bytes downloads have claimed but not yet written)."""
        used = unwritten = 0
        seen: set[int] = set()  # by inode: a download renamed while we list it is counted once
        with os.scandir(self.root) as it:
            for e in it:
                if _FINAL.match(e.name) or _PART.match(e.name):
                    try:
                        st = e.stat()
                    except FileNotFoundError:
                        continue
                    if st.st_ino in seen:
                        continue
                    seen.add(st.st_ino)
                    used += st.st_size
                    if e.name.endswith(".part"):
                        unwritten += max(0, st.st_size - st.st_blocks * 512)
        return used, unwritten

    def _evict(self, need: int, keep: str, priority: Priority | None, bound: float | None) -> int:
        """Remove unpinned files, needed-last first, until ``need`` bytes are free; returns bytes freed."""
        entries = []
        with os.scandir(self.root) as it:
            for e in it:
                if _FINAL.match(e.name) and e.name != keep:
                    try:
                        st = e.stat()
                    except FileNotFoundError:
                        continue
                    p = priority(e.name) if priority is not None else math.inf
                    if bound is None or p > bound:
                        entries.append((-p, st.st_mtime, e.name, st.st_size))
        freed = 0
        for _, _, fname, fsize in sorted(entries):
            if freed >= need:
                break
            if self._drop(fname):
                freed += fsize
                log.debug("%s: evicted %s (%d bytes)", self.root, fname, fsize)
        return freed

    def _drop(self, name: str) -> bool:
        """Remove a cached file unless someone reads it (holds a shared lock)."""
        got = _open_locked(self.path(name), fcntl.LOCK_EX | fcntl.LOCK_NB)
        if got is None:
            return False
        try:
            self.path(name).unlink()
            return True
        finally:
            os.close(got[0])

    def _remove_bad(self, name: str, ino: int) -> None:
        """Unlink the damaged file ``ino`` at ``name`` even while others pin it (their reads of it fail anyway; if
        it stayed, nobody could download it again), unless it was replaced meanwhile."""
        with self._evicting(time.monotonic() + _EVICT_WAIT_S, str(self.path(name))):
            try:
                if os.stat(self.path(name)).st_ino == ino:
                    self.path(name).unlink()
            except FileNotFoundError:
                pass

    def held_bytes(self) -> int:
        """Bytes the cache holds now (cached shards and downloads in progress), counted under the
        eviction lock: an eviction and the reservation it made room for are never both counted."""
        with self._evicting(time.monotonic() + _EVICT_WAIT_S, str(self.root)):
            return self._usage()[0]

    @contextmanager
    def _evicting(self, deadline: float, where: str) -> Iterator[None]:
        """Hold the cache's eviction lock: listings, reservations, evictions and renames take turns."""
        fd = lock(self.path(_EVICT_LOCK), deadline, f"{where}: cache eviction lock", record=False)
        try:
            yield
        finally:
            unlock(fd)

