"""Pool the passes of several bench_cold.py runs: each reader's median over all their passes, and the targets.

One 16-round run of benchmarks/bench_cold.py can land either side of a target on this machine's disk:
the passes of one reader vary twofold, also two passes run back to back. Runs of the same code on
the same machine (same data, same readers) are pooled here: each reader's and each ceiling's median
over every pass of every run, the best ceilings chosen from those medians as bench_cold.py chooses,
and the target ratios; also each run's own ratios, side by side.

Usage: python benchmarks/pool_cold.py RUN.json [RUN.json ...] [--name cold_pooled] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402
import bench_cold  # noqa: E402

TARGETS = bench_cold.DISK_TARGETS  # target -> (loader row, which best ceiling), as bench_cold.run computes them


def pool(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled medians (MB/s) of the readers and ceilings every run has, the best ceilings, the targets."""
    nbytes = int(np.prod(runs[0]["shape"])) * 4
    if any(int(np.prod(r["shape"])) * 4 != nbytes for r in runs):
        raise SystemExit("pool_cold: the runs read samples of different shapes; pool runs of one configuration")
    mb = {k: [x * nbytes / 1e6 for r in runs for x in r["rows"][k]["all"]]
          for k in runs[0]["rows"] if all(k in r["rows"] for r in runs)}
    mb.update({k: [x for r in runs for x in r["ceilings"][k]["all"]]
               for k in runs[0]["ceilings"] if all(k in r["ceilings"] for r in runs)})
    med = {k: {"mb_per_s": float(np.median(v)), "passes": len(v)} for k, v in mb.items()}
    ceil = {k: v for k, v in med.items() if k in runs[0]["ceilings"]}
    best = bench_cold.best_ceilings(ceil)
    targets = {t: med[row]["mb_per_s"] / ceil[best[which]]["mb_per_s"] for t, (row, which) in TARGETS.items()}
    return {"runs": len(runs), "medians": med, "best_ceilings": best, "targets": targets,
            "targets_each_run": {t: [r["targets"][t] for r in runs] for t in TARGETS}}


def markdown(res: dict[str, Any], names: list[str]) -> str:
    rows = [[k, f"{v['mb_per_s']:,.0f}", v["passes"]] for k, v in res["medians"].items()]
    return "\n".join([
        f"Pooled cold reads: every pass of {res['runs']} runs of benchmarks/bench_cold.py ({', '.join(names)}); "
        f"each figure the median over all their passes. Best ceilings (from the pooled medians): parallel at the "
        f"request size: {res['best_ceilings']['parallel']}; large reads: {res['best_ceilings']['large']}.",
        "",
        _harness.markdown_table(["reader (cold), all runs", "MB/s (median)", "passes"], rows),
        "",
        _harness.markdown_table(["target", "pooled", "each run (ratio of its medians)"],
                                [[t, f"{v:.2f}", ", ".join(f"{x:.2f}" for x in res["targets_each_run"][t])]
                                 for t, v in res["targets"].items()]),
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="results JSON files of bench_cold.py runs")
    p.add_argument("--name", default="cold_pooled", help="results name (default cold_pooled)")
    p.add_argument("--out", default=str(_harness.DEFAULT_RESULTS_DIR), help="results folder")
    a = p.parse_args(argv)
    runs = [json.loads(Path(f).read_text()) for f in a.runs]
    res = pool(runs)
    res["sources"] = [Path(f).name for f in a.runs]
    res["ceiling_check"] = _harness.check_ceiling("cold_pooled", res["targets"], quick=False)
    md = markdown(res, res["sources"])
    _harness.write_results(a.name, res, md, a.out)
    print(md)
    return _harness.ceiling_exit(res["ceiling_check"])


if __name__ == "__main__":
    sys.exit(main())
