"""Run every benchmark suite, then draw the charts.

Usage: python benchmarks/run_all.py [--quick] [--out DIR] [--only NAME ...] [--jobs N]

Writes ``<out>/<suite>.json`` and ``.md`` (``<suite>_quick.*`` with ``--quick``) for each suite in
``SUITES``, then the charts; ``python benchmarks/report.py`` then regenerates docs/benchmarks.md's
tables from the full results. ``--quick`` runs each suite on small data (figures meaningless): the
default test suite runs it to check that every suite completes and writes its outputs (no timing
assertions), two suites at a time (``--jobs 2``: their figures disturb each other, so only for ``--quick``).
A full suite that finds a ratio above 1.1 of its ceiling exits non-zero (a
measurement bug, benchmarks/_harness.py ``check_ceiling``), and so does this script.

Not in ``SUITES`` (opt-in, each run by hand; docs/benchmarks.md says how): ``bench_scale.py``
(starts Ray clusters), ``bench_augment_targets.py`` (needs kornia), ``bench_gpu.py`` (needs CUDA),
``bench_cold_large.py`` (a dataset larger than RAM), ``bench_convert_objects.py`` (Python objects against
files, a raw copy, LitData and FFCV where installed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITES = ["get_batch", "loader", "raw", "choices", "fields", "images", "dali", "train", "tune", "remote",
          "augment_views", "cold", "inplace", "jpeg_crop", "codecs"]
OPT_IN = {"scale": "starts Ray clusters", "augment_targets": "needs kornia", "gpu": "needs CUDA",
          "cold_large": "writes a dataset larger than RAM (about 30 GB here)",
          "convert_objects": "compares with LitData and FFCV where they are installed; needs the hf extra"}


def _suite(name: str, out: str, quick: bool) -> tuple[str, bool]:
    """Run one suite's script; print its outcome (and its output's tail when it failed)."""
    t0 = time.perf_counter()
    cmd = [sys.executable, str(HERE / f"bench_{name}.py"), "--out", out] + (["--quick"] if quick else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    lines = [f"== {name}: exit {r.returncode} in {time.perf_counter() - t0:.0f} s"]
    if "MEASUREMENT BUG" in r.stderr:  # check_ceiling's flag: shown even when the suite passed (--quick)
        lines.append(r.stderr[max(0, r.stderr.index("MEASUREMENT BUG") - 100) :][:2000])
    if r.returncode != 0:
        lines += [r.stdout[-2000:], r.stderr[-4000:]]
    print("\n".join(lines), flush=True)
    return name, r.returncode == 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small data, short runs")
    p.add_argument("--out", default=str(HERE / "results"), help="results folder")
    p.add_argument("--only", nargs="*", choices=SUITES + sorted(OPT_IN), help="run only these suites")
    p.add_argument("--jobs", type=int, default=1, help="suites run at once (--quick only: a smoke run)")
    a = p.parse_args(argv)
    if a.jobs < 1 or (a.jobs > 1 and not a.quick):
        p.error("--jobs must be 1 for full runs (suites run side by side disturb each other's figures), "
                "and at least 1")
    with ThreadPoolExecutor(a.jobs) as pool:
        runs = list(pool.map(lambda name: _suite(name, a.out, a.quick), a.only or SUITES))
    failed = [name for name, ok in runs if not ok]
    r = subprocess.run([sys.executable, str(HERE / "plot.py"), "--results", a.out] + (["--quick"] if a.quick else []),
                       capture_output=True, text=True)
    print(r.stdout.strip())
    if r.returncode != 0:
        failed.append("plot")
        print(r.stderr[-2000:])
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
