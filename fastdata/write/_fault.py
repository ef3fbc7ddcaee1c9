"""Fault injection for the crash-safety tests: ``FASTDATA_FAULT=ACTION:POINT[:SHARD]`` pauses or fails a
conversion at a named point (docs/reliability.md, "Fault injection"); inert when unset."""

from __future__ import annotations

import errno
import os
import time

from fastdata.errors import UsageError

ENV = "FASTDATA_FAULT"
READY_ENV = "FASTDATA_FAULT_READY"
POINTS = ("mid_journal", "before_first_shard", "mid_shard", "between_shards", "before_manifest", "upload")
_ERRNOS = {"enospc": errno.ENOSPC, "eio": errno.EIO, "eacces": errno.EACCES}


def point(name: str, shard: int | None = None) -> None:
    """Called by the writer at each named point; does nothing unless ``FASTDATA_FAULT`` selects it."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    action, _, rest = spec.partition(":")
    where, _, which = rest.partition(":")
    if where not in POINTS or (action not in ("pause", "pause1") and action not in _ERRNOS) or (which and not which.isdigit()):
        raise UsageError(f"{ENV}={spec!r}: expected ACTION:POINT[:SHARD], ACTION pause|pause1|{'|'.join(_ERRNOS)}, "
                         f"POINT {'|'.join(POINTS)}")
    if where != name or (which and shard != int(which)):
        return
    ready = os.environ.get(READY_ENV)
    if action == "pause1" and ready and os.path.exists(ready):
        return
    if action in _ERRNOS:
        code = _ERRNOS[action]
        raise OSError(code, os.strerror(code))
    if ready:  # pause (pause1 the first time): say so, then wait
        tmp = f"{ready}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, ready)
    while True:  # until the test kills us
        time.sleep(3600)
