"""Sources -> shards: plan shards by bytes, write them in parallel processes, write the manifest last.

The conversion is crash-safe and resumable (docs/reliability.md). A journal in DST records
the plan before any shard is written and each shard once it is finished (written under a
temporary name, fsynced, hashed, renamed); the manifest is written only after every shard is
in place, and then the journal is deleted. After a failure the finished shards and the journal
stay for ``--resume``; everything else this conversion wrote is removed.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import queue
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Protocol

import numpy as np

from fastdata._units import fmt_bytes
from fastdata._version import __version__
from fastdata.errors import FastdataError, UsageError
from fastdata.format import MANIFEST_NAME, FieldSpec, Manifest, ShardInfo, backend, shard_file_name, write_manifest
from fastdata.handles import usable_cpus

from . import _fault, journal
from .dst import SKIPPED_NAME, Destination, remove_ours, remove_shards_except, remove_temporary
from .shardwork import ShardTask, init_worker, write_error, write_shard

DEFAULT_SHARD_SIZE = 256 << 20
log = logging.getLogger(__name__)
__all__ = ["ConvertReport", "Progress", "Source", "WriteOptions", "plan_shards", "write_dataset"]


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

    def identity(self) -> dict[str, Any]:
        """The options that decide the output bytes (``workers`` does not), for the journal."""
        return {"backend": self.backend, "shard_size": self.shard_size, "compression": self.compression or "none"}


@dataclass
class ConvertReport:
    dst: Path | str
    backend: str
    samples: int
    shards: int
    bytes_in: int
    bytes_out: int
    seconds: float
    skipped: list[tuple[str, str]] = field(default_factory=list)
    kept: int = 0  # shards of an interrupted conversion that --resume verified and kept

    def summary(self) -> str:
        rate = self.bytes_in / self.seconds if self.seconds > 0 else 0.0
        line = (
            f"{self.samples} samples -> {self.shards} {self.backend} shard(s) in {self.dst}: "
            f"{fmt_bytes(self.bytes_in)} in, {fmt_bytes(self.bytes_out)} out, {self.seconds:.1f} s, {fmt_bytes(rate)}/s"
        )
        if self.kept:
            line += f"; resumed: kept {self.kept} finished shard(s)"
        if self.skipped:
            line += f"; skipped {len(self.skipped)} bad file(s), listed in {self.dst}/{SKIPPED_NAME}"
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


# --- main side ---------------------------------------------------------------------------


def write_dataset(source: Source, target: Destination, opts: WriteOptions, progress: Progress | None = None) -> ConvertReport:
    """Write ``source`` into the prepared, locked folder ``target`` (continuing its journal on
    resume). On failure, finished shards and the journal stay for ``--resume``; the rest goes."""
    t0 = time.perf_counter()
    dst = target.path
    nbytes = source.sample_nbytes()
    plans = plan_shards(nbytes, opts.shard_size)
    names = [shard_file_name(i, opts.backend) for i in range(len(plans))]
    head = journal.header(source, opts.identity(), [(n, a, b - a) for n, (a, b) in zip(names, plans)])
    try:
        if target.resume:
            old, done = journal.load(dst)
            journal.check_same(dst, old, head)  # refuses before anything is touched
        else:
            journal.start(dst, head)
            done = {}
    except OSError as e:
        raise write_error(dst / journal.JOURNAL_NAME, e) from None
    journaled = set(done)
    shards: list[ShardInfo] = []
    kept = 0

    def finished(task: ShardTask, info: ShardInfo, was_kept: bool) -> None:
        nonlocal kept
        if not was_kept:
            journal.append(dst, info)
            journaled.add(info.file)
            if target.on_shard is not None:
                target.on_shard(info)  # converting to a URL: upload it now
        kept += was_kept
        shards.append(info)
        _fault.point("between_shards", task.index)

    try:
        remove_temporary(dst)
        remove_shards_except(dst, journaled)
        tasks = _tasks(source, opts, dst, names, plans, done, target.trusted)
        if progress is not None:
            progress.start(len(source), int(nbytes.sum()))
        _fault.point("before_first_shard")
        workers = min(opts.workers or usable_cpus(), len(tasks))
        if workers <= 1:
            update = progress.update if progress is not None else None
            for t in tasks:
                finished(t, *write_shard(t, update))
        else:
            _write_parallel(tasks, workers, progress, finished)
        shards.sort(key=lambda s: s.start)
        if source.skipped:
            skipped = [{"path": p, "reason": r} for p, r in source.skipped]
            (dst / SKIPPED_NAME).write_text(json.dumps(skipped, indent=1) + "\n", encoding="utf-8")
        manifest = Manifest(
            backend=opts.backend, fields=source.fields, num_samples=len(source), shards=shards,
            classes=source.classes,
            source={**source.describe(), "fastdata_version": __version__,
                    "shard_size": opts.shard_size, "compression": opts.compression or "none"},
        )
        _fault.point("before_manifest")
        write_manifest(dst, manifest)
    except BaseException as e:
        err = _failed(dst, journaled, e)
        if err is e:
            raise
        raise err from e
    try:
        journal.remove(dst)  # the manifest now says the dataset is complete; the journal is only clutter
    except OSError as e:
        log.warning("%s: could not remove the conversion journal: %s", dst, e.strerror)
    out = sum(s.bytes for s in shards) + (dst / MANIFEST_NAME).stat().st_size
    return ConvertReport(dst, opts.backend, len(source), len(shards), source.bytes_in, out,
                         time.perf_counter() - t0, list(source.skipped), kept)


def _tasks(source: Source, opts: WriteOptions, dst: Path, names: list[str], plans: list[tuple[int, int]],
           done: dict[str, ShardInfo], trusted: set[str]) -> list[ShardTask]:
    ragged = [f.name for f in source.fields if f.ragged]
    rows = {name: source.ragged_rows(name) for name in ragged}
    tasks = []
    for i, (name, (a, b)) in enumerate(zip(names, plans)):
        expect = done.get(name)
        if expect is not None and (expect.start, expect.count) != (a, b - a):
            expect = None
        tasks.append(ShardTask(
            part=source.part(a, b), fields=source.fields, backend=opts.backend, dst=str(dst), name=name, index=i,
            start=a, count=b - a, ragged_rows={k: int(v[a:b].sum()) for k, v in rows.items()},
            compression=opts.compression, expect=expect, trusted=expect is not None and name in trusted,
        ))
    return tasks


def _failed(dst: Path, journaled: set[str], e: BaseException) -> BaseException:
    """Tidy DST after a failure and return the error to raise: finished, journaled shards stay for
    --resume (the message says so); temporary files go, and so does everything if no shard finished."""
    try:
        remove_temporary(dst)
        remove_shards_except(dst, journaled)
        kept = sum(1 for n in journaled if (dst / n).is_file())
        if kept == 0:
            remove_ours(dst)
    except OSError:
        kept = 0  # tidying failed too (the disk is gone?); the original error matters more
    if isinstance(e, OSError):
        e = write_error(dst, e)
    if isinstance(e, FastdataError) and kept:
        return type(e)(f"{e}; {kept} finished shard(s) kept in {dst}: fix the problem, then run the same "
                       "command with --resume to finish")
    return e


def _mp_context() -> Any:
    # fork on Linux: like torch's DataLoader, and it works from a script without a
    # ``__main__`` guard. Workers touch only numpy, h5py and lmdb, never a parent handle.
    return mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def _write_parallel(tasks: list[ShardTask], workers: int, progress: Progress | None,
                    finished: Callable[[ShardTask, ShardInfo, bool], None]) -> None:
    ctx = _mp_context()
    q = ctx.Queue()

    def drain() -> None:
        while True:
            try:
                n, b = q.get_nowait()
            except queue.Empty:
                return
            if progress is not None:
                progress.update(n, b)

    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=init_worker,
                             initargs=(q, os.getpid())) as ex:
        pending: dict[Future[tuple[ShardInfo, bool]], ShardTask] = {ex.submit(write_shard, t): t for t in tasks}
        error: BaseException | None = None
        try:
            while pending:
                done, _ = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
                drain()
                for fut in sorted(done, key=lambda f: pending[f].index):
                    task = pending.pop(fut)
                    if fut.cancelled():
                        continue
                    if fut.exception() is not None:
                        # Stop starting shards, but journal those still running that finish: less to redo.
                        error = error or fut.exception()
                        for other in pending:
                            other.cancel()
                        continue
                    finished(task, *fut.result())
        finally:
            for fut in pending:
                fut.cancel()
    drain()  # workers flush their queue feeders when they exit at shutdown
    q.close()
    if isinstance(error, BrokenProcessPool):
        raise FastdataError("a conversion worker process died (killed, or out of memory?)") from None
    if error is not None:
        raise error
