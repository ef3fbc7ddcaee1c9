"""Measuring the input pipeline: loader throughput, the machine's ceiling for the same bytes, the naive baseline.

Used by ``fastdata bench`` and ``fastdata tune``; ``benchmarks/`` builds its suites on the same
functions. Figures are steady-state: the first batches (worker start, cold caches) are timed
separately as the first-batch latency and left out of the rate.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from .batching import batch_len
from .dataset import Dataset


@dataclass
class BenchResult:
    """Steady-state throughput of one input pipeline."""

    name: str
    samples: int
    batches: int
    seconds: float
    samples_per_s: float
    mb_per_s: float
    batch_ms_median: float
    batch_ms_p95: float
    first_batch_s: float
    settings: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def sample_bytes(ds: Dataset) -> float:
    """Average stored bytes of one sample (all fields), from the manifest."""
    total = sum(s.bytes for s in ds.manifest.shards)
    return total / max(1, len(ds))


def measure(
    name: str,
    batches: Callable[[], Iterable[Any]],
    *,
    bytes_per_sample: float,
    max_batches: int | None = None,
    max_seconds: float = 10.0,
    warmup: int = 2,
    settings: dict[str, Any] | None = None,
    on_batch: Callable[[int, float], None] | None = None,
) -> BenchResult:
    """Iterate ``batches()`` (re-called at each epoch end) until ``max_batches`` or ``max_seconds``.

    The first ``warmup`` batches are not counted; ``on_batch(samples_so_far, elapsed)`` may show progress.
    """
    durations: list[float] = []
    counted = 0
    t_start = time.perf_counter()
    first = None
    seen = 0
    t_steady = None
    while True:
        it = iter(batches())
        last = time.perf_counter()
        got_any = False
        for batch in it:
            got_any = True
            now = time.perf_counter()
            if first is None:
                first = now - t_start
            seen += 1
            n = batch_len(batch)
            if seen > warmup:
                if t_steady is None:
                    t_steady = last
                durations.append(now - last)
                counted += n
            last = now
            if on_batch is not None:
                on_batch(counted, now - t_start)
            if (max_batches is not None and len(durations) >= max_batches) or (
                t_steady is not None and now - t_steady >= max_seconds and len(durations) >= 3
            ):
                _close(it)
                return _result(name, durations, counted, bytes_per_sample, first or 0.0, settings)
        if not got_any:
            raise ValueError(f"{name}: the pipeline yielded no batches")


def _close(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        close()


def _result(name: str, durations: list[float], samples: int, bps: float, first: float,
            settings: dict[str, Any] | None) -> BenchResult:
    d = np.array(durations)
    secs = float(d.sum())
    return BenchResult(name=name, samples=samples, batches=len(d), seconds=secs,
                       samples_per_s=samples / secs if secs > 0 else 0.0,
                       mb_per_s=samples * bps / secs / 1e6 if secs > 0 else 0.0,
                       batch_ms_median=float(np.median(d) * 1e3), batch_ms_p95=float(np.percentile(d, 95) * 1e3),
                       first_batch_s=first, settings=dict(settings or {}))


def measure_ceiling(ds: Dataset, batch_size: int, *, threads: int = 2, max_seconds: float = 3.0) -> BenchResult:
    """The machine's ceiling for these bytes: threads reading the shard files in batch-sized chunks
    with ``readinto`` into preallocated buffers, page cache warm (one untimed pass first)."""
    bps = sample_bytes(ds)
    chunk = max(1, int(bps * batch_size))
    paths = ds.shard_paths()
    jobs = [(p, off, min(chunk, os.path.getsize(p) - off)) for p in paths for off in range(0, os.path.getsize(p), chunk)]
    bufs = [bytearray(chunk) for _ in range(threads)]
    fds = {p: os.open(p, os.O_RDONLY) for p in paths}

    def read(k: int) -> int:
        p, off, size = jobs[k % len(jobs)]
        view = memoryview(bufs[k % threads])[:size]
        return os.preadv(fds[p], [view], off)

    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(read, range(len(jobs))))  # warm the page cache
            done, k, t0 = 0, 0, time.perf_counter()
            durations = []
            while time.perf_counter() - t0 < max_seconds or k < 3 * threads:
                t = time.perf_counter()
                done += sum(pool.map(read, range(k, k + threads)))
                durations.append((time.perf_counter() - t) / threads)
                k += threads
    finally:
        for fd in fds.values():
            os.close(fd)
    samples = int(done / bps)
    return _result(f"ceiling: {threads} threads reading the shard bytes", durations, samples, bps, 0.0,
                   {"threads": threads})


def naive_pipeline(src: str | os.PathLike[str], batch_size: int, workers: int = 2) -> Callable[[], Iterable[Any]]:
    """The per-file baseline for a source folder of ``.npy`` files (what ``--naive SRC`` measures)."""
    from .examples import naive_loader

    loader = naive_loader(src, batch_size, workers)
    return lambda: loader
