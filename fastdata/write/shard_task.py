"""Writing one shard, in a worker process or inline: temp name, fsync, hash, publish (renamed into a folder, or
uploaded to a URL: staged locally, uploaded within a time bound, deleted locally). Workers die with the main
process (Linux: ``PR_SET_PDEATHSIG``), so a killed conversion leaves none writing."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastdata.errors import DataError, FastdataError, RemoteNotFoundError, UsageError, WriteError
from fastdata.fileio import file_checksum, finish_file, fsync_file, prefault, start_writeback
from fastdata.format import FieldSpec, ShardInfo, backend
from fastdata.format.spec import CHECKSUM_DEFAULT
from fastdata.remote import RemoteOptions, filesystem, join, with_retries
from fastdata.remote.cache import pid_alive
from fastdata.write import _fault

__all__ = ["LocalPublisher", "ShardTask", "UrlPublisher", "UrlSpec", "WORKERS_DIR", "check_sample", "init_worker",
           "publisher_for", "remove_empty", "staging_dir", "write_error", "write_shard"]

_PROGRESS_EVERY_S = 0.2
WORKERS_DIR = "workers"  # under <cache>/uploads/: one folder per writing process, <host>-<pid>
BLOCK_BYTES = 1 << 20  # samples read and written at a time where a source gives blocks of rows (read_rows)
WRITEBACK_BYTES = 8 << 20  # the disk is asked to start writing the shard back after each this many bytes
_PR_SET_PDEATHSIG = 1
_ERRNO_IN_TEXT = re.compile(r"errno = (\d+)")
_HINTS = {errno.ENOSPC: "disk full?", errno.EDQUOT: "over the disk quota?", errno.EIO: "a disk or network error",
          errno.EROFS: "mounted read-only", errno.EACCES: "no write permission", errno.EPERM: "no write permission"}

_progress_queue: Any = None


def init_worker(q: Any, parent: int) -> None:
    """Worker initializer: progress goes to ``q``; the worker dies when the main process does."""
    global _progress_queue
    _progress_queue = q
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no prctl in this libc
            pass
        if os.getppid() != parent:  # the main process died before prctl took effect
            os._exit(1)


@dataclass
class ShardTask:
    """One shard to write: the source slice, where it goes, and (on resume) what the journal says."""

    part: Any
    fields: list[FieldSpec]
    backend: str
    dst: str
    name: str
    index: int
    start: int
    count: int
    ragged_rows: dict[str, int] | None  # None: the part counts them by reading its samples (``load_rows()``)
    compression: str | None
    expect: ShardInfo | None = None
    in_bytes: int = 0  # the source bytes of its samples, for progress counted per shard
    trusted: bool = False  # --resume to a URL: the shard is uploaded already; keep it without a local copy
    remote: "UrlSpec | None" = None  # dst is a URL: the writing process uploads the shard (UrlPublisher)


def check_sample(sample: dict[str, np.ndarray], fields: list[FieldSpec], where: str) -> None:
    """Every sample must match the schema the source promised at scan time."""
    for f in fields:
        a = sample.get(f.name)
        if a is None:
            raise DataError(f"{where}: has no {f.name!r}")
        if a.dtype != f.np_dtype:
            raise DataError(f"{where}: {f.name!r} has dtype {a.dtype}, the dataset {f.np_dtype}")
        shape = a.shape[1:] if f.ragged else a.shape
        if (f.ragged and a.ndim == 0) or tuple(shape) != f.trailing:
            raise DataError(f"{where}: {f.name!r} has shape {a.shape}, the dataset {list(f.shape)}")


def write_error(path: Path | str, e: BaseException) -> WriteError:
    """A one-line WriteError for an OSError or an h5py/lmdb write failure at ``path``."""
    code = getattr(e, "errno", None)
    if not isinstance(code, int):
        m = _ERRNO_IN_TEXT.search(str(e))  # libhdf5 puts the errno inside its message
        code = int(m.group(1)) if m else None
    if code:
        reason = os.strerror(code)
        hint = _HINTS.get(code)
        reason += f" ({hint})" if hint else ""
    else:
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return WriteError(f"{path}: cannot write: {reason}")


@dataclass(frozen=True)
class LocalPublisher:
    """Publishes a finished shard to a folder DST (local, or shared by every worker): written beside its final name,
    then renamed; publishing the same bytes twice is harmless."""

    dst: Path

    def local_path(self, name: str) -> Path:
        return self.dst / f".{name}.partial"

    def publish(self, tmp: Path, name: str) -> None:
        finish_file(tmp, self.dst / name)

    def intact(self, name: str, expect: ShardInfo) -> bool:
        path = self.dst / name
        try:
            return self.size(name) == expect.bytes and file_checksum(path, expect.checksum_algorithm) == expect.checksum
        except FileNotFoundError:
            return False

    def size(self, name: str) -> int | None:
        try:
            return (self.dst / name).stat().st_size
        except FileNotFoundError:
            return None

    def where(self, name: str) -> str:
        return str(self.dst / name)

    def discard(self, tmp: Path) -> None:
        """Nothing: the conversion's own tidying deals with a temporary name in DST (a duplicate task may be
        writing it right now)."""


@dataclass(frozen=True)
class UrlSpec:
    """Where a worker uploads shards: ``url`` (as :func:`fastdata.remote.root` gives it), with the
    ``options`` of the conversion (never printed: their storage options may hold credentials)."""

    url: str
    options: RemoteOptions = field(default_factory=RemoteOptions, repr=False)

    def filesystem(self) -> Any:
        return filesystem(self.url, self.options.storage_options, self.options.timeout)

    def deadline(self) -> float:
        return time.monotonic() + self.options.timeout

    def sizes(self, fs: Any) -> dict[str, int]:
        """Every name under the URL with its size, from one listing."""
        try:
            entries = with_retries(lambda: fs.ls(self.url, detail=True, refresh=True), self.url, self.deadline())
        except RemoteNotFoundError:
            return {}
        return {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: int(e.get("size") or 0) for e in entries}

    def upload(self, local: Path, name: str, fs: Any) -> None:
        """``local`` -> ``URL/name`` (a whole-object PUT: readers never see half of it)."""
        where = join(self.url, name)
        with_retries(lambda: fs.put_file(str(local), where), f"{where}: upload", self.deadline())

    def read(self, name: str, fs: Any) -> bytes:
        where = join(self.url, name)
        return with_retries(lambda: fs.cat_file(where), where, self.deadline())

    def remove(self, name: str, fs: Any) -> None:
        """Delete ``URL/name`` (nothing when it is not there)."""
        where = join(self.url, name)
        try:
            with_retries(lambda: fs.rm_file(where), where, self.deadline())
        except RemoteNotFoundError:
            pass


@dataclass
class UrlPublisher:
    """Where a finished shard goes when DST is a URL: written locally, uploaded, deleted (as LocalPublisher renames)."""

    spec: UrlSpec
    _fs: Any = field(default=None, repr=False)

    def fs(self) -> Any:
        if self._fs is None:
            self._fs = self.spec.filesystem()
        return self._fs

    def local_path(self, name: str) -> Path:
        return staging_dir(self.spec) / f".{name}.partial"

    def publish(self, tmp: Path, name: str) -> None:
        try:
            self.spec.upload(tmp, name, self.fs())
        finally:
            _remove_local(tmp)  # uploaded, or failed: a retry writes it again from the source

    def intact(self, name: str, expect: ShardInfo) -> bool:
        """The object is there with the journaled size (what ``--resume`` to a URL checks: hashing it
        would mean downloading it)."""
        return self.size(name) == expect.bytes

    def size(self, name: str) -> int | None:
        """The size of ``URL/name``, or None when there is no such object."""
        fs, where = self.fs(), self.where(name)

        def size() -> int:
            fs.invalidate_cache(where)  # never a listing cached earlier: another process uploaded it
            return int(fs.info(where)["size"])

        try:
            return with_retries(size, where, self.spec.deadline())
        except RemoteNotFoundError:
            return None

    def where(self, name: str) -> str:
        return join(self.spec.url, name)

    def discard(self, tmp: Path) -> None:
        _remove_local(tmp)


def staging_dir(spec: UrlSpec) -> Path:
    """This process's staging folder, ``<cache>/uploads/workers/<host>-<pid>``; folders left by dead
    processes of this host (a killed worker's half-written shard) are removed on the way."""
    root = spec.options.cache_path() / "uploads" / WORKERS_DIR
    host = socket.gethostname()
    mine = root / f"{host}-{os.getpid()}"
    if not mine.is_dir():  # (removed after each upload, when empty)
        while not mine.is_dir():  # a conversion ending meanwhile may remove the empty folders above it
            with contextlib.suppress(FileNotFoundError):
                mine.mkdir(parents=True, exist_ok=True)
        for d in root.iterdir():
            stem, _, pid = d.name.rpartition("-")
            if stem == host and pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(d, ignore_errors=True)
    return mine


def _remove_local(tmp: Path) -> None:
    """Remove a local shard file (and an LMDB lock file beside it), and its staging folder once empty."""
    tmp.unlink(missing_ok=True)
    Path(f"{tmp}-lock").unlink(missing_ok=True)
    remove_empty(tmp.parent)


def remove_empty(*folders: Path) -> None:
    """Remove each of ``folders`` that is empty, in order (a staging folder, then those above it)."""
    for d in folders:
        try:
            d.rmdir()
        except OSError:  # not empty (another process stages there), or gone already
            pass

def publisher_for(dst: str, remote: "UrlSpec | None" = None) -> "LocalPublisher | UrlPublisher":
    """The publisher for a shard task's destination: a folder, or a URL whose task carries its
    :class:`UrlSpec`; a URL without one is refused rather than written as a folder named ``s3:``."""
    if remote is not None:
        if remote.url != dst.rstrip("/"):
            raise UsageError(f"{dst}: the shard task's upload settings name another URL ({remote.url})")
        return UrlPublisher(remote)
    if "://" in dst:
        scheme = dst.split("://", 1)[0]
        raise UsageError(f"{dst}: a shard task for {scheme}:// needs the upload settings (UrlSpec) with it; convert "
                         "to a URL with fastdata convert SRC URL (docs/remote.md)")
    return LocalPublisher(Path(dst))


def write_shard(task: ShardTask, report: Callable[[int, int], None] | None = None) -> tuple[ShardInfo, bool]:
    """Write (or, on resume, keep) one shard; returns its manifest entry and whether it was kept.
    A pure function of ``task``: the same bytes every time, so a retried task is harmless."""
    pub = publisher_for(task.dst, task.remote)
    tmp = pub.local_path(task.name)
    handed_over = False
    try:
        if task.expect is not None and (task.trusted or pub.intact(task.name, task.expect)):
            _report(report, task.count, task.expect.bytes)
            return task.expect, True
        sent_n, sent_b = _write(task, tmp, report)
        fsync_file(tmp)
        checksum = file_checksum(tmp, CHECKSUM_DEFAULT)  # (still in the page cache: a fast re-read)
        size = tmp.stat().st_size
        if task.remote is not None:
            _fault.point("upload", task.index)
        handed_over = True  # from here the publisher owns the local file (and cleans it up)
        pub.publish(tmp, task.name)  # the fsync in its rename finds nothing left to write
    except Exception as e:  # OSError, and h5py / lmdb write failures (disk full, I/O error)
        if not handed_over:
            pub.discard(tmp)
        if isinstance(e, FastdataError):
            raise
        raise write_error(pub.where(task.name), e) from None
    _report(report, sent_n, sent_b)
    return ShardInfo(file=task.name, start=task.start, count=task.count, bytes=size, checksum=checksum), False


def _write(task: ShardTask, tmp: Path, report: Callable[[int, int], None] | None) -> tuple[int, int]:
    """Write every sample of the task to ``tmp`` (blocks of rows where the part reads them), the disk writing
    the bytes back as they come; returns progress not yet reported."""
    impl = backend(task.backend)
    sent_n = sent_b = unsynced = 0
    last = time.monotonic()
    half = task.count // 2
    rows = task.ragged_rows if task.ragged_rows is not None else task.part.load_rows()
    read_rows = None if any(f.ragged for f in task.fields) else getattr(task.part, "read_rows", None)
    step = max(1, BLOCK_BYTES // max(1, sum(f.row_nbytes for f in task.fields if not f.ragged)))
    with impl.ShardWriter(tmp, task.fields, task.count, rows, task.compression, start=task.start) as w:
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            i = 0
            while i < task.count:
                if i == half:
                    _fault.point("mid_shard", task.index)
                stop = task.count if i >= half else half  # a block never crosses the mid-shard fault point
                n, nbytes = _put(task, w, i, read_rows(i, min(step, stop - i)) if read_rows is not None else None)
                i, sent_n, sent_b, unsynced = i + n, sent_n + n, sent_b + nbytes, unsynced + nbytes
                if unsynced >= WRITEBACK_BYTES:
                    start_writeback(fd)
                    unsynced = 0
                now = time.monotonic()
                if now - last >= _PROGRESS_EVERY_S:
                    _report(report, sent_n, sent_b)
                    sent_n = sent_b = 0
                    last = now
        finally:
            os.close(fd)
    return sent_n, sent_b


def _put(task: ShardTask, w: Any, i: int, block: dict[str, np.ndarray] | None) -> tuple[int, int]:
    """Write ``block`` (samples ``i`` on, one array of rows per field), or sample ``i`` when there is none;
    returns the samples and bytes written."""
    if block is None:
        sample = task.part.read(i)
        check_sample(sample, task.fields, f"sample {task.start + i}")
        w.write(sample)
        return 1, sum(a.nbytes for a in sample.values())
    n = check_rows(block, task.fields, task.start + i)
    for a in block.values():
        prefault(a)  # a memory map's pages mapped in one call, not faulted in one by one while written
    put = getattr(w, "write_rows", None)
    if put is not None:
        put(block, n)
    else:
        for r in range(n):
            w.write({k: v[r] for k, v in block.items()})
    return n, sum(a.nbytes for a in block.values())


def check_rows(block: dict[str, np.ndarray], fields: list[FieldSpec], start: int) -> int:
    """How many samples ``block`` (one array of rows per field, from sample ``start``) holds; a field that
    disagrees with the schema is the error :func:`check_sample` gives for the block's first sample."""
    n = len(next(iter(block.values()))) if block else 0
    for f in fields:
        a = block.get(f.name)
        if a is None or a.ndim == 0 or a.dtype != f.np_dtype or a.shape[1:] != f.trailing or len(a) != n or f.ragged:
            check_sample({k: v[0] if v.ndim else v for k, v in block.items()}, fields, f"sample {start}")
            raise FastdataError(f"sample {start}: a block of {n} rows disagrees with the schema")  # ragged, or lengths
    if n < 1:
        raise FastdataError(f"sample {start}: an empty block of rows")
    return n


def _report(report: Callable[[int, int], None] | None, n: int, b: int) -> None:
    if not n:
        return
    if report is not None:
        report(n, b)
    elif _progress_queue is not None:
        _progress_queue.put((n, b))
