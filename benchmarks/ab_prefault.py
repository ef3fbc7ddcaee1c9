"""Paired A/B of the write engine's prefault (``fileio.prefault``: a block's memory-mapped pages mapped in one
``MADV_POPULATE_READ`` call before it is written) on two Hugging Face datasets: bench_convert_objects.py's
Array2D(128, 128) float32 rows and Array3D(96, 96, 3) uint8 images, each written by ``datasets`` a record batch
at a time (its Arrow cache then lies in the page cache in small pieces).

Each round converts each dataset with and without prefault (order rotating; bench_convert_objects.py's config:
2 workers, HDF5, default shard size); figure: per round, seconds without / seconds with (above 1: prefault helps),
median, quartiles and range. Results: ``<out>/prefault_ab.{json,md}``.

Usage: python benchmarks/ab_prefault.py [--rounds R] [--rows N] [--out DIR] [--workdir DIR]
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
from _harness import DEFAULT_RESULTS_DIR, machine_info, markdown_table, warm_page_cache, write_results
from bench_convert_objects import _config, make_hf, run_rounds

import fastdata
from fastdata.write import shard_task

PREFAULT = shard_task.prefault
IMAGE = (96, 96, 3)


def make_images(root: Path, n: int) -> Any:
    import datasets

    feats = datasets.Features({"x": datasets.Array3D(IMAGE, "uint8"), "label": datasets.Value("int64")})

    def rows() -> Any:
        rng = np.random.default_rng(2)
        for i in range(n):
            yield {"x": rng.integers(0, 256, IMAGE, dtype=np.uint8), "label": i}

    datasets.Dataset.from_generator(rows, features=feats, cache_dir=str(root / "icache")).save_to_disk(str(root / "img"))
    return datasets.load_from_disk(str(root / "img"))


def _variant(hf: Any, out: Path, prefault: bool) -> Callable[[], Any]:
    def run() -> Any:
        shard_task.prefault = PREFAULT if prefault else (lambda a: None)  # (forked workers inherit it)
        try:
            return fastdata.convert(hf, out, _config())
        finally:
            shard_task.prefault = PREFAULT
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--rows", type=int, default=6000)
    ap.add_argument("--out", default=str(DEFAULT_RESULTS_DIR))
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ab-prefault-", dir=args.workdir))
    try:
        sets = {"Hugging Face Array2D(128, 128) float32": make_hf(work, args.rows),
                "Hugging Face Array3D(96, 96, 3) uint8": make_images(work, 3 * args.rows)}
        warm_page_cache(work / "hf", work / "img")
        fns = {f"{name} | {'with' if p else 'without'} prefault": _variant(hf, work / f"out{k}{int(p)}", p)
               for k, (name, hf) in enumerate(sets.items()) for p in (True, False)}
        times, cpu = run_rounds(fns, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for name in sets:
        w, wo = times[f"{name} | with prefault"], times[f"{name} | without prefault"]
        r = sorted(b / a for a, b in zip(w, wo))
        rows.append([name, f"{statistics.median(w):.3f}", f"{statistics.median(wo):.3f}",
                     f"{statistics.median(r):.2f} (quartiles {r[len(r) // 4]:.2f}-{r[3 * len(r) // 4]:.2f}, "
                     f"range {r[0]:.2f}-{r[-1]:.2f}, above 1 in {sum(v > 1 for v in r)}/{len(r)})"])
    md = (f"# Prefault A/B ({args.rounds} paired rounds)\n\nCommand: `python benchmarks/ab_prefault.py "
          f"{' '.join(sys.argv[1:])}`\n\n"
          + markdown_table(["dataset", "with prefault: median s", "without: median s",
                            "seconds without / with, per round"], rows) + "\n")
    write_results("prefault_ab", {"machine": machine_info(), "rounds": args.rounds, "seconds": times,
                                  "cpu_seconds": cpu}, md, args.out)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
