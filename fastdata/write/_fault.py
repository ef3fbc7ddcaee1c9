"""Fault injection for the crash-safety tests; inert unless ``FASTDATA_FAULT`` is set.

``FASTDATA_FAULT=ACTION:POINT[:SHARD]`` acts when the conversion reaches ``POINT`` (for the
points that name a shard, only for shard number ``SHARD`` if given):

* ``pause``: write this process's id to the file named by ``FASTDATA_FAULT_READY`` (atomically,
  so a test polling for it never reads half a number) and sleep until killed. Tests use it
  to SIGKILL a real ``fastdata convert`` at a known moment.
* ``pause1``: as ``pause``, but only while that file does not exist yet: a retried task (a Ray
  worker the test killed) goes on the second time.
* ``enospc``, ``eio``, ``eacces``: raise that ``OSError`` here, as the disk would.

Points: ``mid_journal`` (the journal's first line written to its temporary file, not yet renamed),
``before_first_shard`` (journal written, no shard started), ``mid_shard`` (half of a
shard's samples written to its temporary file), ``between_shards`` (a shard renamed into
place and journaled), ``before_manifest`` (every shard done, no manifest yet), ``upload`` (a
finished shard about to be uploaded to a URL destination; its local copy is there). The hook
lives here only; see docs/reliability.md, "Fault injection".
"""

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
    if action == "pause1":
        ready = os.environ.get(READY_ENV)
        if ready and os.path.exists(ready):
            return
        action = "pause"
    if action == "pause":
        _pause()
    code = _ERRNOS[action]
    raise OSError(code, os.strerror(code))


def _pause() -> None:
    ready = os.environ.get(READY_ENV)
    if ready:
        tmp = f"{ready}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write(str(os.getpid()))
        os.replace(tmp, ready)
    while True:  # until the test kills us
        time.sleep(3600)
