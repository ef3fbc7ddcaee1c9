"""The AMP training core: one tested loop that applies the GPU tuning flags and measures input wait.

``fit(model, loader, optimizer, loss_fn, epochs=...)`` runs ``loss_fn(model, batch)`` over the
loader with autocast (bf16 where the GPU has it, else fp16 with a GradScaler), TF32 and cuDNN
autotuning, channels_last for conv nets, optional torch.compile with a fallback to eager,
gradient accumulation and clipping, atomic checkpoints with exact resume, and per-epoch
metrics: samples/s and the share of each step spent waiting for data. Loss values are read back
from the device only at log boundaries, so the loop adds no host-device syncs per step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import torch
from torch import nn

from .augment import CROPS
from .batching import batch_len
from .fileio import write_atomic
from .format import IMAGE_ENCODINGS
from .world import World, usable_cpus

log = logging.getLogger("fastdata.train")

Precision = Literal["auto", "fp32", "tf32", "bf16", "fp16"]
LossFn = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]
_CKPT_VERSION = 1


@dataclass
class EpochMetrics:
    """What one epoch did and how input-bound it was."""

    epoch: int
    steps: int
    samples: int
    seconds: float
    samples_per_s: float
    wait_s: float
    compute_s: float
    wait_fraction: float
    loss: float
    skipped_steps: int
    nonfinite_losses: int
    peak_memory_bytes: int | None = None


@dataclass
class FitResult:
    report: str
    epochs: list[EpochMetrics] = field(default_factory=list)
    steps: int = 0
    precision: str = "fp32"
    compiled: bool = False


@dataclass(frozen=True)
class _Plan:
    device: torch.device
    precision: str  # fp32 | tf32 | bf16 | fp16
    autocast_dtype: torch.dtype | None
    scaler: bool
    channels_last: bool
    cudnn_benchmark: bool


def to_device(batch: Any, device: torch.device) -> Any:
    """Tensors of a batch (dicts, lists and tuples of them) on ``device``: a plain DataLoader's
    batches move there, from pinned memory without blocking; tensors already there stay as they are."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if type(batch) in (list, tuple):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def _fixed_shapes(loader: Any) -> bool:
    """Whether every batch has the same shapes (then cuDNN autotuning pays): no ragged field,
    except image fields that the loader's augmentation crops to one size."""
    ds = getattr(loader, "dataset", None)
    if ds is None:
        return True
    aug = getattr(loader, "augment", None)
    crops = aug is not None and any(type(op) in CROPS for op in aug.ops)
    for f in getattr(ds, "schema", []):
        if not getattr(f, "ragged", False):
            continue
        cropped = crops and f.encoding in IMAGE_ENCODINGS and (aug.fields is None or f.name in aug.fields)
        if not cropped:
            return False
    return True


def _plan(device: torch.device, precision: Precision, model: nn.Module, channels_last: bool, fixed_shapes: bool) -> _Plan:
    cuda = device.type == "cuda"
    if precision == "auto":
        # native bf16 from compute capability 8 (Ampere); before it torch would emulate bf16 slowly
        precision = ("bf16" if torch.cuda.get_device_capability(device)[0] >= 8 else "fp16") if cuda else "fp32"
    if precision not in ("fp32", "tf32", "bf16", "fp16"):
        raise ValueError(f"precision must be auto, fp32, tf32, bf16 or fp16, not {precision!r}")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    has_conv2d = any(isinstance(m, nn.Conv2d) for m in model.modules())
    return _Plan(device=device, precision=precision, autocast_dtype=dtype, scaler=precision == "fp16",
                 channels_last=channels_last and has_conv2d, cudnn_benchmark=cuda and fixed_shapes)


def _apply_flags(plan: _Plan) -> None:
    if plan.device.type == "cuda":
        tf32 = plan.precision != "fp32"  # fp32 means strict fp32; every other mode lets matmuls use TF32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if plan.cudnn_benchmark:  # (left as the user set it when input shapes may vary)
            torch.backends.cudnn.benchmark = True


def startup_report(plan: _Plan, compiled: bool, grad_accum: int, clip: float | None) -> str:
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


def _unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "_orig_mod", model)  # torch.compile
    return getattr(model, "module", model)  # DistributedDataParallel


def _rng_state() -> dict[str, Any]:
    """RNG states as tensors and plain lists, so checkpoints load with ``weights_only=True`` (no pickle)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_py = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
        "python": [version, list(internal), gauss_py],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_py = state["python"]
    random.setstate((version, tuple(internal), gauss_py))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Write a checkpoint atomically: temp file in the same folder, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: torch.save(payload, f))


def fit(
    model: nn.Module,
    loader: Any,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    *,
    epochs: int,
    precision: Precision = "auto",
    compile: bool = False,  # noqa: A002 - the name users know from torch.compile
    grad_accum: int = 1,
    clip_grad_norm: float | None = None,
    channels_last: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    checkpoint_every: int | None = None,
    resume: str | os.PathLike[str] | None = None,
    max_steps: int | None = None,
    log_every: int = 50,
    on_log: Callable[[str], None] | None = None,
) -> FitResult:
    """Train ``model`` for ``epochs`` over ``loader`` (a ``fastdata.loader`` or any iterable of batch dicts).

    ``loss_fn(model, batch)`` returns the loss. ``checkpoint`` is written at every epoch end
    (and every ``checkpoint_every`` optimizer steps); ``resume`` continues from one. ``max_steps``
    stops after that many optimizer steps in total (writing the checkpoint). Messages go to
    ``on_log`` (default: the ``fastdata.train`` logger), from rank 0 only under DDP.
    """
    if epochs < 1 or grad_accum < 1:
        raise ValueError("epochs and grad_accum must be at least 1")
    world = World.detect()
    say = (on_log or log.info) if world.rank == 0 else (lambda _msg: None)
    device = getattr(loader, "device", None) or next(model.parameters()).device
    plan = _plan(torch.device(device), precision, _unwrap(model), channels_last, _fixed_shapes(loader))
    _apply_flags(plan)
    model.to(plan.device)
    if plan.channels_last:
        model.to(memory_format=torch.channels_last)
    scaler = torch.amp.GradScaler(plan.device.type, enabled=plan.scaler)

    start_epoch, step = 0, 0
    history: list[EpochMetrics] = []
    if resume is not None:
        # onto the CPU: RNG states must stay there; model and optimizer copy into their own devices
        state = torch.load(resume, map_location="cpu", weights_only=True)  # never unpickle code
        if state.get("version") != _CKPT_VERSION:
            raise ValueError(f"{resume}: unknown checkpoint version {state.get('version')!r}")
        _unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if state["scaler"]:  # empty when saved without a scaler (another precision)
            scaler.load_state_dict(state["scaler"])
        if state.get("loader") is not None and hasattr(loader, "load_state_dict"):
            loader.load_state_dict(state["loader"])
        start_epoch, step = state["epoch"], state["step"]
        history = [EpochMetrics(**m) for m in state.get("history", [])]
        _set_rng_state(state["rng"])
        say(f"resumed from {resume}: epoch {start_epoch}, step {step}")

    run_model: nn.Module = model
    compiled = False
    if compile:
        try:
            run_model = torch.compile(model)  # type: ignore[assignment]
            compiled = True
        except Exception as e:  # noqa: BLE001 - any failure means: train eagerly
            say(f"torch.compile failed ({type(e).__name__}: {e}); training in eager mode")
    report = startup_report(plan, compiled, grad_accum, clip_grad_norm)
    say(report)

    def save(epoch: int) -> None:
        if checkpoint is None or world.rank != 0:
            return
        save_checkpoint(checkpoint, {
            "version": _CKPT_VERSION, "model": _unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(), "loader": loader.state_dict() if hasattr(loader, "state_dict") else None,
            "epoch": epoch, "step": step, "rng": _rng_state(), "precision": plan.precision,
            "history": [asdict(m) for m in history]})

    autocast = (lambda: torch.autocast(plan.device.type, dtype=plan.autocast_dtype)) if plan.autocast_dtype \
        else contextlib.nullcontext
    params = [p for p in model.parameters() if p.requires_grad]
    cuda = plan.device.type == "cuda"
    model.train()
    stopped = False
    for epoch in range(start_epoch, epochs):
        if hasattr(loader, "set_epoch") and getattr(loader, "epoch", epoch) != epoch:
            loader.set_epoch(epoch)
        if cuda:
            torch.cuda.reset_peak_memory_stats(plan.device)
        loss_sum = torch.zeros((), device=plan.device)
        skipped = torch.zeros((), device=plan.device, dtype=torch.int64)
        nonfinite = torch.zeros((), device=plan.device, dtype=torch.int64)
        events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        wait = compute = 0.0
        micro = samples = 0
        first_step = step
        optimizer.zero_grad(set_to_none=True)
        t_epoch = time.perf_counter()
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            try:
                batch = to_device(next(it), plan.device)  # a no-op for fastdata.loader's batches
            except StopIteration:
                break
            t1 = time.perf_counter()
            wait += t1 - t0
            if cuda:
                ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                ev[0].record()
            micro += 1
            last_of_step = micro % grad_accum == 0
            sync_ctx = run_model.no_sync() if (not last_of_step and hasattr(run_model, "no_sync")) else contextlib.nullcontext()
            with sync_ctx:
                try:
                    with autocast():
                        loss = loss_fn(run_model, batch)
                except Exception as e:
                    if not compiled:  # (compiled: run_model is torch.compile's wrapper of model)
                        raise
                    say(f"torch.compile failed at the first step ({type(e).__name__}: {e}); falling back to eager")
                    run_model, compiled = model, False
                    with autocast():
                        loss = loss_fn(run_model, batch)
                detached = loss.detach().float()
                nonfinite += (~torch.isfinite(detached)).long()
                loss_sum += torch.nan_to_num(detached, nan=0.0, posinf=0.0, neginf=0.0)
                scaler.scale(loss / grad_accum).backward()
            samples += batch_len(batch)
            if last_of_step:
                skipped += _optimizer_step(optimizer, scaler, params, clip_grad_norm)
                step += 1
                if checkpoint_every and step % checkpoint_every == 0:
                    save(epoch)
            if cuda:
                ev[1].record()
                events.append(ev)
            else:
                compute += time.perf_counter() - t1
            if log_every and micro % log_every == 0:
                say(f"epoch {epoch} step {step}: loss {loss_sum.item() / micro:.4f}")
            if max_steps is not None and step >= max_steps and last_of_step:
                stopped = True
                break
        if micro % grad_accum and not stopped:  # leftover micro-batches at the end of an epoch still step
            skipped += _optimizer_step(optimizer, scaler, params, clip_grad_norm)
            step += 1
        if cuda:
            torch.cuda.synchronize(plan.device)
            compute = sum(a.elapsed_time(b) for a, b in events) / 1e3
        seconds = time.perf_counter() - t_epoch
        m = EpochMetrics(
            epoch=epoch, steps=step - first_step, samples=samples, seconds=seconds,
            samples_per_s=samples / seconds if seconds > 0 else 0.0, wait_s=wait, compute_s=compute,
            wait_fraction=wait / seconds if seconds > 0 else 0.0, loss=loss_sum.item() / max(micro, 1),
            skipped_steps=int(skipped.item()), nonfinite_losses=int(nonfinite.item()),
            peak_memory_bytes=torch.cuda.max_memory_allocated(plan.device) if cuda else None)
        if not stopped:
            history.append(m)
        say(f"epoch {epoch}: {m.samples_per_s:.0f} samples/s, waited for input {100 * m.wait_fraction:.1f}% "
            f"({m.wait_s:.2f} s of {m.seconds:.2f} s), loss {m.loss:.4f}, skipped steps {m.skipped_steps}"
            + (f", peak memory {m.peak_memory_bytes / 2**20:.0f} MiB" if cuda else ""))
        if stopped:
            save(epoch)
            return FitResult(report, history + [m], step, plan.precision, compiled)
        save(epoch + 1)
    return FitResult(report, history, step, plan.precision, compiled)


def _optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, params: list[torch.Tensor],
                    clip: float | None) -> torch.Tensor:
    """Unscale, clip, step, update; returns 1 (as a device tensor, no sync) if the scaler skipped the step."""
    if clip is not None:
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(params, clip)
    scale = getattr(scaler, "_scale", None)
    before = scale.clone() if scaler.is_enabled() and scale is not None else None
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if before is None:
        return torch.zeros((), dtype=torch.int64, device=params[0].device if params else "cpu")
    return (scaler._scale < before).long().reshape(())  # the scale backs off exactly when a step is skipped


__all__ = ["EpochMetrics", "FitResult", "fit", "save_checkpoint", "startup_report"]
