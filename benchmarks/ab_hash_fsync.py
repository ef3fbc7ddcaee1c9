"""Paired A/B: each shard hashed while the disk writes it back (fsync in a thread, as fastdata does) vs
fsync first, then the hash (the plain order).

Two folders converted with ``fastdata convert`` defaults (HDF5, 2 worker processes): FLIM-like float32
samples (2, 256, 21, 21) and raw uint8 images (256, 256, 3). Each round converts each folder once per arm
(arms alternating, the first arm rotating by round) into a fresh destination; seconds per conversion,
median and range over the rounds, and the per-round paired ratio.

Usage: python benchmarks/ab_hash_fsync.py [--rounds N] [--workdir DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import DEFAULT_RESULTS_DIR, machine_info, markdown_table, write_results  # noqa: E402
from bench_cold import flim_sample, natural_image, write_folder  # noqa: E402

import fastdata  # noqa: E402
import fastdata.write.shard_task as shard_task  # noqa: E402

SETS: dict[str, tuple[int, Callable[[np.random.Generator, int], np.ndarray]]] = {
    "FLIM float32 (2,256,21,21)": (1200, lambda rng, c: flim_sample(rng, (2, 256, 21, 21), c)),
    "raw images uint8 (256,256,3)": (4000, lambda rng, c: natural_image(rng, 256)),
}


class _Inline:
    """An executor that runs each call at once: fsync, then the hash."""

    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def __enter__(self) -> "_Inline":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        f: Future = Future()
        f.set_result(fn(*args))
        return f


def convert(src: Path, dst: Path, overlap: bool) -> float:
    real = shard_task.ThreadPoolExecutor
    if not overlap:
        shard_task.ThreadPoolExecutor = _Inline  # type: ignore[misc, assignment]  # (forked workers inherit it)
    try:
        t0 = time.perf_counter()
        fastdata.convert(src, dst, fastdata.ConvertConfig(overwrite=True), progress=None)
        return time.perf_counter() - t0
    finally:
        shard_task.ThreadPoolExecutor = real  # type: ignore[misc]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.workdir))
    times: dict[tuple[str, bool], list[float]] = {}
    try:
        srcs = {}
        for k, (name, (n, make)) in enumerate(SETS.items()):
            srcs[name] = work / f"src{k}"
            write_folder(srcs[name], n, make, seed=k)
        for r in range(args.rounds + 1):
            for name, src in srcs.items():
                arms = (True, False) if r % 2 == 0 else (False, True)
                for overlap in arms:
                    dt = convert(src, work / "out", overlap)
                    if r:  # round 0 warms the sources' page cache
                        times.setdefault((name, overlap), []).append(dt)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows, out = [], []
    for name in SETS:
        on, off = times[(name, True)], times[(name, False)]
        paired = [b / a for a, b in zip(on, off)]  # > 1: overlapping is faster
        rows.append([name, f"{statistics.median(on):.2f} ({min(on):.2f}-{max(on):.2f})",
                     f"{statistics.median(off):.2f} ({min(off):.2f}-{max(off):.2f})",
                     f"{statistics.median(off) / statistics.median(on):.2f}", f"{min(paired):.2f}-{max(paired):.2f}"])
        out.append({"set": name, "overlap_s": on, "sequential_s": off, "paired_speedup": paired})
    table = markdown_table(["folder (fastdata convert defaults)", "hash while fsync: s (range)", "fsync, then hash: s (range)",
                            "speed-up (medians)", "paired speed-up range"], rows)
    md = f"# Hash while fsync A/B (benchmarks/ab_hash_fsync.py, {args.rounds} rounds)\n\n{table}\n"
    write_results("hash_fsync_ab", {"machine": machine_info(), "rounds": args.rounds, "rows": out}, md, args.out)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
