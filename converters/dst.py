"""The destination folder: checking it, locking it, emptying it, and tidying it after a failure.

fastdata only ever deletes names it writes itself (``OURS``), so ``--overwrite`` can never
remove a user's file. A failed conversion keeps its finished shards and its journal for
``--resume`` and removes everything else it wrote; a conversion that finished no shard
leaves the folder as it found it.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from fastdata.errors import DestinationBusyError, UsageError
from fastdata.format import MANIFEST_NAME, ShardInfo

from . import journal
from .dstlock import LOCK_NAME, DstLock, holder

SKIPPED_NAME = "skipped.json"
# Names a conversion may leave in DST; --overwrite deletes only these.
OURS = re.compile(
    r"^(manifest\.json|skipped\.json|\.manifest\..+\.tmp|\.?shard-\d{5,}\.(h5|lmdb)(\.partial)?(-lock)?"
    r"|\.fastdata-journal(\.tmp)?|\.fastdata\.lock)$"
)
# Temporary names: never part of a finished or resumable conversion.
TEMPORARY = re.compile(
    r"^(\.manifest\..+\.tmp|\.shard-\d{5,}\.(h5|lmdb)\.partial(-lock)?|shard-\d{5,}\.lmdb-lock|\.fastdata-journal\.tmp)$"
)
SHARD = re.compile(r"^shard-\d{5,}\.(h5|lmdb)$")


def check_dst(dst: Path, sources: Sequence[Path], overwrite: bool, resume: bool = False) -> None:
    """Refuse a DST inside a source, one being written by another conversion, one that exists
    without --overwrite or --resume, one holding other files, and a --resume with nothing to resume."""
    if overwrite and resume:
        raise UsageError("--overwrite and --resume contradict each other: --resume continues, --overwrite starts over")
    dst_real = os.path.realpath(dst)
    for src in sources:
        s = os.path.realpath(src)
        if dst_real == s or (os.path.isdir(s) and dst_real.startswith(s.rstrip(os.sep) + os.sep)):
            raise UsageError(f"{dst}: the destination is inside the source {src}; choose a folder outside it")
    if not os.path.lexists(dst):
        return
    if not dst.is_dir():
        raise UsageError(f"{dst}: exists and is not a directory")
    who = holder(dst)
    if who is not None:
        raise DestinationBusyError(f"{dst}: another conversion is writing it ({who}); wait for it to end")
    _check_entries(dst, overwrite, resume)


def _check_entries(dst: Path, overwrite: bool, resume: bool) -> list[str]:
    """What DST holds (the lock file aside), once it is known to be fit for this conversion."""
    entries = sorted(e for e in os.listdir(dst) if e != LOCK_NAME)
    foreign = [e for e in entries if not OURS.match(e)]
    if resume:
        if MANIFEST_NAME in entries:
            raise UsageError(f"{dst}: already holds a finished dataset; nothing to resume (--overwrite converts again)")
        if entries and journal.JOURNAL_NAME not in entries and not foreign:
            raise UsageError(f"{dst}: no interrupted conversion to resume (no {journal.JOURNAL_NAME}); "
                             "convert again with --overwrite")
    elif entries and not overwrite:
        if journal.JOURNAL_NAME in entries and MANIFEST_NAME not in entries:
            raise UsageError(f"{dst}: holds an interrupted conversion; pass --resume to finish it, or --overwrite to start over")
        raise UsageError(f"{dst}: already exists; pass --overwrite to replace it")
    if foreign:
        raise UsageError(
            f"{dst}: refused: it holds {foreign[0]!r}, which fastdata did not write; choose an empty or new folder"
        )
    return entries


@dataclass
class Destination:
    """A locked destination folder, ready for writing; ``resume``: a journal there is to be continued."""

    path: Path
    created: bool
    resume: bool
    lock: DstLock | None = field(default=None, repr=False)
    on_shard: Callable[[ShardInfo], None] | None = field(default=None, repr=False)  # a new shard is finished
    trusted: set[str] = field(default_factory=set)  # journaled shards kept without a local file (URL resume)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def __enter__(self) -> "Destination":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        if self.created and exc[0] is not None:
            _rmdir_if_empty(self.path)


def prepare_dst(dst: Path, sources: Sequence[Path], overwrite: bool, resume: bool = False) -> Destination:
    """Create or lock DST, check it again under the lock, and empty a previous dataset for --overwrite."""
    created = False
    if not os.path.lexists(dst):
        try:
            dst.mkdir(parents=True)
            created = True
        except FileExistsError:
            pass  # another process made it just now: the lock below decides
        except OSError as e:
            raise UsageError(f"{dst}: cannot create the destination: {e.strerror}") from None
    try:
        lock = DstLock.acquire(dst)
    except BaseException:
        if created:
            _rmdir_if_empty(dst)
        raise
    target = Destination(dst, created, resume=False, lock=lock)
    try:
        entries = _check_entries(dst, overwrite, resume)  # again: it may have changed before we held the lock
        target.resume = resume and journal.JOURNAL_NAME in entries
        if overwrite:
            remove_ours(dst)  # the manifest first: an interrupted delete never leaves a dataset that looks complete
    except BaseException:
        target.__exit__(UsageError, None, None)
        raise
    return target


def remove_temporary(dst: Path) -> None:
    """Remove half-written files of an earlier or failed run (never a finished shard)."""
    for e in os.listdir(dst):
        if TEMPORARY.match(e):
            _remove(dst / e)


def remove_shards_except(dst: Path, keep: set[str]) -> None:
    """Remove finished-looking shards that the journal does not vouch for."""
    for e in os.listdir(dst):
        if SHARD.match(e) and e not in keep:
            _remove(dst / e)


def remove_ours(dst: Path) -> None:
    """Remove everything a conversion writes, the manifest first (the lock stays with its holder)."""
    (dst / MANIFEST_NAME).unlink(missing_ok=True)
    for e in os.listdir(dst):
        if OURS.match(e) and e != LOCK_NAME:
            _remove(dst / e)


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink(missing_ok=True)


def _rmdir_if_empty(p: Path) -> None:
    try:
        p.rmdir()
    except OSError:
        pass
