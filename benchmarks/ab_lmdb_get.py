"""Paired A/B: LMDB records of a batch fetched by a loop of ``txn.get`` (fastdata.format.lmdb's ``_get_many``)
against one ``Cursor.getmulti``, on 6,000 ragged float32 sequences (10-100 rows of 16): ``get_batch`` epochs of
random batches of 64, the two alternating in order per round. Prints the paired ratio (loop / getmulti).

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

N = 6000


def getmulti(self: Any, txn: Any, local: np.ndarray) -> list[Any]:
    raw = (local.astype(np.int64) + self.info.stored_start).astype(">u8").tobytes()
    return [v for _, v in txn.cursor().getmulti([raw[k : k + 8] for k in range(0, len(raw), 8)])]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    try:
        rng = np.random.default_rng(0)
        src = work / "seq"
        src.mkdir()
        for i in range(N):
            np.save(src / f"{i:06d}.npy", rng.standard_normal((int(rng.integers(10, 101)), 16)).astype(np.float32))
        fastdata.convert(src, work / "lmdb", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb"),
                                                                    no_labels=True))
        ds = fastdata.open(work / "lmdb")
        plan = [np.sort(p) for p in np.array_split(np.random.default_rng(1).permutation(N), N // 64)]
        variants = {"txn.get loop": lmdb_format.ShardReader._get_many, "getmulti": getmulti}
        rates: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(args.rounds + 1):
            for name in list(variants) if r % 2 else list(variants)[::-1]:
                lmdb_format.ShardReader._get_many = variants[name]  # type: ignore[method-assign]
                t0 = time.perf_counter()
                for _ in range(3):
                    for p in plan:
                        ds.get_batch(p)
                if r:  # round 0 warms up
                    rates[name].append(3 * N / (time.perf_counter() - t0))
        lmdb_format.ShardReader._get_many = variants["txn.get loop"]  # type: ignore[method-assign]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for k, v in rates.items():
        print(f"{k}: {statistics.median(v):,.0f} samples/s ({min(v):,.0f}-{max(v):,.0f})")
    ratios = [a / b for a, b in zip(rates["txn.get loop"], rates["getmulti"])]
    print(f"paired loop / getmulti: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
