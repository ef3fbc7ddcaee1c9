"""File utilities every layer shares (positional reads, atomic writes, durable renames, hashing, lock files), so
that a crash never leaves a half-written file under a final name."""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import json
import os
import secrets
import socket
import stat
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

import numpy as np
import xxhash

from fastdata.errors import CorruptShardError

HASH_BLOCK = 8 << 20


def pread_into(fd: int, out: np.ndarray, offset: int, where: str) -> None:
    """Fill the C-contiguous array ``out`` with bytes at ``offset``; a short read is corruption."""
    view = memoryview(out.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # ndarray is a buffer
    want = len(view)
    got = 0
    while got < want:
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            raise CorruptShardError(f"{where}: shard ends early (wanted {want} bytes at offset {offset}, got {got})")
        got += n


def user_cache_dir() -> Path:
    """``$FASTDATA_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastdata``, else ``~/.cache/fastdata``."""
    if os.environ.get("FASTDATA_CACHE_DIR"):
        return Path(os.environ["FASTDATA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastdata"


_HASHES: dict[str, Callable[[], Any]] = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}


def not_regular(mode: int) -> str | None:
    """What to say of a path that should be a regular file but is not (reading a FIFO would block);
    None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    kinds = [(stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
             (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")]
    return f"is not a regular file (a {next((name for test, name in kinds if test(mode)), 'special file')})"


def file_checksum(path: str | os.PathLike[str], algorithm: str) -> str:
    """``"<algorithm>:<hex digest>"`` of the whole file; ``algorithm`` is ``xxh3_128`` or ``sha256``."""
    h = _HASHES[algorithm]()  # every caller's algorithm is CHECKSUM_DEFAULT or one spec.parse_checksum accepted
    for data in read_blocks(path):
        h.update(data)
    return f"{algorithm}:{h.hexdigest()}"


def read_blocks(path: str | os.PathLike[str]) -> Iterator[memoryview]:
    """A file's bytes in order, ``HASH_BLOCK`` at a time (the last may be short), in one reused buffer."""
    buf = bytearray(HASH_BLOCK)
    view = memoryview(buf)
    with open(path, "rb") as f:  # buffered: each read fills the buffer until the end of the file
        while n := f.readinto(buf):
            yield view[:n]


def write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` all or nothing: ``write(f)`` into a temporary file beside it, fsync, rename (removed on
    failure); not mkstemp, whose 0600 mode would ignore the umask."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Wait until the file's data is on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_SYNC_FILE_RANGE_WRITE = 2
_MADV_POPULATE_READ = 22
_PAGE = 4096


@functools.cache
def _linux_libc() -> Any:
    """libc with sync_file_range and madvise typed (Linux); None where there is none."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing the file's dirty pages now, without waiting (Linux ``sync_file_range``),
    so a later fsync waits less; a hint that does nothing where unavailable."""
    libc = _linux_libc()
    if libc:
        libc.sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)


def prefault(a: np.ndarray) -> None:
    """Map the pages of ``a`` in one call before they are read (Linux ``MADV_POPULATE_READ``), so rows of a
    memory-mapped file cost no page fault each; a hint that does nothing where refused."""
    libc = _linux_libc()
    if libc and a.nbytes >= _PAGE:
        addr = a.ctypes.data
        start = addr - addr % _PAGE
        libc.madvise(start, addr + a.nbytes - start, _MADV_POPULATE_READ)


def finish_file(tmp: Path, final: Path) -> None:
    """fsync a completely written file and move it to its final name."""
    fsync_file(tmp)
    os.replace(tmp, final)


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def disk_full(path: str | os.PathLike[str], need: int) -> bool:
    """Whether the file system holding ``path`` has less than ``need`` bytes free for this user (liblmdb
    reports a full disk as EIO: this tells the two apart)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < need


def try_lock(path: Path, no_locks: Callable[[], None] | None = None) -> int | None:
    """A descriptor of ``path`` (created if needed) holding an exclusive ``flock``, or None while another process
    holds it (never stale); ``no_locks`` is called where the file system has no locks, else that OSError raises."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as e:
            if no_locks is None or e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise
            no_locks()
        try:  # a holder that just finished removes the file: lock the one now at the path
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


def record_holder(fd: int) -> Any:
    """Name this process (pid, host, time) in the lock file held through ``fd``, for the messages of
    those who wait; returns what the file said before (parsed JSON, None if nothing)."""
    try:
        before = json.loads(os.pread(fd, 4096, 0) or b"null")
    except ValueError:
        before = None
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}).encode(), 0)
    return before


def lock_holder(path: Path) -> str | None:
    """Who holds the lock on ``path`` (``"fastdata pid N on HOST"``, as its file names them), or None
    when nobody does (or the file system has no locks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # free: released when fd closes
        return None
    except BlockingIOError:
        try:
            info = json.loads(os.pread(fd, 4096, 0))
            return f"fastdata pid {int(info['pid'])} on {info['host']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "a fastdata process"
    except OSError:
        return None
    finally:
        os.close(fd)


def unlock(fd: int, path: Path | None = None) -> None:
    """Release a lock of :func:`try_lock` (also where a forked child still has the descriptor); with
    ``path``, remove its file first, still holding it, so that a waiter never locks a removed file."""
    try:
        if path is not None:
            path.unlink(missing_ok=True)
    except OSError:
        pass  # the lock itself still goes
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
