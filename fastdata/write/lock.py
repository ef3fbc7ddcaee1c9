"""One conversion at a time per destination: an exclusive ``flock`` on ``DST/.fastdata.lock``.

The kernel drops the lock when its holder dies, however it dies (SIGKILL included), so a
killed conversion never leaves a lock that blocks ``--resume``: there is no process id to
check and no stale lock to break (process ids can be reused, and breaking a lock races).
The file records the holder's pid and host, for the message a second conversion shows.
Shard-writing worker processes inherit the lock and are killed with their parent (see
fastdata/write/shard_task.py), so the lock is free once the conversion is gone.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
from pathlib import Path

from fastdata.errors import DestinationBusyError, WriteError
from fastdata.format.files import LOCK_NAME

__all__ = ["DstLock", "holder"]

log = logging.getLogger(__name__)


class DstLock:
    """An exclusive lock on a destination folder, held until :meth:`release`."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, dst: Path, name: str = LOCK_NAME) -> "DstLock":
        """Lock ``dst`` (or, with ``name``, one part of it); raise DestinationBusyError if another
        live conversion holds it."""
        path = dst / name
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as e:
                raise WriteError(f"{dst}: cannot create {name}: {e.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise DestinationBusyError(f"{dst}: another conversion is writing it ({holder}); wait for it to end") from None
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    os.close(fd)
                    raise WriteError(f"{dst}: cannot lock {name}: {e.strerror}") from None
                log.warning("%s: the file system does not support locks; not guarding against a second conversion", dst)
            # A holder that just finished unlinks the file: if ours is no longer at the path, retry.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        info = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, info, 0)
        except OSError as e:
            os.close(fd)
            raise WriteError(f"{dst}: cannot write {name}: {e.strerror}") from None
        return cls(path, fd)

    def release(self) -> None:
        """Remove the lock file and unlock (in that order, so a waiter never locks a removed file)."""
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass  # the lock itself still goes away with the descriptor
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "DstLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(dst: Path, name: str = LOCK_NAME) -> str | None:
    """Who holds the lock ``name`` on ``dst`` (``"pid N on HOST"``), or None when nobody does."""
    try:
        fd = os.open(dst / name, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd)
        except OSError:
            return None  # no locking here: acquire() warns about it
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return f"fastdata pid {int(info['pid'])} on {info['host']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a fastdata process"
