"""One conversion at a time per destination: an exclusive ``flock`` on ``DST/.fastdata.lock``, naming its holder.
The kernel drops it when its holder dies, so a killed conversion never blocks ``--resume``."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from fastdata.errors import DestinationBusyError, WriteError
from fastdata.fileio import lock_holder, record_holder, try_lock, unlock
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

        def no_locks() -> None:
            log.warning("%s: the file system does not support locks; not guarding against a second conversion", dst)

        try:
            fd = try_lock(path, no_locks)
        except OSError as e:  # from open: with no_locks, flock raises nothing else that can happen here
            raise WriteError(f"{dst}: cannot create {name}: {e.strerror}") from None
        if fd is None:
            who = lock_holder(path) or "a fastdata process"
            raise DestinationBusyError(f"{dst}: another conversion is writing it ({who}); wait for it to end")
        try:
            record_holder(fd)
        except OSError as e:
            os.close(fd)
            raise WriteError(f"{dst}: cannot write {name}: {e.strerror}") from None
        return cls(path, fd)

    def release(self) -> None:
        """Remove the lock file and unlock."""
        if self._fd is not None:
            unlock(self._fd, self.path)
            self._fd = None

    def __enter__(self) -> "DstLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def holder(dst: Path, name: str = LOCK_NAME) -> str | None:
    """Who holds the lock ``name`` on ``dst`` (``"fastdata pid N on HOST"``), or None when nobody does."""
    return lock_holder(dst / name)
