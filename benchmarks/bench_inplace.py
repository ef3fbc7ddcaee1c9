"""Data read where it is (``fastdata index``) against the same data converted, and against h5py.

Usage::

    python benchmarks/bench_inplace.py [--quick] [--n N] [--workdir DIR] [--out DIR]

N samples of (2, 256, 21, 21) float32 (903 KB each; values quantized to quarters, so they compress)
are written as: a contiguous HDF5 dataset, a chunked HDF5 dataset (16 samples a chunk, byte shuffle
+ LZ4, hdf5plugin), Zarr v3 arrays (16 samples a chunk; raw, and Zstd), and fastdata conversions
(uncompressed, and ``--compression zstd``). Page cache warm, batch 32, 2 reader threads, CPU; every
figure is a full epoch, median of interleaved runs, in one process:

* contiguous HDF5 in place vs converted (shuffle=True), and vs h5py fancy-index reads of sorted
  random batches in a torch DataLoader with 2 worker processes;
* chunked LZ4 HDF5 in place with shuffle="shards" (its chunks; and shuffle=True, what it costs) vs one
  sequential h5py pass over the dataset (whole chunks, one thread, a reused buffer); read
  amplification = bytes the process read (``/proc/self/io`` rchar) in an epoch over the bytes the
  sequential pass read, and decoded chunk bytes over delivered bytes;
* Zarr in place (shuffle="shards") vs the same data converted (raw vs uncompressed; Zstd vs zstd).

Results go to ``<out>/inplace[_quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

import fastdata  # noqa: E402
from fastdata.converters.arrays import H5Source, ZarrSource  # noqa: E402
from fastdata.write import WriteOptions, write_dataset  # noqa: E402
from fastdata.write.destination import prepare_dst  # noqa: E402

SHAPE = (2, 256, 21, 21)
BATCH = 32
CHUNK = 16


def make_sources(work: Path, n: int) -> None:
    import h5py
    import hdf5plugin
    import zarr

    rng = np.random.default_rng(0)
    with h5py.File(work / "contig.h5", "w") as fc, h5py.File(work / "lz4.h5", "w") as fz:
        dc = fc.create_dataset("x", shape=(n, *SHAPE), dtype="f4")
        dz = fz.create_dataset("x", shape=(n, *SHAPE), dtype="f4", chunks=(CHUNK, *SHAPE), shuffle=True,
                               **hdf5plugin.LZ4())
        for a in range(0, n, CHUNK):
            block = (np.round(rng.standard_normal((min(CHUNK, n - a), *SHAPE)) * 4) / 4).astype("f4")
            dc[a : a + len(block)] = block
            dz[a : a + len(block)] = block
    x = h5py.File(work / "contig.h5", "r")["x"]
    for name, comp in (("raw.zarr", None), ("zstd.zarr", "auto")):
        z = zarr.create_array(str(work / name), shape=(n, *SHAPE), chunks=(CHUNK, *SHAPE), dtype="f4",
                              compressors=comp)
        for a in range(0, n, CHUNK):
            z[a : a + CHUNK] = x[a : a + CHUNK]
    x.file.close()


def convert(src: Any, dst: Path, compression: str | None = None) -> Path:
    with prepare_dst(dst, [], overwrite=False) as target:
        write_dataset(src, target, WriteOptions(workers=2, compression=compression))
    return dst


def rchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar")).split()[1])


def loader_epoch(root: Path, shuffle: Any) -> tuple[Callable[[int], Any], Any]:
    ld = fastdata.loader(root, BATCH, shuffle=shuffle, device="cpu", num_workers=2, seed=0)

    def epoch(i: int) -> None:
        ld.dataset.close()  # no decoded chunks kept from the last epoch: each epoch reads its data again
        ld.set_epoch(i)
        for _ in ld:
            pass

    return epoch, ld


class _H5Fancy:
    """What people write: a torch Dataset reading sorted random batches with h5py fancy indexing."""

    def __init__(self, path: str, n: int) -> None:
        self.path, self.n, self.d = path, n, None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: list[int]) -> Any:
        import h5py
        import torch

        if self.d is None:  # opened in each worker, never before the fork
            self.d = h5py.File(self.path, "r")["x"]
        return torch.from_numpy(self.d[np.sort(np.asarray(idx))])


def h5py_dataloader(path: Path, n: int) -> Callable[[int], Any]:
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    ds = _H5Fancy(str(path), n)
    dl = DataLoader(ds, batch_size=None, sampler=BatchSampler(RandomSampler(ds), BATCH, False),  # type: ignore[arg-type]
                    num_workers=2, persistent_workers=True)
    torch.set_num_threads(1)
    return lambda i: [None for _ in dl]


def sequential_h5py(path: Path, n: int) -> Callable[[int], Any]:
    import h5py
    import hdf5plugin  # noqa: F401

    f = h5py.File(path, "r", rdcc_nbytes=0)
    d = f["x"]
    buf = np.empty((CHUNK, *SHAPE), dtype="f4")

    def run(i: int) -> None:
        for a in range(0, n, CHUNK):
            k = min(CHUNK, n - a)
            d.read_direct(buf[:k], source_sel=np.s_[a : a + k])

    return run


def amplification(fn: Callable[[int], Any], ld: Any) -> tuple[int, int]:
    """(bytes read by the process, chunk bytes decoded) in one epoch of ``fn``."""
    def decoded() -> int:
        return 0 if ld is None else sum(r.columns["x"].decoded_bytes() for r in ld.dataset.readers)

    if ld is not None:
        ld.dataset.close()  # (the epoch does it too) so that the counts start from zero
    before = decoded()
    r0 = rchar()
    fn(99)
    read = rchar() - r0
    return read, decoded() - before


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run, figures meaningless")
    ap.add_argument("--n", type=int, default=None, help="samples (default 512; --quick 48)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=_harness.DEFAULT_RESULTS_DIR)
    args = ap.parse_args(argv)
    n = args.n or (48 if args.quick else 512)
    rounds = 1 if args.quick else 6
    work = Path(tempfile.mkdtemp(prefix="bench_inplace_", dir=args.workdir))
    try:
        results = run(work, n, rounds, args.quick)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    name = "inplace_quick" if args.quick else "inplace"
    _harness.write_results(name, results, results.pop("markdown"), args.out)
    print(Path(args.out) / f"{name}.md")
    return 0


def run(work: Path, n: int, rounds: int, quick: bool) -> dict[str, Any]:
    make_sources(work, n)
    fastdata.index(work / "contig.h5", work / "i_contig", {"x": "/x"})
    fastdata.index(work / "lz4.h5", work / "i_lz4", {"x": "/x"})
    fastdata.index(work / "raw.zarr", work / "i_zraw")
    fastdata.index(work / "zstd.zarr", work / "i_zzstd")
    convert(H5Source.from_src(work / "contig.h5", {"x": "/x"}), work / "conv")
    convert(ZarrSource.from_src(work / "raw.zarr"), work / "conv_zstd", compression="zstd")
    _harness.warm_page_cache(work)
    fns: dict[str, Callable[[int], Any]] = {}
    lds: dict[str, Any] = {}
    for label, root, shuffle in [("contiguous HDF5, in place", "i_contig", True), ("converted", "conv", True),
                                 ("LZ4 HDF5, in place, chunks", "i_lz4", "shards"),
                                 ("LZ4 HDF5, in place, shuffle=True", "i_lz4", True),
                                 ("Zarr raw, in place, chunks", "i_zraw", "shards"),
                                 ("Zarr Zstd, in place, chunks", "i_zzstd", "shards"),
                                 ("converted, zstd", "conv_zstd", True)]:
        fns[label], lds[label] = loader_epoch(work / root, shuffle)
    fns["h5py fancy index, DataLoader 2 workers"] = h5py_dataloader(work / "contig.h5", n)
    fns["h5py sequential pass, LZ4"] = sequential_h5py(work / "lz4.h5", n)
    times = _harness.time_interleaved(fns, repeats=2 * rounds, warmup=1, rounds=rounds)
    gb = n * int(np.prod(SHAPE)) * 4 / 1e9
    speed = {k: gb / v["median"] for k, v in times.items()}
    best = {k: gb / v["min"] for k, v in times.items()}  # the least disturbed epoch (a shared machine)
    seq_read, _ = amplification(fns["h5py sequential pass, LZ4"], None)
    amp = {}
    for label in ("LZ4 HDF5, in place, chunks", "LZ4 HDF5, in place, shuffle=True"):
        read, decoded = amplification(fns[label], lds[label])
        amp[label] = {"read_over_sequential": read / seq_read, "decoded_over_delivered": decoded / (gb * 1e9)}
    pairs = {
        "in place / converted (contiguous HDF5)": ("contiguous HDF5, in place", "converted"),
        "in place / h5py DataLoader (contiguous HDF5)":
            ("contiguous HDF5, in place", "h5py fancy index, DataLoader 2 workers"),
        "chunks / sequential h5py (LZ4 HDF5)": ("LZ4 HDF5, in place, chunks", "h5py sequential pass, LZ4"),
        "shuffle=True / sequential h5py (LZ4 HDF5)": ("LZ4 HDF5, in place, shuffle=True", "h5py sequential pass, LZ4"),
        "Zarr raw in place / converted": ("Zarr raw, in place, chunks", "converted"),
        "Zarr Zstd in place / converted zstd": ("Zarr Zstd, in place, chunks", "converted, zstd"),
    }
    ratios = {k: speed[a] / speed[b] for k, (a, b) in pairs.items()}
    ratios_best = {k: best[a] / best[b] for k, (a, b) in pairs.items()}
    for ld in lds.values():
        ld.close()
    md = render(n, gb, rounds, quick, times, speed, ratios, ratios_best, amp)
    return {"machine": _harness.machine_info(), "n": n, "shape": SHAPE, "batch": BATCH, "times": times,
            "gb_per_s": speed, "ratios": ratios, "ratios_best": ratios_best, "load_avg": os.getloadavg(), "amplification": amp, "markdown": md}


def render(n: int, gb: float, rounds: int, quick: bool, times: dict[str, Any], speed: dict[str, float],
           ratios: dict[str, float], ratios_best: dict[str, float], amp: dict[str, dict[str, float]]) -> str:
    """The Markdown report of one run."""
    rows = [[k, f"{speed[k]:.2f}", f"{times[k]['median'] * 1e3:.0f}", f"{times[k]['p10'] * 1e3:.0f}",
             f"{times[k]['p90'] * 1e3:.0f}"] for k in times]
    return (f"# In place vs converted ({'quick: figures meaningless' if quick else 'full'})\n\n"
          f"{n} samples of {SHAPE} float32 ({gb:.2f} GB), batch {BATCH}, 2 reader threads, page cache warm, "
          f"median of {2 * rounds} epochs each, interleaved; load average at the end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.\n\n"
          + _harness.markdown_table(["reader", "GB/s", "epoch ms (median)", "p10", "p90"], rows) + "\n\n"
          + _harness.markdown_table(["ratio", "of medians", "of best epochs"],
                                    [[k, f"{v:.2f}", f"{ratios_best[k]:.2f}"] for k, v in ratios.items()]) + "\n\n"
          + _harness.markdown_table(["read amplification", "bytes read / sequential pass", "decoded / delivered"],
                                    [[k, f"{v['read_over_sequential']:.2f}", f"{v['decoded_over_delivered']:.2f}"]
                                     for k, v in amp.items()]) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
