"""Paired A/B: LMDB's small-record path (fixed-size records up to 64 KiB joined into one array, headers checked
vectorised: ``ShardReader._read_small``) against the general path (per record and field) on two data sets:
20,000 uint8 images (32, 32, 3) and 20,000 float32 vectors (1024,), each with an int64 label. ``get_batch``
epochs of random batches of 64, the two alternating in order per round; prints the paired ratio small / general.

Usage: python benchmarks/ab_lmdb_small.py [--rounds N]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_lmdb_get import paired_get_batch, report  # noqa: E402

import fastdata  # noqa: E402
from fastdata.format import lmdb as lmdb_format  # noqa: E402

N = 20_000


def make(src: Path, kind: str) -> None:
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, (N, 32, 32, 3), dtype=np.uint8) if kind == "img"
         else rng.standard_normal((N, 1024)).astype(np.float32))
    src.mkdir()
    np.save(src / "X.npy", x)
    np.save(src / "y.npy", rng.integers(0, 10, N).astype(np.int64))


def measure(path: Path, rounds: int) -> dict[str, list[float]]:
    def limit(n: int) -> Callable[[], None]:
        return lambda: setattr(lmdb_format, "_GATHER_RECORD_BYTES", n)

    return paired_get_batch(path, N, rounds, {"small-record path": limit(lmdb_format._GATHER_RECORD_BYTES),
                                              "general path": limit(-1)})


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
            report(label, measure(work / f"{kind}.lmdb", args.rounds))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
