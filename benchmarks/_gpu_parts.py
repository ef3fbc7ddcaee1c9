"""Pieces of bench_gpu.py (issue 32's list): copy ceilings, a ResNet-style model, training fed by the loader
against the same batches already on the device, and batched JPEG decoding on the GPU."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterator

import _harness
import torch
from torch import nn


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_ceiling(device: torch.device, nbytes: int, reps: int, pinned: bool) -> float | None:
    """Bytes/s of one host buffer (pinned or pageable) copied to the device with ``non_blocking`` (None on the CPU)."""
    if device.type != "cuda":
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    src.fill_(7)  # pages touched before timing: a pageable buffer would otherwise fault them in during the copy
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    for _ in range(3):
        dst.copy_(src, non_blocking=True)
    sync(device)
    t = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src, non_blocking=True)
    sync(device)
    return nbytes * reps / (time.perf_counter() - t)


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions and a shortcut (projected when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                                  nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout))
        self.short = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.short(x))


class ResNetStyle(nn.Module):
    """A ResNet-10-like 2-D CNN for (B, 3, 224, 224) images: 7x7 stem, four stages of one basic block each."""

    def __init__(self, num_classes: int = 10, width: int = 64) -> None:
        super().__init__()
        ws = [width, 2 * width, 4 * width, 8 * width]
        layers: list[nn.Module] = [nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width),
                                   nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        cin = width
        for i, w in enumerate(ws):
            layers.append(BasicBlock(cin, w, 1 if i == 0 else 2))
            cin = w
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def resident(loader: Any, n_batches: int, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """The first ``n_batches`` batches of ``loader`` (then closed), kept on ``device``: the no-input-cost baseline."""
    out = []
    for b in loader:
        out.append({k: v.to(device) for k, v in b.items()})
        if len(out) == n_batches:
            break
    if hasattr(loader, "close"):
        loader.close()
    return out


def fit_row(make_model: Callable[[], nn.Module], feed: Any, steps: int, device: torch.device, field: str,
            **fit_kw: Any) -> dict[str, Any]:
    """One timed ``fit`` (after warm-up) of a fresh model fed by ``feed``: samples/s, input wait, loss."""
    from fastdata.demo.examples import classification_loss

    torch.manual_seed(0)
    model = make_model().to(device)
    res = _harness.timed_fit(model, feed, steps, loss=classification_loss(field), **fit_kw)
    m = res.epochs[-1]
    return {"precision": res.precision, "samples_per_s": m.samples_per_s, "wait_fraction": m.wait_fraction,
            "loss": m.loss, "loss_finite": bool(torch.isfinite(torch.tensor(m.loss))),
            "peak_memory_mib": m.peak_memory_bytes / 2**20 if m.peak_memory_bytes else None}


def tv_gpu_decode(paths: list[Path], batch: int, device: str) -> Any:
    """``torchvision.io.decode_jpeg(list, device="cuda")`` over the files in a new random order per epoch:
    bench_dali's Method, yielding float (B, 3, H, W) in [0, 1] on the GPU like the other methods."""
    import bench_dali
    from torchvision.io import decode_jpeg

    data = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in paths]

    def setup() -> tuple[Callable[[], Iterator[int]], Callable[[], None]]:
        state = {"epoch": 0}

        def epoch() -> Iterator[int]:
            state["epoch"] += 1
            order = torch.randperm(len(data), generator=torch.Generator().manual_seed(state["epoch"]))
            for i in range(0, len(order), batch):
                imgs = decode_jpeg([data[j] for j in order[i:i + batch].tolist()], device=device)
                x = torch.stack(imgs).float().div_(255)
                yield x.shape[0]

        return epoch, lambda: None

    return bench_dali.Method(f"torchvision.io.decode_jpeg(device={device!r}), batches of {batch}", setup)


def jpeg_methods(src: Path, dst: Path, paths: list[Path], device: torch.device) -> list[Any]:
    """Item 4's methods on this machine: the torch backend (CPU cores decode), torchvision on the GPU,
    and, when DALI imports, the DALI backend and DALI's own file reader (mixed decode on CUDA)."""
    import importlib.util

    import bench_dali

    from fastdata.loaders import LoaderConfig
    from fastdata.world import usable_cpus

    dev = device.type
    methods = [bench_dali.fastdata_loader(bench_dali.TORCH, dst, dev)]
    if dev == "cuda" and importlib.util.find_spec("torchvision") is not None:
        methods.append(tv_gpu_decode(paths, bench_dali.BATCH, dev))
    if importlib.util.find_spec("nvidia.dali") is not None:
        methods += [bench_dali.fastdata_loader(bench_dali.DALI, dst, dev, backend="dali"),
                    bench_dali.file_reader(src, dev, usable_cpus(), LoaderConfig().prefetch)]
    return methods
