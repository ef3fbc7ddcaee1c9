"""Paired A/B: the loader's read-ahead on a warm page cache, on against off (``LoaderConfig(readahead=0)``).

bench_loader.py times the two one after the other in a fixed order (after the naive DataLoader's worker
processes); here the order rotates every round. Two data sets, each as HDF5 and LMDB shards: FLIM-like
float32 samples (2, 256, 21, 21) and raw uint8 images (224, 224, 3). Default reader threads, batch 64,
3 epochs per method per round after a warm-up round. Figure: the per-round paired ratio on / off, median,
interquartile range and range (1 = the read-ahead costs nothing warm).

Usage: python benchmarks/ab_warm_readahead.py [--rounds N] [--workdir DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import DEFAULT_RESULTS_DIR, machine_info, markdown_table, write_results  # noqa: E402
from ab_copy_phase import make_set  # noqa: E402

import fastdata  # noqa: E402
from fastdata.loaders import LoaderConfig  # noqa: E402

SETS = {"FLIM float32 (2,256,21,21)": ((2, 256, 21, 21), np.float32, 2000),
        "raw images uint8 (224,224,3)": ((224, 224, 3), np.uint8, 6000)}
EPOCHS = 3


def quartiles(v: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(v, n=4)
    return q[0], q[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.workdir))
    try:
        paths = {name: make_set(work / f"set{k}", *spec, backends=("hdf5", "lmdb")) for k, (name, spec) in enumerate(SETS.items())}
        loaders = {(s, be, on): fastdata.loader(p, 64, device="cpu", config=LoaderConfig() if on else LoaderConfig(readahead=0))
                   for s, bes in paths.items() for be, p in bes.items() for on in (True, False)}
        rates: dict[tuple[str, str, bool], list[float]] = {k: [] for k in loaders}
        keys = list(loaders)
        for r in range(args.rounds + 1):
            order = keys[r % len(keys):] + keys[: r % len(keys)]
            if r % 2:
                order.reverse()
            for k in order:
                t0 = time.perf_counter()
                n = sum(len(b["label"]) for _ in range(EPOCHS) for b in loaders[k])
                if r:  # round 0 warms the page cache, the threads and the buffers
                    rates[k].append(n / (time.perf_counter() - t0))
        for ld in loaders.values():
            ld.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows, out = [], []
    for s, bes in paths.items():
        for be in bes:
            on, off = rates[(s, be, True)], rates[(s, be, False)]
            paired = [a / b for a, b in zip(on, off)]
            q1, q3 = quartiles(paired)
            rows.append([s, be, f"{statistics.median(on):,.0f}", f"{statistics.median(off):,.0f}",
                         f"{statistics.median(paired):.2f}", f"{q1:.2f}-{q3:.2f}", f"{min(paired):.2f}-{max(paired):.2f}"])
            out.append({"set": s, "backend": be, "on": on, "off": off, "paired_ratios": paired})
    table = markdown_table(["data set", "shards", "on: samples/s", "off: samples/s", "on / off (median of paired)",
                            "interquartile range", "range"], rows)
    md = (f"# Read-ahead on a warm cache, A/B (benchmarks/ab_warm_readahead.py, {args.rounds} rounds of {EPOCHS} "
          f"epochs, order rotating, batch 64, default threads)\n\n{table}\n")
    write_results("warm_readahead_ab", {"machine": machine_info(), "rounds": args.rounds, "rows": out}, md, args.out)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
