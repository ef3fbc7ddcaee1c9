"""Benchmark the cost of extra per-sample fields and keys, and the time to plan sampled epochs.

Usage::

    python benchmarks/bench_fields.py [--quick] [--samples N] [--out DIR] [--workdir DIR]

1. Fields: N raw 256x256 RGB images (PNG files converted with ``--images raw --size 256 256``)
   with a metadata table giving keypoints ``(17, 3)`` and angles ``(3,)``; every sample is keyed
   by its file path. One dataset, read two ways, in interleaved rounds on the same batches of 64
   random indices: images alone (``fields=["image"]``) against images + keypoints + angles + keys
   (``fields=["image", "keypoints", "angles", "key"]``). Timed twice: ``get_batch`` (the read
   itself, the strictest comparison) and full loader epochs (``fastdata.loader``, CPU, 2 reader
   threads, which also turns the images into float tensors; epochs alternate which goes first;
   wall time and the process's CPU time, the steadier figure on a shared machine). The figure is
   time per sample and the ratio "with fields / images alone" (target: at most 1.10).
2. Planning: one epoch of a 10-million-sample dataset with 1000 classes: ``Weighted("balanced")``,
   ``Weighted(weights)`` with random weights, and ``Episodic(5 way, 5 shot, 15 query)`` (100 000
   episodes), each as the loader plans it (the sampler's draws and this rank's share of 8 ranks:
   ``fastdata.reading.samplers.world_batches`` and ``rank_batches``, what ``Loader.plan`` runs).
   Median of 3 epochs, wall time and this process's CPU time (the machine is shared:
   wall time includes waiting for a core). Binding (reading the classes once, when the loader is
   built) is shown apart. Target: under 1 s.

Results go to stdout (markdown) and ``<out>/fields[_quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from _harness import DEFAULT_RESULTS_DIR, machine_info, markdown_table, warm_page_cache, write_results
from PIL import Image

import fastdata
from fastdata.reading.samplers import Episodic, Weighted, rank_batches, world_batches
from fastdata.world import World

BATCH = 64
SIDE = 256
PLAN_N = 10_000_000
PLAN_CLASSES = 1000
TARGET_RATIO = 1.10
TARGET_PLAN_S = 1.0
FIELDS_ALL = ["image", "keypoints", "angles", "key"]


def make_source(root: Path, n: int) -> None:
    """n PNG images (smooth gradients with noise: quick to encode) and a CSV with keypoints and angles."""
    rng = np.random.default_rng(0)
    (root / "img").mkdir(parents=True)
    yy, xx = np.mgrid[0:SIDE, 0:SIDE]
    rows = []
    for i in range(n):
        base = (xx + yy + 7 * i) % 256
        img = np.stack([base, base[::-1], (base // 2 + i) % 256], axis=2).astype(np.uint8)
        img[rng.integers(0, SIDE, 64), rng.integers(0, SIDE, 64)] = rng.integers(0, 256, (64, 3), dtype=np.uint8)
        rel = f"img/{i:06d}.png"
        Image.fromarray(img).save(root / rel, compress_level=1)
        kp = np.concatenate([rng.random((17, 2)) * SIDE, rng.integers(0, 3, (17, 1))], axis=1)
        rows.append({"path": rel, "keypoints": json.dumps(np.round(kp, 2).tolist()),
                     "angles": json.dumps(np.round(rng.random(3) * 180 - 90, 3).tolist())})
    with open(root / "meta.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def bench_reads(dst: Path, n: int, repeats: int, epochs: int) -> dict[str, Any]:
    """get_batch and loader epochs: images alone against images + keypoints + angles + keys."""
    alone = fastdata.open(dst, fields=["image"])
    full = fastdata.open(dst, fields=FIELDS_ALL)
    a, f = "images alone", "images + keypoints + angles + keys"
    rng = np.random.default_rng(1)
    batches = [rng.choice(n, size=BATCH, replace=False) for _ in range(repeats + 8)]
    # the same batch read both ways back to back (which goes first alternates): the median of the
    # per-batch ratios cancels the drift of a shared machine
    for i in range(8):  # warm-up
        alone.get_batch(batches[i])
        full.get_batch(batches[i])
    times: dict[str, list[float]] = {a: [], f: []}
    for i in range(8, 8 + repeats):
        for name, ds in ([(a, alone), (f, full)] if i % 2 else [(f, full), (a, alone)]):
            t0 = time.perf_counter()
            ds.get_batch(batches[i])
            times[name].append(time.perf_counter() - t0)
    rows = {k: statistics.median(v) / BATCH for k, v in times.items()}
    got: dict[str, Any] = {"get_batch_paired_ratio": statistics.median(x / y for x, y in zip(times[f], times[a]))}
    # the parts apart, in CPU time (steadier on a shared machine): get_batch reads each field on its
    # own, so images + (keypoints, angles, keys) is what the extra fields add to the images
    extras = fastdata.open(dst, fields=["keypoints", "angles", "key"])
    for name, ds, reps in (("images", alone, repeats), ("extras", extras, 4 * repeats)):
        for i in range(8):
            ds.get_batch(batches[i])
        c0, t0 = time.process_time(), time.perf_counter()
        for i in range(reps):
            ds.get_batch(batches[8 + i % repeats])
        got[f"{name}_cpu_s_per_sample"] = (time.process_time() - c0) / reps / BATCH
        got[f"{name}_wall_s_per_sample"] = (time.perf_counter() - t0) / reps / BATCH

    # loader epochs, alternating which goes first; wall time and this process's CPU time (all its
    # threads): on a shared machine the CPU time is the steadier figure
    loaders = {a: fastdata.loader(alone, BATCH, device="cpu", num_workers=2, seed=0),
               f: fastdata.loader(full, BATCH, device="cpu", num_workers=2, seed=0)}
    walls: dict[str, list[float]] = {a: [], f: []}
    cpus: dict[str, list[float]] = {a: [], f: []}
    for i in range(epochs + 1):
        for name in ([a, f] if i % 2 else [f, a]):
            ld = loaders[name]
            ld.set_epoch(i)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in ld:
                pass
            if i:  # epoch 0 warms up
                walls[name].append(time.perf_counter() - t0)
                cpus[name].append(time.process_time() - c0)
    for ld in loaders.values():
        ld.close()
    per = {k: statistics.median(v) / n for k, v in walls.items()}
    per_cpu = {k: statistics.median(v) / n for k, v in cpus.items()}
    # epochs i of both ran back to back: the median of their ratios cancels the machine's drift
    paired = {"wall": statistics.median(x / y for x, y in zip(walls[f], walls[a])),
              "cpu": statistics.median(x / y for x, y in zip(cpus[f], cpus[a]))}
    return {"get_batch_s_per_sample": rows, "loader_s_per_sample": per, "loader_cpu_s_per_sample": per_cpu,
            "loader_paired_ratio": paired,
            "get_batch_raw": got, "loader_wall_epochs": walls, "loader_cpu_epochs": cpus}


def bench_planning(n: int, classes: int, epochs: int = 3) -> list[dict[str, Any]]:
    """Bind once, then plan ``epochs`` epochs the way the loader does; median wall and CPU seconds."""
    codes = np.random.default_rng(2).integers(0, classes, n)
    weights = np.random.default_rng(3).random(n)
    world = World(0, 8)
    cases: list[tuple[str, Callable[[], Any]]] = [
        (f"Weighted('balanced'), {n:,} draws, batch 256", lambda: Weighted("balanced").prepare(n, codes, 256)),
        (f"Weighted(weights), {n:,} draws, batch 256", lambda: Weighted(weights).prepare(n, None, 256)),
        (f"Episodic(5 way, 5 shot, 15 query), {n // 100:,} episodes", lambda: Episodic(5, 5, 15).prepare(codes)),
    ]
    out = []
    for name, bind in cases:
        t0, c0 = time.perf_counter(), time.process_time()
        sampler = bind()
        bind_wall, bind_cpu = time.perf_counter() - t0, time.process_time() - c0
        walls, cpus, drawn = [], [], 0
        for epoch in range(epochs):
            t0, c0 = time.perf_counter(), time.process_time()
            mine = rank_batches(world_batches(sampler, n, world, 0, epoch), world, False)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            drawn = sum(len(b) for b in mine) * world.size
        out.append({"sampler": name, "samples": n, "drawn_all_ranks": drawn, "bind_wall_s": bind_wall,
                    "bind_cpu_s": bind_cpu, "plan_wall_s": statistics.median(walls),
                    "plan_cpu_s": statistics.median(cpus), "plan_wall_all": walls, "plan_cpu_all": cpus})
        del sampler
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (CI smoke run)")
    ap.add_argument("--samples", type=int, default=None, help="images in the fields dataset (default 1024)")
    ap.add_argument("--out", default=str(DEFAULT_RESULTS_DIR))
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    n = args.samples or (64 if args.quick else 1024)
    plan_n = 200_000 if args.quick else PLAN_N
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fastdata-bench-fields-"))
    try:
        src, dst = work / "src", work / "ds"
        if not (dst / "manifest.json").exists():
            shutil.rmtree(work / "src", ignore_errors=True)
            make_source(src, n)
            fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=2), images=fastdata.ImageOptions(images="raw", size=(SIDE, SIDE)), meta_types={"keypoints": fastdata.converters.ColumnType("float32", (17, 3))}, keypoints=("keypoints",)), meta=src / "meta.csv")
        warm_page_cache(dst)
        reads = bench_reads(dst, n, repeats=20 if args.quick else 400, epochs=2 if args.quick else 30)
        plans = bench_planning(plan_n, PLAN_CLASSES if not args.quick else 100)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)

    gb, ld, lc = reads["get_batch_s_per_sample"], reads["loader_s_per_sample"], reads["loader_cpu_s_per_sample"]
    a, f = "images alone", "images + keypoints + angles + keys"
    pr = reads["loader_paired_ratio"]
    gr = reads["get_batch_raw"]["get_batch_paired_ratio"]
    read_rows = [["get_batch (batch 64, random), wall", f"{gb[a] * 1e6:.1f}", f"{gb[f] * 1e6:.1f}", f"{gr:.3f}"],
                 ["loader epoch (CPU device, 2 threads), wall", f"{ld[a] * 1e6:.1f}", f"{ld[f] * 1e6:.1f}",
                  f"{pr['wall']:.3f}"],
                 ["loader epoch, process CPU time", f"{lc[a] * 1e6:.1f}", f"{lc[f] * 1e6:.1f}", f"{pr['cpu']:.3f}"]]
    raw = reads["get_batch_raw"]
    ic, ec = raw["images_cpu_s_per_sample"], raw["extras_cpu_s_per_sample"]
    read_rows.append(["get_batch CPU time, parts apart (images; keypoints + angles + keys read alone, added)",
                      f"{ic * 1e6:.2f}", f"{(ic + ec) * 1e6:.2f}", f"{(ic + ec) / ic:.3f}"])
    plan_rows = [[p["sampler"], f"{p['plan_wall_s']:.3f}", f"{p['plan_cpu_s']:.3f}", f"{p['bind_wall_s']:.3f}",
                  f"{p['bind_cpu_s']:.3f}"] for p in plans]
    md = "\n".join([
        f"# Extra fields and sampled epochs ({'quick' if args.quick else 'full'} run)",
        "",
        f"Command: `python benchmarks/bench_fields.py{' --quick' if args.quick else ''}`",
        "",
        f"## Reading {n} raw {SIDE}x{SIDE} images: alone vs with keypoints (17, 3), angles (3,) and keys",
        "",
        markdown_table(["read", "images alone, us/sample", "with fields + keys, us/sample", "ratio"], read_rows),
        "",
        f"Target: ratio at most {TARGET_RATIO:.2f}. Ratio: the median, over batches (get_batch) or epochs "
        "(loader), of the ratio of the two ways run back to back on the same data, which one first "
        "alternating; columns 2-3 are medians.",
        "",
        f"## Planning one epoch of {plan_n:,} samples, {PLAN_CLASSES if not args.quick else 100} classes (rank 0 of 8)",
        "",
        markdown_table(["sampler", "plan wall s", "plan CPU s", "bind wall s", "bind CPU s"], plan_rows),
        "",
        f"Target: plan under {TARGET_PLAN_S:.0f} s. Medians of 3 epochs; CPU s is this process's own time "
        "(the machine is shared, so wall time includes waiting for a core).",
    ])
    print(md)
    write_results("fields_quick" if args.quick else "fields",
                  {"machine": machine_info(), "samples": n, "reads": reads, "planning": plans}, md, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
