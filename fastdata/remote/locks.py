"""Cache locks (fastdata.fileio.try_lock), waited for until a deadline; a dead holder's lock file is taken
over and reported as stale, so a killed download never blocks the next run."""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from fastdata.fileio import lock_holder, record_holder, try_lock, unlock

__all__ = ["lock", "pid_alive", "unlock"]

log = logging.getLogger("fastdata.remote")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock(path: Path, deadline: float, what: str, *, record: bool = True) -> int:
    """Wait (until the monotonic ``deadline``) for the lock on ``path``; TimeoutError names its holder.
    With ``record``, the file names this process, and a previous holder it named is logged as stale."""
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
