"""Benchmark image loading: a naive PIL-per-file DataLoader against fastdata raw / encoded / jpeg shards.

Usage::

    python benchmarks/bench_images.py [--quick] [--backend hdf5|lmdb] [--out DIR] [--workdir DIR]

Generates synthetic 256x256 JPEGs (quality 90, gradients + shapes + mild noise, about 30 KB
each) in 10 class folders, converts them with ``fastdata.convert`` three ways
(``--images raw --size 256 256``, ``encoded``, ``jpeg``), reads every file once so that all
methods read from the page cache, checks that every method returns the right pixels, and
times whole epochs in random batches of 64 (seeded):

* naive: torch DataLoader over the folder, PIL decode to a uint8 CHW tensor per sample,
  2 worker processes;
* fastdata: ``fastdata.open(dst).get_batch(idx)`` in the main process with 2 decode threads,
  and through a DataLoader with 2 worker processes (one batch per call, 1 decode thread each).
  Batches come back as ``(B, C, H, W)`` uint8 tensors (channels-last views of the HWC arrays).

Also single-thread decode rates of one image: simplejpeg, PIL, and both at 1/2 scale
(PIL ``draft()``, simplejpeg ``min_height``/``min_width``). Results go to stdout (markdown) and, via
``_harness.write_results``, to ``<out>/images[_quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import simplejpeg
import torch
from PIL import Image, ImageDraw
from torch.utils.data import BatchSampler, DataLoader, Dataset
import fastdata
from fastdata.loaders import LoaderConfig
from _harness import DEFAULT_RESULTS_DIR, machine_info, markdown_table, time_interleaved, warm_page_cache, write_results

SIZE = 256
QUALITY = 90
NOISE = 14.0  # standard deviation, in 8-bit levels: gives about 30 KB per image at quality 90
CLASSES = 10
BATCH = 64
WORKERS = 2
SEED = 0
FULL = {"images": 2000, "repeats": 5, "decode_images": 500}
QUICK = {"images": 200, "repeats": 2, "decode_images": 50}
MODES = {
    "raw": fastdata.ImageOptions(images="raw", size=(SIZE, SIZE)),
    "encoded": fastdata.ImageOptions(images="encoded"),
    "jpeg": fastdata.ImageOptions(images="jpeg", quality=QUALITY),
}
TARGETS = {"raw": 15.0, "encoded": 2.0}  # x naive, for the best fastdata method of each mode


def make_image(seed: int) -> bytes:
    """One synthetic photo-like JPEG: a two-axis colour gradient, 6-13 filled shapes, Gaussian noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / SIZE
    c0, c1, c2 = rng.uniform(0, 255, (3, 3))
    angle = rng.uniform(0, 2 * np.pi)
    t = np.cos(angle) * x + np.sin(angle) * y
    base = c0 + (c1 - c0) * t[..., None] + (c2 - c0) * (x * y)[..., None]
    im = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(rng.integers(6, 14)):
        x0, y0 = rng.uniform(-40, SIZE, 2)
        w, h = rng.uniform(15, 120, 2)
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        kind = rng.integers(3)
        if kind == 0:
            draw.ellipse([x0, y0, x0 + w, y0 + h], fill=colour)
        elif kind == 1:
            draw.rectangle([x0, y0, x0 + w, y0 + h], fill=colour)
        else:
            draw.polygon([tuple(p) for p in rng.uniform(0, SIZE, (rng.integers(3, 7), 2))], fill=colour)
    noisy = np.asarray(im).astype(np.float32) + rng.normal(0, NOISE, (SIZE, SIZE, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=QUALITY)
    return buf.getvalue()


def _write_one(args: tuple[str, int]) -> int:
    path, seed = args
    data = make_image(seed)
    Path(path).write_bytes(data)
    return len(data)


def generate(root: Path, n: int) -> list[Path]:
    """``root/class_<k>/<i>.jpg`` for i < n, class i % 10; returns the paths in sorted (= sample) order."""
    paths = [root / f"class_{i % CLASSES}" / f"{i:06d}.jpg" for i in range(n)]
    for k in range(CLASSES):
        (root / f"class_{k}").mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(WORKERS) as ex:
        list(ex.map(_write_one, [(str(p), SEED * 1_000_003 + i) for i, p in enumerate(paths)], chunksize=32))
    return sorted(paths)


class FolderImages(Dataset):
    """The naive loader: one PIL decode per sample, to a uint8 CHW tensor (like ``pil_to_tensor``)."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = [str(p) for p in paths]
        self.labels = [int(Path(p).parent.name.split("_")[1]) for p in self.paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.paths[i]) as im:
            a = np.asarray(im.convert("RGB"))
        return torch.from_numpy(a.copy()).permute(2, 0, 1), self.labels[i]


class ShardBatches(Dataset):
    """fastdata in DataLoader workers: item ``k`` is a whole batch (indices from a BatchSampler)."""

    def __init__(self, path: Path, n: int) -> None:
        self.path, self.n = str(path), n
        self.ds: fastdata.Dataset | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.ds is None:  # opened in the worker, with one decode thread per worker
            self.ds = fastdata.open(self.path, decode_threads=1)
        b = self.ds.get_batch(idx)
        return torch.from_numpy(b["image"]).permute(0, 3, 1, 2), torch.from_numpy(b["label"])


def epoch_batches(n: int, epoch: int) -> list[np.ndarray]:
    order = np.random.default_rng(SEED + epoch).permutation(n)
    return [order[i : i + BATCH] for i in range(0, n, BATCH)]


class EpochSampler(torch.utils.data.Sampler):
    """Sample indices of the epoch set by ``set_epoch`` (the same orders as ``epoch_batches``)."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch = n, 0

    def __iter__(self) -> Iterator[int]:
        return iter(np.random.default_rng(SEED + self.epoch).permutation(self.n).tolist())

    def __len__(self) -> int:
        return self.n


def loader_epoch(loader: DataLoader, sampler: EpochSampler) -> Callable[[int], int]:
    def run(i: int) -> int:
        sampler.epoch = i
        return sum(len(labels) for _, labels in loader)

    return run


def get_batch_epoch(ds: fastdata.Dataset, n: int) -> Callable[[int], int]:
    def run(i: int) -> int:
        count = 0
        for idx in epoch_batches(n, i):
            b = ds.get_batch(idx)
            images = torch.from_numpy(b["image"]).permute(0, 3, 1, 2)
            count += images.shape[0]
        return count

    return run


def fastdata_loader_epoch(ld: Any) -> Callable[[int], int]:
    """One epoch of ``fastdata.loader`` (each full pass moves it to the next epoch's order)."""

    def run(i: int) -> int:
        return sum(b["label"].shape[0] for b in ld)

    return run


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def check_pixels(datasets: dict[str, fastdata.Dataset], paths: list[Path]) -> dict[str, float]:
    """raw and encoded must equal PIL's decode of the sources; jpeg gives its PSNR."""
    idx = np.arange(min(BATCH, len(paths)))
    expected = np.stack([np.asarray(Image.open(paths[i]).convert("RGB")) for i in idx])
    out = {}
    for mode, ds in datasets.items():
        got = ds.get_batch(idx)["image"]
        if mode in ("raw", "encoded") and not np.array_equal(got, expected):
            raise RuntimeError(f"{mode}: pixels differ from PIL's decode of the source files")
        out[mode] = psnr(got, expected)
    return out


def decode_rates(paths: list[Path], count: int) -> dict[str, float]:
    """Single-thread images/s of one-image decoders, full size and at 1/2 scale."""
    blobs = [p.read_bytes() for p in paths[:count]]

    def pil(data: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))

    def pil_draft(data: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(data)) as im:
            im.draft("RGB", (SIZE // 2, SIZE // 2))
            return np.asarray(im.convert("RGB"))

    fns: dict[str, Callable[[bytes], Any]] = {"PIL": pil, "PIL draft() 1/2 scale": pil_draft}
    fns["simplejpeg"] = lambda d: simplejpeg.decode_jpeg(d, colorspace="RGB")
    half = {"min_height": SIZE // 2, "min_width": SIZE // 2}  # libjpeg-turbo DCT scaling, like draft()
    fns["simplejpeg 1/2 scale"] = lambda d: simplejpeg.decode_jpeg(d, colorspace="RGB", **half)
    calls = {name: (lambda i, fn=fn: [fn(d) for d in blobs]) for name, fn in fns.items()}
    timings = time_interleaved(calls, repeats=3, warmup=1, rounds=3)
    return {name: len(blobs) / t["median"] for name, t in timings.items()}


def disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def run(settings: dict[str, Any], workdir: Path, backend: str) -> dict[str, Any]:
    n, repeats = settings["images"], settings["repeats"]
    src = workdir / "images"
    t0 = time.perf_counter()
    paths = generate(src, n)
    src_bytes = disk_bytes(src)
    print(f"generated {n} JPEGs ({src_bytes / n / 1e3:.1f} KB each) in {time.perf_counter() - t0:.1f} s", flush=True)

    conversions, datasets = {}, {}
    for mode, opts in MODES.items():
        dst = workdir / mode
        report = fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=WORKERS), images=opts))
        print(f"convert {mode}: {report.summary()}", flush=True)
        conversions[mode] = {"seconds": report.seconds, "bytes": disk_bytes(dst), "shards": report.shards}
        datasets[mode] = fastdata.open(dst, decode_threads=WORKERS)
    quality = check_pixels(datasets, paths)
    warm_page_cache(src, *(workdir / m for m in MODES))  # every method reads from memory

    naive_sampler = EpochSampler(n)
    naive = DataLoader(FolderImages(paths), batch_size=BATCH, sampler=naive_sampler, num_workers=WORKERS,
                       persistent_workers=True)
    methods: dict[str, Callable[[int], int]] = {"naive: DataLoader, PIL per file, 2 workers": loader_epoch(naive, naive_sampler)}
    for mode, ds in datasets.items():
        threads = "" if mode == "raw" else f", {WORKERS} decode threads"
        methods[f"{mode}: get_batch in the main process{threads}"] = get_batch_epoch(ds, n)
        sampler = EpochSampler(n)
        loader = DataLoader(ShardBatches(workdir / mode, n), sampler=BatchSampler(sampler, BATCH, drop_last=False),
                            batch_size=None, num_workers=WORKERS, persistent_workers=True)
        methods[f"{mode}: DataLoader, get_batch per batch, 2 workers"] = loader_epoch(loader, sampler)
    # fastdata.loader last: its buffers must exist only after the DataLoader workers above have forked
    loaders = []
    for mode in ("raw", "encoded"):
        for label, config in (("defaults, float NCHW", None), ("uint8 kept", LoaderConfig(images=()))):
            ld = fastdata.loader(workdir / mode, BATCH, device="cpu", config=config)
            loaders.append(ld)
            methods[f"{mode}: fastdata.loader, {label}"] = fastdata_loader_epoch(ld)
    try:
        # one timed epoch per method per round, methods in rotating order: load drift hits all alike
        timings = time_interleaved(methods, repeats=repeats, warmup=1, rounds=repeats)
    finally:
        for ds in datasets.values():
            ds.close()
        for ld in loaders:
            ld.close()

    naive_s = timings[next(iter(methods))]["median"]
    rows = []
    for name, t in timings.items():
        rows.append({"method": name, **{f"{k}_s": v for k, v in t.items() if k != "runs"}, "runs": t["runs"],
                     "samples_per_s": n / t["median"], "speedup_vs_naive": naive_s / t["median"]})
    return {"images": n, "source_bytes": src_bytes, "conversions": conversions, "psnr_db": quality,
            "methods": rows, "decode_rates": decode_rates(paths, settings["decode_images"])}


def check_targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    checks = []
    for mode, goal in TARGETS.items():
        best = max((m for m in result["methods"] if m["method"].startswith(mode + ":")), key=lambda m: m["speedup_vs_naive"])
        checks.append({"mode": mode, "method": best["method"], "target": goal, "measured": best["speedup_vs_naive"],
                       "met": best["speedup_vs_naive"] >= goal})
    return checks


def render(info: dict[str, Any], settings: dict[str, Any], result: dict[str, Any], checks: list[dict[str, Any]]) -> str:
    n = result["images"]
    rows = [[m["method"], f"{m['samples_per_s']:,.0f}", f"{m['speedup_vs_naive']:.1f}", f"{m['median_s']:.3f}",
             f"{m['p10_s']:.3f}–{m['p90_s']:.3f}"] for m in result["methods"]]
    disk = [["source JPEG files", f"{result['source_bytes'] / 1e6:.1f}", f"{result['source_bytes'] / n / 1e3:.1f}", "", ""]]
    for mode, c in result["conversions"].items():
        disk.append([f"{mode} shards ({settings['backend']})", f"{c['bytes'] / 1e6:.1f}", f"{c['bytes'] / n / 1e3:.1f}",
                     f"{c['seconds']:.1f}", f"{result['psnr_db'][mode]:.1f}"])
    gpu = info["gpu"] if info["cuda_available"] else "none"
    lines = [
        f"# Image loading benchmark ({settings['mode']} run)",
        "",
        f"Machine: {info['cpu_model']}, {info['usable_cores']} usable cores, {info['ram_gib']} GiB RAM, GPU: {gpu}; "
        f"Python {info['python']}, torch {info['torch']}, JPEG decoder: {settings['jpeg_decoder']}.",
        "",
        f"{n} synthetic {SIZE}x{SIZE} JPEGs (quality {QUALITY}) in {CLASSES} class folders; epochs of random batches "
        f"of {BATCH} (seeded); warm page cache; {settings['repeats']} rounds, each one untimed and one timed epoch "
        "per method, methods in rotating order. "
        "Every method yields uint8 (B, 3, H, W) tensors.",
        "",
        markdown_table(["method", "samples/s", "x naive", "median s/epoch", "p10–p90 s"], rows),
        "",
        markdown_table(["data", "MB on disk", "KB/image", "convert s", "PSNR dB vs source"], disk),
        "",
        "Single-thread decode of one image (images/s): "
        + ", ".join(f"{k} {v:,.0f}" for k, v in result["decode_rates"].items()) + ".",
        "",
        "Targets (best fastdata method of the mode, x naive):",
        "",
    ]
    for c in checks:
        lines.append(f"- {c['mode']}: {c['measured']:.1f}x ({c['method']}; target >= {c['target']:g}x): "
                     f"{'met' if c['met'] else 'NOT met'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 images, 2 epochs per method (CI smoke run, < 1 min)")
    parser.add_argument("--backend", choices=["hdf5", "lmdb"], default="hdf5", help="shard format (default: hdf5)")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR, help="results directory (default: %(default)s)")
    parser.add_argument("--workdir", type=Path, default=None, help="parent folder for generated data (default: temp dir)")
    args = parser.parse_args(argv)
    settings = {"mode": "quick" if args.quick else "full", **(QUICK if args.quick else FULL), "backend": args.backend,
                "batch_size": BATCH, "workers": WORKERS, "seed": SEED, "jpeg_decoder": "simplejpeg"}
    info = machine_info()
    parent = args.workdir if args.workdir is not None else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench_images-", dir=parent))
    try:
        result = run(settings, workdir, args.backend)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    checks = check_targets(result)
    report = render(info, settings, result, checks)
    print("\n" + report)
    results = {"benchmark": "images", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "settings": settings,
               "machine": info, "result": result, "targets": checks}
    json_path, md_path = write_results("images_quick" if args.quick else "images", results, report, args.out)
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
