"""The GPU paths CI cannot run, checked and measured in one command (issue 32's list; sized for one
10-minute device call, each section bounded in time).

    python benchmarks/bench_gpu.py            # on a CUDA machine: every section
    python benchmarks/bench_gpu.py --sections h2d,train --limit-s 300
    python benchmarks/bench_gpu.py --quick --device cpu --skip-dali   # smoke run of the same code, no GPU (CI)
    python benchmarks/bench_gpu.py --combine a/gpu.json b/gpu.json   # one report from runs of several calls

Sections (``--sections``; each in one run so ratios compare like with like):

- ``h2d``: pinned and pageable ``copy_`` ceilings of one batch's bytes, and batches of
  ``fastdata.loader(device="cuda")`` (FLIM float32 (2, 256, 21, 21), HDF5 and LMDB; raw 224x224
  uint8 images) and of the naive DataLoader: samples/s, GB/s, x pinned ceiling (target >= 0.8).
- ``train``: ``fastdata.train.fit`` of the FLIM 3-D CNN (about 0.9M parameters, batch 64) and of a
  ResNet-style 2-D CNN on 224x224 images, each at its default precision, fed by the loader with
  default settings against the same batches already on the device: samples/s, input wait, GPU busy,
  x resident (targets: wait < 5%, x resident >= 0.9).
- ``precision``: both models at fp32/tf32/bf16/fp16, channels_last off and on, and compiled
  (CUDA only), fed by the loader: samples/s, input wait, peak memory, x resident.
- ``images``: mixed-size JPEGs decoded on the host and augmented per image on the device, against
  the same on the CPU (x CPU), and a check that no crop sampled the padding.
- ``jpeg``: 256x256 JPEGs: the torch backend (CPU cores decode), ``torchvision.io.decode_jpeg(device=
  "cuda")`` in batches, and, with DALI, the DALI backend and DALI's own ``fn.readers.file`` +
  ``fn.decoders.image(device="mixed")``, in rotating rounds of one run.
- ``views``: ``bench_augment_views.py`` on the device (two views, sequence ops, MixUp/CutMix).
- ``dali``: ``bench_dali.py --device cuda`` when DALI imports (its own results file).

Writes ``<out>/gpu.md`` and ``gpu.json`` (``gpu_cpu_quick.*`` for the smoke run).
"""

from __future__ import annotations

import argparse
import json
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
import _gpu_parts as parts  # noqa: E402
import _harness  # noqa: E402

import fastdata  # noqa: E402
from fastdata.augment import ColorJitter, HorizontalFlip, RandomResizedCrop  # noqa: E402
from fastdata.demo import naive_loader, write_npy_folder  # noqa: E402
from fastdata.demo.examples import FlimCNN  # noqa: E402
from fastdata.loaders import LoaderConfig  # noqa: E402

FLIM = (2, 256, 21, 21)
BATCH = 64
SECTIONS = ["h2d", "train", "diag", "precision", "images", "jpeg", "views", "dali"]
WEIGHTS = {"h2d": 1, "train": 2, "diag": 2, "precision": 4, "images": 1, "jpeg": 2, "views": 1, "dali": 3}  # shares of --limit-s
FULL = {"samples": 2000, "epochs": 3, "h2d_min_s": 3.0, "diag_steps": 200, "train_steps": 60, "prec_steps": 25, "images": 1024, "raw_images": 1024,
        "side": 224, "flim_width": 58, "resnet_width": 64, "jpegs": 1000, "jpeg_rounds": 3}
QUICK = {"samples": 128, "epochs": 1, "h2d_min_s": 0.0, "diag_steps": 2, "train_steps": 2, "prec_steps": 1, "images": 64, "raw_images": 64,
         "side": 32, "flim_width": 4, "resnet_width": 8, "jpegs": 320, "jpeg_rounds": 1}  # jpegs: 5 batches, more than bench_dali.SKIP


def naive_batches(root: Path, device: torch.device) -> Callable[[], Iterable[dict[str, torch.Tensor]]]:
    dl = naive_loader(root, BATCH)

    def epoch() -> Iterable[dict[str, torch.Tensor]]:
        for b in dl:
            yield {k: v.to(device, non_blocking=True) for k, v in b.items()}

    return epoch


def rate(epoch: Callable[[], Iterable[dict[str, torch.Tensor]]], epochs: int, device: torch.device,
         min_s: float = 0.0) -> float:
    """Samples/s over ``epochs`` passes after an untimed one, and more passes until ``min_s`` seconds have
    gone (one pass of the FLIM data took under a second on an H200: too short for a noisy machine); every
    copy is complete when the clock stops."""
    for _ in epoch():
        pass
    parts.sync(device)
    n, done, t = 0, 0, time.perf_counter()
    while done < epochs or time.perf_counter() - t < min_s:
        for b in epoch():
            n += b["label"].shape[0]
        done += 1
    parts.sync(device)
    return n / (time.perf_counter() - t)


def section_h2d(work: Path, device: torch.device, s: dict[str, Any], deadline: float) -> dict[str, Any]:
    """Loader batches against a pinned (and a pageable) ``copy_`` of the bytes that cross, FLIM and raw images."""
    reps = 20 if s["epochs"] > 1 else 3
    flim_bytes, img_bytes = math.prod(FLIM) * 4, 3 * s["side"] ** 2  # float32 samples; uint8 images cross
    ceil = {kind: {"pinned": parts.copy_ceiling(device, BATCH * b, reps, True),
                   "pageable": parts.copy_ceiling(device, BATCH * b, reps, False)}
            for kind, b in (("flim", flim_bytes), ("images", img_bytes))}
    methods: list[tuple[str, str, Callable[[], Iterable[dict[str, torch.Tensor]]], Any]] = [
        ("flim", "naive DataLoader (np.load per file, 2 workers, pin_memory)", naive_batches(work / "npy", device), None)]
    for be in ("hdf5", "lmdb"):
        ld = fastdata.loader(work / be, BATCH, device=device)
        methods.append(("flim", f"fastdata.loader {be}, defaults", lambda ld=ld: ld, ld))
    ld = fastdata.loader(work / "raw", BATCH, device=device)
    methods.append(("images", f"fastdata.loader raw {s['side']}x{s['side']} uint8 images, defaults", lambda ld=ld: ld, ld))
    # the host side alone (page cache -> pinned batches, no copy): what the loader can hand the GPU at most
    for kind, folder, what in (("flim", "hdf5", "hdf5"), ("images", "raw", f"raw {s['side']}x{s['side']} images")):
        cfg = LoaderConfig(pin_memory=device.type == "cuda", image_dtype="uint8")  # uint8 crosses; the GPU converts
        ld = fastdata.loader(work / folder, BATCH, device="cpu", config=cfg)
        methods.append((kind, f"host side alone: fastdata.loader {what}, device='cpu', pinned", lambda ld=ld: ld, ld))
    rows = []
    for kind, name, epoch, ld in methods:
        if time.perf_counter() > deadline:
            rows.append({"method": name, "data": kind, "not_run": "time budget"})
        else:
            r = rate(epoch, s["epochs"], device, s["h2d_min_s"])
            sb = flim_bytes if kind == "flim" else img_bytes
            c = ceil[kind]["pinned"]
            rows.append({"method": name, "data": kind, "samples_per_s": r, "gb_per_s": r * sb / 1e9,
                         "x_ceiling": r * sb / c if c else None})
        if ld is not None:
            ld.close()
    naive = rows[0].get("samples_per_s")
    for r in rows:
        r["x_naive"] = r["samples_per_s"] / naive if naive and r["data"] == "flim" and "samples_per_s" in r else None
    gb = {k: {m: (v / 1e9 if v else None) for m, v in c.items()} for k, c in ceil.items()}
    return {"ceiling_gb_per_s": gb["flim"]["pinned"], "ceilings_gb_per_s": gb, "rows": rows}


def models(s: dict[str, Any]) -> dict[str, tuple[Callable[[], torch.nn.Module], str, str]]:
    """name: (model factory, dataset folder, input field): the FLIM 3-D CNN and the ResNet-style 2-D CNN."""
    return {f"FlimCNN 3-D ({FLIM})": (lambda: FlimCNN(width=s["flim_width"]), "hdf5", "x"),
            f"ResNet-style 2-D (3x{s['side']}x{s['side']})":
                (lambda: parts.ResNetStyle(width=s["resnet_width"]), "raw", "image")}


def section_train(work: Path, device: torch.device, s: dict[str, Any], deadline: float) -> list[dict[str, Any]]:
    """Each model at its default precision fed by fastdata.loader (defaults) against the same batches
    already on the device (the no-input-cost baseline), plus the naive DataLoader for the FLIM model."""
    from bench_dali import GpuSampler  # GPU utilisation (needs pynvml; no samples without it or without CUDA)

    rows = []
    for name, (make, folder, field) in models(s).items():
        params = sum(p.numel() for p in make().parameters())
        feeds: list[tuple[str, Callable[[], Any]]] = [
            ("fastdata.loader (defaults)", lambda folder=folder: fastdata.loader(work / folder, BATCH, device=device)),
            ("fastdata.loader, 4 reader threads", lambda folder=folder: fastdata.loader(work / folder, BATCH,
                                                                                       device=device, num_workers=4)),
            ("batches already on the device", lambda folder=folder: parts.resident(
                fastdata.loader(work / folder, BATCH, device=device), 8, device))]
        if field == "x":
            feeds.insert(0, ("naive DataLoader (2 workers, pin_memory)", lambda: naive_loader(work / "npy", BATCH)))
        for feed_name, make_feed in feeds:
            if time.perf_counter() > deadline:
                rows.append({"model": name, "feed": feed_name, "not_run": "time budget"})
                continue
            feed = make_feed()
            gpu = GpuSampler()  # samples the timed fit only
            row = parts.fit_row(make, feed, s["train_steps"], device, field, during=gpu)
            row.update(model=name, parameters=params, feed=feed_name,
                       gpu_util_percent=float(np.mean(gpu.samples)) if gpu.samples else None)
            rows.append(row)
            if hasattr(feed, "close"):
                feed.close()
        base = next((r["samples_per_s"] for r in rows if r["model"] == name and r["feed"].startswith("batches")
                     and "samples_per_s" in r), None)
        for r in rows:
            if r["model"] == name and "samples_per_s" in r:
                r["x_resident"] = r["samples_per_s"] / base if base else None
    return rows


def host_waits(ld: Any) -> dict[str, float]:
    """Time the training thread spends waiting for the reader's host batches inside the loader's
    ``next()`` (the rest of that ``next()`` is staging the copy and conversion, and waiting on copies in
    flight); read after the fit: ``{"host_s": seconds}``."""
    acc = {"host_s": 0.0}
    real = ld._reader.run

    def run(*a: Any, **k: Any) -> Iterable[Any]:
        it = real(*a, **k)
        while True:
            t = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:
                return
            acc["host_s"] += time.perf_counter() - t
            yield b

    ld._reader.run = run
    return acc


class _Window:
    """The timed fit's window: its seconds, and the host-batch wait (``host_waits``) within it."""

    def __init__(self, acc: dict[str, float] | None) -> None:
        self.acc, self.seconds, self.host_s = acc, 0.0, 0.0

    def __enter__(self) -> "_Window":
        self.t, self.h = time.perf_counter(), self.acc["host_s"] if self.acc else 0.0
        return self

    def __exit__(self, *exc: Any) -> None:
        self.seconds = time.perf_counter() - self.t
        self.host_s = (self.acc["host_s"] - self.h) if self.acc else 0.0


def section_diag(work: Path, device: torch.device, s: dict[str, Any], deadline: float) -> list[dict[str, Any]]:
    """Where the ResNet-style model's input wait goes (the train section's miss): reader threads 1, 2, 4 and
    the default, and the interpreter's GIL switch interval at 0.5 ms, over longer fits; for each, the share of the step spent in the loader's ``next()`` and,
    within it, waiting for host batches."""
    make, folder, field = models(s)[f"ResNet-style 2-D (3x{s['side']}x{s['side']})"]
    held = parts.resident(fastdata.loader(work / folder, BATCH, device=device), 8, device)
    # (feed, loader arguments or None for the resident batches, GIL switch interval)
    variants: list[tuple[str, dict[str, Any] | None, float | None]] = [
        ("batches already on the device", None, None), ("defaults", {}, None),
        ("num_workers=1", {"num_workers": 1}, None), ("num_workers=2", {"num_workers": 2}, None),
        ("num_workers=4", {"num_workers": 4}, None), ("defaults, GIL switch interval 0.5 ms", {}, 0.0005)]
    rows, base = [], None
    for name, kw, interval in variants:
        if time.perf_counter() > deadline:
            rows.append({"feed": name, "not_run": "time budget"})
            continue
        old = sys.getswitchinterval()
        ld = fastdata.loader(work / folder, BATCH, device=device, **kw) if kw is not None else None
        timed = _Window(host_waits(ld) if ld is not None else None)
        try:
            if interval is not None:
                sys.setswitchinterval(interval)
            row = parts.fit_row(make, ld if ld is not None else held, s["diag_steps"], device, field, during=timed)
        finally:
            sys.setswitchinterval(old)
            if ld is not None:
                ld.close()
        row.update(feed=name, host_wait_fraction=timed.host_s / timed.seconds if ld is not None and timed.seconds
                   else None)
        base = row["samples_per_s"] if ld is None else base
        row["x_resident"] = row["samples_per_s"] / base if base else None
        rows.append(row)
    return rows


def section_precision(work: Path, device: torch.device, s: dict[str, Any], deadline: float) -> list[dict[str, Any]]:
    """Each model fed by fastdata.loader at fp32/tf32/bf16/fp16, channels_last off and on, and compiled
    (CUDA only) at its default precision with channels_last: samples/s, input wait, memory; and the same
    configuration fed from batches already on the device (x resident)."""
    modes = ("fp32", "tf32", "bf16", "fp16") if device.type == "cuda" else ("fp32", "bf16")
    configs = [(p, cl, False) for p in modes for cl in (False, True)]
    if device.type == "cuda":
        configs.append(("auto", True, True))  # last: compiling takes the longest, and the deadline may stop it
    if s.get("precisions"):  # a subset (a later call finishing what an earlier one's time budget left)
        configs = [c for c in configs if c[0] in s["precisions"]]
    rows = []
    held: dict[str, list[dict[str, torch.Tensor]]] = {}
    for precision, cl, comp in configs:
        for name, (make, folder, field) in models(s).items():
            row: dict[str, Any] = {"model": name, "channels_last": cl, "compile": comp}
            if time.perf_counter() > deadline:
                rows.append({**row, "precision": precision, "not_run": "time budget"})
                continue
            kw = {"precision": precision, "channels_last": cl, "compile": comp}
            ld = fastdata.loader(work / folder, BATCH, device=device)
            row.update(parts.fit_row(make, ld, s["prec_steps"], device, field, **kw))
            ld.close()
            if not comp:
                if name not in held:
                    held[name] = parts.resident(fastdata.loader(work / folder, BATCH, device=device), 8, device)
                base = parts.fit_row(make, held[name], s["prec_steps"], device, field, **kw)["samples_per_s"]
                row["x_resident"] = row["samples_per_s"] / base
            rows.append(row)
    return rows


def augment_rate(ds: Path, device: torch.device, epochs: int) -> tuple[float, float]:
    """Images/s of the loader with RandomResizedCrop(224), flip and jitter on ``device``; the darkest pixel."""
    aug = [RandomResizedCrop(224), HorizontalFlip(), ColorJitter(0.2, 0.2, 0.2)]
    ld = fastdata.loader(ds, BATCH, device=device, augment=aug)
    darkest = 1.0
    n, t = 0, time.perf_counter()
    for _ in range(epochs):
        for b in ld:
            n += b["image"].shape[0]
            darkest = min(darkest, float(b["image"].amin()))  # flat images: padding would show as 0
    parts.sync(device)
    r = n / (time.perf_counter() - t)
    ld.close()
    return r, darkest


def section_images(work: Path, device: torch.device, s: dict[str, Any], deadline: float) -> dict[str, Any]:
    """Mixed-size JPEGs stored encoded, decoded on the host, augmented per image on ``device`` and on the CPU."""
    from PIL import Image

    rng = np.random.default_rng(0)
    src = work / "jpegs"
    for i in range(s["images"]):
        h, w = (int(v) for v in rng.integers(160, 400, 2))
        (src / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
        level = int(rng.integers(120, 250))
        Image.fromarray(np.full((h, w, 3), level, np.uint8)).save(src / f"c{i % 4}" / f"{i:05d}.jpg", quality=90)
    fastdata.convert(src, work / "jpeg_ds", fastdata.ConvertConfig(images=fastdata.ImageOptions(images="encoded")))
    r, darkest = augment_rate(work / "jpeg_ds", device, s["epochs"])
    cpu = None
    if device.type == "cuda" and time.perf_counter() < deadline:
        cpu, dark_cpu = augment_rate(work / "jpeg_ds", torch.device("cpu"), s["epochs"])
        darkest = min(darkest, dark_cpu)
    # brightness 0.8 of the darkest level (120/255) is about 0.37: anything near 0 is padding
    return {"images_per_s": r, "images_per_s_cpu": cpu, "x_cpu": r / cpu if cpu else None,
            "darkest_pixel": darkest, "padding_sampled": darkest < 0.2}


def section_jpeg(work: Path, device: torch.device, s: dict[str, Any], deadline: float) -> dict[str, Any]:
    """Item 4's methods over the same 256x256 JPEGs (files and encoded shards), in rotating rounds."""
    import bench_dali
    from bench_images import generate

    src, dst = work / "jpeg256", work / "jpeg256_ds"
    paths = generate(src, s["jpegs"])
    fastdata.convert(src, dst, fastdata.ConvertConfig(images=fastdata.ImageOptions(images="encoded")))
    _harness.warm_page_cache(src, dst)
    methods = parts.jpeg_methods(src, dst, paths, device)
    rates: dict[str, list[float]] = {m.name: [] for m in methods}
    for r in range(s["jpeg_rounds"]):
        if r and time.perf_counter() > deadline:
            break
        for k in range(len(methods)):
            m = methods[(r + k) % len(methods)]
            images, seconds, _, _ = bench_dali.measure(m)
            rates[m.name].append(images / seconds)
    rows = [{"method": k, "images_per_s": float(np.median(v)), "runs": v} for k, v in rates.items() if v]
    by = {r["method"]: r["images_per_s"] for r in rows}
    ratios = {}
    if bench_dali.DALI in by and bench_dali.FILE in by:
        ratios["DALI backend / DALI file reader (target >= 0.9)"] = by[bench_dali.DALI] / by[bench_dali.FILE]
    if bench_dali.DALI in by:
        ratios["DALI backend / torch backend (target > 1)"] = by[bench_dali.DALI] / by[bench_dali.TORCH]
    return {"images": s["jpegs"], "rounds": len(next(iter(rates.values()))), "rows": rows, "ratios": ratios,
            "dali": "DALI imports" if bench_dali.DALI in by else "NVIDIA DALI is not installed here: no DALI rows"}


def section_views(work: Path, device: torch.device, s: dict[str, Any], deadline: float, out: str,
                  quick: bool) -> str:
    import bench_augment_views

    bench_augment_views.main(["--device", device.type, "--out", out] + (["--quick"] if quick else []))
    return f"See augment_views{'_quick' if quick else ''}{'_cuda' if device.type == 'cuda' else ''}.md."


def section_dali(work: Path, device: torch.device, s: dict[str, Any], deadline: float, out: str, quick: bool) -> str:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return "NVIDIA DALI is not installed here: not measured (its GPU figures are owed)."
    import bench_dali

    bench_dali.main((["--quick"] if quick else []) + ["--device", device.type, "--out", out])
    return f"See dali{'_cuda' if device.type == 'cuda' else ''}{'_quick' if quick else ''}.md."


def fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def render(info: dict[str, Any], settings: dict[str, Any], res: dict[str, Any],
           sources: dict[str, list[str]] | None = None) -> str:
    """The markdown report of whatever sections ``res`` holds (``sources``: the run files each came from)."""
    t = _harness.markdown_table
    lines = [f"# GPU paths ({settings['mode']} run, device {settings['device']})", "",
             f"Machine: {info.get('cpu_model', '?')}, {info.get('usable_cores')} usable cores, "
             f"GPU: {info.get('gpu') or 'none'}; torch {info.get('torch')}"
             f" (CUDA {info.get('cuda', '?')}). Sections: {', '.join(res)}.", ""]
    if sources:
        lines += ["Combined from several device calls: " + "; ".join(
            f"{name} from {' + '.join(files)}" for name, files in sources.items()) + ".", ""]
    if "h2d" in res:
        c = res["h2d"]["ceilings_gb_per_s"]
        lines += ["## 1. Host to device", "",
                  "Copy ceilings of one batch (GB/s): " + "; ".join(
                      f"{k} pinned {fmt(v['pinned'], '.1f')}, pageable {fmt(v['pageable'], '.1f')}" for k, v in c.items())
                  + ".", "",
                  t(["method", "samples/s", "GB/s", "x naive", "x pinned ceiling"],
                    [[r["method"], fmt(r.get("samples_per_s"), ",.0f"), fmt(r.get("gb_per_s"), ".2f"),
                      fmt(r.get("x_naive"), ".1f"), fmt(r.get("x_ceiling"), ".2f")] for r in res["h2d"]["rows"]]), ""]
    for key, title in (("train", "## 2. Training input-wait (default precision, default loader)"),
                       ("precision", "## 3. Precision, channels_last, compile (fed by the loader)")):
        if key in res:
            lines += [title, "", t(["model", "feed / precision", "channels_last", "compile", "samples/s",
                                    "waited for input", "x resident", "GPU busy", "loss finite"],
                                   [[r["model"], r.get("feed", r.get("precision")), r.get("channels_last", "-"),
                                     r.get("compile", "-"), fmt(r.get("samples_per_s"), ",.0f"),
                                     fmt(100 * r["wait_fraction"] if "wait_fraction" in r else None, ".1f"),
                                     fmt(r.get("x_resident"), ".2f"), fmt(r.get("gpu_util_percent"), ".0f"),
                                     r.get("loss_finite", r.get("not_run", "-"))] for r in res[key]]), ""]
    if "diag" in res:
        lines += ["## 2b. Where the ResNet-style model's input wait goes", "",
                  t(["feed", "samples/s", "waited in next() (% of step)", "of which for host batches (% of step)", "x resident"],
                    [[r["feed"], fmt(r.get("samples_per_s"), ",.0f"),
                      fmt(100 * r["wait_fraction"] if "wait_fraction" in r else None, ".1f"),
                      fmt(100 * r["host_wait_fraction"] if r.get("host_wait_fraction") is not None else None, ".1f"),
                      fmt(r.get("x_resident"), ".2f") if "not_run" not in r else r["not_run"]] for r in res["diag"]]), ""]
    if "images" in res:
        im = res["images"]
        lines += ["## 4. Mixed-size JPEGs, augmented on the device", "",
                  f"{im['images_per_s']:,.0f} images/s (RandomResizedCrop(224), HorizontalFlip, ColorJitter); "
                  f"the same on the CPU: {fmt(im['images_per_s_cpu'], ',.0f')} images/s (x CPU {fmt(im['x_cpu'], '.1f')}); "
                  f"darkest pixel {im['darkest_pixel']:.3f}: padding {'SAMPLED (bug)' if im['padding_sampled'] else 'never sampled'}.",
                  ""]
    if "jpeg" in res:
        j = res["jpeg"]
        lines += [f"## 5. JPEG decoding, {j['images']} 256x256 JPEGs, median of {j['rounds']} rounds", "",
                  t(["method", "images/s"], [[r["method"], f"{r['images_per_s']:,.0f}"] for r in j["rows"]]), "",
                  "; ".join(f"{k}: {v:.2f}" for k, v in j["ratios"].items()) or j["dali"], ""]
    for key, title in (("views", "## 6. Views, sequence ops, MixUp/CutMix"), ("dali", "## 7. DALI")):
        if key in res:
            lines += [title, "", res[key], ""]
    return "\n".join(lines)


def prepare(work: Path, s: dict[str, Any], sections: list[str]) -> None:
    """The data the chosen sections read: FLIM .npy files and their HDF5/LMDB shards, raw uint8 images."""
    if {"h2d", "train", "diag", "precision"} & set(sections):
        write_npy_folder(work / "npy", s["samples"], FLIM)
        for be in ("hdf5", "lmdb"):
            fastdata.convert(work / "npy", work / be, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=be)))
        rng = np.random.default_rng(0)
        np.save(work / "img.npy", rng.integers(0, 256, (s["raw_images"], s["side"], s["side"], 3), dtype=np.uint8))
        np.save(work / "y.npy", np.arange(s["raw_images"]) % 10)
        fastdata.convert(None, work / "raw", arrays={"image": work / "img.npy", "label": work / "y.npy"})


def merge_rows(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The precision rows of two runs: a measured row replaces the same configuration's row of an
    earlier run or its "time budget" placeholder; a placeholder never replaces a measured row."""
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return r["model"], r.get("precision"), r.get("channels_last"), r.get("compile")

    rows = {key(r): r for r in old}
    for r in new:
        if "not_run" not in r or key(r) not in rows:
            rows[key(r)] = r
    return list(rows.values())


def combine(paths: list[str], out: str) -> int:
    """One report from the gpu.json of several calls: later files win per section, except the
    precision section, whose rows are merged (:func:`merge_rows`); the report says which file gave what."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    res: dict[str, Any] = {}
    sources: dict[str, list[str]] = {}
    for path, r in zip(paths, runs):
        for name, value in r["result"].items():
            if name == "precision" and name in res:
                res[name] = merge_rows(res[name], value)
                sources[name].append(path)
            else:
                res[name] = value
                sources[name] = [path]
    last = runs[-1]
    report = render(last["machine"], last["settings"], res, sources)
    _harness.write_results("gpu", {**last, "result": res, "combined_from": paths, "sources": sources}, report, out)
    print(report)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="default: cuda")
    p.add_argument("--out", default=str(_harness.DEFAULT_RESULTS_DIR))
    p.add_argument("--workdir", default=None, help="where to put the temporary data")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--skip-dali", action="store_true", help="leave out the dali section (bench_dali.py runs on its own)")
    p.add_argument("--limit-s", type=float, default=540, help="time for all sections, shared by weight (default 540)")
    p.add_argument("--combine", nargs="+", metavar="JSON", help="merge gpu.json files of several calls, run nothing")
    p.add_argument("--precisions", default="", help="precision section: only these modes (fp32,tf32,bf16,fp16,auto)")
    args = p.parse_args(argv)
    if args.combine:
        return combine(args.combine, args.out)
    sections = [x for x in args.sections.split(",") if x and not (args.skip_dali and x == "dali")]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown sections {sorted(unknown)}: choose from {','.join(SECTIONS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA here: use --device cpu for a smoke run")
    device = torch.device(args.device)
    settings = {"mode": "quick" if args.quick else "full", "device": args.device, "sections": sections,
                "limit_s": args.limit_s, **(QUICK if args.quick else FULL),
                "precisions": [x for x in args.precisions.split(",") if x]}
    work = Path(tempfile.mkdtemp(prefix="bench_gpu-", dir=args.workdir))
    info = {**_harness.machine_info(), "cuda": torch.version.cuda}
    res: dict[str, Any] = {}
    start, total = time.perf_counter(), sum(WEIGHTS[x] for x in sections)
    runs: dict[str, Callable[[float], Any]] = {
        "h2d": lambda d: section_h2d(work, device, settings, d),
        "train": lambda d: section_train(work, device, settings, d),
        "precision": lambda d: section_precision(work, device, settings, d),
        "diag": lambda d: section_diag(work, device, settings, d),
        "images": lambda d: section_images(work, device, settings, d),
        "jpeg": lambda d: section_jpeg(work, device, settings, d),
        "views": lambda d: section_views(work, device, settings, d, args.out, args.quick),
        "dali": lambda d: section_dali(work, device, settings, d, args.out, args.quick)}
    check: dict[str, Any] = {"over": {}, "quick": args.quick}
    try:
        prepare(work, settings, sections)
        used = 0
        for name in sections:
            used += WEIGHTS[name]
            t = time.perf_counter()
            deadline = start + args.limit_s * used / total  # a section that ends early leaves its time to the next
            res[name] = runs[name](deadline)
            print(f"{name}: done in {time.perf_counter() - t:.0f} s ({time.perf_counter() - start:.0f} s in all)",
                  flush=True)
            check = save(args, info, settings, res)  # after every section: a run stopped later keeps these
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n" + render(info, settings, res))
    return _harness.ceiling_exit(check)


def save(args: argparse.Namespace, info: dict[str, Any], settings: dict[str, Any], res: dict[str, Any]) -> dict[str, Any]:
    """Write gpu[_cpu][_quick].json and .md with the sections done so far; the ceiling check's record."""
    ratios = {r["method"]: r["x_ceiling"] for r in res.get("h2d", {}).get("rows", []) if r.get("x_ceiling")}
    check = _harness.check_ceiling("bench_gpu", ratios, args.quick)
    name = "gpu" + ("_cpu" if args.device == "cpu" else "") + ("_quick" if args.quick else "")
    _harness.write_results(name, {"benchmark": "gpu", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                  "settings": settings, "machine": info, "result": res, "ceiling_check": check},
                           render(info, settings, res), args.out)
    return check


if __name__ == "__main__":
    sys.exit(main())
