"""The doctor's side in the processes that run the dataset: time in ``__getitem__``, collate, known readers and
decoders, and the files opened, written to ``worker-PID.json``."""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.util
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from fastdata.measure.doctor.account import opened

MAX_FILES = 64  # distinct file paths kept per process: enough to find the folder they share
FLUSH_S = 0.25

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


def stop() -> None:
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


def install(out_dir: Path) -> list[tuple[Any, str, Any]]:
    """Record this process's dataset timings into ``out_dir``: patch torch's map and iterable fetchers; the
    (class, name, original) list to undo it."""
    import torch.utils.data._utils.fetch as fetch

    global _out_dir
    _out_dir = out_dir
    saved = []
    for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
        saved.append((cls, "fetch", cls.__dict__["fetch"]))
        cls.fetch = timed_fetch(cls.__dict__["fetch"])  # type: ignore[method-assign]
    return saved


class WorkerHook:
    """Put around a DataLoader's ``worker_init_fn``: a spawned (or forkserver) worker does not inherit the
    parent's patches, so it installs them here before the user's own init function runs."""

    def __init__(self, out_dir: Path, inner: Callable[[int], Any] | None) -> None:
        self.out_dir, self.inner = out_dir, inner

    def __call__(self, worker_id: int) -> None:
        if _out_dir is None:  # spawned: a fresh interpreter (a forked worker already records)
            install(self.out_dir)
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
