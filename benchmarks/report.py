"""Regenerate docs/benchmarks.md's tables from the committed results in benchmarks/results/.

Usage: python benchmarks/report.py [--check] [--doc PATH] [--results DIR]

docs/benchmarks.md holds blocks between ``<!-- begin generated: NAME -->`` and
``<!-- end generated: NAME -->``. Each block NAME is rendered from ``results/NAME.json`` (the machine
and the ceiling check) and ``results/NAME.md`` (the suite's own tables, written in the same run);
the block ``ceilings`` gathers every "x ceiling" figure of every suite into one table. Everything
outside the blocks is prose, kept as it is. ``--check`` rewrites nothing: it exits 1 when the page
differs from what the results render (tests/test_benchmarks.py runs it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable

from fastdata.measure.bench import CEILING_LIMIT

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "docs" / "benchmarks.md"
RESULTS = HERE / "results"
BLOCK = re.compile(r"(<!-- begin generated: ([\w-]+) -->\n)(.*?)(<!-- end generated: \2 -->)", re.S)


def machine_line(res: dict[str, Any]) -> str:
    """One line naming the machine a result was measured on, from its ``machine`` record."""
    m = res.get("machine") or {}
    if not m:
        return "Machine: not recorded in the results file."
    libs = ", ".join(f"{k} {m[k]}" for k in ("numpy", "h5py", "lmdb", "torch") if m.get(k))
    cores = m.get("usable_cores") or m.get("cpu_count")
    return (f"Machine: {m.get('cpu_model') or 'unknown CPU'}, {cores} usable cores, {m.get('ram_gib', '?')} GiB RAM, "
            f"GPU: {m.get('gpu') or 'none'}; Python {m.get('python', '?')}" + (f", {libs}" if libs else "") + "."
            + (f" Load average when the run ended (1, 5, 15 min): {', '.join(map(str, m['load_average']))}."
               if m.get("load_average") else ""))


def check_line(res: dict[str, Any]) -> str:
    """What the harness's ceiling check found in this run (absent: the run predates the check)."""
    c = res.get("ceiling_check")
    if c is None:
        return ""
    if not c["over"]:
        return f"Ceiling check: all {c['checked']} ratios at most {c['limit']} of their ceiling."
    over = "; ".join(f"{k} {v}" for k, v in c["over"].items())
    return f"Ceiling check: **above {c['limit']} of the ceiling (a measurement bug)**: {over}."


def suite_block(name: str, results: Path) -> str:
    """The suite's machine, ceiling check and markdown tables (its title left out, headings one level down)."""
    res = json.loads((results / f"{name}.json").read_text(encoding="utf-8"))
    md = (results / f"{name}.md").read_text(encoding="utf-8").strip().splitlines()
    if md and md[0].startswith("# "):
        md = md[1:]
    body = "\n".join("#" + line if line.startswith("#") else line for line in md).strip()
    head = [f"Results: `benchmarks/results/{name}.json`, `.md`.", machine_line(res), check_line(res)]
    return "\n".join(h for h in head if h) + "\n\n" + body + "\n"


def ceiling_rows(results: Path) -> list[tuple[str, str, float]]:
    """Every (suite, row, x ceiling) of the suites that measure a ceiling, from their JSON."""
    rows: list[tuple[str, str, float]] = []
    raw = results / "raw.json"
    if raw.exists():
        rows += [("raw", r["row"], r["ratio"]) for r in json.loads(raw.read_text())["rows"]]
    loader = results / "loader.json"
    if loader.exists():
        d = json.loads(loader.read_text())
        x = d.get("x_ceiling") or {}
        rows += [("loader", k, v) for k, v in x.items()]
    gb = results / "get_batch.json"
    if gb.exists():
        for ds in json.loads(gb.read_text())["datasets"]:
            rows += [("get_batch", f"{ds['name']}: {m['method']}", m["ratio_to_ceiling"]) for m in ds["methods"]
                     if not m["method"].startswith("ceiling")]
    return rows


def ceilings_block(results: Path) -> str:
    rows = ceiling_rows(results)
    lines = ["| suite | row | x ceiling |", "|---|---|---:|"]
    lines += [f"| {s} | {r} | {x:.2f} |" for s, r, x in rows]
    worst = max((x for _, _, x in rows), default=0.0)
    return "\n".join(lines) + (f"\n\nHighest: {worst:.2f} (the harness flags anything above {CEILING_LIMIT} as a "
                                "measurement bug).\n")


def render(doc: str, results: Path = RESULTS) -> str:
    """``doc`` with every generated block rendered again from ``results``."""
    makers: dict[str, Callable[[], str]] = {"ceilings": lambda: ceilings_block(results)}

    def one(m: re.Match[str]) -> str:
        name = m.group(2)
        body = makers[name]() if name in makers else suite_block(name, results)
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(one, doc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the page differs from the results; write nothing")
    p.add_argument("--doc", type=Path, default=DOC)
    p.add_argument("--results", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    old = a.doc.read_text(encoding="utf-8")
    new = render(old, a.results)
    if a.check:
        if new != old:
            print(f"{a.doc} differs from what {a.results} renders: run python benchmarks/report.py", file=sys.stderr)
            return 1
        return 0
    if new != old:
        a.doc.write_text(new, encoding="utf-8")
        print(f"rewrote {a.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
