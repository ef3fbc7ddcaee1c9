"""Paired A/B (issue 49 item 3): in-place chunked data decoded by fastdata (each chunk one ``pread``, decoded
with the GIL released: ``fastdata.format.chunks``) against the same chunks read through h5py or zarr, whole
chunks into the same cache. Two data sets, each as HDF5 shuffle+LZ4, HDF5 shuffle+deflate and Zarr Zstd:

* FLIM-like: 1,024 samples of (2, 256, 21, 21) float32, quantised to quarters (so they compress), 16 a chunk;
* images: 8,192 smooth uint8 (64, 64, 3) images, 64 a chunk, and 1,024 of (224, 224, 3), 16 a chunk.

An epoch is ``fastdata.loader(index, 32, shuffle=Shards(), num_workers=2)`` (warm page cache, decoded
chunks dropped before each epoch); per round the two variants run in alternating order. Prints the paired
ratio direct / through-library per set and format: median and quartiles of the rounds.

Usage: python benchmarks/ab_inplace_direct.py [--rounds N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

import fastdata  # noqa: E402
from fastdata.format import chunks  # noqa: E402

SETS = {"FLIM (2, 256, 21, 21) float32": ((2, 256, 21, 21), "f4", 1024, 16),
        "images (64, 64, 3) uint8": ((64, 64, 3), "u1", 8192, 64),
        "images (224, 224, 3) uint8": ((224, 224, 3), "u1", 1024, 16)}
FORMATS = ("HDF5 shuffle+LZ4", "HDF5 shuffle+deflate", "Zarr Zstd")


def block(rng: np.random.Generator, n: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    if dtype == "f4":
        return (np.round(rng.standard_normal((n, *shape)) * 4) / 4).astype("f4")
    yy, xx = np.mgrid[0 : shape[0], 0 : shape[1]]
    base = rng.uniform(0, 255, (n, 1, 1, shape[2])) + 40 * np.sin((yy + xx)[None, :, :, None] / 6)
    return np.clip(base + rng.normal(0, 3, (n, *shape)), 0, 255).astype("u1")


def make(work: Path, shape: tuple[int, ...], dtype: str, n: int, chunk: int) -> dict[str, Path]:
    import h5py
    import hdf5plugin
    import zarr

    rng = np.random.default_rng(0)
    paths = {f: work / name for f, name in zip(FORMATS, ("lz4.h5", "deflate.h5", "zstd.zarr"))}
    z = zarr.create_array(str(paths["Zarr Zstd"]), shape=(n, *shape), chunks=(chunk, *shape), dtype=dtype,
                          compressors="auto")
    with h5py.File(paths["HDF5 shuffle+LZ4"], "w") as fl, h5py.File(paths["HDF5 shuffle+deflate"], "w") as fd:
        dl = fl.create_dataset("x", shape=(n, *shape), dtype=dtype, chunks=(chunk, *shape), shuffle=True,
                               **hdf5plugin.LZ4())
        dd = fd.create_dataset("x", shape=(n, *shape), dtype=dtype, chunks=(chunk, *shape), shuffle=True,
                               compression="gzip", compression_opts=4)
        for a in range(0, n, chunk):
            b = block(rng, min(chunk, n - a), shape, dtype)
            dl[a : a + len(b)] = b
            dd[a : a + len(b)] = b
            z[a : a + len(b)] = b
    out = {}
    for f, p in paths.items():
        out[f] = work / f"i_{p.stem}"
        fastdata.index(p, out[f], {"x": "/x"} if p.suffix == ".h5" else None)
    return out


def through_library(*_: Any) -> None:
    """The variant: no direct plan, so chunks are read through h5py (``read_direct``) or zarr."""
    return None


def measure(root: Path, rounds: int) -> dict[str, list[float]]:
    ld = fastdata.loader(root, 32, shuffle=fastdata.Shards(), device="cpu", num_workers=2, seed=0)
    direct = (chunks.chunk_table, chunks.zarr_chunks)
    epochs = iter(range(1 << 30))

    def run(plans: tuple[Any, Any]) -> Callable[[], int]:
        def epoch() -> int:
            chunks.chunk_table, chunks.zarr_chunks = plans
            ld.dataset.close()  # no decoded chunks kept: each epoch decodes its chunks again
            ld.set_epoch(next(epochs))
            return sum(len(b["x"]) for b in ld)

        return epoch

    try:
        return _harness.paired_rounds({"direct": run(direct), "through library": run((through_library,) * 2)}, rounds)
    finally:
        chunks.chunk_table, chunks.zarr_chunks = direct
        ld.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args()
    rows, raw = [], {}
    for label, (shape, dtype, n, chunk) in SETS.items():
        work = Path(tempfile.mkdtemp(prefix="fastdata-ab-direct-"))
        try:
            roots = make(work, shape, dtype, n, chunk)
            _harness.warm_page_cache(work)
            for fmt, root in roots.items():
                rates = measure(root, args.rounds)
                ratio = [a / b for a, b in zip(rates["direct"], rates["through library"])]
                lo, med, hi = _harness.ratio_quartiles(rates["direct"], rates["through library"])
                rows.append([label, fmt, f"{statistics.median(rates['direct']):,.0f}",
                             f"{statistics.median(rates['through library']):,.0f}", f"{med:.2f}", f"{lo:.2f}-{hi:.2f}"])
                raw[f"{label} | {fmt}"] = {"rates": rates, "ratio": ratio}
                print(" | ".join(rows[-1]), flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    head = ["data set", "format", "direct samples/s", "through library samples/s", "direct / library",
            "quartiles"]
    machine = _harness.torch_machine_line(_harness.machine_info(), "h5py", "zarr")
    md = ("# In-place chunks: decoded by fastdata vs read through h5py / zarr (paired A/B)\n\n"
          f"`python benchmarks/ab_inplace_direct.py --rounds {args.rounds}`; {machine}; "
          f"load average at the end {os.getloadavg()[0]:.2f}.\n\n" + _harness.markdown_table(head, rows) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "inplace_direct_ab.md").write_text(md)
    (args.out / "inplace_direct_ab.json").write_text(json.dumps(
        {"machine": _harness.machine_info(), "rounds": args.rounds, "runs": raw}, indent=1))
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
