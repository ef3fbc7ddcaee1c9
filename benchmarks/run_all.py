"""Run every benchmark suite, then draw the charts.

Usage: python benchmarks/run_all.py [--quick] [--out DIR] [--only NAME ...]
``--quick`` runs each suite on small data (the whole set in about 2 minutes); CI runs it to check
that every suite completes and writes its JSON, markdown and PNG outputs (no timing assertions).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SUITES = ["get_batch", "loader", "images", "dali", "train", "tune"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small data, short runs")
    p.add_argument("--out", default=str(HERE / "results"), help="results folder")
    p.add_argument("--only", nargs="*", choices=SUITES, help="run only these suites")
    a = p.parse_args(argv)
    failed = []
    for name in a.only or SUITES:
        script = HERE / f"bench_{name}.py"
        if not script.exists():
            print(f"== {name}: {script.name} not found, skipped", flush=True)
            continue
        t0 = time.perf_counter()
        cmd = [sys.executable, str(script), "--out", a.out] + (["--quick"] if a.quick else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        print(f"== {name}: exit {r.returncode} in {time.perf_counter() - t0:.0f} s", flush=True)
        if r.returncode != 0:
            failed.append(name)
            print(r.stdout[-2000:], r.stderr[-4000:], sep="\n")
    r = subprocess.run([sys.executable, str(HERE / "plot.py"), "--results", a.out] + (["--quick"] if a.quick else []),
                       capture_output=True, text=True)
    print(r.stdout.strip())
    if r.returncode != 0:
        failed.append("plot")
        print(r.stderr[-2000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
