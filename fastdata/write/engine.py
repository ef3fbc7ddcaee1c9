"""Sources -> shards: plan shards by bytes, write them in parallel (a pool of forked processes here, or one Ray task
per shard), write the manifest last. Crash-safe and resumable: after a failure the finished shards and the
journal stay for ``--resume``."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import re
import socket
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Protocol

import numpy as np

from fastdata._version import __version__
from fastdata.errors import DataError, FastdataError, UsageError, WriteError
from fastdata.fileio import file_checksum, write_atomic
from fastdata.format import MANIFEST_NAME, FieldSpec, Manifest, ShardInfo, shard_file_name, write_manifest
from fastdata.format import codec as blosc_codec
from fastdata.format.keys import write_keys
from fastdata.format.spec import (
    CHECKSUM_DEFAULT,
    KEYS_FILE,
    KEYS_INDEX,
    KEYS_KIND_FILE,
    MAX_CLASSES,
    MAX_FIELDS,
    MAX_SAMPLES,
    MAX_SHARDS,
    KeysInfo,
    version_for,
)
from fastdata.world import usable_cpus
from fastdata.write import _fault, journal
from fastdata.write.destination import Destination, remove_ours, remove_shards_except, remove_temporary, write_skipped
from fastdata.write.options import ConvertReport, Progress, Source, WriteOptions
from fastdata.write.shard_task import ShardTask, init_worker, publisher_for, write_error, write_shard

log = logging.getLogger(__name__)
_SURROGATE = re.compile("[\ud800-\udfff]")  # what a str holds that UTF-8 cannot encode
__all__ = ["Finished", "LocalEngine", "RETRIES", "RayEngine", "ShardEngine", "check_source", "import_ray",
           "mp_context", "part_range", "plan_shards", "ray_write_shard", "write_dataset", "write_keys_file"]
RETRIES = 3  # Ray re-runs a shard task this many times after its worker dies or an I/O error
_WAIT_S = 0.2
_DRAIN_S = 60.0  # after a failure: how long to wait for running shards to finish (they are kept)
RAY_PROBE_S = 10.0  # how long a Ray address may take to accept a connection before the conversion is refused


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


def check_source(source: Source, opts: WriteOptions, where: str) -> None:
    """Refuse, before anything is written, a dataset the reader would refuse (the limits of
    fastdata/format/spec.py) or that could not be written whole (a sample key that is not UTF-8 text)."""
    n = len(source.fields)
    if n > MAX_FIELDS:
        raise DataError(f"{where}: would make {n} fields, over the limit of {MAX_FIELDS} a dataset may have")
    if len(source) > MAX_SAMPLES:
        raise DataError(f"{where}: {len(source)} samples, over the limit of {MAX_SAMPLES} a dataset may have")
    if source.classes is not None and len(source.classes) > MAX_CLASSES:
        raise DataError(f"{where}: {len(source.classes)} classes, over the limit of {MAX_CLASSES}")
    shards = len(plan_shards(source.sample_nbytes(), opts.shard_size))
    if shards > MAX_SHARDS:
        raise UsageError(f"%(shard_size) {opts.shard_size} makes {shards} shards, over the limit of {MAX_SHARDS}; "
                         "pass a larger one")
    codec = blosc_codec.parse(opts.compression)
    if codec is not None and not any(blosc_codec.eligible(f) for f in source.fields):  # a no-op said, never silent
        raise UsageError(f"%(compression) {opts.compression}: no field of {where} is compressed by it ("
                         + ", ".join(f"{f.name}: {'ragged' if f.ragged else f.encoding if f.encoding != 'raw' else f'{f.row_nbytes} bytes'}"
                                     for f in source.fields)
                         + f"); {codec.cname} compresses each sample of a fixed-shape field of {blosc_codec.MIN_FIELD_BYTES} "
                         "bytes or more: leave it out")
    keys = source.sample_keys()
    if keys is not None:
        try:
            "\n".join(keys).encode("utf-8")
        except UnicodeEncodeError:
            bad = next(i for i, k in enumerate(keys) if _SURROGATE.search(k))
            raise DataError(f"{where}: the key of sample {bad}, {keys[bad]!a}, is not valid UTF-8 text; rename "
                            "that file") from None


Finished = Callable[[ShardTask, ShardInfo, bool], None]


class ShardEngine(Protocol):
    """Runs shard tasks somewhere and reports each finished one to ``finished`` (on the calling
    thread, in any order). On failure it raises, after reporting every task that did finish."""

    def run(self, tasks: list[ShardTask], progress: Progress | None, finished: Finished) -> None: ...


def write_dataset(source: Source, target: Destination, opts: WriteOptions, progress: Progress | None = None) -> ConvertReport:
    """Write ``source`` into the prepared, locked folder ``target``; on failure the finished shards and journal stay
    for ``--resume``. With ``target.part`` = (I, N), only part I's shards and a part record are written."""
    t0 = time.perf_counter()
    dst = target.path
    nbytes = source.sample_nbytes()
    plans = plan_shards(nbytes, opts.shard_size)
    fields = blosc_codec.compress_fields(source.fields, blosc_codec.parse(opts.compression))
    names = [shard_file_name(i, opts.backend) for i in range(len(plans))]
    head = journal.header(source, opts.identity(), [(n, a, b - a) for n, (a, b) in zip(names, plans)])
    own = range(len(plans)) if target.part is None else part_range(len(plans), *target.part)
    owned = None if target.part is None else {names[i] for i in own}
    if target.part is not None and target.remote is None and not target.overwrite:
        from fastdata.write.parts import check_other_parts

        check_other_parts(dst, target.part, head)  # its shards would replace theirs (--overwrite: as asked)
    done = _open_journal(target, head)
    journaled = set(done) if owned is None else set(done) & owned
    shards: list[ShardInfo] = []
    kept = 0

    def finished(task: ShardTask, info: ShardInfo, was_kept: bool) -> None:
        nonlocal kept
        if not was_kept:
            journal.append(dst, info, target.journal_name)
            journaled.add(info.file)
            if target.on_shard is not None:
                target.on_shard(info)  # converting to a URL: list it in the remote journal
        kept += was_kept
        shards.append(info)
        _fault.point("between_shards", task.index)

    try:
        remove_temporary(dst, owned)
        remove_shards_except(dst, journaled, owned)
        if target.on_start is not None:
            target.on_start()  # converting to a URL: the remote journal must exist before any shard does
        tasks = _tasks(source, fields, opts, target, names, plans, done, own, nbytes)
        if progress is not None:
            progress.start(sum(t.count for t in tasks), sum(t.in_bytes for t in tasks))
        _fault.point("before_first_shard")
        _engine(opts, len(tasks)).run(tasks, progress, finished)
        shards.sort(key=lambda s: s.start)
        _finish(source, target, head, _manifest(source, opts, fields, shards, nbytes, dst))
    except BaseException as e:
        err = _failed(dst, journaled, e, owned, target.journal_name)
        if err is e:
            raise
        raise err from e
    in_bytes = source.bytes_in if target.part is None else int(sum(t.in_bytes for t in tasks))
    return _report(source, target, opts, shards, in_bytes, kept, time.perf_counter() - t0)


def _open_journal(target: Destination, head: dict) -> dict[str, ShardInfo]:
    """Start the journal, or (resume) load it and check it records this same conversion: the shards it
    says are finished."""
    dst, jname = target.path, target.journal_name
    try:
        if target.resume:
            shown = target.remote.url if target.remote is not None else None  # a URL's journal: its staged copy
            old, done = journal.load(dst, jname, shown)
            journal.check_same(shown or dst, old, head)  # refuses before anything is touched
            return done
        journal.start(dst, head, jname)
        return {}
    except OSError as e:
        raise write_error(dst / jname, e) from None


def _manifest(source: Source, opts: WriteOptions, fields: list[FieldSpec], shards: list[ShardInfo],
              nbytes: np.ndarray, dst: Path) -> Manifest:
    keys = source.sample_keys()
    return Manifest(
        backend=opts.backend, fields=fields, num_samples=len(source), shards=shards,
        classes=source.classes, version=version_for(fields),
        source={**source.describe(), "fastdata_version": __version__,
                "shard_size": opts.shard_size, "compression": opts.compression or "none",
                "sample_bytes": int(nbytes.sum())},  # before compression: `fastdata info` shows the ratio
        keys=(KeysInfo(kind=KEYS_INDEX) if keys is None
              else write_keys_file(dst, lambda f: write_keys(f, keys, str(dst)))),
    )


def _finish(source: Source, target: Destination, head: dict, manifest: Manifest) -> None:
    """Write what says the conversion is complete (skipped.json and the manifest, or a part's record)."""
    _fault.point("before_manifest")
    if target.part is None:
        write_skipped(target.path, source.skipped)
        write_manifest(target.path, manifest)
    else:
        from fastdata.write.parts import write_part_record

        write_part_record(target.path, target.part, head, manifest, source.skipped)


def _report(source: Source, target: Destination, opts: WriteOptions, shards: list[ShardInfo], in_bytes: int,
            kept: int, seconds: float) -> ConvertReport:
    """Remove the journal (the manifest now says the dataset is complete) and sum up."""
    dst = target.path
    try:
        journal.remove(dst, target.journal_name)
    except OSError as e:
        log.warning("%s: could not remove the conversion journal: %s", dst, e.strerror)
    out = sum(s.bytes for s in shards)
    if target.part is None:
        out += (dst / MANIFEST_NAME).stat().st_size
    return ConvertReport(dst, opts.backend, sum(s.count for s in shards), len(shards), in_bytes, out, seconds,
                         list(source.skipped), kept, target.part, opts.engine, [f.name for f in source.fields],
                         len(source.classes) if source.classes is not None else None)


def part_range(num_shards: int, index: int, count: int) -> range:
    """The shards of part ``index`` (from 0) of ``count``: consecutive, sizes differing by one at most."""
    return range(num_shards * index // count, num_shards * (index + 1) // count)


def _engine(opts: WriteOptions, ntasks: int) -> ShardEngine:
    if opts.engine == "ray":
        return RayEngine(address=opts.ray_address, workers=opts.workers)
    return LocalEngine(min(opts.workers or usable_cpus(), ntasks))


def write_keys_file(dst: Path, write: Callable[[BinaryIO], object]) -> KeysInfo:
    """The keys side file (docs/format.md, "Sample keys") as ``write(file)`` writes it, atomically, before the
    manifest (which lists its size and checksum)."""
    path = dst / KEYS_FILE
    try:
        write_atomic(path, write)
        return KeysInfo(kind=KEYS_KIND_FILE, file=KEYS_FILE, bytes=path.stat().st_size,
                        checksum=file_checksum(path, CHECKSUM_DEFAULT))
    except OSError as e:
        raise write_error(path, e) from None


def _tasks(source: Source, fields: list[FieldSpec], opts: WriteOptions, target: Destination, names: list[str], plans: list[tuple[int, int]],
           done: dict[str, ShardInfo], own: range, nbytes: np.ndarray) -> list[ShardTask]:
    """One task per shard of ``own``; into ``target.remote``'s URL when the writing processes upload."""
    dst = target.remote.url if target.remote is not None else str(target.path)
    rows = {f.name: source.ragged_rows(f.name) for f in source.fields if f.ragged}
    known = all(v is not None for v in rows.values())  # else each part counts its rows when read (load_rows)
    tasks = []
    for i in own:
        name, (a, b) = names[i], plans[i]
        expect = done.get(name)
        if expect is not None and (expect.start, expect.count) != (a, b - a):
            expect = None
        tasks.append(ShardTask(
            part=source.part(a, b), fields=fields, backend=opts.backend, dst=dst, name=name, index=i,
            start=a, count=b - a, ragged_rows={k: int(v[a:b].sum()) for k, v in rows.items() if v is not None} if known else None,
            compression=opts.compression, expect=expect, in_bytes=int(nbytes[a:b].sum()),
            trusted=expect is not None and name in target.trusted, remote=target.remote,
        ))
    return tasks


def _failed(dst: Path, journaled: set[str], e: BaseException, owned: set[str] | None, jname: str) -> BaseException:
    """Tidy DST after a failure and return the error to raise: journaled shards stay for --resume, the rest goes
    (everything if no shard finished; a ``--part`` touches only its own files)."""
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
        return type(e)(f"{e.template or e}; {kept} finished shard(s) kept in {dst}: fix the problem, then run the same "
                       "command with %(resume=True) to finish")
    return e


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


def mp_context() -> Any:
    # fork on Linux, as torch's DataLoader: works without a ``__main__`` guard; workers never use a parent handle.
    return mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def _write_parallel(tasks: list[ShardTask], workers: int, progress: Progress | None, finished: Finished) -> None:
    ctx = mp_context()
    q = ctx.Queue()

    def drain() -> None:
        while True:
            try:
                n, b = q.get_nowait()
            except queue.Empty:
                return
            if progress is not None:
                progress.update(n, b)

    todo = iter(tasks)
    error: BaseException | None = None
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=init_worker,
                             initargs=(q, os.getpid())) as ex:
        # At most one task per worker, none ever cancelled: a cancelled future hangs the pool when a worker dies.
        pending: dict[Future[tuple[ShardInfo, bool]], ShardTask] = {}
        while True:
            while error is None and len(pending) < workers and (task := next(todo, None)) is not None:
                try:
                    pending[ex.submit(write_shard, task)] = task
                except BrokenProcessPool as e:  # a worker died while another task was finishing
                    error = e
            if not pending:
                break
            done, _ = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            drain()
            for fut in sorted(done, key=lambda f: pending[f].index):
                task = pending.pop(fut)
                if fut.exception() is not None:
                    # Journal the running shards that still finish: less to redo.
                    error = error or fut.exception()
                    continue
                try:
                    finished(task, *fut.result())
                except BaseException as e:  # the journal could not be written (disk full?)
                    error = error or e
    drain()  # workers flush their queue feeders when they exit at shutdown
    q.close()
    if isinstance(error, BrokenProcessPool):
        raise FastdataError("a conversion worker process died (killed, or out of memory?)") from None
    if error is not None:
        raise error


def ray_write_shard(task: ShardTask) -> tuple[ShardInfo, bool, str]:
    """Runs in a Ray worker: write one shard; returns its manifest entry, whether it was kept, the host."""
    info, kept = write_shard(task)
    return info, kept, socket.gethostname()


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("%(engine=ray) needs Ray: pip install 'fastdata[ray]'") from None
    return ray


@dataclass
class RayEngine:
    """Shard tasks on a Ray cluster: ``address`` (else ``RAY_ADDRESS``; else a local Ray started here
    with ``workers`` or all usable CPUs). ``workers`` also caps the shard tasks in flight."""

    address: str | None = None
    workers: int | None = None

    def run(self, tasks: list[ShardTask], progress: Any, finished: Any) -> None:
        if not tasks:
            return
        ray = import_ray()
        started = self._connect(ray)
        try:
            self._run(ray, tasks, progress, finished)
        finally:
            if started:
                ray.shutdown()

    def _connect(self, ray: Any) -> bool:
        """Connect to (or start) Ray; True when this call started it (and so stops it)."""
        address = self.address or os.environ.get("RAY_ADDRESS") or None
        if ray.is_initialized():
            current = ray.get_runtime_context().gcs_address
            if address not in (None, "auto", current):
                raise UsageError(f"%(ray_address={address}): this process is already connected to the Ray cluster at "
                                 f"{current}; drop %(ray_address), or run the conversion from another process")
            return False
        if address and address != "auto":
            _refuse_unreachable(address)
        try:
            if address:
                ray.init(address=address, logging_level=logging.WARNING)
            else:
                # Ray's workers run at nice 15 by default; shard writers run at the caller's priority.
                ray.init(num_cpus=self.workers or usable_cpus(), include_dashboard=False,
                         logging_level=logging.WARNING, log_to_driver=False, _system_config={"worker_niceness": 0})
        except (ConnectionError, ValueError, RuntimeError) as e:
            where = f"the Ray cluster at {address}" if address else "a local Ray"
            raise UsageError(f"cannot start or reach {where}: {str(e).splitlines()[0] if str(e) else e!r}; check "
                             "%(ray_address) / RAY_ADDRESS (or leave both unset for a local Ray)") from None
        return True

    def _run(self, ray: Any, tasks: list[ShardTask], progress: Any, finished: Any) -> None:
        env = {k: os.environ[k] for k in (_fault.ENV, _fault.READY_ENV) if k in os.environ}
        opts: dict[str, Any] = {"num_cpus": 1, "max_retries": RETRIES, "retry_exceptions": [WriteError]}
        if env:  # the crash tests' fault hook follows the shard into the Ray worker
            opts["runtime_env"] = {"env_vars": env}
        remote = ray.remote(ray_write_shard).options(**opts)
        limit = self.workers or max(1, 2 * int(ray.cluster_resources().get("CPU", 1)))
        todo = list(reversed(tasks))
        pending: dict[Any, ShardTask] = {}
        error: BaseException | None = None
        try:
            while todo or pending:
                while todo and error is None and len(pending) < limit:
                    t = todo.pop()
                    pending[remote.remote(t)] = t
                if not pending:
                    break
                # after a failure, running shards may end (they are kept for --resume), but not forever
                draining = error is not None
                ready, _ = ray.wait(list(pending), num_returns=len(pending) if draining else 1,
                                    timeout=_DRAIN_S if draining else _WAIT_S)
                for ref in ready:
                    t = pending.pop(ref)
                    try:
                        info, kept, host = ray.get(ref)
                        _check_visible(t, info, host)
                    except BaseException as e:  # noqa: BLE001 - every failure is reported with its shard
                        if isinstance(e, KeyboardInterrupt):
                            raise
                        if error is None:  # later ones were cancelled, or failed too: the first is reported
                            error = _shard_error(ray, t, e)
                            todo.clear()
                            _cancel(ray, pending, force=False)
                        continue
                    if progress is not None:
                        progress.update(t.count, t.in_bytes)
                    finished(t, info, kept)
                if draining:
                    _cancel(ray, pending, force=True)
                    pending.clear()
        except BaseException:
            _cancel(ray, pending, force=True)
            raise
        if error is not None:
            raise error


def _refuse_unreachable(address: str) -> None:
    """Refuse at once a Ray address at which nothing listens: ray.init retries such an address without end."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not port.isdigit():
        return  # no port given: Ray's own lookup decides
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=RAY_PROBE_S).close()
    except OSError as e:
        raise UsageError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}; check %(ray_address) / "
                         "RAY_ADDRESS (or leave both unset for a local Ray)") from None


def _cancel(ray: Any, pending: dict[Any, ShardTask], force: bool) -> None:
    for ref in pending:
        try:
            ray.cancel(ref, force=force)
        except Exception:  # noqa: BLE001 - already finished, or the cluster is gone
            pass


def _check_visible(task: ShardTask, info: ShardInfo, host: str) -> None:
    """The driver must see the shard a worker reported: in a folder every node shares, or in the
    bucket the worker uploaded to (same endpoint and credentials)."""
    pub = publisher_for(task.dst, task.remote)
    size = pub.size(info.file)
    if size == info.bytes:
        return
    local = task.remote is None
    seen = f"no such {'file' if local else 'object'}" if size is None else f"{size} bytes, not {info.bytes}"
    need = ("DST must be a folder every Ray node shares under the same path (NFS, Lustre, ...)" if local else
            "the workers must reach the same bucket and endpoint as the driver (same storage options and credentials)")
    raise FastdataError(f"{pub.where(info.file)}: {'written' if local else 'uploaded'} by a Ray worker on {host}, "
                        f"but this driver ({socket.gethostname()}) {'sees' if local else 'finds'} {seen}: {need}")


def _shard_error(ray: Any, task: ShardTask, e: BaseException) -> BaseException:
    """A one-line error naming the shard and the reason, the original type kept for fastdata errors."""
    where = f"shard {task.name} (samples {task.start}..{task.start + task.count - 1})"
    cause = e
    if isinstance(e, ray.exceptions.RayTaskError):
        cause = getattr(e, "cause", None) or e
    if isinstance(cause, FastdataError):
        return type(cause)(f"{where}: {cause}")
    if isinstance(cause, (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError)):
        return FastdataError(f"{where}: the Ray worker writing it died {RETRIES + 1} times (killed, or out of memory?)")
    if isinstance(cause, ray.exceptions.TaskCancelledError):
        return FastdataError(f"{where}: the Ray task was cancelled")
    first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    return FastdataError(f"{where}: failed on Ray: {type(cause).__name__}: {first}")
