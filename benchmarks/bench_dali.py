"""Benchmark the DALI backend: fastdata shards through DALI vs DALI's own file reader, the torch backend, naive PIL.

Usage::

    python benchmarks/bench_dali.py [--quick] [--device cpu|cuda] [--backend hdf5|lmdb] [--out DIR] [--workdir DIR]

Generates synthetic 256x256 JPEGs (``bench_images.generate``: quality 90, about 30 KB each) in 10
class folders, converts them with ``--images encoded`` (the original files, byte for byte), reads
every file once so that all methods read from the page cache, checks that the DALI backend
returns the torch backend's pixels, and times whole epochs (a new random order each epoch,
batches of 64). Every method yields float32 (B, 3, 256, 256) images in [0, 1] and the labels:

* naive: a torch DataLoader over the folder, PIL decode per file (``bench_images.FolderImages``),
  2 worker processes, then ``.float() / 255`` in the loop;
* torch backend: ``fastdata.loader(dst, 64, device=DEVICE)`` (defaults: decoding in reader threads);
* DALI backend: ``fastdata.loader(dst, 64, device=DEVICE, backend="dali")`` (defaults);
* DALI file reader: ``fn.readers.file`` over the JPEG folder (``shuffle_after_epoch``: a true
  permutation per epoch) + ``fn.decoders.image`` + ``fn.crop_mirror_normalize``, with the DALI
  backend's thread count and queue depth (the reference the target is measured against);
* both fastdata backends again with a training augmentation (RandomResizedCrop(224),
  HorizontalFlip, Normalize) to show where augmentation runs.

Steady state, measured the same way for every method: in each round (methods in rotating order,
so load drift hits all alike) a method is set up, runs one untimed epoch, then ``EPOCHS``
consecutive timed epochs, and is torn down, so no method's background work (DALI and DataLoader
workers prefetch into the next epoch) runs while another is timed. The first ``SKIP`` batches of
a timed block are not counted: a prefetch queue filled during the untimed epoch would otherwise
flatter the methods that prefetch across epochs. The figure is the median over rounds. CPU
seconds per image are the process's (all threads) for the in-process methods; naive's work is in
its worker processes.

Target: the DALI backend is no slower than DALI's file reader, judged on the median of the
per-round ratios (both ran in the same round, so load drift between rounds cancels); their
p10-p90 spread and the ratio of the medians are reported too. ``--device cuda`` runs the same
with mixed (nvJPEG) decoding and GPU augmentation and samples GPU utilisation. Results: stdout
and ``<out>/dali[_cuda][_quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
from _harness import DEFAULT_RESULTS_DIR, machine_info, markdown_table, summarize, warm_page_cache, write_results
from bench_images import BATCH, SIZE, EpochSampler, FolderImages, generate
from torch.utils.data import DataLoader

import fastdata
from fastdata.augment import IMAGENET_MEAN, IMAGENET_STD, HorizontalFlip, Normalize, RandomResizedCrop
from fastdata.loaders import LoaderConfig
from fastdata.world import usable_cpus

WORKERS = 2
FULL = {"images": 2000, "repeats": 5}
QUICK = {"images": 200, "repeats": 1}  # a smoke run: every method once
EPOCHS = 3  # timed consecutive epochs per method per round
SKIP = 4  # batches not counted at the start of a timed block (the default prefetch depth)
AUGMENT = [RandomResizedCrop(224), HorizontalFlip(), Normalize(IMAGENET_MEAN, IMAGENET_STD)]
NAIVE = "naive: DataLoader, PIL per file, 2 workers"
TORCH = "torch backend: fastdata.loader defaults"
DALI = "DALI backend: fastdata.loader(backend='dali') defaults"
FILE = "DALI file reader: fn.readers.file + fn.decoders.image"


Batches = Callable[[], Iterator[int]]  # one epoch: yields each batch's size


class Method:
    """A way to load the data: ``setup()`` returns an epoch function and a teardown, both untimed."""

    def __init__(self, name: str, setup: Callable[[], tuple[Batches, Callable[[], None]]], in_process: bool = True):
        self.name, self.setup, self.in_process = name, setup, in_process


def naive(paths: list[Path], device: str) -> Method:
    def setup() -> tuple[Batches, Callable[[], None]]:
        sampler = EpochSampler(len(paths))
        # spawn: forking a process that runs DALI or reader threads is unsafe
        loader = DataLoader(FolderImages(paths), batch_size=BATCH, sampler=sampler, num_workers=WORKERS,
                            persistent_workers=True, pin_memory=device == "cuda", multiprocessing_context="spawn")

        def epoch() -> Iterator[int]:
            sampler.epoch += 1
            for images, _ in loader:
                x = images.to(device).float().div_(255)  # what the training loop does next
                yield x.shape[0]

        def teardown() -> None:
            it = getattr(loader, "_iterator", None)  # persistent workers: stop them now (torch's private call)
            if it is not None:
                it._shutdown_workers()
            loader._iterator = None

        return epoch, teardown

    return Method(NAIVE, setup, in_process=False)


def fastdata_loader(name: str, dst: Path, device: str, **kw: Any) -> Method:
    def setup() -> tuple[Batches, Callable[[], None]]:
        ld = fastdata.loader(dst, BATCH, device=device, **kw)
        return (lambda: (b["label"].shape[0] for b in ld)), ld.close  # each pass moves on to the next epoch

    return Method(name, setup)


def file_reader(root: Path, device: str, threads: int, depth: int) -> Method:
    """DALI's own pipeline over the JPEG folder, giving what the DALI backend gives."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    cuda = device == "cuda"

    @pipeline_def(batch_size=BATCH, num_threads=threads, device_id=0 if cuda else None, prefetch_queue_depth=depth,
                  seed=0)
    def pipe() -> tuple[Any, Any]:
        jpegs, labels = fn.readers.file(file_root=str(root), shuffle_after_epoch=True, name="files")
        images = fn.decoders.image(jpegs, device="mixed" if cuda else "cpu", output_type=types.RGB)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="HWC", mean=[0.0] * 3,
                                          std=[255.0] * 3)
        return images, labels.gpu() if cuda else labels

    def setup() -> tuple[Batches, Callable[[], None]]:
        p = pipe()
        p.build()
        holder = {"it": DALIGenericIterator([p], ["image", "label"], reader_name="files", auto_reset=True,
                                            last_batch_policy=LastBatchPolicy.PARTIAL)}

        def epoch() -> Iterator[int]:
            for out in holder["it"]:
                x = out[0]["image"].permute(0, 3, 1, 2)  # NCHW, channels_last memory: as the backends give
                yield x.shape[0]

        return epoch, holder.clear  # dropping the iterator drops the pipeline

    return Method(FILE, setup)


def measure(method: Method) -> tuple[float, float, float | None, list[float]]:
    """Set up, one untimed epoch, ``EPOCHS`` timed epochs, tear down: (images, seconds, CPU s/image, GPU %)."""
    epoch, teardown = method.setup()
    try:
        for _ in epoch():
            pass
        count, t_start, c_start = 0, None, None
        seen = 0
        with GpuSampler() as gpu:
            for _ in range(EPOCHS):
                for b in epoch():
                    seen += 1
                    if seen == SKIP:  # the clock starts once the first SKIP batches are in
                        t_start, c_start = time.perf_counter(), time.process_time()
                    elif seen > SKIP:
                        count += b
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # GPU work of the last batches is part of the time
            seconds = time.perf_counter() - t_start
            cpu = (time.process_time() - c_start) / count if method.in_process else None
    finally:
        teardown()
    return count, seconds, cpu, gpu.samples


class GpuSampler:
    """Samples ``torch.cuda.utilization()`` (needs pynvml) every 50 ms while a method runs (CUDA only)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "GpuSampler":
        if not torch.cuda.is_available():
            return self

        def loop() -> None:
            while not self._stop.wait(0.05):
                try:
                    self.samples.append(float(torch.cuda.utilization()))
                except Exception as e:  # noqa: BLE001 - no nvidia-ml-py (pynvml): no samples, say why once
                    print(f"GPU utilisation not sampled: {type(e).__name__}: {e}", flush=True)
                    return

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def check_pixels(dst: Path, device: str) -> dict[str, float]:
    """The DALI backend must give the torch backend's batches (same order, pixels within JPEG decoder noise)."""
    t = fastdata.loader(dst, BATCH, seed=1, device=device, num_workers=WORKERS)
    d = fastdata.loader(dst, BATCH, seed=1, device=device, backend="dali")
    a, b = next(iter(t)), next(iter(d))
    t.close()
    d.close()
    if not torch.equal(a["label"].cpu(), b["label"].cpu()) or a["image"].shape != b["image"].shape:
        raise RuntimeError("the DALI backend's first batch is not the torch backend's")
    diff = (a["image"].float() - b["image"].float()).abs().mul_(255)
    return {"mean_abs_diff_levels": float(diff.mean()), "max_abs_diff_levels": float(diff.max())}


def run(settings: dict[str, Any], workdir: Path, backend: str, device: str) -> dict[str, Any]:
    n, repeats = settings["images"], settings["repeats"]
    src = workdir / "images"
    t0 = time.perf_counter()
    paths = generate(src, n)
    print(f"generated {n} JPEGs in {time.perf_counter() - t0:.1f} s", flush=True)
    dst = workdir / "encoded"
    report = fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=WORKERS), images=fastdata.ImageOptions(images="encoded")))
    print(f"convert encoded: {report.summary()}", flush=True)
    warm_page_cache(src, dst)  # every method reads from memory

    pixels = check_pixels(dst, device)
    threads = usable_cpus()
    methods = [
        naive(paths, device),
        file_reader(src, device, threads, LoaderConfig().prefetch),
        fastdata_loader(TORCH, dst, device),
        fastdata_loader(DALI, dst, device, backend="dali"),
        fastdata_loader("torch backend + augmentation", dst, device, augment=AUGMENT),
        fastdata_loader("DALI backend + augmentation", dst, device, backend="dali", augment=AUGMENT),
    ]
    rates: dict[str, list[float]] = {m.name: [] for m in methods}
    cpu: dict[str, list[float]] = {m.name: [] for m in methods}
    gpu: dict[str, list[float]] = {m.name: [] for m in methods}
    load_before = os.getloadavg()
    for r in range(repeats):
        for k in range(len(methods)):
            m = methods[(r + k) % len(methods)]
            images, seconds, cpu_s, gpu_pct = measure(m)
            rates[m.name].append(images / seconds)
            if cpu_s is not None:
                cpu[m.name].append(cpu_s)
            gpu[m.name].extend(gpu_pct)
        print(f"round {r + 1}/{repeats}: " + ", ".join(f"{k.split(':')[0]} {v[-1]:,.0f}" for k, v in rates.items()),
              flush=True)
    load_after = os.getloadavg()

    naive_rate = float(np.median(rates[NAIVE]))
    rows = []
    for m in methods:
        per_s = summarize(rates[m.name])
        rows.append({"method": m.name, "samples_per_s": per_s["median"],
                     "samples_per_s_p10_p90": [per_s["p10"], per_s["p90"]],
                     "samples_per_s_runs": rates[m.name], "speedup_vs_naive": per_s["median"] / naive_rate,
                     "cpu_ms_per_image": 1e3 * float(np.median(cpu[m.name])) if cpu[m.name] else None,
                     "gpu_util_percent": float(np.mean(gpu[m.name])) if gpu[m.name] else None})
    return {"images": n, "device": device, "epochs_per_round": EPOCHS, "skipped_batches": SKIP,
            "pixels_vs_torch_backend": pixels, "methods": rows, "loadavg_before": load_before,
            "loadavg_after": load_after}


def check_target(result: dict[str, Any], quick: bool) -> dict[str, Any]:
    """DALI backend / file reader, judged on the median of the per-round ratios: both ran in the same
    round, so load drift between rounds cancels out (the ratio of the medians is reported too)."""
    by = {m["method"]: m for m in result["methods"]}
    medians = by[DALI]["samples_per_s"] / by[FILE]["samples_per_s"]
    paired = sorted(a / b for a, b in zip(by[DALI]["samples_per_s_runs"], by[FILE]["samples_per_s_runs"]))
    spread = summarize(paired)
    ratio = spread["median"]
    cpu = (by[DALI]["cpu_ms_per_image"] / by[FILE]["cpu_ms_per_image"]
           if by[DALI]["cpu_ms_per_image"] and by[FILE]["cpu_ms_per_image"] else None)
    if quick:
        verdict = "not judged (a quick run's epochs are too short; see the full run)"
    elif ratio >= 1.0:
        verdict = "met"
    elif spread["p90"] >= 1.0:
        verdict = "NOT met: parity within run-to-run noise (some rounds >= 1, the median below)"
    else:
        verdict = "NOT met"
    return {"target": "DALI backend no slower than DALI's file reader (median per-round ratio >= 1)", "ratio": ratio,
            "ratio_of_medians": medians, "round_ratios": paired, "round_ratio_p10_p90": [spread["p10"], spread["p90"]],
            "cpu_per_image_ratio": cpu, "met": None if quick else ratio >= 1.0, "verdict": verdict}


def render(info: dict[str, Any], settings: dict[str, Any], result: dict[str, Any], target: dict[str, Any]) -> str:
    file_rate = next(m["samples_per_s"] for m in result["methods"] if m["method"] == FILE)
    rows = []
    for m in result["methods"]:
        lo, hi = m["samples_per_s_p10_p90"]
        cpu = f"{m['cpu_ms_per_image']:.2f}" if m["cpu_ms_per_image"] is not None else "–"
        row = [m["method"], f"{m['samples_per_s']:,.0f}", f"{lo:,.0f}–{hi:,.0f}",
               f"{m['samples_per_s'] / file_rate:.2f}",
               f"{m['speedup_vs_naive']:.1f}", cpu]
        if result["device"] == "cuda":
            row.append(f"{m['gpu_util_percent']:.0f}" if m["gpu_util_percent"] is not None else "–")
        rows.append(row)
    headers = ["method", "images/s", "p10–p90 images/s", "x file reader", "x naive", "CPU ms/image"]
    if result["device"] == "cuda":
        headers.append("GPU busy %")
    gpu = info["gpu"] if info["cuda_available"] else "none"
    px = result["pixels_vs_torch_backend"]
    lines = [
        f"# DALI backend benchmark ({settings['mode']} run, device {result['device']})",
        "",
        f"Machine: {info['cpu_model']}, {info['usable_cores']} usable cores, {info['ram_gib']} GiB RAM, GPU: {gpu}; "
        f"Python {info['python']}, torch {info['torch']}, DALI {settings['dali']}. Load average before/after: "
        f"{result['loadavg_before'][0]:.2f} / {result['loadavg_after'][0]:.2f}.",
        "",
        f"{result['images']} synthetic {SIZE}x{SIZE} JPEGs stored `encoded` ({settings['backend']} shards) and as "
        f"files; epochs of random batches of {BATCH}; warm page cache. Steady state: {settings['repeats']} rounds, "
        f"methods in rotating order; per method and round: set up, one untimed epoch, {result['epochs_per_round']} "
        f"timed consecutive epochs (the first {result['skipped_batches']} batches not counted), tear down. Every "
        "method yields float32 (B, 3, H, W) images (256x256 in [0, 1]; with augmentation 224x224, normalised) and "
        "the labels. CPU ms/image: process CPU time (all threads) per image, for in-process methods.",
        "",
        markdown_table(headers, rows),
        "",
        f"DALI backend vs torch backend, first batch: mean abs diff {px['mean_abs_diff_levels']:.3f}, "
        f"max {px['max_abs_diff_levels']:.0f} (8-bit levels).",
        "",
        f"Target ({target['target']}): {target['ratio']:.2f}x (per round p10–p90: "
        f"{target['round_ratio_p10_p90'][0]:.2f}–{target['round_ratio_p10_p90'][1]:.2f}; ratio of the medians "
        f"{target['ratio_of_medians']:.2f}): {target['verdict']}. "
        + (f"CPU time per image, DALI backend / file reader: {target['cpu_per_image_ratio']:.2f}."
           if target["cpu_per_image_ratio"] else ""),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 images, 1 round (a smoke run)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where batches go (default: cpu)")
    parser.add_argument("--backend", choices=["hdf5", "lmdb"], default="hdf5", help="shard format (default: hdf5)")
    parser.add_argument("--out", type=Path, default=DEFAULT_RESULTS_DIR,
                        help="results directory (default: %(default)s)")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="parent folder for generated data (default: temp dir)")
    args = parser.parse_args(argv)
    try:
        import nvidia.dali
    except ImportError:
        print('bench_dali: NVIDIA DALI is not installed (pip install "fastdata[dali]"); nothing to measure')
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    settings = {"mode": "quick" if args.quick else "full", **(QUICK if args.quick else FULL), "backend": args.backend,
                "batch_size": BATCH, "workers": WORKERS, "dali": nvidia.dali.__version__}
    info = machine_info()
    parent = args.workdir if args.workdir is not None else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench_dali-", dir=parent))
    try:
        result = run(settings, workdir, args.backend, args.device)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    target = check_target(result, args.quick)
    report = render(info, settings, result, target)
    print("\n" + report)
    name = "dali" + ("_cuda" if args.device == "cuda" else "") + ("_quick" if args.quick else "")
    results = {"benchmark": "dali", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "settings": settings,
               "machine": info, "result": result, "target": target,
               "title": f"JPEG loading, {SIZE}x{SIZE} encoded, batch {BATCH}, device {args.device}",
               "rows": [{"name": m["method"], "samples_per_s": m["samples_per_s"]} for m in result["methods"]]}
    json_path, md_path = write_results(name, results, report, args.out)
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
