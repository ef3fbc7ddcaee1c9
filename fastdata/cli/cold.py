"""``fastdata bench PATH --cold``: the loader on your dataset with the page cache emptied, against the disk.

Before each measurement the page cache is emptied for the dataset's shard files
(``POSIX_FADV_DONTNEED`` on each: no root needed; pages another process has mapped stay, so
stop other readers of the dataset first). Then, each for at most ``--seconds`` (or ``--batches``):
the loader with ``shuffle=True`` and with ``shuffle="block"``, and the disk's ceiling: ``pread`` of
the same files by 16 threads in random order, at the size of one sample and at 4 MiB, and 4 MiB and
1 MiB preads by 16 threads each reading its own part of the files in order (parallel sequential
streams; the loader's own stream read-ahead reads 1 MiB at a time), those 1 MiB streams sent to
/dev/null and copied by 2 threads, and the same kept within 2 consecutive shard files at a time
(streams close together on the disk, which some disks serve faster). Each pass counts the allocations on
the machine that stalled for reclaim or compaction meanwhile (fastdata.measure.bench.memory_stalls; machine-wide,
/proc/vmstat has no per-process count): a full page cache makes a cold pass slower and less steady, so the
report names such passes.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from typing import TYPE_CHECKING, Any, Callable

from fastdata._units import fmt_bytes
from fastdata.errors import UsageError

if TYPE_CHECKING:
    from fastdata.measure.bench import Sink

_THREADS = 16
_LARGE = 4 << 20


def add_cold(bench: argparse.ArgumentParser) -> None:
    """Add ``--cold`` to the ``bench`` parser; with it, :func:`run_cold` runs instead of the warm bench."""
    bench.add_argument("--cold", action="store_true",
                       help="empty the page cache for the dataset's files before each pass and compare with the "
                            "disk's own speed (docs/loader.md, 'Larger than RAM')")
    warm = bench.get_default("run")

    def run(args: argparse.Namespace) -> int:
        return run_cold(args) if args.cold else int(warm(args))

    bench.set_defaults(run=run)


def _cold(paths: list[str], measure: Callable[[], dict[str, float]]) -> dict[str, float]:
    """``measure()`` run with the page cache emptied for ``paths`` first; its result plus ``memory_stalls``,
    the machine's allocation stalls for reclaim or compaction meanwhile (fastdata.measure.bench.memory_stalls)."""
    from fastdata.measure.bench import memory_stalls
    from fastdata.reading.readahead import drop_page_cache

    drop_page_cache(paths)
    stalls = memory_stalls()
    r = measure()
    return {**r, "memory_stalls": memory_stalls() - stalls}


def _loader_pass(path: str, shuffle: Any, args: argparse.Namespace) -> dict[str, float]:
    from fastdata.loaders import LoaderConfig, loader
    from fastdata.reading.dataset import Dataset

    given = {k: v for k, v in (("mode", args.mode), ("prefetch", args.prefetch)) if v}
    ds = Dataset(path)
    n = batches = 0
    t0 = time.perf_counter()
    with loader(ds, args.batch_size, shuffle=shuffle, device=args.device, num_workers=args.workers,
                config=LoaderConfig(**given) if given else None) as ld:
        for b in ld:
            n += len(next(iter(b.values())))
            batches += 1
            if (args.batches and batches >= args.batches) or time.perf_counter() - t0 >= args.seconds:
                break
        dt = time.perf_counter() - t0
    ds.close()
    return {"samples": n, "seconds": dt}


def _pread_cold(paths: list[str], size: int, seconds: float, streams: bool = False,
                sink: Sink = "buffer", window: int | None = None) -> dict[str, float]:
    """The disk's ceiling with the page cache emptied: random ``size`` preads by ``_THREADS`` threads
    (``streams``: each thread reads its own contiguous part in order; ``sink="ahead"``: with streams,
    sent to /dev/null first, then copied by 2 threads; without, hinted up to 256 MiB ahead of 2
    copying threads; both as the loader reads: fastdata.measure.bench.pread_pass; ``window``: the streams within
    that many consecutive shard files at a time)."""
    from fastdata.measure.bench import pread_pass

    return _cold(paths, lambda: pread_pass(paths, size, _THREADS, seconds=seconds, streams=streams, sink=sink,
                                           window=window))


def _ceilings(paths: list[str], bps: int, seconds: float) -> list[tuple[str, Callable[[], dict[str, float]]]]:
    """The disk's ceilings on the dataset's files, each a name and its cold pass (module docstring)."""
    return [
        (f"pread {fmt_bytes(bps)} x {_THREADS} threads, cold", lambda: _pread_cold(paths, max(bps, 4096), seconds)),
        (f"pread {fmt_bytes(bps)} at random, hinted 256 MiB ahead, copied by 2 threads, cold",
         lambda: _pread_cold(paths, max(bps, 4096), seconds, False, "ahead")),
        (f"pread 4 MiB x {_THREADS} threads, cold", lambda: _pread_cold(paths, _LARGE, seconds)),
        (f"pread 4 MiB x {_THREADS} streams in order, cold", lambda: _pread_cold(paths, _LARGE, seconds, True)),
        (f"pread 1 MiB x {_THREADS} streams in order, cold", lambda: _pread_cold(paths, 1 << 20, seconds, True)),
        (f"pread 1 MiB x {_THREADS} streams read ahead to /dev/null, copied by 2 threads, cold",
         lambda: _pread_cold(paths, 1 << 20, seconds, True, "ahead")),
        (f"pread 1 MiB x {_THREADS} streams within 2 shard files at a time, read ahead, copied by 2 threads, cold",
         lambda: _pread_cold(paths, 1 << 20, seconds, True, "ahead", window=2)),
    ]


def run_cold(args: argparse.Namespace) -> int:
    from fastdata.measure.bench import sample_bytes
    from fastdata.reading.dataset import Dataset
    from fastdata.reading.readahead import supported
    from fastdata.remote import is_url

    if is_url(args.dst):
        raise UsageError(f"{args.dst}: --cold measures local shard files; run it on the node's cached copy or a local dataset")
    if not supported():
        raise UsageError("--cold needs posix_fadvise to empty the page cache (Linux)")
    for flag in ("naive", "subset"):
        if getattr(args, flag, None):
            raise UsageError(f"--{flag} and --cold cannot be combined: measure them separately")
    with Dataset(args.dst) as ds:
        if ds.manifest.backend == "inplace":  # its files are the source's (docs/in-place.md), not shards
            raise UsageError(f"{args.dst}: an in-place index: --cold measures fastdata shard files; convert it to compare")
        paths = [str(p) for p in ds.shard_paths()]
        bps = int(sample_bytes(ds))
        count = len(ds)
    rows: list[tuple[str, float, float, int]] = []  # name, samples/s, MB/s, memory stalls
    for shuffle in (True, "block"):
        r = _cold(paths, functools.partial(_loader_pass, args.dst, shuffle, args))
        sps = r["samples"] / r["seconds"] if r["seconds"] else 0.0
        rows.append((f"fastdata.loader shuffle={shuffle!r}, cold", sps, sps * bps / 1e6, int(r["memory_stalls"])))
    ceilings = _ceilings(paths, bps, args.seconds)
    for name, fn in ([] if args.no_ceiling else ceilings):
        c = fn()
        mbs = c["bytes"] / c["seconds"] / 1e6 if c["seconds"] else 0.0
        rows.append((name, mbs * 1e6 / bps if bps else 0.0, mbs, int(c["memory_stalls"])))
    best = max((r[2] for r in rows if r[0].startswith("pread")), default=None)
    if args.json:
        print(json.dumps({"dataset": str(args.dst), "cold": True, "results": [
            {"name": n, "samples_per_s": s, "mb_per_s": m, "ceiling_ratio": m / best if best else None,
             "memory_stalls": st} for n, s, m, st in rows]}, indent=1))
        return 0
    print(f"dataset {args.dst}: {count} samples, {fmt_bytes(bps)} per sample, page cache emptied before each pass")
    print(f"{'pipeline':<48}{'samples/s':>11}{'MB/s':>9}{'x disk':>8}")
    for n, s, m, _ in rows:
        x = f"{m / best:>8.2f}" if best else f"{'-':>8}"
        print(f"{n:<48}{s:>11.0f}{m:>9.0f}{x}")
    if best:
        print("x disk: samples/s as a fraction of what the best parallel pread rate of the same files delivers "
              "(MB/s: bytes as stored; compressed samples decode to more)")
    stalled = sum(1 for *_, st in rows if st)
    if stalled:
        print(f"note: during {stalled} of {len(rows)} passes, allocations on this machine waited for memory to be "
              "reclaimed or compacted (/proc/vmstat): with the page cache full of other files these figures include "
              "making room and vary more; as root, `sync; echo 3 > /proc/sys/vm/drop_caches` before measuring "
              "gives the disk alone")
    return 0
