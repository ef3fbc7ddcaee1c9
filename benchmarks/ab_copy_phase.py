"""Paired A/B: batch buffers at the shard's address phase (loaders/host.py) vs plain buffers, warm LMDB.

Four data sets, each converted to LMDB: FLIM-like float32 samples (2, 256, 21, 21) (903 KB), 3-D volumes
float32 (1, 64, 64, 64) (1 MB), raw uint8 images (512, 512, 3) (786 KB) and (224, 224, 3) (151 KB), all in
records larger than the reader's gather size (so every record lies at one offset into its own pages). Each reading mode (2 threads = the default, 0 threads, 2 worker processes) is
timed with and without the phase ("off" = the readers report phase 0, as before this A/B), one epoch
per method per round, methods interleaved in rotating order after a warm-up round; samples/s median and
range over the rounds, and the per-round paired ratio.

Usage: python benchmarks/ab_copy_phase.py [--rounds N] [--workdir DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import DEFAULT_RESULTS_DIR, machine_info, markdown_table, paired_rounds, write_results  # noqa: E402

import fastdata  # noqa: E402
from fastdata.format import lmdb as lmdb_format  # noqa: E402
from fastdata.loaders import LoaderConfig  # noqa: E402

SETS = {"FLIM float32 (2,256,21,21)": ((2, 256, 21, 21), np.float32, 1500),
        "3-D volumes float32 (1,64,64,64)": ((1, 64, 64, 64), np.float32, 1200),
        "raw images uint8 (512,512,3)": ((512, 512, 3), np.uint8, 1500),
        "raw images uint8 (224,224,3)": ((224, 224, 3), np.uint8, 6000)}
MODES = {"2 threads": {}, "0 threads": {"num_workers": 0},
         "2 processes": {"num_workers": 2, "config": LoaderConfig(mode="processes")}}


def make_set(root: Path, shape: tuple[int, ...], dtype: Any, n: int,
             backends: tuple[str, ...] = ("lmdb",)) -> dict[str, Path]:
    """``n`` seeded samples (uniform bytes for uint8, standard normal otherwise) converted once per backend."""
    rng = np.random.default_rng(0)
    src = root / "npy"
    for i in range(n):
        d = src / f"c{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        x = rng.integers(0, 256, shape, dtype=np.uint8) if dtype == np.uint8 else rng.standard_normal(shape, dtype=np.float32)
        np.save(d / f"{i:06d}.npy", x)
    for be in backends:
        fastdata.convert(src, root / be, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=be)))
    shutil.rmtree(src)
    return {be: root / be for be in backends}


def loader(path: Path, phase: bool, kw: dict[str, Any]) -> Any:
    real = lmdb_format.ShardReader.copy_phase
    if not phase:
        lmdb_format.ShardReader.copy_phase = lambda self, name: 0  # type: ignore[method-assign]
    try:
        return fastdata.loader(path, 64, device="cpu", **kw)  # buffers and ring are laid out here
    finally:
        lmdb_format.ShardReader.copy_phase = real  # type: ignore[method-assign]


def epoch(ld: Any) -> int:
    return sum(len(b["label"]) for b in ld)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(dir=args.workdir))
    try:
        paths = {name: make_set(work / f"set{k}", *spec)["lmdb"] for k, (name, spec) in enumerate(SETS.items())}
        loaders = {(s, m, ph): loader(p, ph, kw) for s, p in paths.items() for m, kw in MODES.items() for ph in (True, False)}
        rates = paired_rounds({k: partial(epoch, ld) for k, ld in loaders.items()}, args.rounds)
        phases = {s: loaders[(s, "2 threads", True)].dataset.readers[0].copy_phase("x") for s in paths}
        for ld in loaders.values():
            ld.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows, out = [], []
    for s in paths:
        for m in MODES:
            on, off = rates[(s, m, True)], rates[(s, m, False)]
            paired = [a / b for a, b in zip(on, off)]
            rows.append([s, m, f"{statistics.median(on):,.0f} ({min(on):,.0f}-{max(on):,.0f})",
                         f"{statistics.median(off):,.0f} ({min(off):,.0f}-{max(off):,.0f})",
                         f"{statistics.median(on) / statistics.median(off):.2f}",
                         f"{min(paired):.2f}-{max(paired):.2f}"])
            out.append({"set": s, "mode": m, "phase_on": on, "phase_off": off, "paired_ratios": paired})
    table = markdown_table(["data set (LMDB)", "mode", "phase on: samples/s (range)", "phase off: samples/s (range)",
                            "on / off (medians)", "paired ratio range"], rows)
    md = (f"# Copy phase A/B (benchmarks/ab_copy_phase.py, {args.rounds} rounds, warm, batch 64)\n\n"
          f"Sample field phase (mod 64) in LMDB's map: {phases}.\n\n{table}\n")
    write_results("copy_phase_ab", {"machine": machine_info(), "rounds": args.rounds, "phases": phases, "rows": out}, md, args.out)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
