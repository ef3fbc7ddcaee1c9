"""The GPU paths CI cannot run, checked and measured in one command (fits one 10-minute device call).

    python benchmarks/bench_gpu.py            # on a CUDA machine: every section
    python benchmarks/bench_gpu.py --quick --device cpu   # smoke run of the same code, no GPU (CI)

Sections, each in one run so ratios compare like with like:
1. **Host to device**: the pinned-copy ceiling (one large pinned buffer copied with
   ``non_blocking``), and ``fastdata.loader(device="cuda")`` (pinned recycled buffers, side-stream
   prefetch) against the naive DataLoader (``pin_memory=True``, ``.to(device, non_blocking=True)``)
   on FLIM-like float32 (2, 256, 21, 21) samples, HDF5 and LMDB: samples/s and GB/s.
2. **Training input-wait**: ``fastdata.train.fit`` of the FlimCNN with automatic precision fed by
   each loader: samples/s, the share of the time the step waited for data, GPU utilisation.
3. **Precision**: a 2-D conv net on 3x128x128 inputs at fp32, tf32, bf16 and fp16, each with and
   without channels_last: samples/s, peak memory, the loss finite.
4. **Mixed-size JPEGs augmented on the device** (torch backend: uint8 crosses, crops per image):
   images/s, and a check that no crop sampled the padding.
5. **DALI**: ``benchmarks/bench_dali.py --device cuda`` when DALI imports (its own results file).

Writes ``results/gpu.md`` and ``gpu.json`` (``gpu_cpu_quick.*`` for the smoke run).
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

import fastdata  # noqa: E402
from fastdata.augment import ColorJitter, HorizontalFlip, RandomResizedCrop  # noqa: E402
from fastdata.demo.baseline import naive_loader, write_npy_folder  # noqa: E402
from fastdata.demo.models import FlimCNN, SmallConvNet  # noqa: E402

FLIM = (2, 256, 21, 21)
BATCH = 64
FULL = {"samples": 2000, "epochs": 3, "train_steps": 60, "amp_steps": 40, "images": 1024, "flim_width": 16,
        "conv_width": 64, "side": 128}
QUICK = {"samples": 128, "epochs": 1, "train_steps": 2, "amp_steps": 1, "images": 64, "flim_width": 4,
         "conv_width": 8, "side": 32}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def h2d_ceiling(device: torch.device, nbytes: int, reps: int) -> float | None:
    """Bytes/s of one pinned host buffer copied to the device with ``non_blocking`` (None on the CPU)."""
    if device.type != "cuda":
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    sync(device)
    return nbytes * reps / (time.perf_counter() - t)


def naive_batches(root: Path, device: torch.device) -> Callable[[], Iterable[dict[str, torch.Tensor]]]:
    dl = naive_loader(root, BATCH)

    def epoch() -> Iterable[dict[str, torch.Tensor]]:
        for b in dl:
            yield {k: v.to(device, non_blocking=True) for k, v in b.items()}

    return epoch


def rate(epoch: Callable[[], Iterable[dict[str, torch.Tensor]]], epochs: int, device: torch.device) -> float:
    """Samples/s over ``epochs`` passes after an untimed one; every copy is complete when the clock stops."""
    for _ in epoch():
        pass
    sync(device)
    n, t = 0, time.perf_counter()
    for _ in range(epochs):
        for b in epoch():
            n += b["x"].shape[0]
    sync(device)
    return n / (time.perf_counter() - t)


def section_h2d(work: Path, device: torch.device, s: dict[str, Any]) -> dict[str, Any]:
    sample_bytes = math.prod(FLIM) * 4
    ceiling = h2d_ceiling(device, BATCH * sample_bytes, 20 if s["epochs"] > 1 else 3)
    rows = []
    methods: list[tuple[str, Callable[[], Iterable[dict[str, torch.Tensor]]], Any]] = [
        ("naive DataLoader (np.load per file, 2 workers, pin_memory)", naive_batches(work / "npy", device), None)]
    for be in ("hdf5", "lmdb"):
        ld = fastdata.loader(work / be, BATCH, device=device)
        methods.append((f"fastdata.loader {be}, defaults", lambda ld=ld: ld, ld))
    for name, epoch, ld in methods:
        r = rate(epoch, s["epochs"], device)
        rows.append({"method": name, "samples_per_s": r, "gb_per_s": r * sample_bytes / 1e9,
                     "x_ceiling": r * sample_bytes / ceiling if ceiling else None})
        if ld is not None:
            ld.close()
    naive = rows[0]["samples_per_s"]
    for r in rows:
        r["x_naive"] = r["samples_per_s"] / naive
    return {"ceiling_gb_per_s": ceiling / 1e9 if ceiling else None, "rows": rows}


def section_train(work: Path, device: torch.device, s: dict[str, Any]) -> list[dict[str, Any]]:
    from bench_dali import GpuSampler  # GPU utilisation (needs pynvml; no samples without it or without CUDA)

    rows = []
    for name, make in (("naive DataLoader (2 workers, pin_memory)", lambda: naive_loader(work / "npy", BATCH)),
                       ("fastdata.loader (hdf5, defaults)", lambda: fastdata.loader(work / "hdf5", BATCH, device=device))):
        torch.manual_seed(0)
        model = FlimCNN(width=s["flim_width"]).to(device)
        ld = make()
        gpu = GpuSampler()  # samples the timed fit only
        res = _harness.timed_fit(model, ld, s["train_steps"], during=gpu)
        m = res.epochs[-1]
        busy = float(np.mean(gpu.samples)) if gpu.samples else None
        rows.append({"loader": name, "precision": res.precision, "samples_per_s": m.samples_per_s,
                     "wait_fraction": m.wait_fraction, "gpu_util_percent": busy, "loss": m.loss})
        if hasattr(ld, "close"):
            ld.close()
    return rows


class Images(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Synthetic 3 x side x side float images in memory, 10 classes: the precision section's input."""

    def __init__(self, n: int, side: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(n, 3, side, side, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "label": self.y[i]}


def section_precision(device: torch.device, s: dict[str, Any]) -> list[dict[str, Any]]:
    modes = ("fp32", "tf32", "bf16", "fp16") if device.type == "cuda" else ("fp32", "bf16")
    data = Images(BATCH * 4, s["side"])
    rows = []
    for precision in modes:
        for cl in (False, True):
            torch.manual_seed(0)
            model = SmallConvNet(num_classes=10, width=s["conv_width"]).to(device)
            batches = [{k: v.to(device) for k, v in b.items()}
                       for b in torch.utils.data.DataLoader(data, batch_size=BATCH)]
            res = _harness.timed_fit(model, batches, s["amp_steps"], precision=precision, channels_last=cl)
            m = res.epochs[-1]  # (fit resets the peak memory statistics at each epoch)
            rows.append({"precision": res.precision, "channels_last": cl, "samples_per_s": m.samples_per_s,
                         "peak_memory_mib": m.peak_memory_bytes / 2**20 if m.peak_memory_bytes else None,
                         "loss": m.loss, "loss_finite": bool(np.isfinite(m.loss))})
    return rows


def section_images(work: Path, device: torch.device, s: dict[str, Any]) -> dict[str, Any]:
    """Mixed-size JPEGs stored encoded, decoded on the host, augmented per image on ``device``."""
    from PIL import Image

    rng = np.random.default_rng(0)
    src = work / "jpegs"
    for i in range(s["images"]):
        h, w = (int(v) for v in rng.integers(160, 400, 2))
        (src / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
        level = int(rng.integers(120, 250))
        Image.fromarray(np.full((h, w, 3), level, np.uint8)).save(src / f"c{i % 4}" / f"{i:05d}.jpg", quality=90)
    fastdata.convert(src, work / "jpeg_ds", fastdata.ConvertConfig(images=fastdata.ImageOptions(images="encoded")))
    aug = [RandomResizedCrop(224), HorizontalFlip(), ColorJitter(0.2, 0.2, 0.2)]
    ld = fastdata.loader(work / "jpeg_ds", BATCH, device=device, augment=aug)
    darkest = 1.0
    n, t = 0, time.perf_counter()
    for _ in range(s["epochs"]):
        for b in ld:
            n += b["image"].shape[0]
            darkest = min(darkest, float(b["image"].amin()))  # flat images: padding would show as 0
    sync(device)
    r = n / (time.perf_counter() - t)
    ld.close()
    # brightness 0.8 of the darkest level (120/255) is about 0.37: anything near 0 is padding
    return {"images_per_s": r, "darkest_pixel": darkest, "padding_sampled": darkest < 0.2}


def render(info: dict[str, Any], settings: dict[str, Any], res: dict[str, Any]) -> str:
    t = _harness.markdown_table
    lines = [f"# GPU paths ({settings['mode']} run, device {settings['device']})", "",
             f"Machine: {info.get('cpu_model', '?')}, {info.get('usable_cores')} usable cores, GPU: {info.get('gpu') or 'none'}; torch {torch.__version__}"
             f" (CUDA {torch.version.cuda}).", ""]
    h = res["h2d"]
    lines += ["## 1. Host to device", "",
              f"Pinned-copy ceiling: {h['ceiling_gb_per_s']:.1f} GB/s." if h["ceiling_gb_per_s"] else
              "Pinned-copy ceiling: no CUDA here.", "",
              t(["method", "samples/s", "GB/s", "x naive", "x ceiling"],
                [[r["method"], f"{r['samples_per_s']:,.0f}", f"{r['gb_per_s']:.2f}", f"{r['x_naive']:.1f}",
                  f"{r['x_ceiling']:.2f}" if r["x_ceiling"] else "-"] for r in h["rows"]]), ""]
    lines += ["## 2. Training input-wait (FlimCNN, automatic precision)", "",
              t(["loader", "precision", "samples/s", "waited for input", "GPU busy"],
                [[r["loader"], r["precision"], f"{r['samples_per_s']:,.0f}", f"{100 * r['wait_fraction']:.1f}%",
                  f"{r['gpu_util_percent']:.0f}%" if r["gpu_util_percent"] is not None else "-"]
                 for r in res["train"]]), ""]
    lines += [f"## 3. Precision (SmallConvNet, 3x{settings['side']}x{settings['side']}, batch {BATCH})", "",
              t(["precision", "channels_last", "samples/s", "peak MiB", "loss finite"],
                [[r["precision"], r["channels_last"], f"{r['samples_per_s']:,.0f}",
                  f"{r['peak_memory_mib']:.0f}" if r["peak_memory_mib"] else "-", r["loss_finite"]]
                 for r in res["precision"]]), ""]
    im = res["images"]
    lines += ["## 4. Mixed-size JPEGs, augmented on the device", "",
              f"{im['images_per_s']:,.0f} images/s (RandomResizedCrop(224), HorizontalFlip, ColorJitter); "
              f"darkest pixel {im['darkest_pixel']:.3f}: padding {'SAMPLED (bug)' if im['padding_sampled'] else 'never sampled'}.",
              "", "## 5. DALI", "", res["dali"], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="default: cuda")
    p.add_argument("--out", default=str(_harness.DEFAULT_RESULTS_DIR))
    p.add_argument("--workdir", default=None, help="where to put the temporary data")
    p.add_argument("--skip-dali", action="store_true", help="leave out section 5 (bench_dali.py runs on its own)")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA here: use --device cpu for a smoke run")
    device = torch.device(args.device)
    settings = {"mode": "quick" if args.quick else "full", "device": args.device, **(QUICK if args.quick else FULL)}
    work = Path(tempfile.mkdtemp(prefix="bench_gpu-", dir=args.workdir))
    info = _harness.machine_info()
    res: dict[str, Any] = {}
    try:
        write_npy_folder(work / "npy", settings["samples"], FLIM)
        for be in ("hdf5", "lmdb"):
            fastdata.convert(work / "npy", work / be, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=be)))
        for name, run in (("h2d", lambda: section_h2d(work, device, settings)),
                          ("train", lambda: section_train(work, device, settings)),
                          ("precision", lambda: section_precision(device, settings)),
                          ("images", lambda: section_images(work, device, settings))):
            t = time.perf_counter()
            res[name] = run()
            print(f"{name}: done in {time.perf_counter() - t:.0f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        res["dali"] = "NVIDIA DALI is not installed here: not measured (its GPU figures are owed)."
    if args.skip_dali:
        res["dali"] = "Left out (--skip-dali)."
    if "dali" not in res:
        import bench_dali

        bench_dali.main((["--quick"] if args.quick else []) + ["--device", args.device, "--out", args.out])
        res["dali"] = f"See results/dali{'_cuda' if args.device == 'cuda' else ''}{'_quick' if args.quick else ''}.md."
    report = render(info, settings, res)
    print("\n" + report)
    check = _harness.check_ceiling("bench_gpu", {r["method"]: r["x_ceiling"] for r in res["h2d"]["rows"]
                                                 if r["x_ceiling"] is not None}, args.quick)
    name = "gpu" + ("_cpu" if args.device == "cpu" else "") + ("_quick" if args.quick else "")
    _harness.write_results(name, {"benchmark": "gpu", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                  "settings": settings, "machine": info, "result": res, "ceiling_check": check},
                           report, args.out)
    return _harness.ceiling_exit(check)


if __name__ == "__main__":
    sys.exit(main())
