"""Cold reads: the loader on data that is not in the page cache, against what the disk can give.

Before every timed pass the page cache is emptied for exactly the files that pass reads:
``os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` on each file (no root needed; it drops clean
pages that no process has mapped, so every dataset is closed before), then ``mincore`` checks
how much stayed resident (reported). One run compares, on the same files:

- naive: per-file ``np.load`` in a torch DataLoader (fastdata.demo.examples.naive_loader), random order;
- fastdata.loader, uncompressed HDF5, each shuffle mode (True, "block", "shards", False), with the
  plan-following read-ahead (fastdata/reading/readahead.py) and, for True and "block", without it;
- the same data converted with ``--compression lz4`` (Blosc, byte shuffle), decoded samples/s;
- the disk's ceilings on the uncompressed shard files: ``pread`` at the loader's request size (one
  sample), random order, by 4, 8, 16, 32, 64 and 128 threads (the best is the ceiling) and by one thread in
  order; and 4 MiB preads, parallel in random order, one thread in order, and 16 threads each
  reading its own contiguous part in order (parallel sequential streams), those streams also with
  2 MiB and 1 MiB preads; the large-read ceiling is the best of these. Every in-order read marks its
  descriptors ``POSIX_FADV_SEQUENTIAL`` (fastdata.measure.bench.pread_pass): the ceilings are plain
  ``pread`` loops a user could write, independent of fastdata's read path;
- warm cache: the loader with and without read-ahead, uncompressed and compressed;
- natural-looking raw images (smooth gradients + texture), uncompressed and lz4: ratio and cold rate;
- RSS (anonymous and file-backed) of the loader's process after each of ``--rss-epochs`` cold epochs;
- for every cold pass, the mean size of the read requests the disk received (/proc/diskstats: the
  median pass's figure).

Data: FLIM-like decays, ``counts ~ Poisson(A * exp(-t / tau))`` per pixel, stored as float32 of
shape (2, 256, 21, 21) (0.9 MB a sample; the class sets the lifetime range). Shuffle quality of
each mode is given as the mean distance, in stored order, between consecutive samples of a batch,
divided by n/3 (what a uniform shuffle gives): 1.0 mixes fully, 0 reads in order; and the number of
runs of consecutive stored samples a batch is made of (a uniform shuffle: about the batch size;
"block" and "shards": about the 16 streams a window is read as; False: 1).

Each reader runs ``--rounds`` passes, interleaved with the others in a new random order each round
(:func:`interleaved` says why not a fixed rotation); the figure is the median pass. The target
ratios are given as the ratio of two such medians and, where both sides are cold passes, also as
the median of each round's ratio (:func:`per_round`) and, after the rounds, as the median ratio of
the two passes run back to back ``--rounds`` times (:func:`back_to_back`; against the ceiling the
rounds found best): the steadiest of the three on a disk whose speed drifts.
Usage: python benchmarks/bench_cold.py [--quick] [--samples N] [--rounds R] [--dir DIR] [--out DIR]
The machine may be shared: the result records the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

import fastdata  # noqa: E402
from fastdata.demo import naive_loader  # noqa: E402
from fastdata.loaders import LoaderConfig  # noqa: E402
from fastdata.measure.bench import Sink, memory_stalls  # noqa: E402
from fastdata.measure.bench import pread_pass as bench_pread
from fastdata.reading.samplers import STREAMS, epoch_order  # noqa: E402

CONVERTED_SHUFFLES: list[Any] = [True, False, "block", "shards"]  # the strings: Block() and Shards()
from fastdata.reading.readahead import drop_page_cache  # noqa: E402

SHAPE = (2, 256, 21, 21)
QUICK_SHAPE = (2, 64, 21, 21)
BATCH = 64
CLASSES = ("c0", "c1", "c2", "c3")
LARGE = 4 << 20
PHOTO_SIDES = (192, 640)  # photos' height and width drawn apart, uniformly: every size, as in a folder of photos
THREADS = (4, 8, 16, 32, 64, 128)  # the best is the ceiling: the read-ahead keeps more than 32 reads in flight
HINTED = "random, hinted 256 MiB ahead of 2 copying threads"  # a deeper queue than threads keep (fastdata.measure.bench._hinted)


# --- data --------------------------------------------------------------------------------------

def flim_sample(rng: np.random.Generator, shape: tuple[int, ...], c: int) -> np.ndarray:
    """Photon counts of a decay per pixel, ``Poisson(A * exp(-t / tau))``, as float32."""
    ch, nt, h, w = shape
    t = np.arange(nt, dtype=np.float32)[None, :, None, None]
    amp = rng.uniform(20, 200, size=(ch, 1, h, w)).astype(np.float32)
    tau = rng.uniform(5 + 5 * c, 15 + 5 * c, size=(ch, 1, h, w)).astype(np.float32)
    return rng.poisson(amp * np.exp(-t / tau)).astype(np.float32)


def natural_image(rng: np.random.Generator, side: int, width: int | None = None) -> np.ndarray:
    """A smooth colour gradient with low-frequency blobs and mild sensor texture, uint8 (side, width, 3)
    (width: side when not given)."""
    w = side if width is None else width
    y, x = np.mgrid[0:side, 0:w].astype(np.float32) / max(side, w)
    img = np.empty((side, w, 3), dtype=np.float32)
    for ch in range(3):
        a, b, c = rng.uniform(-1, 1, 3)
        img[..., ch] = 128 + 60 * (a * x + b * y) + 40 * np.sin(2 * np.pi * (c * x + rng.uniform(0.5, 2) * y))
    for _ in range(4):
        cy, cx, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.3)
        img += rng.uniform(-50, 50, 3) * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))[..., None]
    img += rng.normal(0, 2.0, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_folder(root: Path, n: int, make: Callable[[np.random.Generator, int], np.ndarray], seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    files = []
    for i in range(n):
        c = i % len(CLASSES)
        d = root / CLASSES[c]
        d.mkdir(parents=True, exist_ok=True)
        files.append(d / f"{i:07d}.npy")
        np.save(files[-1], make(rng, c))
    return sorted(files)


def files_of(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".json"))


# --- one cold pass -----------------------------------------------------------------------------

def loadavg() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def disk_reads(path: Path) -> tuple[int, int]:
    """(read requests completed, bytes read) of the block device holding ``path`` (/proc/diskstats;
    (0, 0) where it is not found): the mean request size a pass sent to the disk."""
    dev = os.stat(path).st_dev
    try:
        with open("/proc/diskstats") as f:
            for line in f:
                v = line.split()
                if (int(v[0]), int(v[1])) == (os.major(dev), os.minor(dev)):
                    return int(v[3]), int(v[5]) * 512
    except OSError:
        pass
    return 0, 0


def with_requests(path: Path, fn: Callable[[], dict[str, float]]) -> dict[str, float]:
    """``fn()``'s result plus ``request_kib``, the mean size of the disk's read requests during it, and
    ``stalls``, the memory stalls (fastdata.measure.bench.memory_stalls) during it."""
    n0, b0 = disk_reads(path)
    s0 = memory_stalls()
    r = fn()
    n1, b1 = disk_reads(path)
    r["request_kib"] = (b1 - b0) / (n1 - n0) / 1024 if n1 > n0 else 0.0
    r["stalls"] = memory_stalls() - s0
    return r


def memory_mib() -> dict[str, int]:
    """MemFree and Cached of /proc/meminfo, MiB (empty where not found)."""
    try:
        with open("/proc/meminfo") as f:
            info = {k.rstrip(":"): int(v) for k, v, *_ in (line.split() for line in f)}
    except (OSError, ValueError):
        return {}
    return {k: info[k] // 1024 for k in ("MemFree", "Cached") if k in info}


def drop_whole_page_cache() -> bool:
    """Drop every clean page of the page cache (``/proc/sys/vm/drop_caches``; root only): a run starts with
    the memory free, not fragmented by other files' pages, which new pages would first have to be reclaimed
    from (with the cache full after the 30.7 GB run, a stream pass right after a 128-thread random pass was
    slower than the one before it in 3 of 4 pairs, and not with the cache dropped; notes of issue 26).
    False where not allowed."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def cold(paths: list[Path]) -> float:
    """Empty the page cache for ``paths``; the fraction still resident after."""
    total = drop_page_cache(paths)
    return _harness.resident_bytes(paths) / total if total else 0.0


def loader_pass(root: Path, shuffle: Any, *, readahead: bool = True, epoch: int = 0, warm: bool = False,
                uint8: bool = False) -> dict[str, float]:
    """One epoch of fastdata.loader (threads, defaults) over ``root``; cold unless ``warm``."""
    cfg = LoaderConfig(readahead=LoaderConfig.readahead if readahead else 0,
                       image_dtype="uint8" if uint8 else "float32")
    paths = files_of(root)
    left = 0.0 if warm else cold(paths)
    with fastdata.loader(root, BATCH, shuffle=shuffle, device="cpu", config=cfg, seed=epoch) as ld:
        ld.set_epoch(epoch)
        t0 = time.perf_counter()
        n = 0
        for b in ld:
            n += len(b["label"])
        dt = time.perf_counter() - t0
    return {"samples_per_s": n / dt, "seconds": dt, "resident_before": left}


def naive_pass(src: Path, files: list[Path]) -> dict[str, float]:
    left = cold(files)
    dl = naive_loader(src, BATCH)
    t0 = time.perf_counter()
    n = sum(len(b["label"]) for b in dl)
    dt = time.perf_counter() - t0
    del dl
    return {"samples_per_s": n / dt, "seconds": dt, "resident_before": left}


def pread_pass(paths: list[Path], size: int, threads: int, shuffled: bool, streams: bool = False,
               sink: Sink = "buffer") -> dict[str, float]:
    """The disk's ceiling at request size ``size`` (fastdata.measure.bench.pread_pass), cold."""
    left = cold(paths)
    r = bench_pread(paths, size, threads, shuffled=shuffled, streams=streams, sink=sink)
    return {"mb_per_s": r["bytes"] / r["seconds"] / 1e6, "seconds": r["seconds"], "resident_before": left}


def stream_ceilings(paths: list[Path]) -> dict[str, Callable[[], dict[str, float]]]:
    """The parallel-stream ceilings of both cold benchmarks: 16 threads each reading its own part in
    order with 4, 2 and 1 MiB preads (the loader's stream reads are 1 MiB)."""
    return {f"pread {mib} MiB, {STREAMS} streams in order": (lambda mib=mib: pread_pass(paths, mib << 20, STREAMS, False, streams=True))
            for mib in (4, 2, 1)}


def random_ceiling(name: str) -> bool:
    """Whether ceiling ``name`` reads at random (by threads, or hinted ahead of copying threads)."""
    return "threads, random" in name or HINTED in name


def best_large(ceil: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The best large-read ceiling (reads of 1 MiB or more) among ``ceil``; not the sample-size reads
    hinted "256 MiB" ahead (HINTED: the size in their name is the hints' bound, not the request's)."""
    return max((v for k, v in ceil.items() if " MiB" in k and HINTED not in k),
               key=lambda v: v["mb_per_s"])


DISK_TARGETS = {  # the targets against the disk: (loader row, which best ceiling: best_ceilings)
    "shuffle=True / best parallel ceiling at the request size (>= 0.85)": ("loader shuffle=True", "parallel"),
    "shuffle='block' / best large-read ceiling, 1-4 MiB (>= 0.9)": ("loader shuffle='block'", "large"),
    "shuffle='shards' / best large-read ceiling, 1-4 MiB (>= 0.9)": ("loader shuffle='shards'", "large"),
}


def best_ceilings(ceil: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The names of the best ceilings by MB/s: random reads at the request size ("parallel": threads,
    or hinted ahead) and large reads ("large": :func:`best_large`)."""
    large = best_large(ceil)
    return {"parallel": max((k for k in ceil if random_ceiling(k) and "4 MiB" not in k), key=lambda k: ceil[k]["mb_per_s"]),
            "large": next(k for k, v in ceil.items() if v is large)}


def mb_per_s(result: dict[str, Any], nbytes: int) -> float:
    """A pass's MB/s: a ceiling's own, or a loader's samples/s times ``nbytes`` a sample."""
    return result["mb_per_s"] if "mb_per_s" in result else result["samples_per_s"] * nbytes / 1e6


def per_round(runs: dict[str, list[dict[str, Any]]], num: str, den: str, nbytes: int) -> float:
    """The median over rounds of ``num``'s MB/s over ``den``'s in the same round (``nbytes`` a sample):
    this disk's speed drifts in runs of several passes (docs/loader.md), and the passes of one round
    are closer in time than the medians of all rounds."""
    return _harness.median_ratio([mb_per_s(r, nbytes) for r in runs[num]], [mb_per_s(r, nbytes) for r in runs[den]])


def back_to_back(fns: dict[str, Callable[[], dict[str, Any]]], pairs: dict[str, tuple[str, str]], rounds: int,
                 nbytes: int, seed: int = 1) -> dict[str, dict[str, Any]]:
    """Each pair's two passes (``fns`` names) right after each other, which first drawn at random,
    ``rounds`` times (the pairs in a new random order each round): the median of the pairs' MB/s
    ratios, and every ratio. This disk's speed drifts over runs of several passes (docs/loader.md);
    two passes back to back meet nearly the same disk, so theirs is the steadiest ratio of a target."""
    rng = np.random.default_rng(seed)
    got: dict[str, list[float]] = {k: [] for k in pairs}
    for _ in range(rounds):
        for k in rng.permutation(list(pairs)).tolist():
            a, b = pairs[k]
            flip = bool(rng.integers(2))
            res = {n: fns[n]() for n in ((b, a) if flip else (a, b))}
            got[k].append(mb_per_s(res[a], nbytes) / mb_per_s(res[b], nbytes))
    return {k: {"median": float(np.median(v)), "all": [round(x, 3) for x in v]} for k, v in got.items()}


def both_units(results: dict[str, dict[str, Any]], nbytes: int) -> dict[str, dict[str, Any]]:
    """Each result in samples/s and MB/s (``nbytes`` a sample), from whichever of the two it has."""
    for r in results.values():
        r["mb_per_s"] = mb_per_s(r, nbytes)
        r["samples_per_s"] = r["mb_per_s"] * 1e6 / nbytes
    return results


def shuffle_quality(ds: fastdata.Dataset, shuffle: Any) -> dict[str, float]:
    """Mean distance in stored order between consecutive samples of a batch / (n/3), and shards per batch."""
    n = len(ds)
    counts = [s.count for s in ds.manifest.shards]
    order = epoch_order(n, shuffle=shuffle, seed=0, epoch=0, shard_counts=counts)
    starts = np.array([s.start for s in ds.manifest.shards])
    dists, shards, runs = [], [], []
    for a in range(0, n - 1, BATCH):
        b = order[a : a + BATCH]
        dists.append(np.abs(np.diff(b)).mean())
        shards.append(len(np.unique(np.searchsorted(starts, b, side="right"))))
        runs.append(1 + int((np.diff(np.sort(b)) != 1).sum()))
    return {"mixing": float(np.mean(dists) / (n / 3)) if dists else 0.0,
            "shards_per_batch": float(np.mean(shards)) if shards else 0.0,
            "runs_per_batch": float(np.mean(runs)) if runs else 0.0}


def rss_kib() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, v = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(v.split()[0])
    return out


# --- the run -----------------------------------------------------------------------------------

def interleaved(fns: dict[str, Callable[[], dict[str, Any]]], rounds: int, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Every pass ``rounds`` times, in a new random order each round (seeded): drift in load hits all
    alike, and no pass always follows the same one. (A fixed rotation did: under it the 2 MiB
    streams ceiling, always right after the 4 MiB streams, led the 1 MiB streams, which read the same
    bytes in the same order, in all three runs made so (2,634 against 1,884 MB/s in the 12-round run);
    with the random order the two came close in three runs.) Each pass's result records the pass before it (``after``)."""
    names = list(fns)
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    rng = np.random.default_rng(seed)
    before = None
    for _ in range(rounds):
        for k in rng.permutation(names).tolist():
            out[k].append({**fns[k](), "after": before})
            before = k
    return out


def median_of(results: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The pass with the median ``key`` (and every pass's ``key``, as ``all``, and the pass before each)."""
    ranked = sorted(results, key=lambda r: r[key])
    return {**ranked[len(ranked) // 2], "all": [round(r[key], 1) for r in results],
            "after_all": [r.get("after") for r in results], "stalls_all": [r.get("stalls") for r in results]}


def after_same_pattern(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The ceiling's parallel streams (1, 2 and 4 MiB preads) after another of them vs after any other
    pass: median MB/s of each group and how many passes (what :func:`interleaved` guards against)."""
    streams = [k for k in runs if k.startswith("pread ") and "streams in order" in k]
    same = [r["mb_per_s"] for k in streams for r in runs[k] if r.get("after") in streams]
    other = [r["mb_per_s"] for k in streams for r in runs[k] if r.get("after") not in streams]
    med = lambda v: float(np.median(v)) if v else None  # noqa: E731
    return {"after_streams": med(same), "after_other": med(other), "n_after_streams": len(same),
            "n_after_other": len(other)}


def run(n: int, n_images: int, side: int, shape: tuple[int, ...], rss_epochs: int, rounds: int,
        work: Path, n_photos: int = 1500, photo_sides: tuple[int, int] = PHOTO_SIDES) -> dict[str, Any]:
    res: dict[str, Any] = {"loadavg_before": loadavg(), "samples": n, "shape": list(shape), "batch": BATCH,
                           "rounds": rounds, "memory_mib_before": memory_mib()}
    src = work / "npy"
    files = write_folder(src, n, lambda rng, c: flim_sample(rng, shape, c))
    conv = {}
    for name, comp in (("hdf5", None), ("hdf5_lz4", "lz4")):
        conv[name] = fastdata.convert(src, work / name, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="hdf5", compression=comp)), progress=None)
    img_src = work / "img_npy"
    write_folder(img_src, n_images, lambda rng, c: natural_image(rng, side), seed=1)
    for name, comp in (("img", None), ("img_lz4", "lz4")):
        conv[name] = fastdata.convert(img_src, work / name, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="hdf5", compression=comp)))
    os.sync()  # writeback done: every page dropped below is clean
    sample_bytes = int(np.prod(shape)) * 4
    res["dataset_bytes"] = {k: sum(p.stat().st_size for p in files_of(work / k)) for k in conv}
    res["ratio"] = {k: round(conv[k].bytes_in / res["dataset_bytes"][k], 2) for k in conv}
    shard_files = files_of(work / "hdf5")
    conv["lmdb"] = fastdata.convert(src, work / "lmdb", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb")))
    os.sync()

    naive_loader(src, BATCH)  # (imports and forks once before timing: the first pass is not a start-up figure)
    cold_fns: dict[str, Callable[[], dict[str, float]]] = {"naive np.load per file, random": lambda: naive_pass(src, files)}
    for sh in CONVERTED_SHUFFLES:
        cold_fns[f"loader shuffle={sh!r}"] = lambda sh=sh: loader_pass(work / "hdf5", sh)
    for sh in (True, "block"):
        cold_fns[f"loader shuffle={sh!r}, no read-ahead"] = lambda sh=sh: loader_pass(work / "hdf5", sh, readahead=False)
    cold_fns["loader lz4 shuffle=True"] = lambda: loader_pass(work / "hdf5_lz4", True)
    cold_fns["loader lz4 shuffle='block'"] = lambda: loader_pass(work / "hdf5_lz4", "block")
    cold_fns["loader LMDB shuffle=True"] = lambda: loader_pass(work / "lmdb", True)
    ceil_fns: dict[str, Callable[[], dict[str, float]]] = {}
    for t in THREADS:
        ceil_fns[f"pread {sample_bytes} B, {t} threads, random"] = lambda t=t: pread_pass(shard_files, sample_bytes, t, True)
    ceil_fns[f"pread {sample_bytes} B, {HINTED}"] = lambda: pread_pass(shard_files, sample_bytes, 2, True, sink="ahead")
    ceil_fns[f"pread {sample_bytes} B, 1 thread, in order"] = lambda: pread_pass(shard_files, sample_bytes, 1, False)
    ceil_fns["pread 4 MiB, 16 threads, random"] = lambda: pread_pass(shard_files, LARGE, 16, True)
    ceil_fns["pread 4 MiB, 1 thread, in order"] = lambda: pread_pass(shard_files, LARGE, 1, False)
    ceil_fns.update(stream_ceilings(shard_files))
    runs = interleaved({k: (lambda f=f: with_requests(work, f)) for k, f in {**cold_fns, **ceil_fns}.items()}, rounds)
    res["after_same_pattern"] = after_same_pattern(runs)
    rows = both_units({k: median_of(runs[k], "samples_per_s") for k in cold_fns}, sample_bytes)  # decoded bytes for lz4
    ceil = both_units({k: median_of(runs[k], "mb_per_s") for k in ceil_fns}, sample_bytes)
    _harness.warm_page_cache(work / "hdf5", work / "hdf5_lz4")
    warm_fns = {f"{root} shuffle=True, read-ahead {'on' if ra else 'off'}":
                (lambda root=root, ra=ra: loader_pass(work / root, True, readahead=ra, warm=True))
                for root in ("hdf5", "hdf5_lz4") for ra in (True, False)}
    warm = {k: median_of(v, "samples_per_s") for k, v in interleaved(warm_fns, max(3, rounds)).items()}
    images = {k: loader_pass(work / k, True, uint8=True) for k in ("img", "img_lz4")}
    res["photos"] = photos(work, n_photos, rounds, photo_sides)
    with fastdata.open(work / "hdf5") as ds:
        quality = {repr(sh): shuffle_quality(ds, sh) for sh in CONVERTED_SHUFFLES}
    rss = rss_run(work / "hdf5", rss_epochs)
    best = best_ceilings(ceil)
    unc = rows["loader shuffle=True"]["mb_per_s"]
    res.update(rows=rows, ceilings=ceil, warm=warm, images=images, shuffle_quality=quality, rss=rss,
               loadavg_after=loadavg(), machine=_harness.machine_info())
    res["targets"] = {
        **{t: rows[row]["mb_per_s"] / ceil[best[which]]["mb_per_s"] for t, (row, which) in DISK_TARGETS.items()},
        "lz4 cold / uncompressed cold, shuffle=True (>= 1.5)": rows["loader lz4 shuffle=True"]["mb_per_s"] / unc,
        "lz4 warm / uncompressed warm (>= 0.5)": warm["hdf5_lz4 shuffle=True, read-ahead on"]["samples_per_s"]
        / warm["hdf5 shuffle=True, read-ahead on"]["samples_per_s"],
        "warm read-ahead on / off, uncompressed (>= ~1)": warm["hdf5 shuffle=True, read-ahead on"]["samples_per_s"]
        / warm["hdf5 shuffle=True, read-ahead off"]["samples_per_s"],
        "RssAnon growth epoch 2 -> last, MiB": (rss[-1]["RssAnon"] - rss[min(1, len(rss) - 1)]["RssAnon"]) / 1024,
    }
    pair = {**{t: (row, best[which]) for t, (row, which) in DISK_TARGETS.items()},
            "lz4 cold / uncompressed cold, shuffle=True (>= 1.5)": ("loader lz4 shuffle=True", "loader shuffle=True")}
    res["targets_per_round"] = {k: per_round(runs, a, b, sample_bytes) for k, (a, b) in pair.items()}
    res["targets_back_to_back"] = back_to_back({**cold_fns, **ceil_fns}, pair, rounds, sample_bytes)
    return res


def rss_run(root: Path, epochs: int) -> list[dict[str, int]]:
    """RSS of this process after each cold epoch of one loader (closed between epochs to unmap the shards)."""
    out = []
    paths = files_of(root)
    ld = fastdata.loader(root, BATCH, shuffle=True, device="cpu")
    for _ in range(epochs):
        ld.close()
        cold(paths)
        for _b in ld:
            pass
        out.append(rss_kib())
    ld.close()
    return out


def write_photos(root: Path, n: int, sides: tuple[int, int]) -> list[tuple[int, int]]:
    """``n`` JPEG photos (quality 90) of natural-looking images in class folders, each of its own size."""
    from PIL import Image

    rng = np.random.default_rng(2)
    lo, hi = sides
    sizes = []
    for i in range(n):
        h, w = (int(v) for v in rng.integers(lo, hi + 1, size=2))
        d = root / CLASSES[i % len(CLASSES)]
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(natural_image(rng, h, w)).save(d / f"{i:07d}.jpg", quality=90)
        sizes.append((h, w))
    return sizes


def photos(work: Path, n: int, rounds: int, sides: tuple[int, int] = PHOTO_SIDES) -> dict[str, Any]:
    """Photos of mixed sizes, cold: stored as raw pixels (ragged, each its own shape) against the same
    photos resized to one size of the same mean bytes, and as the JPEG files (decoded on read), with
    the random-pread ceiling at the mean raw photo's size; then the same passes on a warm cache."""
    sizes = write_photos(work / "photos", n, sides)
    mean_px = float(np.mean([h * w for h, w in sizes]))
    side = int(round(mean_px ** 0.5))
    opts = {"raw, mixed sizes": fastdata.ImageOptions(images="raw"),
            f"raw, one size ({side}x{side})": fastdata.ImageOptions(images="raw", size=(side, side)),
            "JPEG, mixed sizes (decoded)": fastdata.ImageOptions(images="encoded")}
    roots = {k: work / f"photos_{i}" for i, k in enumerate(opts)}
    for k, o in opts.items():
        fastdata.convert(work / "photos", roots[k], fastdata.ConvertConfig(images=o), progress=None)
    os.sync()
    raw_bytes = int(round(mean_px)) * 3
    fns: dict[str, Callable[[], dict[str, float]]] = {
        k: (lambda k=k: loader_pass(roots[k], True, uint8=True)) for k in opts}
    fns["raw, mixed sizes, shuffle='block'"] = lambda: loader_pass(roots["raw, mixed sizes"], "block", uint8=True)
    shard_files = files_of(roots["raw, mixed sizes"])
    for t in (16, 64, 128):
        fns[f"pread {raw_bytes} B, {t} threads, random"] = lambda t=t: pread_pass(shard_files, raw_bytes, t, True)
    fns[f"pread {raw_bytes} B, {HINTED}"] = lambda: pread_pass(shard_files, raw_bytes, 2, True, sink="ahead")
    runs = interleaved({k: (lambda f=f: with_requests(work, f)) for k, f in fns.items()}, rounds, seed=1)
    # MB/s of pixels delivered (decoded for JPEG); samples/s for the ceilings
    rows = both_units({k: median_of(v, "mb_per_s" if k.startswith("pread") else "samples_per_s")
                       for k, v in runs.items()}, raw_bytes)
    for k in opts:
        _harness.warm_page_cache(roots[k])
    warm = {k: median_of(v, "samples_per_s") for k, v in interleaved(
        {k: (lambda k=k: loader_pass(roots[k], True, uint8=True, warm=True)) for k in opts}, max(3, rounds // 4)).items()}
    best = max(v["mb_per_s"] for k, v in rows.items() if k.startswith("pread"))
    return {"n": n, "sides": list(sides), "mean_pixels": mean_px, "one_side": side, "mean_raw_bytes": raw_bytes,
            "dataset_bytes": {k: sum(f.stat().st_size for f in files_of(r)) for k, r in roots.items()},
            "rows": rows, "warm": warm,
            "ratios": {"raw mixed sizes, shuffle=True / best random pread at the mean photo's size":
                       rows["raw, mixed sizes"]["mb_per_s"] / best,
                       "raw mixed sizes / raw one size, shuffle=True (cold)":
                       rows["raw, mixed sizes"]["samples_per_s"] / rows[f"raw, one size ({side}x{side})"]["samples_per_s"],
                       "JPEG cold / JPEG warm (1: decoding, not the disk, is the limit)":
                       rows["JPEG, mixed sizes (decoded)"]["samples_per_s"] / warm["JPEG, mixed sizes (decoded)"]["samples_per_s"]}}


def photos_markdown(ph: dict[str, Any]) -> list[str]:
    mb = lambda v: f"{v:,.0f}"  # noqa: E731
    lo, hi = ph["sides"]
    return [
        f"Photos of mixed sizes, cold: {ph['n']} JPEGs (quality 90), height and width each drawn from {lo}-{hi} "
        f"pixels, mean {ph['mean_raw_bytes'] / 1e3:,.0f} kB of raw pixels; stored raw ({ph['dataset_bytes']['raw, mixed sizes'] / 1e9:.2f} GB), "
        f"raw resized to one size of the same mean pixels, and as the JPEG files "
        f"({ph['dataset_bytes']['JPEG, mixed sizes (decoded)'] / 1e9:.2f} GB). Loader: shuffle=True, uint8, defaults; "
        "MB/s are raw pixels delivered (decoded for JPEG).",
        "",
        _harness.markdown_table(["photos (cold)", "samples/s", "MB/s", "disk request, KiB", "resident before"],
                                [[k, mb(v["samples_per_s"]), mb(v["mb_per_s"]), mb(v.get("request_kib", 0)),
                                  f"{v['resident_before']:.3f}"] for k, v in ph["rows"].items()]),
        "",
        _harness.markdown_table(["photos (warm cache)", "samples/s"], [[k, mb(v["samples_per_s"])] for k, v in ph["warm"].items()]),
        "",
        _harness.markdown_table(["photos: ratio", "measured"], [[k, f"{v:.2f}"] for k, v in ph["ratios"].items()]),
    ]


def target_rows(res: dict[str, Any]) -> list[list[str]]:
    """The target table: each ratio of medians, and where measured the same ratio per round and from
    back-to-back pairs (:func:`per_round`, :func:`back_to_back`)."""
    rnd, b2b = res.get("targets_per_round", {}), res.get("targets_back_to_back", {})
    return [[k, f"{v:.2f}", f"{rnd[k]:.2f}" if k in rnd else "", f"{b2b[k]['median']:.2f}" if k in b2b else ""]
            for k, v in res["targets"].items()]


def markdown(res: dict[str, Any]) -> str:
    mb = lambda v: f"{v:,.0f}"  # noqa: E731
    rows = [[k, mb(v["samples_per_s"]), mb(v["mb_per_s"]), mb(v.get("request_kib", 0)), f"{v['resident_before']:.3f}",
             mb(sum(x or 0 for x in v.get("stalls_all", [])))]
            for k, v in [*res["rows"].items(), *res["ceilings"].items()]]
    q = res["shuffle_quality"]
    out = [
        f"Cold reads, {res['samples']} samples of float32 {tuple(res['shape'])} (Poisson counts), batch {res['batch']}; "
        f"HDF5 {res['dataset_bytes']['hdf5'] / 1e9:.2f} GB, lz4 {res['dataset_bytes']['hdf5_lz4'] / 1e9:.2f} GB "
        f"(ratio {res['ratio']['hdf5_lz4']}). Page cache emptied (POSIX_FADV_DONTNEED per file) before each pass; "
        f"the machine's whole page cache dropped at the start: {'yes' if res.get('whole_page_cache_dropped') else 'no'} "
        f"(memory then, MiB: {res.get('memory_mib_before', {})}). "
        f"Load average before {res['loadavg_before']}, after {res['loadavg_after']} "
        f"({res['machine']['usable_cores']} cores).",
        "",
        _harness.markdown_table(["reader (cold)", "samples/s", "MB/s (decoded)", "disk request, KiB", "resident before",
                                 "memory stalls, all passes"], rows),
        "",
        _harness.markdown_table(["shuffle", "mixing (1 = uniform)", "shards per batch", "stored runs per batch"],
                                [[k, f"{v['mixing']:.3f}", f"{v['shards_per_batch']:.1f}",
                                  f"{v.get('runs_per_batch', 0):.1f}"] for k, v in q.items()]),
        "",
        _harness.markdown_table(["warm cache", "samples/s"], [[k, mb(v["samples_per_s"])] for k, v in res["warm"].items()]),
        "",
        _harness.markdown_table(["raw images (cold, uint8)", "ratio", "samples/s"],
                                [[k, res["ratio"][k], mb(v["samples_per_s"])] for k, v in res["images"].items()]),
        "",
        _harness.markdown_table(["target", "measured (ratio of the medians)", "median of each round's ratio",
                                 "back-to-back pairs: median ratio"], target_rows(res)),
        "",
        "RssAnon after each cold epoch (MiB): " + ", ".join(f"{r['RssAnon'] / 1024:.0f}" for r in res["rss"]),
    ]
    if "photos" in res:
        out += ["", *photos_markdown(res["photos"])]
    a = res.get("after_same_pattern")
    if a and a["after_streams"] is not None and a["after_other"] is not None:
        out += ["", f"Passes ran in a new random order each round. The ceiling's parallel streams right after another "
                f"streams pass: median {a['after_streams']:,.0f} MB/s ({a['n_after_streams']} passes); after any other "
                f"pass: {a['after_other']:,.0f} MB/s ({a['n_after_other']})."]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small run (seconds): checks the script, not the disk")
    p.add_argument("--samples", type=int, default=None, help="FLIM-like samples (default 2000; quick 48)")
    p.add_argument("--rss-epochs", type=int, default=None, help="cold epochs for the RSS check (default 20; quick 2)")
    p.add_argument("--rounds", type=int, default=None, help="passes of each reader, interleaved (default 3; quick 1)")
    p.add_argument("--dir", default=None, help="work folder on the disk to measure (default: a temporary folder)")
    p.add_argument("--out", default=str(_harness.DEFAULT_RESULTS_DIR), help="results folder")
    p.add_argument("--keep-page-cache", action="store_true",
                   help="do not drop the machine's whole page cache at the start (done by default where allowed: root)")
    a = p.parse_args(argv)
    dropped = False if a.quick or a.keep_page_cache else drop_whole_page_cache()
    print(f"whole page cache dropped at the start: {'yes' if dropped else 'no'}; memory {memory_mib()}", flush=True)
    n = a.samples or (48 if a.quick else 2000)
    shape = QUICK_SHAPE if a.quick else SHAPE
    work = Path(tempfile.mkdtemp(prefix="bench_cold_", dir=a.dir))
    try:
        res = run(n, 32 if a.quick else 400, 64 if a.quick else 256, shape,
                  a.rss_epochs or (2 if a.quick else 20), a.rounds or (1 if a.quick else 3), work,
                  n_photos=24 if a.quick else 1500, photo_sides=(32, 96) if a.quick else PHOTO_SIDES)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res["whole_page_cache_dropped"] = dropped
    name = "cold_quick" if a.quick else "cold"
    ratios = {k: v for k, v in res["targets"].items() if "ceiling" in k}  # the rows measured against the disk
    ratios.update({f"photos: {k}": v for k, v in res["photos"]["ratios"].items() if "pread" in k})
    res["ceiling_check"] = _harness.check_ceiling("cold", ratios, quick=a.quick)
    md = markdown(res)
    _harness.write_results(name, res, md, a.out)
    print(md)
    return _harness.ceiling_exit(res["ceiling_check"])


if __name__ == "__main__":
    sys.exit(main())
