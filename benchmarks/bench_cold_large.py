"""Cold reads of a dataset larger than the machine's RAM: the loader against the disk, one slow run.

bench_cold.py empties the page cache per file before each pass; this run checks the same figures
hold when the data cannot fit in memory at all. It converts ``--base`` FLIM-like samples once, then
copies that dataset ``--copies`` times into one dataset with ``fastdata merge`` (method "copy": new
files, no shared pages), sized to ``--ram-factor`` times the RAM (MemTotal). It then times one
cold pass each (``--rounds``: more, in a new random order each round; the median) of the loader
(shuffle True, "block", "shards") and the disk's ceilings on the same shard files (sample-size
preads by 4, 8, 16, 32, 64 and 128 threads in random order, the best of them; 4 MiB preads by one
thread in order and 4, 2 and 1 MiB preads by 16 threads each reading its own part in order, the
best of these; in-order reads mark their descriptors sequential), and the loader's RSS after its
last pass. Each pass reads the whole dataset.

Usage: python benchmarks/bench_cold_large.py [--ram-factor 1.15] [--base 2000] [--rounds R] [--dir DIR] [--out DIR]
Needs free disk of about (1 + ram-factor) x RAM in --dir while it runs; everything is removed at the end.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402
import bench_cold  # noqa: E402

import fastdata  # noqa: E402
from fastdata.converters import ConvertConfig  # noqa: E402
from fastdata.write import WriteOptions  # noqa: E402


def mem_total() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def build(work: Path, base: int, ram_factor: float) -> tuple[Path, int]:
    """The large dataset (merged copies of a converted base) and the number of copies."""
    src = work / "npy"
    bench_cold.write_folder(src, base, lambda rng, c: bench_cold.flim_sample(rng, bench_cold.SHAPE, c))
    one = work / "one"
    fastdata.convert(src, one, ConvertConfig(write=WriteOptions(backend="hdf5")))
    shutil.rmtree(src)
    one_bytes = sum(p.stat().st_size for p in bench_cold.files_of(one))
    copies = max(2, math.ceil(ram_factor * mem_total() / one_bytes))
    if shutil.disk_usage(work).free < (copies + 1) * one_bytes:
        raise SystemExit(f"{work}: needs {(copies + 1) * one_bytes / 1e9:.0f} GB free for {copies} copies")
    big = work / "large"
    t0 = time.perf_counter()
    fastdata.merge([one] * copies, big, method="copy", drop_keys=True)
    print(f"merged {copies} copies in {time.perf_counter() - t0:.0f} s", flush=True)
    shutil.rmtree(one)
    os.sync()
    return big, copies


def run(base: int, ram_factor: float, work: Path, rounds: int = 1) -> dict[str, Any]:
    res: dict[str, Any] = {"loadavg_before": bench_cold.loadavg(), "ram_bytes": mem_total(), "base": base,
                           "shape": list(bench_cold.SHAPE), "batch": bench_cold.BATCH, "rounds": rounds}
    big, copies = build(work, base, ram_factor)
    paths = bench_cold.files_of(big)
    res.update(copies=copies, samples=base * copies, dataset_bytes=sum(p.stat().st_size for p in paths))
    sample_bytes = int(np.prod(bench_cold.SHAPE)) * 4
    rss: dict[str, dict[str, int]] = {}

    def loader(sh: Any, key: str) -> dict[str, Any]:
        print(key, flush=True)
        r = bench_cold.loader_pass(big, sh)
        r["mb_per_s"] = r["samples_per_s"] * sample_bytes / 1e6
        rss[key] = bench_cold.rss_kib()  # (the last pass's)
        return r

    fns: dict[str, Any] = {f"loader shuffle={sh!r}": (lambda sh=sh, k=f"loader shuffle={sh!r}": loader(sh, k))
                           for sh in (True, "block", "shards")}
    ceil_fns: dict[str, Any] = {f"pread {sample_bytes} B, {t} threads, random":
                                (lambda t=t: bench_cold.pread_pass(paths, sample_bytes, t, True))
                                for t in bench_cold.THREADS}  # the best thread count is the ceiling
    ceil_fns[f"pread {sample_bytes} B, {bench_cold.HINTED}"] = \
        lambda: bench_cold.pread_pass(paths, sample_bytes, 2, True, sink="ahead")
    ceil_fns["pread 4 MiB, 1 thread, in order"] = lambda: bench_cold.pread_pass(paths, bench_cold.LARGE, 1, False)
    ceil_fns.update(bench_cold.stream_ceilings(paths))
    # in a random order (bench_cold.interleaved): a fixed one put every loader pass first, right after
    # the dataset was written, and every ceiling after them
    runs = bench_cold.interleaved({**fns, **ceil_fns}, rounds)
    rows = {k: bench_cold.median_of(runs[k], "samples_per_s") for k in fns}
    ceil = {k: bench_cold.median_of(runs[k], "mb_per_s") for k in ceil_fns}
    best = bench_cold.best_ceilings(ceil)
    res.update(rows=rows, ceilings=ceil, rss=rss, loadavg_after=bench_cold.loadavg(), machine=_harness.machine_info())
    res["targets"] = {
        **{t: rows[row]["mb_per_s"] / ceil[best[which]]["mb_per_s"] for t, (row, which) in bench_cold.DISK_TARGETS.items()},
    }
    return res


def markdown(res: dict[str, Any]) -> str:
    mb = lambda v: f"{v:,.0f}"  # noqa: E731
    rows = [[k, mb(v["samples_per_s"]), mb(v["mb_per_s"]), f"{res['rss'][k]['VmRSS'] / 1024:,.0f}"]
            for k, v in res["rows"].items()]
    rows += [[k, "", mb(v["mb_per_s"]), ""] for k, v in res["ceilings"].items()]
    return "\n".join([
        f"Larger than RAM: {res['samples']:,} samples of float32 {tuple(res['shape'])} ({res['copies']} copies of "
        f"{res['base']:,}), HDF5 {res['dataset_bytes'] / 1e9:.1f} GB on a machine with "
        f"{res['ram_bytes'] / 2**30:.0f} GiB of RAM; {res.get('rounds', 1)} cold pass(es) each in a random order "
        f"(the median), batch {res['batch']}. "
        f"Load average before {res['loadavg_before']}, after {res['loadavg_after']}.",
        "",
        _harness.markdown_table(["reader (cold, larger than RAM)", "samples/s", "MB/s", "VmRSS after, MiB"], rows),
        "",
        _harness.markdown_table(["target", "measured"], [[k, f"{v:.2f}"] for k, v in res["targets"].items()]),
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a tiny run (0.005 x RAM): checks the script, not the disk")
    p.add_argument("--ram-factor", type=float, default=1.15, help="dataset size over RAM (default 1.15)")
    p.add_argument("--base", type=int, default=2000, help="samples converted once, then copied (default 2000)")
    p.add_argument("--rounds", type=int, default=1, help="passes of each reader, in a random order each round; "
                   "the figure is the median pass (default 1)")
    p.add_argument("--dir", default=None, help="work folder on the disk to measure (default: a temporary folder)")
    p.add_argument("--out", default=str(_harness.DEFAULT_RESULTS_DIR), help="results folder")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench_cold_large_", dir=a.dir))
    try:
        res = run(16 if a.quick else a.base, 0.005 if a.quick else a.ram_factor, work, a.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res["ceiling_check"] = _harness.check_ceiling("cold_large", dict(res["targets"]), quick=a.quick)
    md = markdown(res)
    _harness.write_results("cold_large_quick" if a.quick else "cold_large", res, md, a.out)
    print(md)
    return _harness.ceiling_exit(res["ceiling_check"])


if __name__ == "__main__":
    sys.exit(main())
