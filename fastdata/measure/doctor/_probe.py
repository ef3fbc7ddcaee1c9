"""The doctor's hooks. In the script's process: time each batch a loader hands the training loop, untouched, then
replay copies of the first (alone, then beside fastdata's loader) and stop the script. In the dataset's workers:
the time in ``__getitem__``, collate, known readers and decoders, and the files opened (``worker-PID.json``)."""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.util
import os
import sys
import threading
import time
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from fastdata.measure.doctor import project
from fastdata.measure.doctor.project import MEASURE_S, SAMPLE_BUDGET_S, is_table, opened

if TYPE_CHECKING:
    from fastdata.measure.doctor._h2d import Accountant

WARMUP = 2  # batches of each pass left out of the statistics: worker start-up, first-batch caching
REPLAY = 8  # steps run on the cached batches to time the step without input
CACHED_BATCHES, CACHED_BYTES = 8, 32 << 20  # batches cached for the replay (at least one, whatever its size)
MIN_REPLAY = 2  # the fewest replayed steps (each kind) when steps are slow
STEPS_EXTRA_S = 5.0  # with --steps, the replay, sample and projection may take this long, or half the steps' time
MEASURE_SHARE, HARD_SHARE = 0.5, 0.8  # of a --seconds budget: measuring the loop; the latest it may end
BESIDE = 24  # then steps on the cached batches while fastdata's loader reads a sample beside them (projection)
MAX_EVENTS = 20000  # per loader, for the timeline
ENV = "FASTDATA_DOCTOR"  # how fastdata.measure.doctor.run tells its child process its folder and budget, as JSON
MAX_FILES = 64  # distinct file paths kept per process: enough to find the folder they share
FLUSH_S = 0.25


class BudgetReached(SystemExit):
    """Raised in the training loop when the doctor's budget is spent: stops the script like sys.exit."""


@dataclass
class LoaderRecord:
    """What one loader (torch DataLoader or fastdata Loader) did in the training loop."""

    key: int
    kind: str  # "torch" or "fastdata"
    settings: dict[str, Any]
    dataset: str
    events: list[tuple[float, float, int]] = field(default_factory=list)  # (asked, got, pass number)
    passes: int = 0
    replay: list[tuple[float, float]] = field(default_factory=list)  # (handed out, copy seconds)


class Recorder:
    """Collects the main-process side; one per process while the hooks are installed."""

    def __init__(self, out_dir: Path, steps: int | None, seconds: float | None, replay: bool,
                 project: bool = False, start: float | None = None) -> None:
        self.out_dir = out_dir
        self.steps, self.seconds, self.do_replay, self.do_project = steps, seconds, replay, project
        self.loaders: dict[int, LoaderRecord] = {}
        # a --seconds budget counts from the doctor's own start (time.time()), the child's start-up too
        self.started = time.perf_counter() - (max(time.time() - start, 0.0) if start else 0.0)
        self.cached: list[Any] = []  # the replay's batches: the first after WARMUP of one loader
        self.cached_from: int | None = None
        self.replaying = 0
        self.stop_reason = "script ended"
        self.stopped_at: float | None = None
        self.datasets: dict[int, Any] = {}  # key -> the dataset object (for the fastdata projection)
        self.batch_sizes: dict[int, int | None] = {}
        self.batches = 0  # every loader's batches: the --steps budget (events stop at MAX_EVENTS)
        self.h2d: dict[str, Any] | None = None  # the host-to-device copies (fastdata.measure.doctor._h2d), at uninstall
        # the replay beside fastdata's loader: (handed out, seconds waited for fastdata, copy seconds, position)
        self.beside: list[tuple[float, float, float, int]] = []
        self.beside_why: str | None = None  # why there was no replay beside fastdata's loader
        self.sampled: Any = None  # fastdata.measure.doctor.project.Sampled, or a string saying why not
        self._beside: Any = None  # the running fastdata.measure.doctor.project.Beside
        self.own = False  # the doctor's own loaders are running (sampling, fastdata beside): not the loop's
        self.n_replay, self.n_beside = REPLAY, BESIDE  # set from the time left when the loop's budget is spent
        self.sample_budget_s: float | None = None  # seconds drawing the sample through __getitem__
        self.measure_s: float | None = None  # seconds timing fastdata's loader alone
        self.tables: list[str] = []  # the tables this process opened (fastdata.measure.doctor.project.opened)

    # -- budget ---------------------------------------------------------------------------------
    def spent(self) -> bool:
        """The loop's measured part is over: ``steps`` batches after the warm-up, or half the ``seconds`` budget (the
        rest is for the replay and verdict) once WARMUP + 1 batches are in; then the replay's sizes are set."""
        done = False
        if self.steps is not None and self.batches >= self.steps + WARMUP:
            done = True
        elif self.seconds is not None:
            elapsed = time.perf_counter() - self.started
            done = (elapsed >= HARD_SHARE * self.seconds and self.batches >= 2) or (
                elapsed >= MEASURE_SHARE * self.seconds and self.batches > WARMUP)
        if done:
            self._size_the_rest()
        return done

    def _size_the_rest(self) -> None:
        """Replayed steps, beside steps, sampling and measuring time from what is left: the rest of a
        ``seconds`` budget, or half the time the ``steps`` took; fewer steps when steps are slow."""
        if self.sample_budget_s is not None:  # sized already
            return
        now = time.perf_counter()
        got = sorted(g for r in self.loaders.values() for _, g, _ in r.events)
        if self.seconds is not None:
            left = max(self.started + self.seconds - now, 0.0)
        else:
            left = max(0.5 * (now - (got[0] if got else self.started)), STEPS_EXTRA_S)
        step = (got[-1] - got[0]) / (len(got) - 1) if len(got) > 1 else max(now - got[0], 1e-3) if got else 1e-3
        self.n_replay = int(min(REPLAY, max(MIN_REPLAY, 0.25 * left / step)))
        beside = 0.35 * left / step  # too few to fit: none (the projection is then fastdata's loader alone)
        self.n_beside = int(min(BESIDE, max(beside, MIN_REPLAY + 1))) if beside >= MIN_REPLAY else 0  # +1: a pass's first
        self.sample_budget_s = min(SAMPLE_BUDGET_S, max(1.0, 0.15 * left))
        self.measure_s = min(MEASURE_S, max(0.5, 0.1 * left))

    def new_pass(self, loader: Any, kind: str, settings: Callable[[Any], dict[str, Any]]) -> int:
        """Count a pass of ``loader`` (recorded on its first: a torch loader's dataset is kept for the
        projection); its key."""
        key = id(loader)
        if key not in self.loaders:
            self.loaders[key] = LoaderRecord(key, kind, settings(loader), _describe(loader.dataset))
            if kind == "torch":
                self.datasets[key] = loader.dataset
            self.batch_sizes[key] = loader.batch_size
        self.loaders[key].passes += 1
        return key

    def next_batch(self, key: int, fn: Callable[[Any], Any], arg: Any) -> Any:
        """The loop's next batch: ``fn(arg)`` (the loader's next()) timed, the copies to a GPU made meanwhile
        counted as the loader's own; once the budget is spent, a replayed batch."""
        if self.replaying or self.spent():
            return self.next_replay(key)
        acc, rec = _copies, self.loaders[key]
        asked = time.perf_counter()
        if acc is not None:
            acc.depth += 1
        try:
            batch = fn(arg)
        finally:
            if acc is not None:
                acc.depth -= 1
        self.batches += 1
        if len(rec.events) < MAX_EVENTS:
            rec.events.append((asked, time.perf_counter(), rec.passes))
        if acc is not None:  # to know the loop's later copies of this batch to the GPU
            acc.track(batch, key, self.batches, len(rec.events) > WARMUP)
        if self.batch_sizes.get(key) is None:  # a batch_sampler (episodes): the size of the batches it makes
            self.batch_sizes[key] = next((int(a.shape[0]) for a in _leaves(batch) if len(a.shape) > 0), None)
        if len(rec.events) > WARMUP and self.cached_from in (None, key) and len(self.cached) < CACHED_BATCHES:
            if not self.cached or sum(map(_nbytes, self.cached)) + _nbytes(batch) <= CACHED_BYTES:
                self.cached.append(_clone(batch))
                self.cached_from = key
        return batch

    def next_replay(self, key: int) -> Any:
        """A fresh copy of a cached batch (the script may change a batch in place), or BudgetReached (also
        when another loader, a validation loader say, asks: it must never be handed the training batch)."""
        rec = self.loaders[key]
        self.stop_reason = "budget spent"
        if _copies is not None:  # the copies of the cached batches are not the loop's
            _copies.active = False
        if not self.cached or not self.do_replay or key != self.cached_from:
            self._stop()
        if self.replaying >= self.n_replay:  # the compute-only steps are done: the steps beside fastdata's loader
            return self._next_beside()
        t0 = time.perf_counter()
        batch = _clone(self.cached[self.replaying % len(self.cached)])  # the cached batches in turn
        now = time.perf_counter()
        rec.replay.append((now, now - t0))
        self.replaying += 1
        return batch

    def _next_beside(self) -> Any:
        if self.stopped_at is None:  # the end of the last compute-only step
            self.stopped_at = time.perf_counter()
            if not self.do_project:
                self._stop()
            if self.n_beside == 0:
                self.beside_why = "steps too slow to replay beside fastdata's loader within the budget"
                self._stop()
            self._start_beside()
        if self._beside is None or len(self.beside) >= self.n_beside:
            self._stop()
        try:
            with self._own():
                waited = self._beside.next()
        except Exception as e:  # the projection is optional: say why, stop the script as planned
            self.beside_why = f"fastdata's loader failed beside the step: {type(e).__name__}: {e}"
            self._stop()
        t1 = time.perf_counter()
        batch = _clone(self.cached[(self.replaying + len(self.beside)) % len(self.cached)])
        now = time.perf_counter()
        self.beside.append((now, waited, now - t1, self._beside.position))
        return batch

    def _start_beside(self) -> None:
        try:
            with self._own():
                self.sampled = project.sample(self, self.cached_from)
                if isinstance(self.sampled, str):
                    self.beside_why = self.sampled
                    return
                self._beside = project.Beside(self.sampled)
        except Exception as e:
            self.beside_why = f"fastdata's loader failed on the sample: {type(e).__name__}: {e}"

    @contextmanager
    def _own(self) -> Iterator[None]:
        """The doctor's own loaders run in this block (sampling, fastdata beside): the hooks pass them by."""
        self.own = True
        try:
            yield
        finally:
            self.own = False

    def _stop(self) -> None:
        """End the replay: stop fastdata's loader if it ran, then the script (BudgetReached)."""
        if self.stopped_at is None:
            self.stopped_at = time.perf_counter()
        if self._beside is not None:
            b, self._beside = self._beside, None
            b.close()
        raise BudgetReached(0)

    def _episode(self) -> dict[str, int] | None:
        """For batches made by a batch_sampler: the classes in the first cached batch (its one 1-D integer
        field) and the samples of each, for fastdata.reading.samplers.Episodic."""
        if not self.cached or self.cached_from is None or self.loaders[self.cached_from].settings.get("batch_size"):
            return None
        for v in _leaves(self.cached[0]):
            if len(v.shape) == 1 and str(v.dtype).replace("torch.", "").startswith(("int", "uint")):
                classes = len({int(x) for x in v.tolist()})
                if classes and len(v) % classes == 0:
                    return {"classes": classes, "per_class": len(v) // classes}
        return None

    def step_on_cpu(self) -> bool:
        """No batch of the loaders went to a CUDA device (so far): the script's step runs on the CPU."""
        if self.h2d is not None:
            return not any(b["batches"] for b in self.h2d["loaders"].values())
        return _copies is None or not any(b.batches for b in _copies.loaders.values())

    def dump(self) -> dict[str, Any]:
        return {
            "stop_reason": self.stop_reason, "main_pid": os.getpid(), "replay_key": self.cached_from,
            "stopped_at": self.stopped_at, "beside": self.beside, "beside_why": self.beside_why,
            "tables": self.tables, "episode": self._episode(),
            "loaders": [vars(r) for r in self.loaders.values()], "h2d": self.h2d,
        }


_recorder: Recorder | None = None
_undo = ExitStack()  # what install patched and opened (and the DataLoaders' worker_init_fn), given back last first
_copies: Accountant | None = None  # times the copies of the batches to a GPU (fastdata.measure.doctor._h2d)


# -- main side -----------------------------------------------------------------------------------------
def _torch_settings(loader: Any) -> dict[str, Any]:
    ctx = loader.multiprocessing_context
    return {"num_workers": loader.num_workers, "batch_size": loader.batch_size, "pin_memory": loader.pin_memory,
            "prefetch_factor": loader.prefetch_factor, "persistent_workers": loader.persistent_workers,
            "multiprocessing_context": getattr(ctx, "_name", None) if ctx is not None else None,
            "sampler": _sampler(loader)}


def _sampler(loader: Any) -> str | None:
    """The DataLoader's sampler where it picks the samples (a fold's subset, weights), not torch's order
    (random, sequential, or a rank's share: fastdata's loader shares among ranks itself); None otherwise."""
    from torch.utils.data import DistributedSampler, RandomSampler, SequentialSampler

    s = loader.sampler
    if loader.batch_size is None or isinstance(s, (RandomSampler, SequentialSampler, DistributedSampler)):
        return None  # (batches from a batch_sampler: the Episodic line)
    n = ""
    with suppress(Exception):  # a sampler without a length
        n = f"({len(s)} draws of {len(loader.dataset)} samples)"
    return f"{type(s).__name__}{n}"


def _timed_iter_init(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, loader: Any) -> None:
        orig(self, loader)
        rec = _recorder
        if rec is None or rec.own:
            return
        if loader.num_workers > 0 and not isinstance(loader.worker_init_fn, WorkerHook):
            # read by the multiprocessing iterator right after this: spawned workers install the hooks
            _undo.callback(setattr, loader, "worker_init_fn", loader.worker_init_fn)
            loader.worker_init_fn = WorkerHook(rec.out_dir, loader.worker_init_fn)
        self._doctor_key = rec.new_pass(loader, "torch", _torch_settings)

    return __init__


def _timed_next(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __next__(self: Any) -> Any:
        rec = _recorder
        key = getattr(self, "_doctor_key", None)
        if rec is None or key is None or rec.own:
            return orig(self)
        return rec.next_batch(key, orig, self)

    return __next__


def _timed_fastdata_iter(orig: Callable[..., Any]) -> Callable[..., Any]:
    def __iter__(self: Any) -> Iterator[Any]:
        rec = _recorder
        if rec is None or rec.own:  # (the doctor's own fastdata loader, beside the replayed step)
            yield from orig(self)
            return
        key = rec.new_pass(self, "fastdata", _fastdata_settings)
        it = orig(self)
        while True:
            try:
                yield rec.next_batch(key, next, it)
            except StopIteration:
                return

    return __iter__


def _fastdata_settings(loader: Any) -> dict[str, Any]:
    return {"num_workers": getattr(loader, "workers", None), "batch_size": loader.batch_size,  # (DALI: none)
            "device": str(loader.device), "mode": loader.config.mode, "prefetch": loader.config.prefetch}


def _describe(dataset: Any) -> str:
    n = ""
    with suppress(Exception):  # an iterable dataset has no length
        n = f", {len(dataset)} samples"
    return f"{type(dataset).__module__}.{type(dataset).__qualname__}{n}"


def _leaves(batch: Any) -> Iterator[Any]:
    """The tensors and arrays of a batch (and of its dicts, lists and tuples)."""
    if hasattr(batch, "shape") and hasattr(batch, "nbytes"):
        yield batch
    elif isinstance(batch, (dict, list, tuple)):
        for v in batch.values() if isinstance(batch, dict) else batch:
            yield from _leaves(v)


def _nbytes(batch: Any) -> int:
    return sum(int(a.nbytes) for a in _leaves(batch))


def _clone(batch: Any) -> Any:
    """A deep copy of the tensors and arrays of a batch (other objects are shared: they are not data)."""
    import numpy as np
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.detach().clone()
    if isinstance(batch, np.ndarray):
        return batch.copy()
    if isinstance(batch, dict):
        return {k: _clone(v) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_clone(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_clone(v) for v in batch)
    return batch


def _patch(cls: Any, name: str, make: Callable[[Any], Any]) -> None:
    orig = cls.__dict__[name]
    _undo.callback(setattr, cls, name, orig)
    setattr(cls, name, make(orig))


def install(out_dir: Path, steps: int | None = None, seconds: float | None = None, replay: bool = True,
            clock: Any = None, project: bool = False, start: float | None = None) -> Recorder:
    """Patch the loader classes in this process (and the workers it forks) to report to a new Recorder."""
    global _recorder, _copies
    if _recorder is not None:
        raise RuntimeError("fastdata.measure.doctor is already watching this process")
    import torch.utils.data.dataloader as dl

    from fastdata.measure.doctor import _h2d

    out_dir.mkdir(parents=True, exist_ok=True)
    _recorder = Recorder(out_dir, steps, seconds, replay, project, start)
    _patch(dl._BaseDataLoaderIter, "__init__", _timed_iter_init)
    _patch(dl._BaseDataLoaderIter, "__next__", _timed_next)
    install_worker(out_dir)
    from fastdata.loaders.base import Loader

    _patch(Loader, "__iter__", _timed_fastdata_iter)
    _copies = _h2d.install(clock)
    _recorder.tables = _undo.enter_context(opened(tables_only=True))
    return _recorder


def uninstall() -> Recorder | None:
    """Undo the patches; flush this process's dataset timings; return the Recorder."""
    global _recorder, _copies
    rec, _recorder = _recorder, None
    if _copies is not None:
        from fastdata.measure.doctor import _h2d

        acc, _copies = _h2d.uninstall(), None
        if rec is not None and acc is not None:
            rec.h2d = acc.dump()
    stop_worker()
    _undo.close()
    if rec is not None:
        rec.tables = [p for p in rec.tables if is_table(p)]
    return rec


# -- the dataset's side: the worker processes (the training process itself with num_workers=0) ----------
_out_dir: Path | None = None
_local = threading.local()  # .collate (seconds in the current batch's collate), .depth (inside a timed reader)
_stats_by_pid: dict[int, WorkerStats] = {}
_patched: dict[str, tuple[Any, str, Any]] = {}  # reader -> (owner, attribute, original); a fork inherits them


class WorkerStats:
    """One process's totals; flushed to its file at most every FLUSH_S seconds and at the end."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / f"worker-{os.getpid()}.json"
        self.fetch_s = self.collate_s = 0.0
        self.batches = self.samples = 0
        self.causes: dict[str, float] = {}
        self.files: list[str] = []
        self.born = time.time()
        self.cpu0 = time.process_time()
        self.last_flush = 0.0

    def add(self, fetch_s: float, collate_s: float, samples: int) -> None:
        self.fetch_s += fetch_s
        self.collate_s += collate_s
        self.batches += 1
        self.samples += samples
        now = time.monotonic()
        if now - self.last_flush > FLUSH_S:
            self.last_flush = now
            self.flush()

    def flush(self) -> None:
        data = {"pid": os.getpid(), "fetch_s": self.fetch_s, "collate_s": self.collate_s, "batches": self.batches,
                "samples": self.samples, "alive_s": time.time() - self.born, "cpu_s": time.process_time() - self.cpu0,
                "io": _proc_io(), "causes": self.causes, "files": self.files}
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self.path)
        except OSError:  # the doctor's folder is gone (the run ended): nothing left to report to
            pass


def stop_worker() -> None:
    """Flush this process's figures, undo the reader patches, stop recording."""
    global _out_dir
    here = _stats_by_pid.get(os.getpid())
    if here is not None:
        here.flush()
    while _patched:
        _, (owner, attr, orig) = _patched.popitem()
        setattr(owner, attr, orig)
    _stats_by_pid.clear()
    _out_dir = None


def stats_here() -> WorkerStats | None:
    """This process's WorkerStats (made on first use, with the reader patches), or None when not recording."""
    if _out_dir is None:
        return None
    pid = os.getpid()
    s = _stats_by_pid.get(pid)
    if s is None:
        s = _stats_by_pid[pid] = WorkerStats(_out_dir)
        if multiprocessing.parent_process() is not None:  # a worker: its last figures are written as it exits
            multiprocessing.util.Finalize(None, s.flush, exitpriority=100)
    _patch_causes()
    return s


def timed_fetch(orig: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a torch dataset fetcher's ``fetch``: time in the dataset (less collate) and in collate."""

    def fetch(self: Any, index: Any) -> Any:
        stats = stats_here()
        if stats is None:
            return orig(self, index)
        if not getattr(self, "_doctor_wrapped", False):
            inner = self.collate_fn

            def collate(data: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return inner(data)
                finally:
                    _local.collate = time.perf_counter() - t0

            self.collate_fn, self._doctor_wrapped = collate, True
        _local.collate = 0.0
        _local.stats = stats
        t0 = time.perf_counter()
        try:
            with opened() as files:
                out = orig(self, index)
        finally:
            _local.stats = None
        total = time.perf_counter() - t0
        stats.files += [f for f in dict.fromkeys(files) if f not in stats.files][: MAX_FILES - len(stats.files)]
        n = len(index) if hasattr(index, "__len__") and self.auto_collation else 1
        stats.add(total - _local.collate, _local.collate, n)
        return out

    return fetch


def install_worker(out_dir: Path) -> None:
    """Record this process's dataset timings into ``out_dir``: patch torch's map and iterable fetchers (undone
    with the loaders' patches)."""
    import torch.utils.data._utils.fetch as fetch

    global _out_dir
    _out_dir = out_dir
    for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
        _patch(cls, "fetch", timed_fetch)


class WorkerHook:
    """Put around a DataLoader's ``worker_init_fn``: a spawned (or forkserver) worker does not inherit the
    parent's patches, so it installs them here before the user's own init function runs."""

    def __init__(self, out_dir: Path, inner: Callable[[int], Any] | None) -> None:
        self.out_dir, self.inner = out_dir, inner

    def __call__(self, worker_id: int) -> None:
        if _out_dir is None:  # spawned: a fresh interpreter (a forked worker already records)
            install_worker(self.out_dir)
        if self.inner is not None:
            self.inner(worker_id)


# -- what __getitem__ spends its time on ---------------------------------------------------------------
def _timed(what: Callable[[Any, tuple[Any, ...]], str], orig: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        stats = getattr(_local, "stats", None)
        if stats is None or getattr(_local, "depth", False):
            return orig(*args, **kwargs)
        _local.depth = True
        t0 = time.perf_counter()
        try:
            return orig(*args, **kwargs)
        finally:
            _local.depth = False
            key = what(args[0] if args else None, args)
            stats.causes[key] = stats.causes.get(key, 0.0) + time.perf_counter() - t0

    return call


# (module, owner path, attribute, label) of the readers and decoders the doctor times, once their module is imported
_READERS: list[tuple[str, str, str, Callable[[Any, tuple[Any, ...]], str]]] = [
    ("PIL.ImageFile", "ImageFile", "load", lambda im, _: f"decoding {getattr(im, 'format', None) or 'images'} (PIL)"),
    ("numpy", "", "load", lambda *_: "reading arrays (np.load)"),
    ("torch", "", "load", lambda *_: "reading tensors (torch.load)"),
    ("cv2", "", "imread", lambda *_: "decoding images (cv2.imread)"),
    ("h5py", "Dataset", "__getitem__", lambda *_: "reading HDF5 (h5py)"),
]


def _patch_causes() -> None:
    """Patch each reader whose module is imported by now (called per batch: a few dict lookups once all are)."""
    if len(_patched) == len(_READERS):
        return
    for module, owner_path, attr, label in _READERS:
        key = f"{module}.{owner_path}.{attr}"
        mod = sys.modules.get(module)
        if key in _patched or mod is None:
            continue
        owner = getattr(mod, owner_path) if owner_path else mod
        orig = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr, None)
        if orig is None:
            continue
        _patched[key] = (owner, attr, orig)
        setattr(owner, attr, _timed(label, orig))


def _proc_io() -> dict[str, int] | None:
    """/proc/self/io (Linux): rchar counts bytes asked of read(), read_bytes those fetched from storage."""
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, _, v in (line.partition(":") for line in f)}
    except OSError:
        return None
