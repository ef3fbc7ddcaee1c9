"""Does ``fastdata tune`` pick settings at least as fast as the best hand-picked ones?

One run: 2,000 samples of float32 (2, 256, 21, 21) converted to HDF5; ``fastdata.measure.tune`` races
settings within a budget (60 s; 6 s with ``--quick``); then the winner and a grid of hand-picked settings (threads 0/1/2/4
x prefetch 2/4/8) are measured as the race measures them (``fastdata.measure.tune.measure_setting``:
``fastdata.measure.bench.measure``, what ``fastdata bench`` runs),
for 2 s each (0.3 s with ``--quick``), in interleaved rounds; the figure is the median round.
Usage: python benchmarks/bench_tune.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

import fastdata  # noqa: E402
from fastdata.measure.tune import measure_setting, tune  # noqa: E402

SHAPE = (2, 256, 21, 21)
BATCH = 64


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small dataset, short budget (CI smoke run)")
    p.add_argument("--out", default=str(_harness.DEFAULT_RESULTS_DIR))
    a = p.parse_args(argv)
    n, budget, seconds, rounds = (256, 6.0, 0.3, 2) if a.quick else (2000, 60.0, 2.0, 3)
    work = Path(tempfile.mkdtemp(prefix="fastdata-bench-tune-"))
    try:
        rng = np.random.default_rng(0)
        np.save(work / "X.npy", rng.standard_normal((n, *SHAPE), dtype=np.float32))
        fastdata.convert(None, work / "hdf5", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="hdf5")), arrays={"x": work / "X.npy"})
        (work / "X.npy").unlink()
        os.sync()
        ds = fastdata.open(work / "hdf5")
        res = tune(ds.root, batch_size=BATCH, budget_s=budget, store=False)
        grid = [{"mode": "threads", "num_workers": w, "prefetch": pf, "batch_size": BATCH}
                for w in (0, 1, 2, 4) for pf in (2, 4, 8)]
        w = res.winner
        settings = {f"tuned: {w['mode']}={w['num_workers']} prefetch={w['prefetch']}": w}
        settings.update({f"grid: threads={g['num_workers']} prefetch={g['prefetch']}": g for g in grid})
        rates: dict[str, list[float]] = {k: [] for k in settings}
        for _ in range(rounds):
            for name, s in settings.items():
                rates[name].append(measure_setting(ds, s, max_seconds=seconds).samples_per_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    tuned_name = next(iter(settings))
    best_grid = max((k for k in med if k.startswith("grid")), key=med.__getitem__)
    rows = [[k, f"{med[k]:,.0f}", f"{min(v):,.0f}-{max(v):,.0f}", f"{med[k] / med[best_grid]:.2f}"]
            for k, v in sorted(rates.items(), key=lambda kv: -med[kv[0]])]
    tune_rows = []
    for s, r, rnd in res.table:
        tune_rows.append([rnd, s["mode"], s["num_workers"], s["prefetch"], f"{r.samples_per_s:,.0f}"])
    spread = max(max(v) / min(v) for v in rates.values())
    machine = _harness.machine_info()
    ratio = med[tuned_name] / med[best_grid]
    text = "\n".join([
        f"# fastdata tune against a hand-picked grid, float32{list(SHAPE)}, {n} samples, HDF5, batch {BATCH}", "",
        f"Machine: {machine['cpu_model']}, {machine['usable_cores']} cores. Tune budget {budget:.0f} s; then every "
        f"setting measured {seconds} s per round, {rounds} interleaved rounds, median.", "",
        "## Measured with fastdata.measure.bench in the same run", "",
        _harness.markdown_table(["setting", "samples/s", "range", "x best grid"], rows), "",
        f"Tuned pick / best grid setting ({best_grid}): **{ratio:.2f}**. Largest max/min spread of one setting "
        f"across rounds: {spread:.2f} (the machine's noise).", "",
        "## The tune race (successive halving)", "",
        _harness.markdown_table(["round", "mode", "workers", "prefetch", "samples/s"], tune_rows)])
    print(text)
    _harness.write_results("tune_quick" if a.quick else "tune", {
        "winner": res.winner, "tuned_rate_in_race": res.rate, "rates": rates, "median": med, "best_grid": best_grid,
        "ratio_tuned_to_best_grid": ratio, "noise_spread": spread, "machine": machine,
        "race": [{"round": k, "settings": s, "samples_per_s": r.samples_per_s} for s, r, k in res.table]}, text, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
