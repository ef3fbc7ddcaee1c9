"""The numeric setup of a training run: autocast dtype, GradScaler, TF32, cuDNN autotuning and
channels_last, decided once from the device, the model and the loader, and its start-up report."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from fastdata.augment import CROPS
from fastdata.augment.sequence import TimeCrop
from fastdata.format import IMAGE_ENCODINGS
from fastdata.world import usable_cpus

Precision = Literal["auto", "fp32", "tf32", "bf16", "fp16"]


def fixed_shapes(loader: Any) -> bool:
    """Whether every batch has the same shapes (then cuDNN autotuning pays): no ragged field,
    except image fields that the loader's augmentation crops to one size."""
    ds = getattr(loader, "dataset", None)
    if ds is None:
        return True
    aug = getattr(loader, "augment", None)
    views = aug.view_ops if aug is not None else ()
    crops = bool(views) and all(any(type(op) in CROPS for op in ops) for ops in views)  # every view crops
    time_crops = bool(views) and all(any(isinstance(op, TimeCrop) for op in ops) for ops in views)
    for f in getattr(ds, "schema", []):
        if not getattr(f, "ragged", False):
            continue
        named = aug is not None and (aug.fields is None or f.name in aug.fields)
        cropped = named and (crops and f.encoding in IMAGE_ENCODINGS or time_crops and f.encoding not in IMAGE_ENCODINGS)
        if not cropped:
            return False
    return True


@dataclass(frozen=True)
class PrecisionPlan:
    """The numeric setup of a run, decided once from the device, the model and the loader:
    autocast dtype, GradScaler, TF32, cuDNN autotuning, channels_last."""

    device: torch.device
    precision: str  # fp32 | tf32 | bf16 | fp16
    autocast_dtype: torch.dtype | None
    scaler: bool
    channels_last: bool
    cudnn_benchmark: bool

    @classmethod
    def choose(cls, device: torch.device, precision: Precision, model: nn.Module, channels_last: bool,
               fixed_shapes: bool) -> PrecisionPlan:
        """``auto`` is bf16 on GPUs that have it natively, fp16 (+ GradScaler) on older ones, fp32 on the CPU."""
        cuda = device.type == "cuda"
        if precision == "auto":
            # native bf16 from compute capability 8 (Ampere); before it torch would emulate bf16 slowly
            precision = ("bf16" if torch.cuda.get_device_capability(device)[0] >= 8 else "fp16") if cuda else "fp32"
        if precision not in ("fp32", "tf32", "bf16", "fp16"):
            raise ValueError(f"precision must be auto, fp32, tf32, bf16 or fp16, not {precision!r}")
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        has_conv2d = any(isinstance(m, nn.Conv2d) for m in model.modules())
        return cls(device=device, precision=precision, autocast_dtype=dtype, scaler=precision == "fp16",
                   channels_last=channels_last and has_conv2d, cudnn_benchmark=cuda and fixed_shapes)

    def apply_flags(self) -> None:
        """Set TF32 and cudnn.benchmark for this plan (CUDA only; the CPU has no such flags)."""
        if self.device.type == "cuda":
            tf32 = self.precision != "fp32"  # fp32 means strict fp32; every other mode lets matmuls use TF32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
            if self.cudnn_benchmark:  # (left as the user set it when input shapes may vary)
                torch.backends.cudnn.benchmark = True

    def place(self, model: nn.Module) -> None:
        """Move ``model`` to the plan's device, in channels_last when the plan says so."""
        model.to(self.device)
        if self.channels_last:
            model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # Module.to's stubs omit it

    def autocast(self) -> AbstractContextManager[Any]:
        """A fresh autocast context for one forward pass (a no-op context in fp32/tf32)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def make_scaler(self) -> torch.amp.GradScaler:
        """A GradScaler, enabled only for fp16 (bf16 and fp32 need none)."""
        return torch.amp.GradScaler(self.device.type, enabled=self.scaler)


def startup_report(plan: PrecisionPlan, compiled: bool, grad_accum: int, clip: float | None) -> str:
    """Device, memory, CUDA/cuDNN versions, and the precision and flags in force."""
    lines = [f"fastdata.train: torch {torch.__version__}"]
    if plan.device.type == "cuda":
        props = torch.cuda.get_device_properties(plan.device)
        lines.append(f"  device   {props.name} ({plan.device}), {props.total_memory / 2**30:.1f} GiB, "
                     f"capability {props.major}.{props.minor}")
        lines.append(f"  cuda     {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
        lines.append(f"  flags    TF32 matmul={torch.backends.cuda.matmul.allow_tf32} "
                     f"cuDNN TF32={torch.backends.cudnn.allow_tf32} cudnn.benchmark={torch.backends.cudnn.benchmark}")
    else:
        lines.append(f"  device   cpu, {usable_cpus()} usable cores, {torch.get_num_threads()} torch threads")
    amp = f"autocast {plan.precision}" if plan.autocast_dtype is not None else plan.precision
    lines.append(f"  precision {amp}{' + GradScaler' if plan.scaler else ''}; channels_last={plan.channels_last}; "
                 f"compile={compiled}; grad_accum={grad_accum}; clip_grad_norm={clip}")
    return "\n".join(lines)


__all__ = ["Precision", "PrecisionPlan", "fixed_shapes", "startup_report"]
