"""Paired A/B (one run, interleaved rounds) of write-engine mechanisms, on the data sets of
bench_convert_objects.py (a Hugging Face Array2D dataset, the same rows as .npy arrays, saved by np.save or
written a row at a time, a torch Dataset that np.loads FLIM-like files, and the folder of those files):

- blocks (kept): a source that gives blocks of rows (``read_rows``: a Hugging Face dataset's fixed-shape
  columns, ``.npy`` arrays) is written a block at a time (one ``pwrite`` per field), against sample by sample;
- prefault (kept): before a block of rows is written, its pages are mapped in one call (``MADV_POPULATE_READ``),
  against faulting them in while the block is written (a memory-mapped Arrow file or ``.npy`` array);
- writeback (kept): the writer asks the kernel to start writing the shard to disk every 8 MiB written
  (``sync_file_range``), against leaving it all to the fsync at the end of the shard;
Variants: old (per sample, no writeback), new (blocks, prefault, writeback), and new without each. (A balanced
shard plan, the fewest shards cut into near-equal sizes, was tried as a candidate in earlier runs of this script
and dropped: no gain beyond the spread, see this file's history.)

Usage::

    python benchmarks/ab_convert_blocks.py [--rounds R] [--files N] [--rows N] [--out DIR] [--workdir DIR]

Each mechanism is switched in this process (the forked workers inherit it); every conversion uses
bench_convert_objects.py's config (2 workers, HDF5, the default shard size). Figures: per round, the seconds of
the variant without a mechanism over the seconds of new (the mechanism's gain; above 1: it helps), median,
quartiles, range and the rounds it won. Results: ``<out>/convert_blocks_ab.{json,md}``.
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
from bench_convert_objects import NpyFiles, _config, _copy_fsync, make_flim, make_hf, run_rounds

import fastdata
from fastdata.converters.arrays import ArraysSource
from fastdata.converters.objects import ObjectSource
from fastdata.write import shard_task

BLOCKS = {cls: cls.read_rows for cls in (ObjectSource, ArraysSource)}
WRITEBACK, PREFAULT = shard_task.start_writeback, shard_task.prefault
OLD, NEW = "old (per sample, no writeback)", "new (blocks, prefault, writeback)"
# (blocks, prefault, writeback)
VARIANTS = {OLD: (False, False, False), NEW: (True, True, True), "new without blocks": (False, True, True),
            "new without prefault": (True, False, True), "new without writeback": (True, True, False)}
PER_FILE = ("new without blocks", "new without prefault")  # a folder or a Dataset gives no blocks: the same as new


def _set(blocks: bool, prefault: bool, writeback: bool) -> None:
    for cls, fn in BLOCKS.items():
        cls.read_rows = fn if blocks else (lambda self, i, n: None)  # type: ignore[method-assign]
    shard_task.prefault = PREFAULT if prefault else (lambda a: None)
    shard_task.start_writeback = WRITEBACK if writeback else (lambda fd: None)


def _variant(convert: Callable[[], Any], switches: tuple[bool, bool, bool]) -> Callable[[], Any]:
    def run() -> Any:
        _set(*switches)
        try:
            return convert()
        finally:
            _set(*VARIANTS[NEW])
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
        pieces = {"x": work / "npy_pieces" / "x.npy", "label": arrays["label"]}
        pieces["x"].parent.mkdir()
        with open(pieces["x"], "wb") as f:  # the same array, written a row at a time
            np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(cols["x"]))
            for row in cols["x"]:
                f.write(np.ascontiguousarray(row).data)
        del cols
        warm_page_cache(work / "flim", work / "hf", work / "npy", work / "npy_pieces")
        (work / "copy").mkdir()
        sets: dict[str, Callable[[Path], Any]] = {
            "Hugging Face Array2D": lambda out: fastdata.convert(hf, out, _config()),
            ".npy arrays": lambda out: fastdata.convert(None, out, _config(), arrays=arrays),
            ".npy arrays written a row at a time": lambda out: fastdata.convert(None, out, _config(), arrays=pieces),
            "FLIM torch Dataset": lambda out: fastdata.convert(ds, out, _config()),
            "FLIM folder": lambda out: fastdata.convert(work / "flim", out, _config()),
        }
        fns: dict[str, Callable[[], Any]] = {
            "copy of the Arrow bytes": lambda: [_copy_fsync(a, work / "copy" / Path(a).name) for a in arrow]}
        for s, (name, convert) in enumerate(sets.items()):
            for v, (label, switches) in enumerate(VARIANTS.items()):
                if name.startswith("FLIM") and label in PER_FILE:
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


def _spread(r: list[float]) -> str:
    q = sorted(r)
    return (f"{statistics.median(r):.2f} (quartiles {q[len(q) // 4]:.2f}-{q[3 * len(q) // 4]:.2f}, range "
            f"{q[0]:.2f}-{q[-1]:.2f}, above 1 in {sum(v > 1 for v in r)}/{len(r)})")


def markdown(res: dict[str, Any], sets: list[str], cmd: str) -> str:
    times, cpu, med = res["seconds"], res["cpu_seconds"], statistics.median
    copy = times["copy of the Arrow bytes"]
    lines = [f"# Write engine A/B: blocks of rows, prefault, early writeback ({res['rounds']} paired "
             "rounds)", "", f"Command: `{cmd}`", "",
             f"Machine: {res['machine']['usable_cores']} usable cores, load average {res['machine']['load_average']} "
             "(shared with other work: see the spread). 2 workers, HDF5, default shard size; every variant in every "
             "round, the order rotating.", "",
             f"Copy of the Arrow bytes (copy + fsync): median {med(copy):.3f} s.", ""]
    for s in sets:
        new = times[f"{s} | {NEW}"]
        rows = [[label, f"{med(times[k]):.3f}", f"{med(cpu[k]):.2f}",
                 _spread([o / n for o, n in zip(times[k], new)]) if label != NEW else "1"]
                for label in VARIANTS if (k := f"{s} | {label}") in times]
        lines += [f"## {s}", "", markdown_table(["variant", "median s", "median CPU s",
                                                 "variant seconds / new seconds, per round"], rows), ""]
        if s.startswith("Hugging"):
            lines += [f"Share of the raw copy's speed (copy seconds / variant seconds, per round): new "
                      f"{_spread([c / n for c, n in zip(copy, new)])}; old "
                      f"{_spread([c / o for c, o in zip(copy, times[f'{s} | {OLD}'])])}.", ""]
    lines.append("Variant seconds / new seconds: above 1, the variant is slower than new (for 'new without X': "
                 "X helps). CPU s: user + system time of the process and its workers.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
