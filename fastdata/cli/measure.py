"""``fastdata bench``, ``tune`` and ``doctor``: the CLI side of fastdata.measure. ``bench --cold`` drops the shards
from the page cache before each pass (no root needed) and compares with the disk's own ``pread`` rate."""

from __future__ import annotations

import argparse
import json
import pkgutil
import sys
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from fastdata._units import fmt_bytes
from fastdata.cli import Bar, duration, positive, positives, with_bar, workers
from fastdata.errors import UsageError
from fastdata.reading.dataset import Dataset
from fastdata.reading.readahead import drop_page_cache, supported
from fastdata.remote import is_url

if TYPE_CHECKING:
    from fastdata.measure.bench import BenchResult


def add_parsers(sub: Any) -> None:
    b = sub.add_parser("bench", help="measure the input pipeline on a dataset",
                       description="Run the loader over a dataset for a bounded time and report steady-state "
                                   "throughput as a fraction of the machine's ceiling for this dataset (a memcpy gather "
                                   "of the same bytes for raw data, the decode rate for encoded images).")
    b.add_argument("dst", metavar="PATH", help="dataset folder or URL (s3://bucket/ds; docs/remote.md)")
    b.add_argument("--workers", type=workers, default="auto", metavar="N",
                   help="reader threads, or 'auto' (tuned settings if stored, default otherwise)")
    b.add_argument("--mode", choices=["threads", "processes"], default=None,
                   help="read with threads or worker processes (default: tuned or threads)")
    b.add_argument("--prefetch", type=positive, default=None, metavar="N", help="batches read ahead")
    b.add_argument("--augment", choices=["none", "flip", "imagenet"], default="none",
                   help="augmentation on the device: none, flip (+noise), imagenet (crop, flip, jitter, normalise)")
    b.add_argument("--seconds", type=duration, default=10.0, metavar="T", help="how long to measure (default: 10s)")
    b.add_argument("--batches", type=positive, default=None, metavar="N", help="stop after N batches instead")
    b.add_argument("--naive", metavar="SRC", help="also measure the naive per-file loader over this .npy folder")
    b.add_argument("--no-ceiling", action="store_true", help="skip measuring the machine's ceiling")
    b.add_argument("--subset", metavar="KEYS.txt",
                   help="measure only the samples whose keys (relative source paths) FILE lists, one per line")
    b.add_argument("--cold", action="store_true",
                   help="empty the page cache for the dataset's files before each pass and compare with the "
                        "disk's own speed (docs/loader.md, 'Larger than RAM')")
    b.set_defaults(run=run_bench)

    t = sub.add_parser("tune", help="choose loader settings by measurement",
                       description="Race loader settings (reader mode, workers, prefetch, optionally batch size) "
                                   "within a time budget; store the winner in the user's cache directory.")
    t.add_argument("dst", metavar="PATH", help="dataset folder")
    t.add_argument("--budget", type=duration, default=60.0, metavar="T", help="time budget, e.g. 60s or 2m")
    t.add_argument("--batch-sizes", type=positives, metavar="N,N,...", help="also search these batch sizes")
    t.add_argument("--transform", metavar="MODULE:FUNCTION",
                   help="race with this transform in every trial (transform= of fastdata.loader); worker processes "
                        "are raced only then")
    t.add_argument("--no-store", action="store_true", help="do not remember the winner")
    t.set_defaults(run=run_tune)
    for p in (b, t):
        p.add_argument("--batch-size", type=int, default=64, metavar="N", help="batch size (default: 64)")
        p.add_argument("--device", default="cpu", help="the batches' device: cpu, cuda, cuda:N or auto (default: cpu)")
        p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    _add_doctor(sub)


def _add_doctor(sub: Any) -> None:
    d = sub.add_parser("doctor", help="is a training script input-bound? measured on the script, with the fix",
                       description="Run a training script unchanged for a bounded budget, measure how long its loop "
                                   "waits for each DataLoader batch and why (time in __getitem__ and collate, worker "
                                   "CPU, bytes read, the copies of batches to a CUDA GPU), time the step on copies of "
                                   "its first batches and fastdata.loader on a sample of the dataset, and print the "
                                   "verdict, the projected gain and the fix (docs/doctor.md).")
    b = d.add_mutually_exclusive_group()
    b.add_argument("--steps", type=int, default=None, metavar="N", help="stop after N batches")
    b.add_argument("--seconds", type=duration, default=60.0, metavar="S",
                   help="the whole run, start to verdict, takes about S seconds (e.g. 30s or 2m; default: 60s): about half of it measures the loop, the rest replays the step and projects fastdata; slow steps give fewer steps, and the report says its confidence")
    d.add_argument("--json", metavar="FILE", help="write the report as JSON")
    d.add_argument("--html", metavar="FILE", help="write an HTML page with a timeline of waits and steps")
    d.add_argument("--no-replay", action="store_true",
                   help="do not time the step on cached batches (the compute-only step is then estimated)")
    d.add_argument("--no-project", action="store_true", help="do not measure fastdata.loader on a sample")
    d.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- python SCRIPT ARGS",
                   help="the training command, after --")
    d.set_defaults(run=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    from fastdata.measure.doctor import run

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    report = run(cmd, steps=args.steps, seconds=args.seconds, json_path=args.json, html_path=args.html,
                 replay=not args.no_replay, project=not args.no_project)
    return 0 if report.get("bottleneck") is not None else 1


def _augment(name: str) -> Any:
    if name == "none":
        return None
    from fastdata import augment as A

    if name == "flip":
        return [A.HorizontalFlip(0.5), A.GaussianNoise(0.01)]
    return [A.RandomResizedCrop(224), A.HorizontalFlip(0.5), A.ColorJitter(0.4, 0.4, 0.4, 0.1),
            A.Normalize(A.IMAGENET_MEAN, A.IMAGENET_STD)]


def bench_loader(args: argparse.Namespace, ds: Dataset, **kw: Any) -> Any:
    """The loader the flags of ``fastdata bench`` ask for (tuned settings where none are given)."""
    from fastdata.loaders import LoaderConfig, loader

    if len(ds) == 0:
        raise UsageError(f"{args.dst}: the dataset has no samples: nothing to measure")
    given = {k: v for k, v in (("mode", args.mode), ("prefetch", args.prefetch)) if v}  # others: the defaults
    return loader(ds, args.batch_size, device=args.device, num_workers=args.workers,
                  config=LoaderConfig(**given) if given else None, **kw)


def run_bench(args: argparse.Namespace) -> int:
    from fastdata.measure.bench import CEILING_LIMIT, payload_bytes, sample_bytes

    if args.cold:
        return run_cold(args)
    ds = _bench_dataset(args)
    local = ds.remote is None or all(r.path.is_file() for r in ds.readers)
    # MB/s of the data the loader hands over; stored bytes only where reading the payload would download shards
    bps = payload_bytes(ds) if local else sample_bytes(ds)
    results, settings = _bench_results(args, ds, bps, local)
    ceiling = next((r for r in results if r.name.startswith("ceiling")), None)
    ratio = {r.name: r.samples_per_s / ceiling.samples_per_s if ceiling and ceiling.samples_per_s else None
             for r in results}
    over = [n for n, x in ratio.items() if x is not None and x > CEILING_LIMIT]
    if over:  # a pipeline cannot beat the machine's best for the same work: the ceiling was measured badly
        print(f"warning: {', '.join(over)} above {CEILING_LIMIT} of the ceiling: the ceiling's measurement was "
              "disturbed (another process busy?); run again on a quiet machine", file=sys.stderr)
    if args.json:
        print(json.dumps({"dataset": str(ds.root), "results": [{**asdict(r), "ceiling_ratio": ratio[r.name]}
                                                                for r in results]}, indent=1))
        return 0
    print(f"dataset {ds.root}: {len(ds)} samples, {fmt_bytes(bps)} per sample, settings {settings}")
    _print_bench(results, ratio, ceiling)
    return 0


def _bench_dataset(args: argparse.Namespace) -> Dataset:
    """The dataset ``fastdata bench`` measures: ``PATH``, or the samples keyed in ``--subset``'s file."""
    ds = Dataset(args.dst)
    if args.subset:
        try:
            keys = [k for k in Path(args.subset).read_text(encoding="utf-8").splitlines() if k.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"{args.subset}: cannot read the subset's keys: {e}") from None
        ds = ds.subset(keys)
    return ds


def _bench_results(args: argparse.Namespace, ds: Dataset, bps: float,
                   local: bool) -> tuple[list[BenchResult], dict[str, Any]]:
    """The loader's measurement, then the ceiling and the naive loader where asked; and the loader's settings."""
    from fastdata.demo import naive_loader
    from fastdata.measure.bench import measure_ceiling

    naive = naive_loader(args.naive, args.batch_size, workers=2) if args.naive else None  # a bad folder: before measuring
    ld = bench_loader(args, ds, augment=_augment(args.augment))
    settings = {"mode": ld.config.mode, "workers": getattr(ld, "workers", None), "prefetch": ld.config.prefetch,
                "batch_size": args.batch_size, "device": str(ld.device), "augment": args.augment}
    try:
        results = [_measure_live(args, "fastdata.loader", ld, bps, settings, "measuring")]
    finally:
        ld.close()
    if not args.no_ceiling and not local:
        print("ceiling: not measured (the dataset is larger than what its shard cache holds now)", file=sys.stderr)
    elif not args.no_ceiling:  # the best of 1 .. the loader's own reader count, on the payload's bytes
        threads = max(1, int(settings["workers"] or 0))
        results.append(measure_ceiling(ds, args.batch_size, threads=threads, max_seconds=min(3.0, args.seconds),
                                       bytes_per_sample=bps))
    if naive is not None:
        results.append(_measure_live(args, "naive per-file loader", naive, bps, {"workers": 2}, "naive"))
    return results, settings


def _measure_live(args: argparse.Namespace, name: str, ld: Any, bps: float, settings: dict[str, Any],
                  label: str) -> BenchResult:
    """fastdata.measure.bench.measure on ``ld`` for the flags' time or batches, with a progress bar."""
    from fastdata.measure.bench import measure

    def run(bar: Bar) -> BenchResult:
        bar.start(0, 0, desc=label)
        return measure(name, lambda: ld, bytes_per_sample=bps, max_batches=args.batches, max_seconds=args.seconds,
                       settings=settings, on_batch=lambda n, _: bar.update(n - bar.done, int((n - bar.done) * bps)))

    return with_bar(args.json, run)


def _print_bench(results: list[BenchResult], ratio: dict[str, float | None], ceiling: BenchResult | None) -> None:
    main = results[0]
    print(f"{'pipeline':<44}{'samples/s':>11}{'MB/s':>9}{'ms/batch':>10}{'p95 ms':>9}{'first s':>9}{'x this':>8}"
          f"{'x ceiling':>10}")
    for r in results:
        x = ratio[r.name]
        xs = f"{x:>10.2f}" if x is not None else f"{'-':>10}"
        print(f"{r.name:<44}{r.samples_per_s:>11.0f}{r.mb_per_s:>9.0f}{r.batch_ms_median:>10.2f}"
              f"{r.batch_ms_p95:>9.2f}{r.first_batch_s:>9.2f}{r.samples_per_s / main.samples_per_s:>8.2f}{xs}")
    if ceiling is not None:
        what = "decoding the same images" if ceiling.settings["kind"] == "decode" else \
            "a memcpy gather of the same bytes from memory"
        rates = ceiling.settings["rates"]
        tried = ", ".join(f"{t}: {r:.0f}" for t, r in rates.items())
        print(f"x ceiling: the fraction of the machine's limit for this dataset ({what}, the best of "
              f"1 to the loader's {max(rates)} threads: {tried} samples/s)")


def run_tune(args: argparse.Namespace) -> int:
    from fastdata.measure.tune import tune

    def show(s: dict[str, Any], r: Any, rnd: int) -> None:
        print(f"  round {rnd}: {r.name:<46} {r.samples_per_s:>10.0f} samples/s", file=sys.stderr, flush=True)

    res = tune(args.dst, batch_size=args.batch_size, budget_s=args.budget, device=args.device, batch_sizes=args.batch_sizes,
               store=not args.no_store, on_trial=None if args.json else show,
               transform=_import_function(args.transform) if args.transform else None)
    # each setting's rate in its last round (the table is in round order, so later trials overwrite)
    last = {json.dumps(s, sort_keys=True): (s, r.samples_per_s, rnd) for s, r, rnd in res.table}
    rows = sorted(last.values(), key=lambda t: (-t[2], -t[1]))
    if args.json:
        print(json.dumps({"winner": res.winner, "samples_per_s": res.rate, "stored_at": str(res.stored_at) if res.stored_at else None,
                          "reason": res.reason,
                          "trials": [{"settings": s, "samples_per_s": r.samples_per_s, "round": k}
                                     for s, r, k in res.table]}, indent=1))
        return 0
    print(f"{'mode':<10}{'workers':>8}{'prefetch':>9}{'batch':>7}{'samples/s':>11}{'last round':>11}")
    for s, rate, rnd in rows:
        print(f"{s['mode']:<10}{s['num_workers']:>8}{s['prefetch']:>9}{s['batch_size']:>7}{rate:>11.0f}{rnd:>11}")
    print(f"winner: {res.winner} at {res.rate:.0f} samples/s"
          + (f"; stored in {res.stored_at} ({_tuned_call(args, res.winner)} uses it)" if res.stored_at else ""))
    print(f"why: {res.reason}")
    return 0


def _tuned_call(args: argparse.Namespace, winner: dict[str, Any]) -> str:
    """The loader call that finds the stored winner: its key is the dataset, the batch size, the device and the
    transform, so a call without any of them gets the default settings."""
    transform = f", transform={args.transform.replace(':', '.')}" if args.transform else ""
    return (f"fastdata.loader({str(args.dst)!r}, {winner['batch_size']}, device={args.device!r}, num_workers='auto'"
            f"{transform})")


def _import_function(spec: str) -> Any:
    """``module:function`` (or ``module:Class.attr``) imported, as ``--transform`` names it."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise UsageError(f"--transform {spec!r}: expected MODULE:FUNCTION, e.g. mypkg.augment:jitter")
    try:
        return pkgutil.resolve_name(spec)
    except (ImportError, AttributeError, ValueError) as e:
        raise UsageError(f"--transform {spec!r}: {type(e).__name__}: {e}") from None


_THREADS = 16


def _cold(paths: list[str], measure: Callable[[], Any]) -> tuple[Any, int]:
    """``measure()`` run with the page cache emptied for ``paths`` first, and the memory stalls meanwhile."""
    from fastdata.measure.bench import memory_stalls

    drop_page_cache(paths)
    stalls = memory_stalls()
    return measure(), memory_stalls() - stalls


def _ceilings(paths: list[str], bps: int, seconds: float) -> list[tuple[str, Callable[[], dict[str, float]]]]:
    """The disk's ceilings on the dataset's files (fastdata.measure.bench.pread_pass), each a name and its pass."""
    from fastdata.measure.bench import pread_pass

    size = max(bps, 4096)
    passes: list[tuple[str, int, dict[str, Any]]] = [
        (f"pread {fmt_bytes(bps)} x {_THREADS} threads", size, {}),
        (f"pread {fmt_bytes(bps)} at random, hinted 256 MiB ahead, copied by 2 threads", size, {"sink": "ahead"}),
        (f"pread 4 MiB x {_THREADS} threads", 4 << 20, {}),
        (f"pread 4 MiB x {_THREADS} streams in order", 4 << 20, {"streams": True}),
        (f"pread 1 MiB x {_THREADS} streams in order", 1 << 20, {"streams": True})]
    return [(f"{name}, cold", partial(pread_pass, paths, size, _THREADS, seconds=seconds, **kw))
            for name, size, kw in passes]


def run_cold(args: argparse.Namespace) -> int:
    from fastdata.measure.bench import measure, sample_bytes

    if is_url(args.dst):
        raise UsageError(f"{args.dst}: --cold measures local shard files; run it on the node's cached copy or a local dataset")
    if not supported():
        raise UsageError("--cold needs posix_fadvise to empty the page cache (Linux)")
    for flag in ("naive", "subset"):
        if getattr(args, flag):
            raise UsageError(f"--{flag} and --cold cannot be combined: measure them separately")
    ds = Dataset(args.dst)
    if ds.manifest.backend == "inplace":  # its files are the source's (docs/in-place.md), not shards
        raise UsageError(f"{args.dst}: an in-place index: --cold measures fastdata shard files; convert it to compare")
    paths = [str(r.path) for r in ds.readers]
    bps = int(sample_bytes(ds))
    rows: list[tuple[str, float, float, int]] = []  # name, samples/s, MB/s, memory stalls
    for shuffle in (True, "block"):
        with bench_loader(args, ds, shuffle=shuffle) as ld:  # one pass: a second would find the pages cached
            r, st = _cold(paths, lambda: measure("", lambda: ld, bytes_per_sample=bps, max_batches=args.batches,
                                                 max_seconds=args.seconds, warmup=0, one_pass=True))
        rows.append((f"fastdata.loader shuffle={shuffle!r}, cold", r.samples_per_s, r.mb_per_s, st))
    for name, fn in ([] if args.no_ceiling else _ceilings(paths, bps, args.seconds)):
        c, st = _cold(paths, fn)
        mbs = c["bytes"] / c["seconds"] / 1e6 if c["seconds"] else 0.0
        rows.append((name, mbs * 1e6 / bps if bps else 0.0, mbs, st))
    ds.close()  # (its manifest stays)
    return _print_cold(args, ds.manifest.num_samples, bps, rows)


def _print_cold(args: argparse.Namespace, count: int, bps: int, rows: list[tuple[str, float, float, int]]) -> int:
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
