"""Cache locks: ``flock`` on small files that record their holder (pid, host, time).

The kernel drops an flock when its process dies, so a process killed mid-download never blocks
the next run: its lock file is found without a holder, reported as stale and taken over.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

log = logging.getLogger("fastdata.remote")
HOST = socket.gethostname()


def owner(path: Path) -> str:
    """Who a lock file says holds it, for messages."""
    try:
        info = json.loads(path.read_text(encoding="utf-8") or "{}")
        return f"pid {info.get('pid')} on {info.get('host')}"
    except (OSError, ValueError):
        return "an unknown process"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def try_lock(path: Path, *, record: bool = True) -> int | None:
    """An exclusively flocked fd on ``path`` (created if needed), or None when someone holds it.

    A lock file whose previous holder died (no flock) is taken over; when it names a dead process
    of this host that is logged as a stale lock cleared."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # its holder removed it between our open and our lock: take the new one
            os.close(fd)
            continue
        if record:
            _note_stale(fd, path)
            data = json.dumps({"pid": os.getpid(), "host": HOST, "time": time.time()}).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        return fd


def _note_stale(fd: int, path: Path) -> None:
    try:
        prev = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return
    pid = prev.get("pid")
    if isinstance(pid, int) and pid != os.getpid():
        dead = prev.get("host") == HOST and not pid_alive(pid)
        log.info("%s: cleared a stale lock left by pid %s on %s%s", path, pid, prev.get("host"),
                 " (no longer running)" if dead else "")


def lock(path: Path, deadline: float, what: str, *, record: bool = True) -> int:
    """Wait (until the monotonic ``deadline``) for the lock on ``path``; TimeoutError names its holder."""
    delay = 0.01
    while True:
        fd = try_lock(path, record=record)
        if fd is not None:
            return fd
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: still locked by {owner(path)} ({path})")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def unlock(fd: int, path: Path | None = None) -> None:
    """Release a lock; with ``path``, remove the lock file first (while still holding it)."""
    try:
        if path is not None:
            path.unlink(missing_ok=True)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
