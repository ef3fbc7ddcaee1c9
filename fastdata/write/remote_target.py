"""Converting to a URL: stage the journal, keys and manifest locally while shard tasks upload their shards, and
upload the manifest (or part record) last, so an unfinished dataset never looks finished (docs/remote.md)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil

from fastdata.errors import DestinationBusyError, RemoteError
from fastdata.fileio import lock_holder
from fastdata.format import MANIFEST_NAME, ShardInfo
from fastdata.format.files import OURS, SKIPPED_NAME
from fastdata.format.spec import KEYS_FILE
from fastdata.remote import RemoteOptions, filesystem, root
from fastdata.write import journal
from fastdata.write.destination import check_entries, check_part_entries, own_files, part_stem
from fastdata.write.url_publish import WORKERS_DIR, UrlSpec, remove_empty

__all__ = ["RemoteTarget"]

log = logging.getLogger(__name__)


class RemoteTarget:
    """The URL a conversion uploads to, and its local staging folder. ``part`` = (I, N): this run
    converts part I of N (its own journal and staging folder; a part record instead of the manifest)."""

    def __init__(self, url: str, options: RemoteOptions | None = None, *, part: tuple[int, int] | None = None) -> None:
        self.options = options or RemoteOptions()
        self.spec = UrlSpec(root(url), self.options)  # what the shard tasks upload their shards with
        self.url = self.spec.url
        self.fs = filesystem(self.url, self.options.storage_options, self.options.timeout)
        self.part = part
        self.journal_name, self.lock_name, self.last = own_files(part)  # the last: the manifest, or the part record
        key = hashlib.sha256(self.url.encode()).hexdigest()[:20] + ("" if part is None else "-" + part_stem(*part))
        self.staging = self.options.cache_path() / "uploads" / key
        self.uploaded: list[ShardInfo] = []  # shards safely uploaded (listed in the remote journal)
        self.journal_uploaded = False  # the remote journal exists: a failed run can be resumed
        self.resuming = False  # --resume found a remote journal to continue (check); without one it starts afresh

    def check(self, overwrite: bool, resume: bool) -> None:
        """Refuse what a local destination would refuse (see fastdata/write/destination.py), before any work."""
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
