"""Two source trees measured against each other in one run, paired: each benchmark run alternately from
the "before" and the "after" tree, every row matched by name, one markdown table (issue 49's before/after).

Usage::

    python benchmarks/pair_trees.py --before DIR --after DIR [--rounds N] [--cold-rounds N] [--cold-passes P]
        [--only loader raw cold jpeg_crop] [--quick] [--out FILE] [--workdir DIR] [--timeout S]

Each run is ``python <tree>/benchmarks/<script>`` in a subprocess with the tree as its working folder and
as its only PYTHONPATH, so each tree runs its own copy of the script against its own package (module
names differ between layouts); nothing from either tree is imported here. Round r of each benchmark runs
both trees back to back, and which goes first alternates from round to round (A B, B A, A B ...) and from
one benchmark to the next, so a slow drift of the machine hits both trees alike.

The scripts write their own data (seeded, so the same bytes for both trees) into a temporary folder;
TMPDIR points every run at one scratch folder under ``--workdir`` (the same disk for both trees), emptied
after each run. Each run's results JSON and log stay in ``--workdir``. Benchmarks (``--only``):

- loader: ``bench_loader.py --sections base`` (warm page cache), each row's samples/s per interleaved round;
- raw: ``bench_raw.py``, each method's rate per round, and convert as MB/s of .npy converted per round;
- cold: ``bench_cold.py --rounds P`` (P = ``--cold-passes``, default 5; it drops the whole page cache first
  where it may, as root), each reader's passes: cold loader rows, the disk's ceilings, warm, photos;
- jpeg_crop: ``bench_jpeg_crop.py --no-train``, each method's images/s per round (older scripts kept only
  summaries of their repeats: there a row's passes are images/s at the slow (p90), median and fastest repeat). PIP_NO_INDEX=1 keeps its FFCV wheel
  check off the network.

Per row: each side's median over all its passes (every round pooled), after/before, the per-round ratio
of the two trees' figures, and each side's spread (its slowest and fastest pass over its own median).
"Slower beyond spread?" is YES when the after median is below every before pass and the before median
above every after pass: the two sides' ranges each exclude the other's median. Reference rows (ceilings,
plain numpy or torch copies, the disk alone, DALI's own decoder) time no loader of either tree: their
ratios show how much the machine itself moved during the run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "layout_before_after.md"
SIDES = ("before", "after")
REFERENCE = ("ceiling", "disk: ", "pread ", "numpy ", "torch x.float", "parallel copy", "DALI CPU", "no loader")

Rows = dict[str, tuple[str, list[float]]]  # row -> (unit, its passes: throughput, higher is faster)


def parse_loader(d: dict[str, Any]) -> tuple[Rows, str]:
    rows = {k: ("samples/s", list(v)) for k, v in d["all_rounds"].items()}
    size = (f"{d['samples']} samples float32{list(d['shape'])}, batch {d['batch']}, {d['rounds']} rounds of "
            f"{d['epochs_per_round']} epochs a run, warm page cache")
    return rows, size


def parse_raw(d: dict[str, Any]) -> tuple[Rows, str]:
    rows: Rows = {}
    for sec, s in d["sections"].items():
        for method, r in s.get("rates", {}).items():
            rows[f"{sec}: {method}"] = ("samples/s", list(r["rounds"]))
        if "seconds" in s:  # the convert section: seconds per round -> MB/s converted (or copied)
            for method, secs in s["seconds"].items():
                rows[f"{sec}: {method}"] = ("MB/s", [s["bytes"] / t / 1e6 for t in secs])
    c = d["config"]
    size = (f"{c['images']} 256x256 images, {c['mixed']} mixed-size images, {c['seqs']} sequences, {c['npy']} .npy "
            f"samples to convert; {c['rounds']} rounds a run, warm page cache")
    return rows, size


def parse_cold(d: dict[str, Any]) -> tuple[Rows, str]:
    rows: Rows = {}
    parts = [("cold: ", d["rows"], "samples/s"), ("disk: ", d["ceilings"], "MB/s"), ("warm: ", d["warm"], "samples/s"),
             ("raw images cold: ", d["images"], "samples/s"), ("photos cold: ", d["photos"]["rows"], ""),
             ("photos warm: ", d["photos"]["warm"], "samples/s")]
    for prefix, got, unit in parts:
        for k, v in got.items():
            u = unit or ("MB/s" if k.startswith("pread") else "samples/s")  # what median_of ranked the passes by
            rows[prefix + k] = (u, list(v.get("all", [v["mb_per_s" if u == "MB/s" else "samples_per_s"]])))
    size = (f"{d['samples']} samples float32{tuple(d['shape'])} (HDF5 {d['dataset_bytes']['hdf5'] / 1e9:.2f} GB), "
            f"{d['rounds']} passes of each reader a run, {d['photos']['n']} photos; whole page cache dropped at the "
            f"start: {'yes' if d.get('whole_page_cache_dropped') else 'no'}")
    return rows, size


def parse_jpeg(d: dict[str, Any]) -> tuple[Rows, str]:
    rows: Rows = {}
    for name, s in d["sets"].items():
        n = s["images"]
        for method, secs in s.get("seconds_per_round", {}).items():  # each round's seconds (the script since issue 51)
            rows[f"{name}: {method}"] = ("images/s", [n / t for t in secs])
        for method, t in s.get("timings_s", {}).items():  # older scripts: summaries of the repeats only
            one = t["runs"] < 2  # a single repeat: one pass
            rows[f"{name}: {method}"] = ("images/s", [n / t["median"]] if one else [n / t["p90"], n / t["median"], n / t["min"]])
    st = d["settings"]
    return rows, f"{st['images']} images a set, {st['repeats']} repeats a run, no training parity"


@dataclass(frozen=True)
class Bench:
    script: str
    args: tuple[str, ...]
    parse: Callable[[dict[str, Any]], tuple[Rows, str]]


BENCHES = {
    "loader": Bench("bench_loader.py", ("--sections", "base"), parse_loader),
    "raw": Bench("bench_raw.py", (), parse_raw),
    "cold": Bench("bench_cold.py", (), parse_cold),
    "jpeg_crop": Bench("bench_jpeg_crop.py", ("--no-train",), parse_jpeg),
}


def schedule(rounds: dict[str, int]) -> list[tuple[str, int, str]]:
    """(benchmark, round, side) in run order: benchmarks take turns round by round, each round runs both
    trees back to back, and which goes first alternates from one round of a benchmark to the next (A B, B A,
    ...) and from one benchmark to the next within a round."""
    out: list[tuple[str, int, str]] = []
    for r in range(max(rounds.values(), default=0)):
        for i, (name, n) in enumerate(rounds.items()):
            if r < n:
                out += [(name, r, side) for side in (SIDES if (i + r) % 2 == 0 else SIDES[::-1])]
    return out


def tree_env(tree: Path, scratch: Path) -> dict[str, str]:
    """The environment of a run: the tree as the only PYTHONPATH, temporary data in ``scratch``."""
    return {**os.environ, "PYTHONPATH": str(tree), "TMPDIR": str(scratch), "PIP_NO_INDEX": "1"}


def check_tree(tree: Path, names: list[str], scratch: Path) -> str:
    """The tree's commit; raise SystemExit when a script is missing or ``fastdata`` is not imported from it."""
    for name in names:
        if not (tree / "benchmarks" / BENCHES[name].script).is_file():
            raise SystemExit(f"{tree}: no benchmarks/{BENCHES[name].script}")
    r = subprocess.run([sys.executable, "-c", "import fastdata; print(fastdata.__file__)"], cwd=tree,
                       env=tree_env(tree, scratch), capture_output=True, text=True)
    if r.returncode != 0 or not Path(r.stdout.strip()).resolve().is_relative_to(tree):
        raise SystemExit(f"{tree}: fastdata is not imported from this tree ({(r.stdout + r.stderr).strip()[-500:]})")
    git = lambda *a: subprocess.run(["git", "-C", str(tree), *a], capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" if git("status", "--porcelain") else "")


def run_one(tree: Path, bench: Bench, extra: list[str], out: Path, scratch: Path, timeout: float) -> dict[str, Any]:
    """One run of ``bench`` from ``tree``: its rows and size, or the error; exit status and seconds."""
    out.mkdir(parents=True)
    scratch.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(tree / "benchmarks" / bench.script), *bench.args, *extra, "--out", str(out)]
    t0 = time.perf_counter()
    with open(out / "log.txt", "w") as log:
        try:
            rc: int | str = subprocess.run(cmd, cwd=tree, env=tree_env(tree, scratch), stdout=log,
                                           stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = f"timed out after {timeout:.0f} s"
    shutil.rmtree(scratch, ignore_errors=True)
    res: dict[str, Any] = {"cmd": " ".join(cmd[1:]), "rc": rc, "seconds": round(time.perf_counter() - t0, 1)}
    found = sorted(out.glob("*.json"))
    try:
        if len(found) != 1:
            raise ValueError(f"expected one results JSON in {out}, found {[p.name for p in found]}")
        res["rows"], res["size"] = bench.parse(json.loads(found[0].read_text()))
    except (ValueError, KeyError, TypeError, ZeroDivisionError) as e:
        res["error"] = f"{type(e).__name__}: {e} (log: {out / 'log.txt'})"
    return res


def compare(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """One record per row measured on both sides (pooled passes, medians, spread, verdict), and the rows
    only one side has."""
    runs = {"before": [r for r in before if "rows" in r], "after": [r for r in after if "rows" in r]}
    names = {s: [k for r in runs[s] for k in r["rows"]] for s in SIDES}
    common = [k for k in dict.fromkeys(names["before"]) if k in set(names["after"])]
    only = [f"{k} ({s} only)" for s in SIDES for k in dict.fromkeys(names[s]) if k not in common]
    out = []
    for k in common:
        passes = {s: [v for r in runs[s] if k in r["rows"] for v in r["rows"][k][1]] for s in SIDES}
        figs = {s: [statistics.median(r["rows"][k][1]) for r in runs[s] if k in r["rows"]] for s in SIDES}
        med = {s: statistics.median(passes[s]) for s in SIDES}
        out.append({"row": k, "unit": next(r["rows"][k][0] for r in runs["before"] if k in r["rows"]),
                    "reference": any(p in k for p in REFERENCE), "passes": passes, "median": med,
                    "ratio": med["after"] / med["before"],
                    "per_round": [a / b for a, b in zip(figs["after"], figs["before"])],
                    "spread": {s: (min(passes[s]) / med[s], max(passes[s]) / med[s]) for s in SIDES},
                    "verdict": verdict(passes["before"], passes["after"])})
    return out, only


def verdict(before: list[float], after: list[float]) -> str:
    """YES when after's median is below every before pass and before's median above every after pass."""
    if len(before) < 2 or len(after) < 2:
        return "n/a (1 pass)"
    mb, ma = statistics.median(before), statistics.median(after)
    if ma < min(before) and max(after) < mb:
        return "YES"
    if ma > max(before) and min(after) > mb:
        return "no (faster beyond spread)"
    return "no"


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def section(name: str, bench: Bench, runs: dict[str, list[dict[str, Any]]]) -> tuple[list[str], list[str]]:
    """The markdown of one benchmark, and its fastdata rows slower beyond spread."""
    sizes = {s: next((r["size"] for r in runs[s] if "size" in r), "no run parsed") for s in SIDES}
    size = sizes["before"] if sizes["before"] == sizes["after"] else f"before: {sizes['before']}; after: {sizes['after']}"
    md = [f"## {bench.script} {' '.join(bench.args)}".rstrip(), "", f"Size: {size}.", ""]
    for s in SIDES:
        md += [f"- {s} run {i + 1}: {r['seconds']:.0f} s, exit {r['rc']}" + (f", NOT PARSED: {r['error']}" if "error" in r
               else "") for i, r in enumerate(runs[s])]
    rows, only = compare(runs["before"], runs["after"])
    f = lambda v: f"{v:,.0f}" if v >= 100 else f"{v:,.2f}"  # noqa: E731
    md += ["", table(["row", "unit", "before median", "after median", "after/before", "per round", "spread before",
                      "spread after", "slower beyond spread?"],
                     [[r["row"] + (" (reference)" if r["reference"] else ""), r["unit"], f(r["median"]["before"]),
                       f(r["median"]["after"]), f"{r['ratio']:.3f}", ", ".join(f"{x:.2f}" for x in r["per_round"]),
                       *(f"{r['spread'][s][0]:.2f}-{r['spread'][s][1]:.2f}" for s in SIDES), r["verdict"]]
                      for r in rows])]
    if only:
        md += ["", "Rows on one side only: " + "; ".join(only) + "."]
    slower = [f"{bench.script}: {r['row']}" for r in rows if r["verdict"] == "YES" and not r["reference"]]
    return md + [""], slower


def report(args: argparse.Namespace, commits: dict[str, str], results: dict[str, dict[str, list[dict[str, Any]]]],
           load: tuple[list[float], list[float]], order: list[tuple[str, int, str]]) -> str:
    body, slower = [], []
    for name, runs in results.items():
        md, bad = section(name, BENCHES[name], runs)
        body += md
        slower += bad
    seq = " ".join(f"{n}{r + 1}:{'A' if s == 'before' else 'B'}" for n, r, s in order)
    head = [f"# Before/after in one run, paired{' (quick: tiny data, figures meaningless)' if args.quick else ''}", "",
            f"Before (A): {args.before} @ {commits['before']}; after (B): {args.after} @ {commits['after']}. "
            f"Machine: {os.cpu_count()} cores; load average (1, 5, 15 min) {load[0]} at the start, {load[1]} at the end. "
            f"Written by benchmarks/pair_trees.py on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
            f"Run order: {seq}.", "",
            "after/before: the ratio of the two sides' medians over all their passes (higher: after faster); "
            "per round: after's figure over before's in each round; spread: each side's slowest and fastest pass "
            "over its own median. Slower beyond spread? YES when after's median is below every before pass and "
            "before's median above every after pass. (reference): no loader of either tree in it; its ratio is "
            "the machine's own drift.", "",
            f"fastdata rows slower beyond spread: {len(slower)}" + (": " + "; ".join(slower) if slower else "."), ""]
    return "\n".join(head + body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", type=Path, required=True, help="tree with the code before the change")
    p.add_argument("--after", type=Path, required=True, help="tree with the code after the change")
    p.add_argument("--rounds", type=int, default=1, help="runs of each benchmark per tree (default 1)")
    p.add_argument("--cold-rounds", type=int, default=None, help="runs of bench_cold per tree (default: --rounds)")
    p.add_argument("--cold-passes", type=int, default=5, help="bench_cold's own --rounds (default 5)")
    p.add_argument("--only", nargs="+", choices=list(BENCHES), default=list(BENCHES), help="benchmarks to run")
    p.add_argument("--quick", action="store_true", help="each script's --quick sizes: a smoke run")
    p.add_argument("--out", type=Path, default=None,
                   help=f"markdown table (default {DEFAULT_OUT.relative_to(HERE.parent)}; --quick: in --workdir); "
                        "the same name .json beside it holds every pass")
    p.add_argument("--workdir", type=Path, default=None, help="logs, each run's results, scratch (default: new temp)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    a = p.parse_args(argv)
    if a.rounds < 1 or (a.cold_rounds is not None and a.cold_rounds < 1) or a.cold_passes < 1:
        p.error("--rounds, --cold-rounds and --cold-passes must be at least 1")
    a.before, a.after = a.before.resolve(), a.after.resolve()
    work = (a.workdir or Path(tempfile.mkdtemp(prefix="pair_trees_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = a.out or (work / "layout_before_after_quick.md" if a.quick else DEFAULT_OUT)
    commits = {s: check_tree(getattr(a, s), a.only, work / "scratch") for s in SIDES}
    extra = {n: (["--quick"] if a.quick else []) + (["--rounds", str(a.cold_passes)] if n == "cold" else [])
             for n in a.only}
    order = schedule({n: (a.cold_rounds or a.rounds) if n == "cold" else a.rounds for n in a.only})
    results: dict[str, dict[str, list[dict[str, Any]]]] = {n: {s: [] for s in SIDES} for n in a.only}
    load0, t0 = [round(v, 2) for v in os.getloadavg()], time.perf_counter()
    for i, (name, r, side) in enumerate(order):
        res = run_one(getattr(a, side), BENCHES[name], extra[name], work / f"{i:02d}_{name}_{side}_r{r + 1}",
                      work / "scratch", a.timeout)
        results[name][side].append(res)
        print(f"[{i + 1}/{len(order)}] {name} round {r + 1} {side}: exit {res['rc']}, {res['seconds']:.0f} s"
              f"{', NOT PARSED: ' + res['error'] if 'error' in res else ''} (elapsed {time.perf_counter() - t0:.0f} s)",
              flush=True)
    md = report(a, commits, results, (load0, [round(v, 2) for v in os.getloadavg()]), order)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md)
    out.with_suffix(".json").write_text(json.dumps({"before": str(a.before), "after": str(a.after), "commits": commits,
                                                    "order": order, "runs": results}, indent=1) + "\n")
    print(md)
    print(f"\nwrote {out} and {out.with_suffix('.json')}; logs and each run's results in {work}")
    return 1 if any("error" in r for b in results.values() for s in b.values() for r in s) else 0


if __name__ == "__main__":
    sys.exit(main())
