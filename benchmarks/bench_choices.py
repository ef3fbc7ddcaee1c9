"""A/B runs behind five reading choices (issue 16), each pair interleaved in one process.

Usage::

    python benchmarks/bench_choices.py [--quick] [--workdir DIR] [--out DIR]

1. uint8 -> float on the CPU with two loader threads converting at once: two whole-batch torch ops
   (``fastdata.loaders.torch_backend.to_unit_float``) against the 64K-element chunks used before.
2. Large fixed-size samples from a file in the page cache, 2 threads: a copy from a memory map
   (what the HDF5 reader does for every fixed column) against one ``pread`` per sample (what it did
   for samples over 512 KB), for 903 KB samples (the FLIM ``.npy`` arrays) and 4 MB ones.
3. The torch loader on JPEG shards, float output on the CPU, 2 reader threads: the reader view it
   uses now (each reader decodes its own batch, straight to float: ``decode_threads=1``,
   ``decode="float"``) against the path before (one decode pool shared by the readers, uint8
   decoding, then a batch conversion), rebuilt here from the same loader.
4. The float conversion of one decoded 256x256 image while it is in cache (``decode="float"``), 2
   threads each filling its own batch buffer: a plain cast into the batch row, then the multiply in
   place, against one mixed-type ``np.multiply(pixels, 1/255, out=row)``.
5. Mixed-size images (sides 160-352) copied into their batch padded to the largest height and width,
   one thread (what ``get_batch`` does for a mixed-size ``pixels`` field): each image's whole block
   zeroed first, then its rows copied (``fastdata.format.interface.RaggedOut``), against the rows
   copied first, then the right and bottom margins zeroed.

Each figure is the median of interleaved rounds; results go to ``<out>/choices[_quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402
import bench_images  # noqa: E402
import bench_raw  # noqa: E402

import fastdata  # noqa: E402
from fastdata.loaders.host import ThreadReader  # noqa: E402
from fastdata.loaders.torch_backend import to_unit_float  # noqa: E402

THREADS = 2
BATCH = 64


def chunked_unit_float(x: torch.Tensor, out: torch.Tensor, chunk: int = 1 << 16) -> None:
    """The conversion before: chunk by chunk, so the scaling reads back floats still in cache."""
    xf, of = x.reshape(-1), out.view(-1)
    for s in range(0, xf.numel(), chunk):
        of[s : s + chunk].copy_(xf[s : s + chunk]).mul_(1 / 255)


def float_choice(pool: ThreadPoolExecutor, batches: int) -> dict[str, Callable[[int], Any]]:
    xs = [torch.randint(0, 256, (BATCH, 256, 256, 3), dtype=torch.uint8) for _ in range(THREADS)]
    outs = [torch.empty(x.shape, dtype=torch.float32) for x in xs]

    def run(fn: Callable[[torch.Tensor, torch.Tensor], None]) -> Callable[[int], Any]:
        return lambda _i: list(pool.map(lambda t: [fn(xs[t], outs[t]) for _ in range(batches)], range(THREADS)))

    return {"float: whole-batch ops (now)": run(to_unit_float), "float: 64K-element chunks (before)": run(chunked_unit_float)}


def rows_choice(pool: ThreadPoolExecutor, path: Path, row: int, n: int, reads: int) -> dict[str, Callable[[int], Any]]:
    fd = os.open(path, os.O_RDONLY)
    m = np.memmap(path, dtype=np.uint8, mode="r", shape=(n, row)).view(np.ndarray)
    bufs = [np.empty((reads, row), np.uint8) for _ in range(THREADS)]
    plans = [np.random.default_rng(t).integers(0, n, reads) for t in range(THREADS)]

    def mapped(t: int) -> None:
        for j, i in enumerate(plans[t].tolist()):
            bufs[t][j] = m[i]

    def pread(t: int) -> None:
        for j, i in enumerate(plans[t].tolist()):
            os.preadv(fd, [bufs[t][j]], i * row)

    return {f"{row / 1e6:.2f} MB rows: memory map (now)": lambda _i: list(pool.map(mapped, range(THREADS))),
            f"{row / 1e6:.2f} MB rows: pread (before)": lambda _i: list(pool.map(pread, range(THREADS)))}


def jpeg_choice(root: Path) -> tuple[dict[str, Callable[[int], Any]], list[Any]]:
    now = fastdata.loader(root, BATCH, device="cpu", num_workers=THREADS)
    before = fastdata.loader(root, BATCH, device="cpu", num_workers=THREADS)
    before._reader.close()  # type: ignore[attr-defined]
    before._reader = ThreadReader(before.dataset, THREADS, before.config.prefetch, False)  # type: ignore[attr-defined]

    def epoch(ld: Any) -> Callable[[int], Any]:
        return lambda _i: sum(b["image"].shape[0] for b in ld)

    return {"jpeg loader: readers decode their own batch to float (now)": epoch(now),
            "jpeg loader: shared decode pool, uint8, batch conversion (before)": epoch(before)}, [now, before]


def image_float_choice(pool: ThreadPoolExecutor, batches: int) -> dict[str, Callable[[int], Any]]:
    pixels = [np.random.default_rng(t).integers(0, 256, (256, 256, 3), dtype=np.uint8) for t in range(THREADS)]
    outs = [np.empty((BATCH, 256, 256, 3), np.float32) for _ in range(THREADS)]
    scale = np.float32(1 / 255)

    def cast_then_scale(t: int) -> None:
        for _ in range(batches):
            for k in range(BATCH):
                dst = outs[t][k]
                dst[...] = pixels[t]
                np.multiply(dst, scale, out=dst)

    def mixed_multiply(t: int) -> None:
        for _ in range(batches):
            for k in range(BATCH):
                np.multiply(pixels[t], scale, out=outs[t][k])

    return {"image to float in cache: cast, then multiply in place (now)": lambda _i: list(pool.map(cast_then_scale, range(THREADS))),
            "image to float in cache: one mixed-type np.multiply (before)": lambda _i: list(pool.map(mixed_multiply, range(THREADS)))}


def padded_choice(n: int, batches: int) -> dict[str, Callable[[int], Any]]:
    rng = np.random.default_rng(6)
    images = [rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8) for h, w in rng.integers(160, 353, (n, 2))]
    plan = [rng.permutation(n)[:BATCH] for _ in range(batches)]
    buf = np.empty(BATCH * 352 * 352 * 3, np.uint8)
    return {"padded mixed images: block zeroed, then rows copied (now)":
            lambda _i: bench_raw.numpy_padded_epoch(images, plan, buf, zero_first=True),
            "padded mixed images: rows copied, then margins zeroed (before)":
            lambda _i: bench_raw.numpy_padded_epoch(images, plan, buf, zero_first=False)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run, figures meaningless")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=_harness.DEFAULT_RESULTS_DIR)
    args = ap.parse_args(argv)
    images, rounds, reads = (64, 1, 4) if args.quick else (2000, 5, 32)
    torch.set_num_threads(THREADS)
    work = Path(tempfile.mkdtemp(prefix="bench_choices_", dir=args.workdir))
    pool = ThreadPoolExecutor(THREADS)
    closers: list[Any] = []
    try:
        fns: dict[str, Callable[[int], Any]] = dict(float_choice(pool, 2 if args.quick else 8))
        for row, n in ((903_168, 40 if args.quick else 300), (4 << 20, 10 if args.quick else 60)):
            path = work / f"rows_{row}.bin"
            np.random.default_rng(0).integers(0, 256, row * n, dtype=np.uint8).tofile(path)
            fns.update(rows_choice(pool, path, row, n, reads))
        bench_images.generate(work / "jpegs", images)
        fastdata.convert(work / "jpegs", work / "jpeg_ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=THREADS)))
        _harness.warm_page_cache(work)
        jpeg, closers = jpeg_choice(work / "jpeg_ds")
        fns.update(jpeg)
        fns.update(image_float_choice(pool, 1 if args.quick else 4))
        fns.update(padded_choice(100 if args.quick else 800, 2 if args.quick else 24))
        times = _harness.time_interleaved(fns, repeats=2 * rounds, warmup=1, rounds=rounds)
        names = list(fns)
        rows = []
        for now, before in zip(names[0::2], names[1::2]):
            a, b = times[now]["median"], times[before]["median"]
            rows.append([now.split(":")[0], f"{a:.3f}", f"{b:.3f}", f"{b / a:.2f}"])
        md = (f"# Reading choices, A/B ({'quick: figures meaningless' if args.quick else 'full'})\n\n"
              + _harness.markdown_table(["choice", "now: s per run (median)", "before: s per run", "speed-up (before / now)"], rows)
              + "\n")
        print(md)
        _harness.write_results("choices_quick" if args.quick else "choices",
                               {"machine": _harness.machine_info(), "times": times}, md, args.out)
    finally:
        for ld in closers:
            ld.close()
        pool.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
