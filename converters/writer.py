"""Sources -> shards: plan shards by bytes, write them in parallel processes, write the manifest last.

Each shard is written under a temporary name, fsynced, hashed and renamed; the manifest
is written only after every shard is in place, so an interrupted conversion never looks
finished. On failure everything this conversion wrote is removed again.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import re
import shutil
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, Sequence

import numpy as np

import fastdata
from fastdata._units import fmt_bytes
from fastdata.errors import DataError, FastdataError, UsageError
from fastdata.format import MANIFEST_NAME, FieldSpec, Manifest, ShardInfo, backend, shard_file_name, write_manifest
from fastdata.format._io import finish_file, sha256_file

DEFAULT_SHARD_SIZE = 256 << 20
SKIPPED_NAME = "skipped.json"
# Names a conversion may leave in DST; --overwrite deletes only these.
_OURS = re.compile(r"^(manifest\.json|skipped\.json|\.manifest\..+\.tmp|\.?shard-\d{5,}\.(h5|lmdb)(\.partial)?(-lock)?)$")


class Source(Protocol):
    kind: str
    fields: list[FieldSpec]
    classes: list[str] | None
    skipped: list[tuple[str, str]]

    def __len__(self) -> int: ...
    @property
    def bytes_in(self) -> int: ...
    def sample_nbytes(self) -> np.ndarray: ...
    def ragged_rows(self, name: str) -> np.ndarray: ...
    def part(self, start: int, stop: int) -> "Source": ...
    def read(self, i: int) -> dict[str, np.ndarray]: ...
    def describe(self) -> dict[str, Any]: ...


class Progress(Protocol):
    """Progress of one phase; a conversion may have several (image folders: checking, then writing)."""

    def start(self, total_samples: int, total_bytes: int, desc: str = "converting") -> None: ...
    def update(self, samples: int, nbytes: int) -> None: ...


@dataclass(frozen=True)
class WriteOptions:
    """How to write shards. Validated on construction."""

    backend: Literal["hdf5", "lmdb"] = "hdf5"
    shard_size: int = DEFAULT_SHARD_SIZE
    workers: int | None = None  # None: one per CPU
    compression: str | None = None

    def __post_init__(self) -> None:
        impl = backend(self.backend)
        impl.parse_compression(self.compression)
        if self.shard_size <= 0:
            raise UsageError("--shard-size must be positive")
        if self.workers is not None and self.workers < 1:
            raise UsageError("--workers must be at least 1")


@dataclass
class ConvertReport:
    dst: Path
    backend: str
    samples: int
    shards: int
    bytes_in: int
    bytes_out: int
    seconds: float
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        rate = self.bytes_in / self.seconds if self.seconds > 0 else 0.0
        line = (
            f"{self.samples} samples -> {self.shards} {self.backend} shard(s) in {self.dst}: "
            f"{fmt_bytes(self.bytes_in)} in, {fmt_bytes(self.bytes_out)} out, {self.seconds:.1f} s, {fmt_bytes(rate)}/s"
        )
        if self.skipped:
            line += f"; skipped {len(self.skipped)} bad file(s), listed in {self.dst / SKIPPED_NAME}"
        return line


def plan_shards(nbytes: np.ndarray, shard_size: int) -> list[tuple[int, int]]:
    """Cut samples into consecutive shards of at most ``shard_size`` bytes (at least one sample each)."""
    n = len(nbytes)
    cum = np.cumsum(nbytes, dtype=np.int64)
    plans, start = [], 0
    while start < n:
        base = cum[start - 1] if start else 0
        stop = int(np.searchsorted(cum, base + shard_size, side="right"))
        stop = max(stop, start + 1)
        plans.append((start, stop))
        start = stop
    return plans


def check_dst(dst: Path, sources: Sequence[Path], overwrite: bool) -> None:
    """Refuse a DST inside a source, a DST that exists without --overwrite, or one holding other files."""
    dst_real = os.path.realpath(dst)
    for src in sources:
        s = os.path.realpath(src)
        if dst_real == s or (os.path.isdir(s) and dst_real.startswith(s.rstrip(os.sep) + os.sep)):
            raise UsageError(f"{dst}: the destination is inside the source {src}; choose a folder outside it")
    if not os.path.lexists(dst):
        return
    if not dst.is_dir():
        raise UsageError(f"{dst}: exists and is not a directory")
    entries = sorted(os.listdir(dst))
    if entries and not overwrite:
        raise UsageError(f"{dst}: already exists; pass --overwrite to replace it")
    foreign = [e for e in entries if not _OURS.match(e)]
    if foreign:
        raise UsageError(
            f"{dst}: --overwrite refused: it holds {foreign[0]!r}, which fastdata did not write; "
            "choose an empty or new folder"
        )


def prepare_dst(dst: Path, sources: Sequence[Path], overwrite: bool) -> bool:
    """Check DST (see check_dst), create it or empty a previous dataset there. True if created."""
    check_dst(dst, sources, overwrite)
    if not os.path.lexists(dst):
        try:
            dst.mkdir(parents=True)
        except OSError as e:
            raise UsageError(f"{dst}: cannot create the destination: {e.strerror}") from None
        return True
    entries = sorted(os.listdir(dst))
    # The manifest goes first, so an interrupted delete never leaves a dataset that looks complete.
    if MANIFEST_NAME in entries:
        (dst / MANIFEST_NAME).unlink()
    for e in entries:
        _remove(dst / e)
    return False


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink(missing_ok=True)


def _cleanup(dst: Path, created: bool) -> None:
    """Remove everything a failed conversion wrote (never anything else)."""
    if not dst.is_dir():
        return
    for e in os.listdir(dst):
        if _OURS.match(e):
            _remove(dst / e)
    if created:
        try:
            dst.rmdir()
        except OSError:
            pass


# --- worker side -------------------------------------------------------------------------

_progress_queue: Any = None
_PROGRESS_EVERY_S = 0.2


def _init_worker(q: Any) -> None:
    global _progress_queue
    _progress_queue = q


@dataclass
class _ShardTask:
    part: Any
    fields: list[FieldSpec]
    backend: str
    dst: str
    index: int
    start: int
    count: int
    ragged_rows: dict[str, int]
    compression: str | None


def _check_sample(sample: dict[str, np.ndarray], fields: list[FieldSpec], where: str) -> None:
    for f in fields:
        a = sample.get(f.name)
        if a is None:
            raise DataError(f"{where}: has no {f.name!r}")
        if a.dtype != f.np_dtype:
            raise DataError(f"{where}: {f.name!r} has dtype {a.dtype}, the dataset {f.np_dtype}")
        shape = a.shape[1:] if f.ragged else a.shape
        if (f.ragged and a.ndim == 0) or tuple(shape) != f.trailing:
            raise DataError(f"{where}: {f.name!r} has shape {a.shape}, the dataset {list(f.shape)}")


def _write_shard(task: _ShardTask, report: Any = None) -> ShardInfo:
    """Write one shard (in a worker or inline); returns its manifest entry."""
    name = shard_file_name(task.index, task.backend)
    dst = Path(task.dst)
    tmp, final = dst / f".{name}.partial", dst / name
    impl = backend(task.backend)
    sent_n = sent_b = 0
    last = time.monotonic()
    try:
        with impl.ShardWriter(tmp, task.fields, task.count, task.ragged_rows, task.compression, start=task.start) as w:
            for i in range(task.count):
                sample = task.part.read(i)
                _check_sample(sample, task.fields, f"sample {task.start + i}")
                w.write(sample)
                sent_n += 1
                sent_b += sum(a.nbytes for a in sample.values())
                now = time.monotonic()
                if now - last >= _PROGRESS_EVERY_S:
                    _report(report, sent_n, sent_b)
                    sent_n = sent_b = 0
                    last = now
        sha = sha256_file(tmp)
        size = tmp.stat().st_size
        finish_file(tmp, final)
    except FastdataError:
        raise
    except OSError as e:
        raise FastdataError(f"{final}: cannot write shard: {e.strerror or e}") from None
    except Exception as e:  # h5py / lmdb write failures (disk full, I/O error)
        raise FastdataError(f"{final}: cannot write shard: {type(e).__name__}: {e}") from None
    _report(report, sent_n, sent_b)
    return ShardInfo(file=name, start=task.start, count=task.count, bytes=size, sha256=sha)


def _report(report: Any, n: int, b: int) -> None:
    if not n:
        return
    if report is not None:
        report(n, b)
    elif _progress_queue is not None:
        _progress_queue.put((n, b))


# --- main side ---------------------------------------------------------------------------


def write_dataset(
    source: Source, dst: Path, opts: WriteOptions, created: bool, progress: Progress | None = None
) -> ConvertReport:
    """Write ``source`` into the prepared folder ``dst``; on any failure remove what was written."""
    t0 = time.perf_counter()
    try:
        nbytes = source.sample_nbytes()
        plans = plan_shards(nbytes, opts.shard_size)
        ragged = [f.name for f in source.fields if f.ragged]
        rows = {name: source.ragged_rows(name) for name in ragged}
        tasks = [
            _ShardTask(
                part=source.part(a, b), fields=source.fields, backend=opts.backend, dst=str(dst), index=i,
                start=a, count=b - a, ragged_rows={k: int(v[a:b].sum()) for k, v in rows.items()},
                compression=opts.compression,
            )
            for i, (a, b) in enumerate(plans)
        ]
        if progress is not None:
            progress.start(len(source), int(nbytes.sum()))
        workers = min(opts.workers or os.cpu_count() or 1, len(tasks))
        if workers <= 1:
            update = progress.update if progress is not None else None
            shards = [_write_shard(t, update) for t in tasks]
        else:
            shards = _write_parallel(tasks, workers, progress)
        shards.sort(key=lambda s: s.start)
        if source.skipped:
            skipped = [{"path": p, "reason": r} for p, r in source.skipped]
            (dst / SKIPPED_NAME).write_text(json.dumps(skipped, indent=1) + "\n", encoding="utf-8")
        manifest = Manifest(
            backend=opts.backend, fields=source.fields, num_samples=len(source), shards=shards,
            classes=source.classes,
            source={**source.describe(), "fastdata_version": fastdata.__version__,
                    "shard_size": opts.shard_size, "compression": opts.compression or "none"},
        )
        write_manifest(dst, manifest)
    except BaseException:
        _cleanup(dst, created)
        raise
    out = sum(s.bytes for s in shards) + (dst / MANIFEST_NAME).stat().st_size
    return ConvertReport(dst, opts.backend, len(source), len(shards), source.bytes_in, out,
                         time.perf_counter() - t0, list(source.skipped))


def _mp_context() -> Any:
    # fork on Linux: like torch's DataLoader, and it works from a script without a
    # ``__main__`` guard. Workers touch only numpy, h5py and lmdb, never a parent handle.
    return mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def _write_parallel(tasks: list[_ShardTask], workers: int, progress: Progress | None) -> list[ShardInfo]:
    ctx = _mp_context()
    q = ctx.Queue()
    shards: list[ShardInfo] = []

    def drain() -> None:
        while True:
            try:
                n, b = q.get_nowait()
            except queue.Empty:
                return
            if progress is not None:
                progress.update(n, b)

    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(q,)) as ex:
        pending: set[Future[ShardInfo]] = {ex.submit(_write_shard, t) for t in tasks}
        try:
            while pending:
                done, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
                drain()
                for fut in done:
                    shards.append(fut.result())
        except BrokenProcessPool:
            raise FastdataError("a conversion worker process died (killed, or out of memory?)") from None
        finally:
            for fut in pending:
                fut.cancel()
    drain()  # workers flush their queue feeders when they exit at shutdown
    q.close()
    return shards
