"""Sources -> shards: plan shards by bytes, write them in parallel processes, write the manifest last.

The conversion is crash-safe and resumable (docs/reliability.md). A journal in DST records
the plan before any shard is written and each shard once it is finished (written under a
temporary name, fsynced, hashed, renamed); the manifest is written only after every shard is
in place, and then the journal is deleted. After a failure the finished shards and the journal
stay for ``--resume``; everything else this conversion wrote is removed.
"""

from __future__ import annotations

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
from fastdata.fileio import file_checksum, write_atomic
from fastdata.format import MANIFEST_NAME, FieldSpec, Manifest, ShardInfo, backend, shard_file_name, write_manifest
from fastdata.format import codec as blosc_codec
from fastdata.format.keys import write_keys
from fastdata.format.spec import (
    CHECKSUM_DEFAULT,
    KEYS_FILE,
    KEYS_INDEX,
    KEYS_KIND_FILE,
    LABEL_FIELD,
    KeysInfo,
    version_for,
)
from fastdata.handles import usable_cpus

from . import _fault, journal
from .destination import SKIPPED_NAME, Destination, remove_ours, remove_shards_except, remove_temporary, write_skipped
from .shard_task import ShardTask, init_worker, write_error, write_shard

DEFAULT_SHARD_SIZE = 256 << 20
log = logging.getLogger(__name__)
__all__ = ["ConvertReport", "LocalEngine", "Progress", "ShardEngine", "Source", "WriteOptions", "part_range", "plan_shards",
           "write_dataset"]


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
    def sample_keys(self) -> list[str] | None: ...  # None: a sample's key is its index


class Progress(Protocol):
    """Progress of one phase; a conversion may have several (image folders: checking, then writing)."""

    def start(self, total_samples: int, total_bytes: int, desc: str = "converting") -> None: ...
    def update(self, samples: int, nbytes: int) -> None: ...


Engine = Literal["local", "ray"]
ENGINES = ("local", "ray")


@dataclass(frozen=True)
class WriteOptions:
    """How to write shards. Validated on construction.

    ``engine``: ``local`` writes shards in a process pool on this machine; ``ray`` runs one Ray task
    per shard (``ray_address``, else ``RAY_ADDRESS``, else a local Ray). ``workers``: processes
    (local), or at most that many shard tasks at once (ray; default: the cluster's CPUs).
    """

    backend: Literal["hdf5", "lmdb"] = "hdf5"
    shard_size: int = DEFAULT_SHARD_SIZE
    workers: int | None = None  # None: one per CPU
    compression: str | None = None
    engine: Engine = "local"
    ray_address: str | None = None

    def __post_init__(self) -> None:
        impl = backend(self.backend)
        impl.parse_compression(self.compression)
        if blosc_codec.parse(self.compression) is not None:
            blosc_codec.require()  # the packages are missing: say so before anything is written
        if self.shard_size <= 0:
            raise UsageError("--shard-size must be positive")
        if self.workers is not None and self.workers < 1:
            raise UsageError("--workers must be at least 1")
        if self.engine not in ENGINES:
            raise UsageError(f"unknown engine {self.engine!r} (expected one of {', '.join(ENGINES)})")
        if self.ray_address is not None and self.engine != "ray":
            raise UsageError("--ray-address applies to --engine ray only")

    def identity(self) -> dict[str, Any]:
        """The options that decide the output bytes (``workers`` and ``engine`` do not), for the journal."""
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
    part: tuple[int, int] | None = None  # (I, N) when this run converted part I of N
    engine: str = "local"
    fields: list[str] = field(default_factory=list)  # the fields written, in the manifest's order
    classes: int | None = None  # how many classes the label field has, when it has names

    def summary(self) -> str:
        rate = self.bytes_in / self.seconds if self.seconds > 0 else 0.0
        what = f"part {self.part[0]}/{self.part[1]}: " if self.part else ""
        via = " (Ray)" if self.engine == "ray" else ""
        line = (
            f"{what}{self.samples} samples -> {self.shards} {self.backend} shard(s) in {self.dst}{via}: "
            f"{fmt_bytes(self.bytes_in)} in, {fmt_bytes(self.bytes_out)} out, {self.seconds:.1f} s, {fmt_bytes(rate)}/s"
        )
        if self.fields:
            named = f" ({self.classes} classes)" if self.classes is not None else ""
            line += "; fields " + ", ".join(f + named if f == LABEL_FIELD else f for f in self.fields)
        if self.kept:
            line += f"; resumed: kept {self.kept} finished shard(s)"
        if self.skipped:
            where = "listed in the part record" if self.part else f"listed in {self.dst}/{SKIPPED_NAME}"
            line += f"; skipped {len(self.skipped)} bad file(s), {where}"
        if self.part:
            line += f"; when all {self.part[1]} parts are done, run: fastdata merge-parts {self.dst}"
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

Finished = Callable[[ShardTask, ShardInfo, bool], None]


class ShardEngine(Protocol):
    """Runs shard tasks somewhere and reports each finished one to ``finished`` (on the calling
    thread, in any order). On failure it raises, after reporting every task that did finish."""

    def run(self, tasks: list[ShardTask], progress: Progress | None, finished: Finished) -> None: ...


def write_dataset(source: Source, target: Destination, opts: WriteOptions, progress: Progress | None = None) -> ConvertReport:
    """Write ``source`` into the prepared, locked folder ``target`` (continuing its journal on
    resume). On failure, finished shards and the journal stay for ``--resume``; the rest goes.
    With ``target.part`` = (I, N), only the shards of part I are written, and a part record
    replaces the manifest (``fastdata merge-parts`` writes it once every part is done)."""
    t0 = time.perf_counter()
    dst = target.path
    nbytes = source.sample_nbytes()
    plans = plan_shards(nbytes, opts.shard_size)
    fields = blosc_codec.compress_fields(source.fields, blosc_codec.parse(opts.compression))
    names = [shard_file_name(i, opts.backend) for i in range(len(plans))]
    head = journal.header(source, opts.identity(), [(n, a, b - a) for n, (a, b) in zip(names, plans)])
    own = range(len(plans)) if target.part is None else part_range(len(plans), *target.part)
    owned = None if target.part is None else {names[i] for i in own}
    jname = target.journal_name
    try:
        if target.resume:
            old, done = journal.load(dst, jname)
            journal.check_same(dst, old, head)  # refuses before anything is touched
        else:
            journal.start(dst, head, jname)
            done = {}
    except OSError as e:
        raise write_error(dst / jname, e) from None
    journaled = set(done) if owned is None else set(done) & owned
    shards: list[ShardInfo] = []
    kept = 0

    def finished(task: ShardTask, info: ShardInfo, was_kept: bool) -> None:
        nonlocal kept
        if not was_kept:
            journal.append(dst, info, jname)
            journaled.add(info.file)
            if target.on_shard is not None:
                target.on_shard(info)  # converting to a URL: upload it now
        kept += was_kept
        shards.append(info)
        _fault.point("between_shards", task.index)

    try:
        remove_temporary(dst, owned)
        remove_shards_except(dst, journaled, owned)
        if target.on_start is not None:
            target.on_start()  # workers upload to a URL: the remote journal must exist before any shard does
        tasks = _tasks(source, fields, opts, target, names, plans, done, own, nbytes)
        if progress is not None:
            progress.start(sum(t.count for t in tasks), sum(t.in_bytes for t in tasks))
        _fault.point("before_first_shard")
        _engine(opts, len(tasks)).run(tasks, progress, finished)
        shards.sort(key=lambda s: s.start)
        manifest = Manifest(
            backend=opts.backend, fields=fields, num_samples=len(source), shards=shards,
            classes=source.classes, version=version_for(fields),
            source={**source.describe(), "fastdata_version": __version__,
                    "shard_size": opts.shard_size, "compression": opts.compression or "none",
                    "sample_bytes": int(nbytes.sum())},  # before compression: `fastdata info` shows the ratio
            keys=_write_keys(dst, source.sample_keys()),
        )
        _fault.point("before_manifest")
        if target.part is None:
            write_skipped(dst, source.skipped)
            write_manifest(dst, manifest)
        else:
            from .parts import write_part_record

            write_part_record(dst, target.part, head, manifest, source.skipped)
    except BaseException as e:
        err = _failed(dst, journaled, e, owned, jname)
        if err is e:
            raise
        raise err from e
    try:
        journal.remove(dst, jname)  # the manifest now says the dataset is complete; the journal is only clutter
    except OSError as e:
        log.warning("%s: could not remove the conversion journal: %s", dst, e.strerror)
    out = sum(s.bytes for s in shards)
    if target.part is None:
        out += (dst / MANIFEST_NAME).stat().st_size
    return ConvertReport(dst, opts.backend, sum(s.count for s in shards), len(shards),
                         source.bytes_in if target.part is None else int(sum(t.in_bytes for t in tasks)), out,
                         time.perf_counter() - t0, list(source.skipped), kept, target.part, opts.engine,
                         [f.name for f in source.fields], len(source.classes) if source.classes is not None else None)


def part_range(num_shards: int, index: int, count: int) -> range:
    """The shards of part ``index`` (from 0) of ``count``: consecutive, sizes differing by one at most."""
    return range(num_shards * index // count, num_shards * (index + 1) // count)


def _engine(opts: WriteOptions, ntasks: int) -> ShardEngine:
    if opts.engine == "ray":
        from .ray_engine import RayEngine

        return RayEngine(address=opts.ray_address, workers=opts.workers)
    return LocalEngine(min(opts.workers or usable_cpus(), ntasks))


@dataclass
class LocalEngine:
    """Shards written in this process (one worker) or in a pool of forked processes."""

    workers: int

    def run(self, tasks: list[ShardTask], progress: Progress | None, finished: Finished) -> None:
        if self.workers <= 1:
            update = progress.update if progress is not None else None
            for t in tasks:
                finished(t, *write_shard(t, update))
        else:
            _write_parallel(tasks, self.workers, progress, finished)


def _write_keys(dst: Path, keys: list[str] | None) -> KeysInfo:
    """The keys side file (docs/format.md, "Sample keys"), written atomically before the manifest."""
    if keys is None:
        return KeysInfo(kind=KEYS_INDEX)
    path = dst / KEYS_FILE
    try:
        write_atomic(path, lambda f: write_keys(f, keys, str(dst)))
        return KeysInfo(kind=KEYS_KIND_FILE, file=KEYS_FILE, bytes=path.stat().st_size,
                        checksum=file_checksum(path, CHECKSUM_DEFAULT))
    except OSError as e:
        raise write_error(path, e) from None


def _tasks(source: Source, fields: list[FieldSpec], opts: WriteOptions, target: Destination, names: list[str], plans: list[tuple[int, int]],
           done: dict[str, ShardInfo], own: range, nbytes: np.ndarray) -> list[ShardTask]:
    """One task per shard of ``own``; into ``target.remote``'s URL when the writing processes upload."""
    dst = target.remote.url if target.remote is not None else str(target.path)
    ragged = [f.name for f in source.fields if f.ragged]
    rows = {name: source.ragged_rows(name) for name in ragged}
    tasks = []
    for i in own:
        name, (a, b) = names[i], plans[i]
        expect = done.get(name)
        if expect is not None and (expect.start, expect.count) != (a, b - a):
            expect = None
        tasks.append(ShardTask(
            part=source.part(a, b), fields=fields, backend=opts.backend, dst=dst, name=name, index=i,
            start=a, count=b - a, ragged_rows={k: int(v[a:b].sum()) for k, v in rows.items()},
            compression=opts.compression, expect=expect, in_bytes=int(nbytes[a:b].sum()),
            trusted=expect is not None and name in target.trusted, remote=target.remote,
        ))
    return tasks


def _failed(dst: Path, journaled: set[str], e: BaseException, owned: set[str] | None = None,
            jname: str = journal.JOURNAL_NAME) -> BaseException:
    """Tidy DST after a failure and return the error to raise: finished, journaled shards stay for
    --resume (the message says so); temporary files go, and so does everything if no shard finished
    (for a ``--part``: everything of that part; other parts' files are never touched)."""
    try:
        remove_temporary(dst, owned)
        remove_shards_except(dst, journaled, owned)
        if owned is None:  # (a --part leaves keys.bin to the others: every part writes the same one)
            (dst / KEYS_FILE).unlink(missing_ok=True)  # written again, with the manifest, by --resume
        kept = sum(1 for n in journaled if (dst / n).is_file())
        if kept == 0:
            if owned is None:
                remove_ours(dst)
            else:
                journal.remove(dst, jname)
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
