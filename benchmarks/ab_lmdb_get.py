"""Paired A/B: LMDB records of a batch fetched by a loop of ``txn.get`` (fastdata.format.lmdb's ``_get_many``)
against one ``Cursor.getmulti``, on two data sets: 6,000 ragged float32 sequences (10-100 rows of 16) and 20,000 small
fixed uint8 images (32, 32, 3) (the small-record path): ``get_batch`` epochs of random batches of 64, the two
alternating in order per round. Prints the paired ratio (loop / getmulti) per set.

Usage: python benchmarks/ab_lmdb_get.py [--rounds N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import fastdata
from fastdata.format import lmdb as lmdb_format


def getmulti(self: Any, txn: Any, local: np.ndarray) -> list[Any]:
    raw = (local.astype(np.int64) + self.info.stored_start).astype(">u8").tobytes()
    return [v for _, v in txn.cursor().getmulti([raw[k : k + 8] for k in range(0, len(raw), 8)])]


def make(src: Path, kind: str) -> int:
    rng = np.random.default_rng(0)
    src.mkdir()
    n = 6000 if kind == "seq" else 20000
    for i in range(n):
        x = (rng.standard_normal((int(rng.integers(10, 101)), 16)).astype(np.float32) if kind == "seq"
             else rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
        np.save(src / f"{i:06d}.npy", x)
    return n


def measure(path: Path, n: int, rounds: int) -> dict[str, list[float]]:
    ds = fastdata.open(path)
    plan = [np.sort(p) for p in np.array_split(np.random.default_rng(1).permutation(n), n // 64)]
    variants = {"txn.get loop": lmdb_format.ShardReader._get_many, "getmulti": getmulti}
    rates: dict[str, list[float]] = {k: [] for k in variants}
    try:
        for r in range(rounds + 1):
            for name in list(variants) if r % 2 else list(variants)[::-1]:
                lmdb_format.ShardReader._get_many = variants[name]  # type: ignore[method-assign]
                t0 = time.perf_counter()
                for _ in range(3):
                    for p in plan:
                        ds.get_batch(p)
                if r:  # round 0 warms up
                    rates[name].append(3 * n / (time.perf_counter() - t0))
    finally:
        lmdb_format.ShardReader._get_many = variants["txn.get loop"]  # type: ignore[method-assign]
    return rates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    try:
        for kind, label in (("seq", "ragged sequences"), ("img", "small fixed images (32, 32, 3)")):
            n = make(work / kind, kind)
            fastdata.convert(work / kind, work / f"{kind}.lmdb", fastdata.ConvertConfig(
                write=fastdata.WriteOptions(backend="lmdb"), no_labels=True))
            rates = measure(work / f"{kind}.lmdb", n, args.rounds)
            for k, v in rates.items():
                print(f"{label}, {k}: {statistics.median(v):,.0f} samples/s ({min(v):,.0f}-{max(v):,.0f})")
            ratios = sorted(a / b for a, b in zip(rates["txn.get loop"], rates["getmulti"]))
            q = len(ratios) // 4
            print(f"{label}, paired loop / getmulti: median {statistics.median(ratios):.3f}, quartiles "
                  f"{ratios[q]:.3f}-{ratios[-1 - q]:.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
