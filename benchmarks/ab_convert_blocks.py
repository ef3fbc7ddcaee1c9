"""Paired A/B (one run, interleaved rounds) of three write-engine mechanisms, on the data sets of
bench_convert_objects.py:

- blocks: a source that gives blocks of rows (``read_rows``: a Hugging Face dataset's fixed-shape columns,
  ``.npy`` arrays) is written a block at a time (one ``pwrite`` per field), against sample by sample;
- balanced: the shard plan cuts the fewest shards of at most ``shard_size`` into near-equal sizes, against
  filling each shard up to ``shard_size`` in order (a small last shard);
- writeback: the writer asks the kernel to start writing the shard to disk every 8 MiB written
  (``sync_file_range``), against leaving it all to the fsync at the end of the shard.

Variants: old (none of them), new (all three), and new without each one.

Usage::

    python benchmarks/ab_convert_blocks.py [--rounds R] [--files N] [--rows N] [--out DIR] [--workdir DIR]

Each mechanism is switched in this process (the forked workers inherit it); every conversion uses
bench_convert_objects.py's config (2 workers, HDF5, the default shard size). Figure per variant: the median
over rounds of old-seconds / variant-seconds (its speed as a share of the old engine's; above 1 is faster),
and its range. Results: ``<out>/convert_blocks_ab.{json,md}``.
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
from bench_convert_objects import NpyFiles, _config, _copy_fsync, _ratio, make_flim, make_hf, run_rounds

import fastdata
from fastdata.converters.arrays import ArraysSource
from fastdata.converters.objects import ObjectSource
from fastdata.write import engine, shard_task

BLOCKS = {cls: cls.read_rows for cls in (ObjectSource, ArraysSource)}
BALANCED, GREEDY = engine.plan_shards, engine._greedy_plan
WRITEBACK = shard_task.start_writeback
OLD, NEW = "old (per sample, greedy plan, no writeback)", "new (blocks, balanced plan, writeback)"
VARIANTS = {OLD: (False, False, False), NEW: (True, True, True), "new without blocks": (False, True, True),
            "new without the balanced plan": (True, False, True), "new without writeback": (True, True, False)}


def _set(blocks: bool, balanced: bool, writeback: bool) -> None:
    for cls, fn in BLOCKS.items():
        cls.read_rows = fn if blocks else (lambda self, i, n: None)  # type: ignore[method-assign]
    engine.plan_shards = BALANCED if balanced else GREEDY
    shard_task.start_writeback = WRITEBACK if writeback else (lambda fd: None)


def _variant(convert: Callable[[], Any], switches: tuple[bool, bool, bool]) -> Callable[[], Any]:
    def run() -> Any:
        _set(*switches)
        try:
            return convert()
        finally:
            _set(True, True, True)
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--files", type=int, default=300)
    ap.add_argument("--rows", type=int, default=6000)
    ap.add_argument("--out", default=str(DEFAULT_RESULTS_DIR))
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ab-blocks-", dir=args.workdir))
    try:
        ds = NpyFiles(make_flim(work / "flim", args.files))
        hf = make_hf(work, args.rows)
        arrow = [f["filename"] for f in hf.cache_files]
        cols = hf.with_format("numpy")[:]
        (work / "npy").mkdir()
        arrays = {k: work / "npy" / f"{k}.npy" for k in ("x", "label")}
        for k, path in arrays.items():
            np.save(path, np.ascontiguousarray(cols[k]))
        del cols
        warm_page_cache(work / "flim", work / "hf", work / "npy")
        (work / "copy").mkdir()
        sets: dict[str, Callable[[Path], Any]] = {
            "Hugging Face Array2D": lambda out: fastdata.convert(hf, out, _config()),
            ".npy arrays": lambda out: fastdata.convert(None, out, _config(), arrays=arrays),
            "FLIM torch Dataset": lambda out: fastdata.convert(ds, out, _config()),
            "FLIM folder": lambda out: fastdata.convert(work / "flim", out, _config()),
        }
        fns: dict[str, Callable[[], Any]] = {
            "copy of the Arrow bytes": lambda: [_copy_fsync(a, work / "copy" / Path(a).name) for a in arrow]}
        for s, (name, convert) in enumerate(sets.items()):
            for v, (label, switches) in enumerate(VARIANTS.items()):
                if name.startswith("FLIM") and label == "new without blocks":
                    continue  # one sample per file or __getitem__: no blocks of rows to give
                fns[f"{name} | {label}"] = _variant(lambda c=convert, o=work / f"out{s}{v}": c(o), switches)
        times, cpu = run_rounds(fns, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {"machine": machine_info(), "rounds": args.rounds, "files": args.files, "rows": args.rows,
           "seconds": times, "cpu_seconds": cpu}
    cmd = "python benchmarks/ab_convert_blocks.py " + " ".join(sys.argv[1:])
    md = markdown(res, list(sets), cmd.strip())
    print(md)
    write_results("convert_blocks_ab", res, md, args.out)
    return 0


def markdown(res: dict[str, Any], sets: list[str], cmd: str) -> str:
    times, cpu, med = res["seconds"], res["cpu_seconds"], statistics.median
    copy = times["copy of the Arrow bytes"]
    lines = [f"# Write engine A/B: blocks of rows, balanced shard plan, early writeback ({res['rounds']} paired rounds)", "",
             f"Command: `{cmd}`", "",
             f"Machine: {res['machine']['usable_cores']} usable cores, load average {res['machine']['load_average']} "
             "(shared with other work: see the spread). 2 workers, HDF5, default shard size; every variant in every "
             "round, the order rotating.", "",
             f"Copy of the Arrow bytes (copy + fsync): median {med(copy):.3f} s.", ""]
    for s in sets:
        old = times[f"{s} | {OLD}"]
        rows = []
        for label in VARIANTS:
            key = f"{s} | {label}"
            if key not in times:
                continue
            r, c = _ratio(old, times[key]), _ratio(copy, times[key])
            rows.append([label, f"{med(times[key]):.3f}", f"{med(cpu[key]):.2f}",
                         f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})",
                         f"{c['median']:.2f} ({c['min']:.2f}-{c['max']:.2f})" if s.startswith("Hugging") else "-"])
        lines += [f"## {s}", "", markdown_table(["variant", "median s", "median CPU s", "speed / old (min-max)",
                                                 "speed / copy of the Arrow bytes (min-max)"], rows), ""]
    lines.append("Speed / old: old seconds / variant seconds in the same round (above 1: faster). CPU s: user + "
                 "system time of the process and its workers.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
