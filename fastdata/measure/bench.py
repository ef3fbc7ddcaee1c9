"""Measuring the input pipeline (``fastdata bench``, ``tune``, ``doctor``, benchmarks/): loader throughput, and the
machine's and the disk's ceilings for the same bytes; steady-state, the first batches timed apart."""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Sequence

import numpy as np

from fastdata.errors import UsageError
from fastdata.format.spec import CODEC_SUFFIX, ENCODING_IMAGE, LENGTHS_SUFFIX, SHAPE_SUFFIX
from fastdata.loaders.transform import batch_len
from fastdata.reading.dataset import Dataset

Sink = Literal["buffer", "ahead"]  # pread_pass: plain preads, or hinted ahead of them
CEILING_LIMIT = 1.1  # a ratio above this of the ceiling means the ceiling's measurement was wrong


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


def sample_bytes(ds: Dataset) -> float:
    """Average stored bytes of one sample (all fields), from the manifest (a subset: the whole dataset's)."""
    total = sum(s.bytes for s in ds.manifest.shards)
    return total / max(1, ds.manifest.num_samples)


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
    one_pass: bool = False,
) -> BenchResult:
    """Iterate ``batches()`` (re-called at each epoch end unless ``one_pass``) until ``max_batches`` or ``max_seconds``,
    not counting the first ``warmup`` batches; ``on_batch(samples_so_far, elapsed)`` may show progress."""
    durations: list[float] = []
    counted = seen = 0
    t_start = time.perf_counter()
    first = 0.0  # seconds to the first batch
    t_steady: float | None = None  # when the first counted batch was asked for
    while True:
        seen_before = seen
        it = iter(batches())
        last = time.perf_counter()
        for batch in it:
            now = time.perf_counter()
            seen += 1
            if seen == 1:
                first = now - t_start
            if seen > warmup:
                if t_steady is None:
                    t_steady = last
                durations.append(now - last)
                counted += batch_len(batch)
            last = now
            if on_batch is not None:
                on_batch(counted, now - t_start)
            if (max_batches is not None and len(durations) >= max_batches) or (
                t_steady is not None and now - t_steady >= max_seconds and len(durations) >= 3
            ):
                if hasattr(it, "close"):  # a generator, or a loader's iterator: its threads stop now
                    it.close()
                return _result(name, durations, counted, bytes_per_sample, first, settings)
        if seen == seen_before:
            raise UsageError(f"{name}: the pipeline yielded no batches")
        if one_pass:
            return _result(name, durations, counted, bytes_per_sample, first, settings)


def _result(name: str, durations: list[float], samples: int, bps: float, first: float,
            settings: dict[str, Any] | None, seconds: float | None = None) -> BenchResult:
    """``durations``: time per batch; ``seconds``: the wall time the samples took, when batches ran
    in parallel (else the durations' sum)."""
    d = np.array(durations)
    secs = float(d.sum()) if seconds is None else seconds
    return BenchResult(name=name, samples=samples, batches=len(d), seconds=secs,
                       samples_per_s=samples / secs if secs > 0 else 0.0,
                       mb_per_s=samples * bps / secs / 1e6 if secs > 0 else 0.0,
                       batch_ms_median=float(np.median(d) * 1e3), batch_ms_p95=float(np.percentile(d, 95) * 1e3),
                       first_batch_s=first, settings=dict(settings or {}))


_CEILING_RAM_BYTES = 512 << 20  # the gather ceiling's in-memory copy of the data is at most this big
_CEILING_IMAGES = 256  # encoded images decoded over and over for the decode ceiling
_PAYLOAD_SAMPLES = 256  # samples read to average the payload of ragged and encoded fields


def payload_bytes(ds: Dataset) -> float:
    """Average bytes of one sample's data as ``get_batch`` hands them over (ragged and encoded fields: from the first
    samples), without the storage overhead that :func:`sample_bytes` counts."""
    fixed = sum(f.row_nbytes for f in ds.schema if not f.ragged)
    ragged = [f for f in ds.schema if f.ragged]
    if not ragged or len(ds) == 0:
        return float(fixed)
    m = min(len(ds), _PAYLOAD_SAMPLES)
    raw = ds.with_options(fields=[f.name for f in ragged], decode=False)
    batch = raw.get_batch(np.arange(m), ragged="packed")
    total = 0
    for f in ragged:
        v = batch[f.name]
        total += v.nbytes if isinstance(v, np.ndarray) else sum(len(str(s).encode("utf-8")) for s in v)
    return fixed + total / m


def measure_ceiling(ds: Dataset, batch_size: int, *, threads: int = 2, max_seconds: float = 3.0,
                    bytes_per_sample: float | None = None) -> BenchResult:
    """The machine's ceiling for this dataset at the best of 1 to ``threads`` threads (``settings["rates"]``):
    decoding the stored images without a loader, or else a memcpy gather of random rows of the payload's size."""
    counts = list(range(1, max(1, threads) + 1))
    share = max_seconds / len(counts)
    bps = payload_bytes(ds) if bytes_per_sample is None else bytes_per_sample
    ceiling = _decode_ceiling if any(f.encoding == ENCODING_IMAGE for f in ds.schema) else _gather_ceiling
    runs = [ceiling(ds, batch_size, t, share, bps) for t in counts]
    best = max(runs, key=lambda r: r.samples_per_s)
    best.name = f"ceiling: {best.settings['kind']}, best of 1-{counts[-1]} threads"
    best.settings["rates"] = {r.settings["threads"]: round(r.samples_per_s, 1) for r in runs}
    return best


def _run_batches(name: str, job: Callable[[int], int], threads: int, max_seconds: float, bps: float,
                 settings: dict[str, Any]) -> BenchResult:
    """Run ``job(k)`` (one batch, returns its samples) ``threads`` at a time until ``max_seconds``."""
    durations: list[float] = []  # per batch: a round's wall time over the batches it ran at once
    done = 0
    wall = 0.0
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(job, range(threads)))  # warm-up: buffers touched, caches filled
        k, t0 = threads, time.perf_counter()
        while time.perf_counter() - t0 < max_seconds or len(durations) < 3:
            t = time.perf_counter()
            done += sum(pool.map(job, range(k, k + threads)))
            took = time.perf_counter() - t
            wall += took
            durations.append(took / threads)
            k += threads
    # the rate is samples over wall time (the per-batch durations of parallel rounds sum to wall / threads)
    return _result(name, durations, done, bps, 0.0, settings, seconds=wall)


def _gather_ceiling(ds: Dataset, batch_size: int, threads: int, max_seconds: float, bps: float) -> BenchResult:
    row = max(1, int(round(bps)))
    n = max(batch_size, min(len(ds), _CEILING_RAM_BYTES // row))
    data = np.random.default_rng(0).integers(0, 256, (n, row), dtype=np.uint8)
    bufs = [np.empty((batch_size, row), np.uint8) for _ in range(threads)]
    plans = np.random.default_rng(1).integers(0, n, (64, batch_size))

    def gather(k: int) -> int:
        out = bufs[k % threads]
        for j, i in enumerate(plans[k % len(plans)].tolist()):
            out[j] = data[i]
        return batch_size

    return _run_batches(f"ceiling: {threads}-thread memcpy gather", gather, threads, max_seconds, bps,
                        {"threads": threads, "kind": "memcpy gather", "row_bytes": row})


def _decode_ceiling(ds: Dataset, batch_size: int, threads: int, max_seconds: float, bps: float) -> BenchResult:
    from fastdata.reading.decode import decode_image

    fields = [f for f in ds.schema if f.encoding == ENCODING_IMAGE]
    raw = ds.with_options(fields=[f.name for f in fields], decode=False)
    m = min(len(ds), _CEILING_IMAGES)
    stored = raw.get_batch(np.arange(m), companions=True)
    images = []  # (field spec, bytes, codec, shape) per sample
    for k in range(m):
        for f in fields:
            n = int(stored[f.name + LENGTHS_SUFFIX][k])
            images.append((f.image, stored[f.name][k, :n].tobytes(), int(stored[f.name + CODEC_SUFFIX][k]),
                           tuple(int(v) for v in stored[f.name + SHAPE_SUFFIX][k])))
    per_sample = len(fields)
    outs: list[dict[tuple[int, ...], np.ndarray]] = [{} for _ in range(threads)]  # reused pixels, by shape

    def decode(k: int) -> int:
        mine = outs[k % threads]
        for j in range(batch_size * per_sample):
            spec, data, codec, shape = images[(k * batch_size * per_sample + j) % len(images)]
            out = mine.get(shape)
            if out is None:
                out = mine[shape] = np.empty(shape, np.uint8)
            assert spec is not None
            decode_image(data, codec, spec, out)
        return batch_size

    return _run_batches(f"ceiling: {threads}-thread image decode", decode, threads, max_seconds, bps,
                        {"threads": threads, "kind": "decode", "images": m})


def _hinted(reqs: list[tuple[int, int]], size: int, copiers: int, stop: float, ahead_bytes: int) -> int:
    """``reqs`` hinted (``WILLNEED``) in order by one thread at most ``ahead_bytes`` ahead of ``copiers``
    threads that ``pread`` them: random reads with a queue as deep as fastdata's read-ahead keeps."""
    room = threading.Semaphore(max(1, ahead_bytes // size))  # requests that may be hinted and not yet read
    order = iter(reqs)  # each copier takes the next request (next() on a list iterator is atomic)
    over = threading.Event()

    def hint() -> None:
        for fd, off in reqs:
            room.acquire()
            if over.is_set():
                return
            os.posix_fadvise(fd, off, size, os.POSIX_FADV_WILLNEED)

    def copy() -> int:
        buf, got = bytearray(size), 0
        for fd, off in order:
            if time.perf_counter() > stop:
                break
            got += os.preadv(fd, [buf], off)
            room.release()
        return got

    hinting = threading.Thread(target=hint, name="fastdata-bench-hint", daemon=True)
    hinting.start()
    try:
        with ThreadPoolExecutor(max(1, copiers)) as pool:
            return sum(pool.map(lambda _: copy(), range(max(1, copiers))))
    finally:
        if time.perf_counter() > stop:  # out of time: the hints stop too; else the rest are hinted, as in a pass
            over.set()
        room.release(len(reqs) + 1)  # a hint waiting for room goes on (or sees over)
        hinting.join()


def pread_pass(paths: Sequence[str | os.PathLike[str]], size: int, threads: int, *, shuffled: bool = True,
               seconds: float | None = None, streams: bool = False, sink: Sink = "buffer",
               copiers: int = 2, ahead_bytes: int = 256 << 20) -> dict[str, float]:
    """The disk's rate: all of ``paths`` read in ``size`` preads by ``threads`` threads within ``seconds`` (random if
    ``shuffled``; ``streams``: contiguous runs; ``sink="ahead"``: hinted ahead of ``copiers``) -> {bytes, seconds}."""
    if sink not in ("buffer", "ahead") or (sink == "ahead" and streams):
        raise ValueError(f"sink={sink!r}: 'buffer', or 'ahead' without streams")
    fds = [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in paths]
    try:
        if (streams or not shuffled) and hasattr(os, "posix_fadvise"):
            for fd in fds:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        reqs = [(fd, off) for fd in fds for off in range(0, os.fstat(fd).st_size, size)]
        if shuffled and not streams:
            random.Random(0).shuffle(reqs)
        mine = threading.local()  # one buffer per thread, made once: the ceiling times reads, not allocation
        t0 = time.perf_counter()
        stop = t0 + seconds if seconds is not None else float("inf")

        def read(req: tuple[int, int]) -> int:
            if time.perf_counter() > stop:
                return 0
            if not hasattr(mine, "buf"):
                mine.buf = bytearray(size)
            return os.preadv(req[0], [mine.buf], req[1])

        if sink == "ahead":
            total = _hinted(reqs, size, copiers, stop, ahead_bytes)
        elif streams:
            per = -(-len(reqs) // max(1, threads))
            runs = [reqs[a : a + per] for a in range(0, len(reqs), per)] or [[]]
            with ThreadPoolExecutor(len(runs)) as pool:
                total = sum(pool.map(lambda run: sum(read(r) for r in run), runs))
        else:
            with ThreadPoolExecutor(threads) as pool:
                total = sum(pool.map(read, reqs, chunksize=8))
        return {"bytes": total, "seconds": time.perf_counter() - t0}
    finally:
        for fd in fds:
            os.close(fd)


def memory_stalls() -> int:
    """Times an allocation has stalled for reclaim or compaction since boot (/proc/vmstat; 0 where not found): a cold
    pass during which it grows timed making room in the page cache, not the disk alone."""
    try:
        with open("/proc/vmstat") as f:
            return sum(int(v) for k, v in (line.split() for line in f)
                       if k.startswith("allocstall_") or k == "compact_stall")
    except (OSError, ValueError):
        return 0


__all__ = ["BenchResult", "CEILING_LIMIT", "Sink", "measure", "measure_ceiling", "memory_stalls",
           "payload_bytes", "pread_pass", "sample_bytes"]
