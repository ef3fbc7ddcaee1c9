"""Run every benchmark suite, then draw the charts.

Usage: python benchmarks/run_all.py [--quick] [--out DIR] [--only NAME ...]

Writes ``<out>/<suite>.json`` and ``.md`` (``<suite>_quick.*`` with ``--quick``) for each suite in
``SUITES``, then the charts; ``python benchmarks/report.py`` then regenerates docs/benchmarks.md's
tables from the full results. ``--quick`` runs each suite on small data (figures meaningless): the
default test suite runs it to check that every suite completes and writes its outputs (no timing
assertions). A full suite that finds a ratio above 1.1 of its ceiling exits non-zero (a
measurement bug, benchmarks/_harness.py ``check_ceiling``), and so does this script.

Not in ``SUITES`` (opt-in, each run by hand; docs/benchmarks.md says how): ``bench_scale.py``
(starts Ray clusters), ``bench_augment_targets.py`` (needs kornia), ``bench_gpu.py`` (needs CUDA),
``bench_cold_large.py`` (a dataset larger than RAM).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITES = ["get_batch", "loader", "raw", "choices", "fields", "images", "dali", "train", "tune", "remote",
          "augment_views", "lmdb_check", "cold", "inplace", "jpeg_crop"]
OPT_IN = {"scale": "starts Ray clusters", "augment_targets": "needs kornia", "gpu": "needs CUDA",
          "cold_large": "writes a dataset larger than RAM (about 30 GB here)"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small data, short runs")
    p.add_argument("--out", default=str(HERE / "results"), help="results folder")
    p.add_argument("--only", nargs="*", choices=SUITES + sorted(OPT_IN), help="run only these suites")
    a = p.parse_args(argv)
    failed = []
    for name in a.only or SUITES:
        script = HERE / f"bench_{name}.py"
        t0 = time.perf_counter()
        cmd = [sys.executable, str(script), "--out", a.out] + (["--quick"] if a.quick else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(f"== {name}: exit {r.returncode} in {time.perf_counter() - t0:.0f} s", flush=True)
        if "MEASUREMENT BUG" in r.stderr:  # check_ceiling's flag: shown even when the suite passed (--quick)
            print(r.stderr[max(0, r.stderr.index("MEASUREMENT BUG") - 100) :][:2000], flush=True)
        if r.returncode != 0:
            failed.append(name)
            print(r.stdout[-2000:], r.stderr[-4000:], sep="\n")
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
