"""Converting to a URL (``fastdata convert SRC s3://bucket/ds``): write locally, upload as we go.

Shards are written into a local staging folder (under the shard cache's directory, one per
URL) exactly as for a local conversion, and each is uploaded as soon as it is finished, then
removed locally. The remote copy of the journal lists only shards whose upload completed; the
sample keys' file (``keys.bin``) follows the shards, and the manifest is uploaded last, so a
remote dataset without a manifest is never taken for finished.
``--resume`` continues from the remote journal (on any machine): shards it lists and that are
present remotely with the right size are kept, the rest are written and uploaded again.

With ``--engine ray`` the Ray workers upload the shards they write (fastdata/write/url_publish.py);
here the driver journals each one after checking it is there, and uploads the manifest last.
``--part I/N`` into a URL stages, journals (``.fastdata-journal-part-I-of-N``) and uploads like a
whole conversion, and uploads its part record instead of the manifest (``merge-parts`` then
writes the manifest, fastdata/write/parts.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastdata.errors import DestinationBusyError, UsageError
from fastdata.format import MANIFEST_NAME, ShardInfo
from fastdata.format.files import JOURNAL_NAME, OURS, SKIPPED_NAME
from fastdata.format.spec import KEYS_FILE
from fastdata.remote import RemoteOptions
from fastdata.remote.retry import RemoteError, RemoteNotFoundError, describe, with_retries
from fastdata.remote.url import filesystem, join, root
from fastdata.write import _fault, journal
from fastdata.write.destination import (
    check_part_entries,
    part_journal_name,
    part_lock_name,
    part_record_name,
    part_stem,
)
from fastdata.write.lock import holder
from fastdata.write.url_publish import UrlSpec, shard_number

__all__ = ["RemoteTarget", "check_not_urls"]

log = logging.getLogger(__name__)
_UPLOAD_THREADS = 4


class RemoteTarget:
    """The URL a conversion uploads to, and its local staging folder. ``part`` = (I, N): this run
    converts part I of N (its own journal and staging folder; a part record instead of the manifest).
    ``workers_upload``: the shard tasks upload their shards themselves (``--engine ray``)."""

    def __init__(self, url: str, options: RemoteOptions | None = None, *, part: tuple[int, int] | None = None,
                 workers_upload: bool = False) -> None:
        self.url = root(url)
        self.options = options or RemoteOptions()
        self.fs = filesystem(self.url, self.options.storage_options, self.options.timeout)
        self.part = part
        self.workers_upload = workers_upload
        self.journal_name = JOURNAL_NAME if part is None else part_journal_name(*part)
        key = hashlib.sha256(self.url.encode()).hexdigest()[:20] + ("" if part is None else "-" + part_stem(*part))
        self.staging = self.options.cache_path() / "uploads" / key
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._lock = threading.Lock()
        self._uploaded: list[ShardInfo] = []
        self._head: str | None = None
        self._failed = False  # an upload gave up: those not started yet are not tried (each would wait the bound)
        self.journal_uploaded = False  # the remote journal exists: a failed run can be resumed
        self.resuming = False  # --resume found a remote journal to continue (check); without one it starts afresh

    def _call(self, fn: Any, what: str) -> Any:
        return with_retries(fn, what, _deadline(self.options))

    def _names(self) -> list[str]:
        try:
            entries = self._call(lambda: self.fs.ls(self.url, detail=False, refresh=True), self.url)
        except RemoteNotFoundError:
            return []
        return [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]

    @property
    def spec(self) -> UrlSpec | None:
        """What the shard tasks upload with (``workers_upload`` only)."""
        return UrlSpec.of(self.url, self.options) if self.workers_upload else None

    def check(self, overwrite: bool, resume: bool) -> None:
        """Refuse what a local destination would refuse (see fastdata/write/destination.py), before any work."""
        names = self._names()
        foreign = [n for n in names if not OURS.match(n)]
        if foreign:
            raise UsageError(f"{self.url}: refused: it holds {foreign[0]!r}, which fastdata did not write; "
                             "choose an empty or new prefix")
        self.resuming = resume and self.journal_name in names  # none (never started, killed before it was
        # uploaded: the journal goes up before any shard): a new conversion, as for a local folder
        if self.part is not None:
            self._check_part(names, overwrite, self.resuming)
        elif resume:
            if MANIFEST_NAME in names:
                raise UsageError(f"{self.url}: already holds a finished dataset; nothing to resume "
                                 "(%(overwrite=True) converts again)")
            if names and not self.resuming:
                raise UsageError(f"{self.url}: no interrupted conversion to resume (no {JOURNAL_NAME}, but it holds "
                                 f"{names[0]!r}); convert again with %(overwrite=True)")
        elif names and not overwrite:
            if JOURNAL_NAME in names and MANIFEST_NAME not in names:
                raise UsageError(f"{self.url}: holds an interrupted conversion; pass %(resume=True) to finish it, "
                                 "or %(overwrite=True) to start over")
            raise UsageError(f"{self.url}: already exists; pass %(overwrite=True) to replace it")
        self._check_not_busy()

    def _check_not_busy(self) -> None:
        who = None
        if self.staging.is_dir():
            who = holder(self.staging) if self.part is None else holder(self.staging, part_lock_name(*self.part))
        if who is not None:
            what = "it" if self.part is None else f"part {self.part[0]}/{self.part[1]} of it"
            raise DestinationBusyError(f"{self.url}: another conversion on this machine is writing {what} ({who}); "
                                       "wait for it to end")

    def _check_part(self, names: list[str], overwrite: bool, resume: bool) -> None:
        """As a shared folder is checked for a part (other parts may be uploading)."""
        assert self.part is not None
        check_part_entries(self.url, names, self.part, self.journal_name, overwrite, resume, "prefix")

    def prepare(self, overwrite: bool, resume: bool) -> tuple[Path, set[str]]:
        """A fresh staging folder (holding the remote journal on resume) and the shards kept remotely.
        ``resume`` with no remote journal (see ``check``) starts afresh."""
        if self.staging.exists():
            shutil.rmtree(self.staging)
        self.staging.parent.mkdir(parents=True, exist_ok=True)
        if overwrite and self.part is not None:  # this part's record and journal; its shards are written again
            for name in (part_record_name(*self.part), self.journal_name):
                self._remove(name)
        elif overwrite:
            self._remove_ours()
        if not self.resuming:  # check() set it: resume asked for and a remote journal there
            return self.staging, set()
        self.staging.mkdir()
        where = join(self.url, self.journal_name)
        raw = self._call(lambda: self.fs.cat_file(where), where).split(b"\n")
        kept: list[ShardInfo] = []
        for line in raw[1:]:
            info = journal._parse_entry(line) if line.strip() else None
            if info is None:
                continue
            where_shard = join(self.url, info.file)
            try:
                size = self._call(lambda w=where_shard: self.fs.info(w)["size"], where_shard)
            except RemoteError:
                continue
            if size == info.bytes:
                kept.append(info)
        self._head = raw[0].decode("utf-8")
        self._uploaded = list(kept)
        (self.staging / self.journal_name).write_bytes(self._journal_bytes())
        return self.staging, {k.file for k in kept}

    def _remove(self, name: str) -> None:
        try:
            self._call(lambda: self.fs.rm_file(join(self.url, name)), join(self.url, name))
        except RemoteNotFoundError:
            pass

    def _remove_ours(self) -> None:
        """--overwrite: the manifest first, so an interrupted delete never leaves a dataset that looks complete."""
        names = self._names()
        if MANIFEST_NAME in names:
            self._call(lambda: self.fs.rm_file(join(self.url, MANIFEST_NAME)), join(self.url, MANIFEST_NAME))
        for n in names:
            if n != MANIFEST_NAME and OURS.match(n):
                self._call(lambda n=n: self.fs.rm_file(join(self.url, n)), join(self.url, n))

    def _journal_bytes(self) -> bytes:
        lines = [self._head or ""] + [json.dumps(asdict(i), sort_keys=True) for i in self._uploaded]
        return ("\n".join(lines) + "\n").encode("utf-8")

    # --- while writing -------------------------------------------------------------------

    def _read_head(self) -> None:
        if self._head is None:
            self._head = (self.staging / self.journal_name).read_text(encoding="utf-8").split("\n", 1)[0]

    def started(self) -> None:
        """The local journal is written, no shard yet (``workers_upload``): put it remotely first, so that
        a shard a worker uploads is never there without a journal saying what it belongs to."""
        self._read_head()
        with self._lock:
            self._upload_journal()

    def shard_done(self, info: ShardInfo) -> None:
        """A shard is finished locally: upload it in the background (a failed upload stops the conversion).
        With ``workers_upload`` it is uploaded already (the engine checked it): journal it."""
        self.raise_failed()
        self._read_head()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_UPLOAD_THREADS, thread_name_prefix="fastdata-upload")
        work = self._journal_shard if self.workers_upload else self._upload_shard
        self._pending.append(self._pool.submit(self._unless_failed, work, info))

    def _unless_failed(self, work: Any, info: ShardInfo) -> None:
        """``work(info)``, skipped once an upload failed; a failure stops the uploads not started yet."""
        if self._failed:
            return
        try:
            work(info)
        except BaseException:
            self._failed = True
            raise

    def _upload_shard(self, info: ShardInfo) -> None:
        local = self.staging / info.file
        where = join(self.url, info.file)
        with self._lock:  # the journal goes up first: a shard is never there without a journal (after a kill too)
            if not self.journal_uploaded:
                self._upload_journal()
        try:
            _fault.point("upload", shard_number(info.file))
            self._call(lambda: self.fs.put_file(str(local), where), f"{where}: upload")
        except OSError as e:  # the local copy could not be read (the retried call raises RemoteError itself)
            raise RemoteError(f"{where}: upload failed: {describe(e)}") from None
        self._journal_shard(info)
        local.unlink(missing_ok=True)  # it is safe remotely; the local disk need not hold the dataset

    def _journal_shard(self, info: ShardInfo) -> None:
        with self._lock:
            self._uploaded.append(info)
            self._upload_journal()

    @property
    def resumable(self) -> bool:
        """A failed conversion left a remote journal that ``--resume`` continues from."""
        return self.journal_uploaded or bool(self.uploaded)

    def _upload_journal(self) -> None:
        data = self._journal_bytes()
        jw = join(self.url, self.journal_name)
        self._call(lambda: self.fs.pipe_file(jw, data), f"{jw}: upload")
        self.journal_uploaded = True

    @property
    def uploaded(self) -> list[ShardInfo]:
        """Shards safely uploaded (listed in the remote journal)."""
        with self._lock:
            return list(self._uploaded)

    def raise_failed(self) -> None:
        for f in self._pending:
            if f.done() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]

    def wait(self) -> None:
        """Wait for every upload; raise the first failure."""
        first: BaseException | None = None
        for f in self._pending:
            try:
                f.result()
            except BaseException as e:  # noqa: BLE001 - the first one is raised below
                first = first or e
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if first is not None:
            then = ("run the same conversion with %(resume=True) to finish" if self.resumable
                    else "nothing was uploaded: run the same command again")
            raise RemoteError(f"{first}; the conversion stopped: {then}") from None

    def finish(self) -> None:
        """Every shard is uploaded: upload the sample keys' file, skipped.json and then the manifest
        (last: it lists keys.bin with its checksum), remove the remote journal and the staging folder.
        A part uploads its part record instead of the manifest."""
        self.wait()
        if (self.staging / KEYS_FILE).is_file():  # the manifest lists it: it goes up before the manifest
            self._put(KEYS_FILE)
        if self.part is not None:
            self._put(part_record_name(*self.part))
            self._drop_journal()
            shutil.rmtree(self.staging, ignore_errors=True)
            return
        skipped = self.staging / SKIPPED_NAME
        if skipped.is_file():
            self._call(lambda: self.fs.put_file(str(skipped), join(self.url, SKIPPED_NAME)), join(self.url, SKIPPED_NAME))
        man = join(self.url, MANIFEST_NAME)
        self._call(lambda: self.fs.put_file(str(self.staging / MANIFEST_NAME), man), f"{man}: upload")
        self._drop_journal()
        shutil.rmtree(self.staging, ignore_errors=True)

    def _put(self, name: str) -> None:
        where = join(self.url, name)
        self._call(lambda: self.fs.put_file(str(self.staging / name), where), f"{where}: upload")

    def _drop_journal(self) -> None:
        try:
            self._remove(self.journal_name)
        except RemoteError as e:
            log.warning("%s: could not remove the conversion journal: %s", self.url, e)

    def abandon(self) -> None:
        """The conversion failed: uploads not started are dropped, those in flight end (the remote journal
        lists what is safe), and the staging folder goes: ``--resume`` starts from the remote journal, never
        from staged shards, so they would only fill the cache's disk."""
        self._failed = True
        for f in self._pending:
            f.cancel()
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - the conversion's own error is the one to report
            pass
        shutil.rmtree(self.staging, ignore_errors=True)


def _deadline(options: RemoteOptions) -> float:
    import time

    return time.monotonic() + options.timeout


def check_not_urls(paths: list[str | os.PathLike[str] | None]) -> None:
    """Sources are local: a URL there is refused, never read as a folder named ``s3:``."""
    from fastdata.remote import is_url

    for p in paths:
        if p is not None and is_url(str(p) if not isinstance(p, str) else p):
            raise UsageError(f"{p}: sources must be local files or folders (download it first); "
                             "only the destination may be a URL")
