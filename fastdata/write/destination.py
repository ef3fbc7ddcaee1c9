"""Where a conversion writes: a folder (checked, locked, emptied, tidied after a failure) or a URL (checked; the
journal, keys and manifest staged locally and uploaded last, so an unfinished dataset never looks finished).
Only names fastdata writes (``OURS``) are ever deleted, so ``--overwrite`` never removes a user's file."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from fastdata.errors import DestinationBusyError, RemoteError, UsageError, WriteError
from fastdata.fileio import lock_holder, record_holder, try_lock, unlock
from fastdata.format import MANIFEST_NAME, ShardInfo
from fastdata.format.manifest import JOURNAL_NAME, LOCK_NAME, OURS, PART_FILE, SKIPPED_NAME, TEMPORARY
from fastdata.format.spec import KEYS_FILE
from fastdata.remote import RemoteOptions, root
from fastdata.write import journal
from fastdata.write.shard_task import WORKERS_DIR, UrlSpec, remove_empty

__all__ = ["Destination", "DstLock", "RemoteTarget", "SHARD", "check_dst", "check_entries", "check_part_entries",
           "own_files", "part_stem", "prepare_dst", "refuse_broken_url", "remove_ours", "remove_shards_except",
           "remove_temporary", "write_skipped"]

log = logging.getLogger(__name__)


SHARD = re.compile(r"^shard-\d{5,}\.(h5|lmdb)$")


def part_stem(index: int, count: int) -> str:
    return f"part-{index:05d}-of-{count:05d}"


def own_files(part: tuple[int, int] | None) -> tuple[str, str, str]:
    """The journal, the lock and the file written last (the manifest; for part (I, N) the record it leaves for
    ``fastdata merge-parts``) of a whole conversion (``part`` None) or of one part."""
    if part is None:
        return JOURNAL_NAME, LOCK_NAME, MANIFEST_NAME
    stem = part_stem(*part)
    return f"{JOURNAL_NAME}-{stem}", f".fastdata-{stem}.lock", f".fastdata-{stem}.json"


_BROKEN_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+):/(?!/)")  # two letters or more: C:/x is a Windows path


def refuse_broken_url(path: str | os.PathLike[str], what: str = "DST") -> None:
    """A local path that starts like a URL with a slash too few (``s3:/bucket/ds``) is
    almost surely a typo: refuse it rather than write a local folder named ``s3:``."""
    text = os.fspath(path)
    m = _BROKEN_URL.match(text) if isinstance(text, str) and "://" not in text else None
    if m is not None:
        raise UsageError(f"{text}: {what} looks like a URL missing a slash ({m.group(1)}://bucket/path); a local "
                         f"path has no '{m.group(1)}:' prefix (write ./{text} if you mean one)")


def check_dst(dst: Path, sources: Sequence[Path], overwrite: bool, resume: bool = False) -> None:
    """Refuse a DST inside a source, one being written by another conversion, one that exists
    without --overwrite or --resume, one holding other files, and a --resume with nothing to resume."""
    dst_real = os.path.realpath(dst)
    for src in sources:
        s = os.path.realpath(src)
        if dst_real == s or (os.path.isdir(s) and dst_real.startswith(s.rstrip(os.sep) + os.sep)):
            raise UsageError(f"{dst}: the destination is inside the source {src}; choose a folder outside it")
    if not os.path.lexists(dst):
        return
    if not dst.is_dir():
        raise UsageError(f"{dst}: exists and is not a directory")
    who = lock_holder(dst / LOCK_NAME)
    if who is not None:
        raise DestinationBusyError(f"{dst}: another conversion is writing it ({who}); wait for it to end")
    _check_entries(dst, overwrite, resume)


def _check_entries(dst: Path, overwrite: bool, resume: bool) -> list[str]:
    """What DST holds (the lock file aside), once it is known to be fit for this conversion."""
    entries = sorted(e for e in os.listdir(dst) if e != LOCK_NAME)
    check_entries(str(dst), entries, overwrite, resume)
    return entries


def check_entries(where: str, names: Sequence[str], overwrite: bool, resume: bool, place: str = "folder") -> None:
    """What a whole conversion refuses in a destination (a folder or a URL prefix, ``place``) holding ``names``:
    a finished dataset or nothing to resume (``resume``), a dataset (unless ``overwrite``), files not ours."""
    if resume:
        if MANIFEST_NAME in names:
            raise UsageError(f"{where}: already holds a finished dataset; nothing to resume (%(overwrite=True) converts again)")
        left = [n for n in names if not TEMPORARY.match(n)]  # a kill while the journal was written leaves only these
        if left and JOURNAL_NAME not in names and all(OURS.match(n) for n in names):
            raise UsageError(f"{where}: no interrupted conversion to resume (no {JOURNAL_NAME}, but it holds "
                             f"{left[0]!r}); convert again with %(overwrite=True)")
    elif names and not overwrite:
        if JOURNAL_NAME in names and MANIFEST_NAME not in names:
            raise UsageError(f"{where}: holds an interrupted conversion; pass %(resume=True) to finish it, or %(overwrite=True) to start over")
        raise UsageError(f"{where}: already exists; pass %(overwrite=True) to replace it")
    _refuse_foreign(where, names, place)


def _refuse_foreign(where: str, names: Sequence[str], place: str) -> None:
    foreign = [n for n in names if not OURS.match(n)]
    if foreign:
        raise UsageError(f"{where}: refused: it holds {foreign[0]!r}, which fastdata did not write; choose an empty or "
                         f"new {place}")


class DstLock:
    """One conversion at a time per destination: an exclusive ``flock`` on ``DST/.fastdata.lock`` (or one part's
    lock file), naming its holder, until :meth:`release`. The kernel drops it when its holder dies, so a killed
    conversion never blocks ``--resume``."""

    def __init__(self, dst: Path, name: str = LOCK_NAME) -> None:
        """Raises DestinationBusyError if another live conversion holds the lock."""
        self.path = dst / name

        def no_locks() -> None:
            log.warning("%s: the file system does not support locks; not guarding against a second conversion", dst)

        try:
            fd = try_lock(self.path, no_locks)
        except OSError as e:  # from open: with no_locks, flock raises nothing else that can happen here
            raise WriteError(f"{dst}: cannot create {name}: {e.strerror}") from None
        if fd is None:
            who = lock_holder(self.path) or "a fastdata process"
            raise DestinationBusyError(f"{dst}: another conversion is writing it ({who}); wait for it to end")
        try:
            record_holder(fd)
        except OSError as e:
            os.close(fd)
            raise WriteError(f"{dst}: cannot write {name}: {e.strerror}") from None
        self._fd: int | None = fd

    def release(self) -> None:
        """Remove the lock file and unlock."""
        if self._fd is not None:
            unlock(self._fd, self.path)
            self._fd = None

    def __enter__(self) -> "DstLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass
class Destination:
    """A locked destination folder, ready for writing; ``resume``: a journal there is to be continued."""

    path: Path
    created: bool
    resume: bool
    lock: DstLock | None = field(default=None, repr=False)
    part: tuple[int, int] | None = None  # (I, N) for ``--part I/N``: this run writes part I of N
    overwrite: bool = False  # --overwrite: what DST holds is to be replaced (a part: its own files)
    on_shard: Callable[[ShardInfo], None] | None = field(default=None, repr=False)  # a new shard is finished
    trusted: set[str] = field(default_factory=set)  # journaled shards kept without a local file (URL resume)
    remote: UrlSpec | None = field(default=None, repr=False)  # shard tasks upload here (a URL destination)
    on_start: Callable[[], None] | None = field(default=None, repr=False)  # the journal is written, no shard yet

    @property
    def journal_name(self) -> str:
        return own_files(self.part)[0]

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def __enter__(self) -> "Destination":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        if self.created and exc[0] is not None:
            remove_empty(self.path)


def check_part_entries(where: str, names: Sequence[str], part: tuple[int, int], overwrite: bool, resume: bool,
                       place: str) -> None:
    """What part ``part`` refuses in ``place`` (a folder or URL prefix) holding ``names``: a finished dataset, parts
    split another way, this part done (unless ``overwrite``) or interrupted (unless ``resume``: its journal is
    there), files not ours."""
    index, count = part
    journal_name, _, record = own_files(part)
    _refuse_foreign(where, names, place)
    if MANIFEST_NAME in names:
        raise UsageError(f"{where}: already holds a finished dataset; convert the parts into a new {place}")
    for name in names:
        m = PART_FILE.match(name)
        if m and int(m.group(2)) != count:
            raise UsageError(f"{where}: holds {name}, a part of a conversion split in {int(m.group(2))} parts, not "
                             f"{count}; use the same N for every part (or a new {place})")
    what = f"{where}: part {index}/{count}"
    if record in names and not overwrite:
        raise UsageError(f"{what} is already converted; pass %(overwrite=True) to convert it again")
    if journal_name in names and not (resume or overwrite):
        raise UsageError(f"{what} was interrupted; pass %(resume=True) to finish it, or %(overwrite=True) to start it over")


def prepare_dst(dst: Path, sources: Sequence[Path], overwrite: bool, resume: bool = False,
                part: tuple[int, int] | None = None) -> Destination:
    """Create or lock DST (for part (I, N): lock only its own files, as other parts may write DST at the same time),
    check it again under the lock, and empty what --overwrite replaces (a part: its record and journal)."""
    if part is not None:
        check_dst(dst, sources, overwrite=True)  # the source checks, and no whole conversion or merge-parts in DST
    jname, lock_name, last = own_files(part)
    created = False
    if not os.path.lexists(dst):
        try:
            dst.mkdir(parents=True)
            created = part is None  # (a part leaves DST to the others)
        except FileExistsError:
            pass  # another process made it just now: the lock below decides
        except OSError as e:
            raise UsageError(f"{dst}: cannot create the destination: {e.strerror}") from None
    try:
        lock = DstLock(dst, lock_name)
    except BaseException:
        if created:
            remove_empty(dst)
        raise
    target = Destination(dst, created, resume=False, lock=lock, part=part, overwrite=overwrite)
    try:  # checked again: DST may have changed before we held the lock
        if part is None:
            entries = _check_entries(dst, overwrite, resume)
        else:
            entries = sorted(e for e in os.listdir(dst) if not e.endswith(".lock"))
            check_part_entries(str(dst), entries, part, overwrite, resume and jname in entries, "folder")
        target.resume = resume and jname in entries  # no journal (never started, or killed writing it): start afresh
        if overwrite and part is None:
            remove_ours(dst)  # the manifest first: an interrupted delete never leaves a dataset that looks complete
        elif overwrite:
            (dst / last).unlink(missing_ok=True)
            journal.remove(dst, jname)  # its shards go when the writer removes shards no journal vouches for
    except BaseException:
        target.__exit__(UsageError, None, None)
        raise
    return target


def write_skipped(dst: Path, skipped: list[tuple[str, str]]) -> None:
    """``skipped.json``: the bad files ``--skip-bad`` left out (nothing when there are none)."""
    if skipped:
        rows = [{"path": p, "reason": r} for p, r in skipped]
        (dst / SKIPPED_NAME).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")


def remove_temporary(dst: Path, owned: set[str] | None = None) -> None:
    """Remove half-written files of an earlier or failed run (never a finished shard); with ``owned``
    (a ``--part``'s shard names), only the temporary files of those shards."""
    for e in os.listdir(dst):
        shard = e.lstrip(".").replace(".partial", "").replace("-lock", "")  # the shard a temporary name is of
        if TEMPORARY.match(e) and (owned is None or shard in owned):
            _remove(dst / e)


def remove_shards_except(dst: Path, keep: set[str], owned: set[str] | None = None) -> None:
    """Remove finished-looking shards that the journal does not vouch for (with ``owned``: among those)."""
    for e in os.listdir(dst):
        if SHARD.match(e) and e not in keep and (owned is None or e in owned):
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


class RemoteTarget:
    """The URL a conversion uploads to, and its local staging folder. ``part`` = (I, N): this run
    converts part I of N (its own journal and staging folder; a part record instead of the manifest)."""

    def __init__(self, url: str, options: RemoteOptions | None = None, *, part: tuple[int, int] | None = None) -> None:
        self.options = options or RemoteOptions()
        self.spec = UrlSpec(root(url), self.options)  # what the shard tasks upload their shards with
        self.url = self.spec.url
        self.fs = self.spec.filesystem()
        self.part = part
        self.journal_name, self.lock_name, self.last = own_files(part)  # the last: the manifest, or the part record
        key = hashlib.sha256(self.url.encode()).hexdigest()[:20] + ("" if part is None else "-" + part_stem(*part))
        self.staging = self.options.cache_path() / "uploads" / key
        self.uploaded: list[ShardInfo] = []  # shards safely uploaded (listed in the remote journal)
        self.journal_uploaded = False  # the remote journal exists: a failed run can be resumed
        self.resuming = False  # --resume found a remote journal to continue (check); without one it starts afresh

    def check(self, overwrite: bool, resume: bool) -> None:
        """Refuse what a local destination would refuse (as :func:`check_dst`), before any work."""
        names = list(self.spec.sizes(self.fs))
        self.resuming = resume and self.journal_name in names  # no remote journal: no shard either, start afresh
        if self.part is not None:  # as a shared folder is checked for a part (other parts may be uploading)
            check_part_entries(self.url, names, self.part, overwrite, self.resuming, "prefix")
        else:
            check_entries(self.url, names, overwrite, resume, "prefix")
        self._check_not_busy()

    def _check_not_busy(self) -> None:
        who = lock_holder(self.staging / self.lock_name)
        if who is not None:
            what = "it" if self.part is None else f"part {self.part[0]}/{self.part[1]} of it"
            raise DestinationBusyError(f"{self.url}: another conversion on this machine is writing {what} ({who}); "
                                       "wait for it to end")

    def prepare(self, overwrite: bool, resume: bool) -> set[str]:
        """A fresh staging folder (holding the remote journal on resume); the shards kept remotely.
        ``resume`` with no remote journal (see ``check``) starts afresh."""
        if self.staging.exists():
            shutil.rmtree(self.staging)
        self.staging.parent.mkdir(parents=True, exist_ok=True)
        if overwrite and self.part is not None:  # this part's record and journal; its shards are written again
            for name in (self.last, self.journal_name):
                self.spec.remove(name, self.fs)
        elif overwrite:
            for n in sorted(self.spec.sizes(self.fs), key=lambda n: n != MANIFEST_NAME):  # the manifest first: an interrupted
                if OURS.match(n):  # delete never leaves a dataset that looks complete
                    self.spec.remove(n, self.fs)
        if not self.resuming:  # check() set it: resume asked for and a remote journal there
            return set()
        self.staging.mkdir()
        raw = self.spec.read(self.journal_name, self.fs).split(b"\n")
        sizes = self.spec.sizes(self.fs)  # a shard the journal lists is kept when it is there with its size
        kept = [i for i in map(journal._parse_entry, raw[1:]) if i is not None and sizes.get(i.file) == i.bytes]
        self.uploaded = kept
        lines = [raw[0], *(json.dumps(k.to_json(), sort_keys=True).encode() for k in kept)]  # as journal.append
        (self.staging / self.journal_name).write_bytes(b"\n".join(lines) + b"\n")
        return {k.file for k in kept}

    # --- while writing -------------------------------------------------------------------

    def upload_journal(self) -> None:
        """Put the local journal remotely: first once it is written, before any shard (a shard a task uploads is
        never there without a journal saying what it belongs to), then after each shard (:meth:`shard_done`)."""
        self.spec.upload(self.staging / self.journal_name, self.journal_name, self.fs)
        self.journal_uploaded = True

    def shard_done(self, info: ShardInfo) -> None:
        """A shard task uploaded a shard (the engine checked it and added it to the local journal)."""
        self.upload_journal()
        self.uploaded.append(info)

    def finish(self) -> None:
        """Every shard is uploaded: upload the keys file, skipped.json, then the manifest (a part: its record) last;
        remove the remote journal and the staging folder."""
        for name in (KEYS_FILE, SKIPPED_NAME, self.last):  # the last lists keys.bin with its checksum
            if name == self.last or (self.staging / name).is_file():
                self.spec.upload(self.staging / name, name, self.fs)
        try:
            self.spec.remove(self.journal_name, self.fs)
        except RemoteError as e:
            log.warning("%s: could not remove the conversion journal: %s", self.url, e)
        self.abandon()

    def abandon(self) -> None:
        """Remove the staging folder (after a failure, ``--resume`` starts from the remote journal)."""
        shutil.rmtree(self.staging, ignore_errors=True)
        remove_empty(self.staging.parent / WORKERS_DIR, self.staging.parent)  # what the shard tasks staged in
