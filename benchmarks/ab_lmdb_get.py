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
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import paired_rounds, ratio_quartiles  # noqa: E402

import fastdata  # noqa: E402
from fastdata.format import lmdb as lmdb_format  # noqa: E402


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


def paired_get_batch(path: Path, n: int, rounds: int, use: dict[str, Callable[[], None]]) -> dict[str, list[float]]:
    """Samples/s of ``get_batch`` passes (3 epochs of random batches of 64) per variant, paired by round;
    ``use[name]()`` switches to a variant (the first is switched back at the end)."""
    ds = fastdata.open(path)
    plan = [np.sort(p) for p in np.array_split(np.random.default_rng(1).permutation(n), n // 64)]

    def one(name: str) -> Callable[[], int]:
        def run() -> int:
            use[name]()
            for _ in range(3):
                for p in plan:
                    ds.get_batch(p)
            return 3 * n

        return run

    try:
        return paired_rounds({k: one(k) for k in use}, rounds)
    finally:
        next(iter(use.values()))()


def report(label: str, rates: dict[str, list[float]]) -> None:
    """Each variant's samples/s, and the paired ratio of the first variant over the second."""
    for k, v in rates.items():
        print(f"{label}, {k}: {statistics.median(v):,.0f} samples/s ({min(v):,.0f}-{max(v):,.0f})")
    a, b = rates.values()
    q1, med, q3 = ratio_quartiles(a, b)
    ratios = [x / y for x, y in zip(a, b)]
    print(f"{label}, paired {' / '.join(rates)}: median {med:.3f}, quartiles {q1:.3f}-{q3:.3f}, "
          f"range {min(ratios):.3f}-{max(ratios):.3f}", flush=True)


def measure(path: Path, n: int, rounds: int) -> dict[str, list[float]]:
    loop = lmdb_format.ShardReader._get_many

    def use(fn: Any) -> Callable[[], None]:
        return lambda: setattr(lmdb_format.ShardReader, "_get_many", fn)

    return paired_get_batch(path, n, rounds, {"txn.get loop": use(loop), "getmulti": use(getmulti)})


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
            report(label, measure(work / f"{kind}.lmdb", n, args.rounds))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
