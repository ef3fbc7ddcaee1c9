"""Benchmark converting Python objects (``fastdata.convert(obj, ...)``) against converting files and copying bytes.

Usage::

    python benchmarks/bench_convert_objects.py [--quick] [--rounds R] [--files N] [--rows N] [--out DIR] [--workdir DIR]

1. A torch Dataset that ``np.load``s FLIM-like files ((2, 256, 21, 21) float32, 0.9 MB each) against
   ``fastdata.convert`` of the same folder (the npy-folder source), both with 2 workers, HDF5, in
   interleaved rounds (which goes first rotates); the page cache is warm. Figure: the median over rounds of
   the paired ratio folder-seconds / Dataset-seconds (the Dataset's throughput as a share of the folder's;
   target at least 0.8), and its spread. LitData's ``optimize`` (2 workers) and FFCV's
   ``DatasetWriter.from_indexed_dataset`` run on the same Dataset in the same rounds where they import.
2. A Hugging Face dataset of fixed-shape float32 arrays (``Array2D``), saved to disk and loaded memory-mapped,
   against a raw copy of its Arrow file (copied and fsynced, as a shard is). Figure: copy-seconds /
   convert-seconds per round (target at least 0.8). Also timed: ``fastdata convert`` of the same rows
   saved as ``.npy`` arrays (memory-mapped rows: the write engine with its cheapest source), which
   separates the cost of reading the Arrow table from the cost of the write engine. Also timed, as a
   diagnostic (not the target): the same dataset with its Arrow file rewritten in one ``write`` call (the same
   bytes; ``datasets`` writes the file a record batch at a time, and the page cache then holds it in small
   pieces, which costs the writer processes reading it through the memory map), and a raw copy of that file.

Results go to stdout (markdown) and ``<out>/convert_objects[_quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from _harness import DEFAULT_RESULTS_DIR, machine_info, markdown_table, warm_page_cache, write_results

import fastdata

FLIM_SHAPE = (2, 256, 21, 21)
HF_SHAPE = (128, 128)
TARGET = 0.8
WORKERS = 2
COPY1 = "copy of the Arrow file rewritten in one write (diagnostic)"
HF1 = "fastdata.convert(the dataset, its Arrow file rewritten in one write) (diagnostic)"


class NpyFiles(torch.utils.data.Dataset):
    """What a user's Dataset does: one ``np.load`` per sample."""

    def __init__(self, files: list[str]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return {"x": np.load(self.files[i])}


def make_flim(root: Path, n: int) -> list[str]:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    files = []
    for i in range(n):
        path = root / f"{i:06d}.npy"
        np.save(path, rng.random(FLIM_SHAPE, dtype=np.float32))
        files.append(str(path))
    return files


def make_hf(root: Path, n: int) -> Any:
    import datasets

    feats = datasets.Features({"x": datasets.Array2D(HF_SHAPE, "float32"), "label": datasets.Value("int64")})

    def rows() -> Any:
        rng = np.random.default_rng(1)
        for i in range(n):
            yield {"x": rng.random(HF_SHAPE, dtype=np.float32), "label": i}

    datasets.Dataset.from_generator(rows, features=feats, cache_dir=str(root / "cache")).save_to_disk(str(root / "hf"))
    return datasets.load_from_disk(str(root / "hf"))


def _config() -> fastdata.ConvertConfig:
    return fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=WORKERS), overwrite=True)


def _item(ds: NpyFiles, i: int) -> dict[str, np.ndarray]:
    return ds[i]


def _litdata(ds: NpyFiles, out: Path) -> Callable[[], None] | None:
    try:
        from litdata import optimize
    except ImportError:
        return None

    def run() -> None:
        shutil.rmtree(out, ignore_errors=True)
        optimize(fn=functools.partial(_item, ds), inputs=list(range(len(ds))), output_dir=str(out), num_workers=WORKERS, chunk_bytes="256MB",
                 mode="overwrite")
    return run


def _ffcv(ds: NpyFiles, out: Path) -> Callable[[], None] | None:
    try:
        from ffcv.fields import NDArrayField
        from ffcv.writer import DatasetWriter
    except ImportError:
        return None

    class Tuples(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(ds)

        def __getitem__(self, i: int) -> tuple[np.ndarray]:
            return (ds[i]["x"],)

    def run() -> None:
        out.unlink(missing_ok=True)
        DatasetWriter(str(out), {"x": NDArrayField(np.dtype("float32"), FLIM_SHAPE)},
                      num_workers=WORKERS).from_indexed_dataset(Tuples(), chunksize=16)
    return run


def _copy_fsync(src: str, dst: Path) -> None:
    shutil.copyfile(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system  # worker processes count once reaped


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (this process and its finished children) of one call."""
    c0, t0 = _cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, _cpu() - c0


def run_rounds(fns: dict[str, Callable[[], Any]], rounds: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall and CPU seconds of each callable per round; the order rotates each round. One untimed warm-up
    round first."""
    names = list(fns)
    for name in names:
        fns[name]()
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            wall, c = _timed(fns[name])
            times[name].append(wall)
            cpu[name].append(c)
    return times, cpu


def _ratio(base: list[float], other: list[float]) -> dict[str, Any]:
    """base-seconds / other-seconds per round: other's throughput as a share of base's."""
    r = [b / o for b, o in zip(base, other)]
    return {"median": statistics.median(r), "min": min(r), "max": max(r), "per_round": r}


def bench_flim(work: Path, n: int, rounds: int) -> dict[str, Any]:
    files = make_flim(work / "flim", n)
    ds = NpyFiles(files)
    warm_page_cache(work / "flim")
    fns: dict[str, Callable[[], Any]] = {
        "fastdata convert (folder)": lambda: fastdata.convert(work / "flim", work / "out_folder", _config()),
        "fastdata.convert(Dataset)": lambda: fastdata.convert(ds, work / "out_ds", _config()),
    }
    missing = {}
    for name, make in (("litdata optimize", _litdata), ("ffcv from_indexed_dataset", _ffcv)):
        fn = make(ds, work / name.split()[0] / ("out.beton" if name.startswith("ffcv") else ""))
        if fn is None:
            missing[name] = "not importable"
        else:
            fns[name] = fn
    times, cpu = run_rounds(fns, rounds)
    base = times["fastdata convert (folder)"]
    return {"files": n, "mb": n * int(np.prod(FLIM_SHAPE)) * 4 / 1e6, "seconds": times, "cpu_seconds": cpu,
            "missing": missing,
            "ratios": {k: _ratio(base, v) for k, v in times.items() if k != "fastdata convert (folder)"}}


def bench_hf(work: Path, n: int, rounds: int) -> dict[str, Any]:
    hf = make_hf(work, n)
    arrow = [f["filename"] for f in hf.cache_files]
    cols = hf.with_format("numpy")[:]
    (work / "npy").mkdir()
    arrays = {k: work / "npy" / f"{k}.npy" for k in ("x", "label")}
    for k, path in arrays.items():
        np.save(path, np.ascontiguousarray(cols[k]))
    warm_page_cache(work / "hf", work / "npy")
    import datasets

    shutil.copytree(work / "hf", work / "hf_one_write")
    for a in arrow:  # the same bytes, written in one call
        data = Path(a).read_bytes()
        (work / "hf_one_write" / Path(a).name).write_bytes(data)
        del data
    hf1 = datasets.load_from_disk(str(work / "hf_one_write"))
    arrow1 = [f["filename"] for f in hf1.cache_files]
    (work / "copy").mkdir()
    (work / "copy1").mkdir()
    hf_name, npy_name = "fastdata.convert(hf dataset)", "fastdata convert of the same rows as .npy arrays"
    fns: dict[str, Callable[[], Any]] = {
        "copy of the Arrow bytes": lambda: [_copy_fsync(a, work / "copy" / Path(a).name) for a in arrow],
        hf_name: lambda: fastdata.convert(hf, work / "out_hf", _config()),
        npy_name: lambda: fastdata.convert(None, work / "out_npy", _config(), arrays=arrays),
        COPY1: lambda: [_copy_fsync(a, work / "copy1" / Path(a).name) for a in arrow1],
        HF1: lambda: fastdata.convert(hf1, work / "out_hf1", _config()),
    }
    times, cpu = run_rounds(fns, rounds)
    nbytes = sum(os.path.getsize(a) for a in arrow)
    return {"rows": n, "arrow_mb": nbytes / 1e6, "seconds": times, "cpu_seconds": cpu,
            "ratio": _ratio(times["copy of the Arrow bytes"], times[hf_name]),
            "ratio_to_npy": _ratio(times[npy_name], times[hf_name]),
            "ratio_one_write": _ratio(times[COPY1], times[HF1])}


def markdown(res: dict[str, Any], cmd: str) -> str:
    f, h = res["flim"], res["hf"]
    med = statistics.median
    rows = [[name, f"{med(t):.2f}", f"{med(f['cpu_seconds'][name]):.2f}", f"{f['mb'] / med(t):.0f}",
             f"{f['ratios'][name]['median']:.2f} ({f['ratios'][name]['min']:.2f}-{f['ratios'][name]['max']:.2f})"
             if name in f["ratios"] else "1"] for name, t in f["seconds"].items()]
    rows += [[name, "-", "-", "-", why] for name, why in f["missing"].items()]
    hrows = [[name, f"{med(t):.2f}", f"{med(h['cpu_seconds'][name]):.2f}", f"{h['arrow_mb'] / med(t):.0f}"]
             for name, t in h["seconds"].items()]
    hr = h["ratio"]
    return "\n".join([
        f"# Converting Python objects ({res['mode']} run)", "", f"Command: `{cmd}`", "",
        f"Machine: {res['machine']['usable_cores']} usable cores, load average {res['machine']['load_average']} "
        "(shared with other work: see the spread).", "",
        f"## A torch Dataset that np.loads {f['files']} FLIM-like files {FLIM_SHAPE} float32 ({f['mb']:.0f} MB), "
        f"{WORKERS} workers", "",
        markdown_table(["writer", "median s", "median CPU s", "MB/s", "share of the folder's speed (min-max)"], rows), "",
        f"Target: the Dataset at least {TARGET} of `fastdata convert` on the same folder. Ratio per round: folder "
        f"seconds / other seconds, median of {len(next(iter(f['seconds'].values())))} interleaved rounds.", "",
        f"## A Hugging Face dataset of {h['rows']} Array2D{HF_SHAPE} float32 rows ({h['arrow_mb']:.0f} MB of Arrow)", "",
        markdown_table(["writer", "median s", "median CPU s", "MB/s"], hrows), "",
        f"Share of the raw copy's speed: {hr['median']:.2f} (min {hr['min']:.2f}, max {hr['max']:.2f}); target at "
        f"least {TARGET}. Share of the speed of converting the same rows from .npy arrays (the write engine "
        f"with its cheapest source): {h['ratio_to_npy']['median']:.2f} (min {h['ratio_to_npy']['min']:.2f}, "
        f"max {h['ratio_to_npy']['max']:.2f}).", "",
        *([f"Diagnostic, the same bytes with the Arrow file rewritten in one write: the conversion's share of "
           f"that file's copy speed {h['ratio_one_write']['median']:.2f} (min {h['ratio_one_write']['min']:.2f}, "
           f"max {h['ratio_one_write']['max']:.2f}).", ""] if "ratio_one_write" in h else []),
        "CPU s: user + system time of the process and its worker processes (a writer's own work, steadier than "
        "wall time on a shared machine; the kernel's writeback is not in it).",
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--files", type=int, default=400)
    ap.add_argument("--rows", type=int, default=4000)
    ap.add_argument("--out", default=str(DEFAULT_RESULTS_DIR))
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    files, rows, rounds = (40, 400, 2) if args.quick else (args.files, args.rows, args.rounds)
    work = Path(tempfile.mkdtemp(prefix="bench-objects-", dir=args.workdir))
    try:
        res = {"machine": machine_info(), "mode": "quick" if args.quick else "full",
               "flim": bench_flim(work, files, rounds), "hf": bench_hf(work, rows, rounds)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cmd = "python benchmarks/bench_convert_objects.py " + " ".join(sys.argv[1:])
    md = markdown(res, cmd.strip())
    print(md)
    write_results("convert_objects_quick" if args.quick else "convert_objects", res, md, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
