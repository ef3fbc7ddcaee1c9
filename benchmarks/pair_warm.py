"""Warm reads of one tree's fastdata (``PYTHONPATH=<tree>``), for pairing two trees run alternately.

``make DIR``: FLIM-like float32 (2, 256, 21, 21) .npy folder (1,500 samples) converted to HDF5 and LMDB, and
6,000 ragged sequences (10-100, 16) float32 converted to LMDB. Then, one line of samples/s per call:

- ``loader DIR FORMAT [THREADS] [--no-readahead]``: ``fastdata.loader`` (batch 64, device cpu) over the FLIM set,
  5 rounds of 2 epochs after one warm-up epoch: the median round and the range;
- ``seq DIR``: ``Dataset.get_batch`` of random batches of 64 over the sequences, 7 epochs: the median.

Usage: python benchmarks/pair_warm.py make DIR; PYTHONPATH=<tree> python benchmarks/pair_warm.py loader DIR lmdb 0
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

import fastdata
from fastdata.demo import write_npy_folder
from fastdata.loaders import LoaderConfig


def make(root: Path) -> None:
    write_npy_folder(root / "npy", 1500, (2, 256, 21, 21))
    for be in ("hdf5", "lmdb"):
        fastdata.convert(root / "npy", root / be, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=be)), progress=None)
    rng = np.random.default_rng(8)
    (root / "seq_npy").mkdir(parents=True, exist_ok=True)
    for i in range(6000):
        np.save(root / "seq_npy" / f"{i:06d}.npy", rng.standard_normal((int(rng.integers(10, 101)), 16)).astype(np.float32))
    fastdata.convert(root / "seq_npy", root / "seq", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb")),
                     progress=None)


def loader(root: Path, fmt: str, threads: int | None, readahead: bool) -> str:
    kw: dict = {} if readahead else {"config": LoaderConfig(readahead=0)}
    if threads is not None:
        kw["num_workers"] = threads
    with fastdata.loader(root / fmt, 64, device="cpu", **kw) as ld:
        def epoch() -> int:
            return sum(b["x"].shape[0] for b in ld)

        epoch()
        rates = []
        for _ in range(5):
            t0 = time.perf_counter()
            n = epoch() + epoch()
            rates.append(n / (time.perf_counter() - t0))
    return f"{statistics.median(rates):.0f} ({min(rates):.0f}-{max(rates):.0f})"


def seq(root: Path) -> str:
    with fastdata.open(root / "seq") as ds:
        rng = np.random.default_rng(0)
        plan = [rng.permutation(len(ds))[a : a + 64] for a in range(0, len(ds), 64)]
        rates = []
        for k in range(8):
            t0 = time.perf_counter()
            for idx in plan:
                ds.get_batch(idx)
            if k:
                rates.append(len(ds) / (time.perf_counter() - t0))
    return f"{statistics.median(rates):.0f}"


if __name__ == "__main__":
    cmd, root = sys.argv[1], Path(sys.argv[2])
    if cmd == "make":
        make(root)
    elif cmd == "loader":
        rest = [a for a in sys.argv[4:] if a != "--no-readahead"]
        print(loader(root, sys.argv[3], int(rest[0]) if rest else None, "--no-readahead" not in sys.argv))
    else:
        print(seq(root))
