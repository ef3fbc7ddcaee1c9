"""Paired A/B: LMDB's small-record path (fixed-size records up to 64 KiB joined into one array, headers checked
vectorised: ``ShardReader._read_small``) against the general path (per record and field) on two data sets:
20,000 uint8 images (32, 32, 3) and 20,000 float32 vectors (1024,), each with an int64 label. ``get_batch``
epochs of random batches of 64, the two alternating in order per round; prints the paired ratio small / general.

Usage: python benchmarks/ab_lmdb_small.py [--rounds N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import fastdata
from fastdata.format import lmdb as lmdb_format

N = 20_000


def make(src: Path, kind: str) -> None:
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, (N, 32, 32, 3), dtype=np.uint8) if kind == "img"
         else rng.standard_normal((N, 1024)).astype(np.float32))
    src.mkdir()
    np.save(src / "X.npy", x)
    np.save(src / "y.npy", rng.integers(0, 10, N).astype(np.int64))


def measure(path: Path, rounds: int) -> dict[str, list[float]]:
    ds = fastdata.open(path)
    plan = [np.sort(p) for p in np.array_split(np.random.default_rng(1).permutation(N), N // 64)]
    limits = {"small-record path": lmdb_format._GATHER_RECORD_BYTES, "general path": -1}
    rates: dict[str, list[float]] = {k: [] for k in limits}
    try:
        for r in range(rounds + 1):
            for name in list(limits) if r % 2 else list(limits)[::-1]:
                lmdb_format._GATHER_RECORD_BYTES = limits[name]
                t0 = time.perf_counter()
                for _ in range(3):
                    for p in plan:
                        ds.get_batch(p)
                if r:  # round 0 warms up
                    rates[name].append(3 * N / (time.perf_counter() - t0))
    finally:
        lmdb_format._GATHER_RECORD_BYTES = limits["small-record path"]
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    try:
        for kind, label in (("img", "uint8 images (32, 32, 3) + label"), ("vec", "float32 vectors (1024,) + label")):
            make(work / kind, kind)
            fastdata.convert(None, work / f"{kind}.lmdb", fastdata.ConvertConfig(
                write=fastdata.WriteOptions(backend="lmdb")), arrays={"x": work / kind / "X.npy",
                                                                      "label": work / kind / "y.npy"})
            rates = measure(work / f"{kind}.lmdb", args.rounds)
            for k, v in rates.items():
                print(f"{label}, {k}: {statistics.median(v):,.0f} samples/s ({min(v):,.0f}-{max(v):,.0f})")
            ratios = sorted(a / b for a, b in zip(rates["small-record path"], rates["general path"]))
            q = len(ratios) // 4
            print(f"{label}, paired small / general: median {statistics.median(ratios):.3f}, quartiles "
                  f"{ratios[q]:.3f}-{ratios[-1 - q]:.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
