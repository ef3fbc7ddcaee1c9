"""Which ``--compression`` to pick: each codec and level, cold and warm, on FLIM-like photon counts and raw images.

For each data set (FLIM-like Poisson counts, float32 (2, 256, 21, 21), 0.9 MB a sample; natural-looking raw
images, uint8 256x256x3) and each codec (none, lz4:1, lz4 (level 5), lz4:9, zstd:1, zstd (level 3), zstd:9):
convert once (HDF5, seconds and ratio), then time one epoch of ``fastdata.loader`` (defaults, shuffle=True,
batch 64) cold (the page cache emptied for the dataset's files before the pass: POSIX_FADV_DONTNEED) and warm,
in ``--rounds`` interleaved rounds (a new random order of the codecs each round; the figure is the median
pass). Decoding also measured alone: ``codec.decode_into`` of every sample of one shard from memory, one
thread (decoded MB/s per core). Reading threads: the loader's default on this machine.

Usage: python benchmarks/bench_codecs.py [--quick] [--rounds N] [--dir DIR] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402
from bench_cold import files_of, flim_sample, natural_image, write_folder  # noqa: E402

import fastdata  # noqa: E402
from fastdata.reading.readahead import drop_page_cache  # noqa: E402

CODECS = ["none", "lz4:1", "lz4", "lz4:9", "zstd:1", "zstd", "zstd:9"]
BATCH = 64


def sets(quick: bool) -> dict[str, tuple[int, Callable[[np.random.Generator, int], np.ndarray]]]:
    shape = (2, 64, 21, 21) if quick else (2, 256, 21, 21)
    side = 64 if quick else 256
    return {"FLIM photon counts float32 (2,256,21,21)": (24 if quick else 1200, lambda rng, c: flim_sample(rng, shape, c)),
            "raw images uint8 (256,256,3)": (24 if quick else 3000, lambda rng, c: natural_image(rng, side))}


def one_pass(root: Path, cold: bool) -> float:
    if cold:
        drop_page_cache(files_of(root))
    else:
        _harness.warm_page_cache(root)
    with fastdata.loader(root, BATCH, shuffle=True, device="cpu") as ld:
        t0 = time.perf_counter()
        n = sum(len(b["label"]) for b in ld)
        return n / (time.perf_counter() - t0)


def decode_rate(root: Path) -> float | None:
    """Decoded MB/s of one thread over the samples of the first shard, from memory (None: not compressed)."""
    with fastdata.open(root) as ds:
        f = next(f for f in ds.schema if f.name == "x")
        if f.compression is None:
            return None
        n = min(len(ds), 200)
        batch = ds.get_batch(np.arange(n))  # warm the pages and the handles
        t0 = time.perf_counter()
        ds.get_batch(np.arange(n))
        dt = time.perf_counter() - t0
        return batch["x"].nbytes / dt / 1e6


def run(work: Path, quick: bool, rounds: int) -> dict[str, Any]:
    res: dict[str, Any] = {"sets": {}}
    for k, (name, (n, make)) in enumerate(sets(quick).items()):
        src = work / f"src{k}"
        write_folder(src, n, make, seed=k)
        raw_bytes = sum(p.stat().st_size for p in src.rglob("*.npy"))
        roots, conv = {}, {}
        for codec in CODECS:
            roots[codec] = work / f"set{k}_{codec.replace(':', '_')}"
            t0 = time.perf_counter()
            fastdata.convert(src, roots[codec], fastdata.ConvertConfig(
                write=fastdata.WriteOptions(compression=None if codec == "none" else codec)), progress=None)
            conv[codec] = {"seconds": time.perf_counter() - t0,
                           "bytes": sum(p.stat().st_size for p in files_of(roots[codec]))}
        shutil.rmtree(src)
        os.sync()
        passes: dict[str, dict[str, list[float]]] = {c: {"cold": [], "warm": []} for c in CODECS}
        rng = random.Random(k)
        for _ in range(rounds):
            for temp in ("cold", "warm"):
                order = CODECS[:]
                rng.shuffle(order)
                for codec in order:
                    passes[codec][temp].append(one_pass(roots[codec], temp == "cold"))
        rows = {}
        for codec in CODECS:
            rows[codec] = {"ratio": conv["none"]["bytes"] / conv[codec]["bytes"],
                           "convert_s": conv[codec]["seconds"],
                           "cold": statistics.median(passes[codec]["cold"]),
                           "warm": statistics.median(passes[codec]["warm"]),
                           "decode_mb_s_one_thread": decode_rate(roots[codec]), "passes": passes[codec]}
        for codec in CODECS:
            rows[codec]["cold_x_none"] = rows[codec]["cold"] / rows["none"]["cold"]
            rows[codec]["warm_x_none"] = rows[codec]["warm"] / rows["none"]["warm"]
        res["sets"][name] = {"samples": n, "raw_bytes": raw_bytes, "rows": rows}
        for codec in CODECS:
            shutil.rmtree(roots[codec])
    return res


def markdown(res: dict[str, Any], cmd: str) -> str:
    m = res["machine"]
    out = [f"# Compression codecs, cold and warm (`{cmd}`)", "",
           f"Machine: {m.get('usable_cores')} usable cores (all the machine has), {m.get('ram_gib')} GiB RAM; {res['rounds']} interleaved rounds, median pass; "
           "loader defaults, shuffle=True, batch 64; cold = page cache emptied for the dataset's files before each pass.", ""]
    for name, s in res["sets"].items():
        out += [f"## {name}: {s['samples']} samples, {s['raw_bytes'] / 1e6:,.0f} MB", ""]
        rows = []
        for codec, r in s["rows"].items():
            dec = r["decode_mb_s_one_thread"]
            rows.append([codec, f"{r['ratio']:.2f}", f"{r['convert_s']:.1f}", f"{r['cold']:,.0f}", f"{r['cold_x_none']:.2f}",
                         f"{min(r['passes']['cold']):,.0f}-{max(r['passes']['cold']):,.0f}", f"{r['warm']:,.0f}",
                         f"{r['warm_x_none']:.2f}", "-" if dec is None else f"{dec:,.0f}"])
        out += [_harness.markdown_table(["codec", "ratio", "convert s", "cold samples/s", "cold x none", "cold range",
                                         "warm samples/s", "warm x none", "decode MB/s, 1 thread"], rows), ""]
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small run (seconds): checks the script, not the codecs")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; quick 1)")
    p.add_argument("--dir", default=None, help="work folder on the disk to measure")
    p.add_argument("--out", default=str(_harness.DEFAULT_RESULTS_DIR), help="results folder")
    a = p.parse_args()
    rounds = a.rounds or (1 if a.quick else 3)
    work = Path(tempfile.mkdtemp(prefix="bench_codecs_", dir=a.dir))
    try:
        res = run(work, a.quick, rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res.update(rounds=rounds, machine=_harness.machine_info())
    cmd = "python benchmarks/bench_codecs.py" + (" --quick" if a.quick else "") + (f" --rounds {a.rounds}" if a.rounds else "")
    md = markdown(res, cmd)
    _harness.write_results("codecs_quick" if a.quick else "codecs", res, md, a.out)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
