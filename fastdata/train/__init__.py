"""The AMP training core: ``fit`` runs ``loss_fn(model, batch)`` over a loader with the GPU's precision (autocast,
GradScaler, TF32, cuDNN autotuning, channels_last: decided once by ``PrecisionPlan``), optional torch.compile,
accumulation, clipping, checkpoints with exact resume and per-epoch metrics."""

from __future__ import annotations

import contextlib
import logging
import numbers
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from fastdata.augment import CROPS
from fastdata.augment.sequence import TimeCrop
from fastdata.errors import UsageError
from fastdata.fileio import write_atomic
from fastdata.format import IMAGE_ENCODINGS
from fastdata.loaders.transform import batch_len
from fastdata.world import World, usable_cpus

log = logging.getLogger("fastdata.train")

Precision = Literal["auto", "fp32", "tf32", "bf16", "fp16"]
LossFn = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]
Say = Callable[[str], None]


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


def to_device(batch: Any, device: torch.device) -> Any:
    """Tensors of a batch (dicts, lists and tuples of them) on ``device``, from pinned memory without blocking;
    tensors already there stay as they are."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if type(batch) in (list, tuple):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


_END = object()  # EpochMeter.fetch: the loader is exhausted


class EpochMeter:
    """Input wait and compute time of one epoch, with loss, non-finite and skip counters kept on the device; on
    CUDA compute is timed with events read at the epoch's end, so timing does not serialise the pipeline."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(device)
        self.loss_sum = torch.zeros((), device=device)
        self.skipped = torch.zeros((), device=device, dtype=torch.int64)
        self.nonfinite = torch.zeros((), device=device, dtype=torch.int64)
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.wait = self.compute = 0.0
        self.micro = self.samples = 0
        self._t_batch = 0.0
        self.t_start = time.perf_counter()

    def fetch(self, it: Any, device: torch.device) -> Any:
        """The next batch on ``device`` (``_END`` when exhausted); the time of getting and moving it is input wait."""
        t0 = time.perf_counter()
        try:
            batch = to_device(next(it), device)  # a no-op for fastdata.loader's batches
        except StopIteration:
            return _END
        self._t_batch = t1 = time.perf_counter()
        self.wait += t1 - t0
        if self.cuda:
            ev = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            ev[0].record()
            self.events.append(ev)
        return batch

    def add(self, loss: torch.Tensor, samples: int) -> None:
        """Count one micro-batch: its loss (inf/nan counted apart and summed as 0) and its samples."""
        self.micro += 1
        self.samples += samples
        self.nonfinite += (~torch.isfinite(loss)).long()
        self.loss_sum += torch.nan_to_num(loss, nan=0.0, posinf=0.0, neginf=0.0)

    def end_compute(self) -> None:
        """The step of the batch from the last ``fetch`` is done (on CUDA: queued)."""
        if self.cuda:
            self.events[-1][1].record()
        else:
            self.compute += time.perf_counter() - self._t_batch

    def mean_loss(self) -> float:
        """Mean loss so far, NaN before any batch (a host sync: for log lines only)."""
        return self.loss_sum.item() / self.micro if self.micro else float("nan")

    def finish(self, epoch: int, steps: int) -> EpochMetrics:
        """The epoch's metrics: one host sync for the counters, and on CUDA for the compute events."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            self.compute = sum(a.elapsed_time(b) for a, b in self.events) / 1e3
        seconds = time.perf_counter() - self.t_start
        return EpochMetrics(
            epoch=epoch, steps=steps, samples=self.samples, seconds=seconds,
            samples_per_s=self.samples / seconds if seconds > 0 else 0.0, wait_s=self.wait, compute_s=self.compute,
            wait_fraction=self.wait / seconds if seconds > 0 else 0.0, loss=self.mean_loss(),
            skipped_steps=int(self.skipped.item()), nonfinite_losses=int(self.nonfinite.item()),
            peak_memory_bytes=torch.cuda.max_memory_allocated(self.device) if self.cuda else None)


def epoch_summary(m: EpochMetrics) -> str:
    """The log line of an epoch: throughput, input wait, loss, skipped steps, GPU memory peak."""
    if m.samples == 0:
        return (f"epoch {m.epoch}: no batches: the loader gave none (an empty dataset, or fewer samples than "
                "batch_size with drop_last=True?)")
    peak = f", peak memory {m.peak_memory_bytes / 2**20:.0f} MiB" if m.peak_memory_bytes is not None else ""
    return (f"epoch {m.epoch}: {m.samples_per_s:.0f} samples/s, waited for input {100 * m.wait_fraction:.1f}% "
            f"({m.wait_s:.2f} s of {m.seconds:.2f} s), loss {m.loss:.4f}, skipped steps {m.skipped_steps}{peak}")


_CKPT_VERSION = 1


def _unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "_orig_mod", model)  # torch.compile
    return getattr(model, "module", model)  # DistributedDataParallel


def _rng_state() -> dict[str, Any]:
    """RNG states as tensors and plain lists, so checkpoints load with ``weights_only=True`` (no pickle)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    version, internal, gauss_py = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(np.asarray(keys).astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
        "python": [version, list(internal), gauss_py],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``_rng_state`` saved (torch, numpy, python, and CUDA when both sides have it)."""
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


def checkpoint_state(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, loader: Any,
                     *, epoch: int, step: int, precision: str, history: Sequence[EpochMetrics]) -> dict[str, Any]:
    """Everything exact resume needs (weights, optimizer, scaler, loader position, RNG states, metric
    history), as tensors and plain values only, so that it loads with ``weights_only=True``."""
    return {
        "version": _CKPT_VERSION, "model": _unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
        "optimizer_type": type(optimizer).__qualname__,
        "scaler": scaler.state_dict(), "loader": loader.state_dict() if hasattr(loader, "state_dict") else None,
        "epoch": epoch, "step": step, "rng": _rng_state(), "precision": precision,
        "history": [asdict(m) for m in history]}


def restore_checkpoint(path: str | os.PathLike[str], model: nn.Module, optimizer: torch.optim.Optimizer,
                       scaler: torch.amp.GradScaler, loader: Any) -> tuple[int, int, list[EpochMetrics]]:
    """Load a ``checkpoint_state`` into the objects of this run and the RNGs; returns (epoch, step, history).
    A scaler state saved under another precision (empty) is left out."""
    # onto the CPU: RNG states must stay there; model and optimizer copy into their own devices
    if not Path(path).is_file():
        raise UsageError(f"resume={str(path)!r}: no such checkpoint file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # never unpickle code
    except Exception as e:  # not torch.save's (an UnpicklingError under weights_only), truncated, unreadable, ...
        raise UsageError(f"{path}: not a fastdata.train checkpoint ({type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else 'unreadable'})") from None
    if not isinstance(state, dict) or state.get("version") != _CKPT_VERSION:
        version = state.get("version") if isinstance(state, dict) else None
        raise ValueError(f"{path}: unknown checkpoint version {version!r}")
    try:
        _unwrap(model).load_state_dict(state["model"])
    except RuntimeError as e:  # another architecture: missing, unexpected or differently shaped weights
        raise UsageError(f"{path}: the checkpoint's weights do not fit this model ({' '.join(str(e).split())[:300]})") \
            from None
    saved = state.get("optimizer_type", type(optimizer).__qualname__)  # (absent from older checkpoints)
    if saved != type(optimizer).__qualname__:  # its state would load, and fail at the first step (SGD -> AdamW)
        raise UsageError(f"{path}: the checkpoint holds the state of a {saved} optimizer, not of this "
                         f"{type(optimizer).__qualname__}; resume with the optimizer it was saved with")
    optimizer.load_state_dict(state["optimizer"])
    if state["scaler"]:  # empty when saved without a scaler (another precision)
        scaler.load_state_dict(state["scaler"])
    if state.get("loader") is not None and hasattr(loader, "load_state_dict"):
        loader.load_state_dict(state["loader"])
    history = [EpochMetrics(**m) for m in state.get("history", [])]
    _set_rng_state(state["rng"])
    return state["epoch"], state["step"], history


@dataclass
class FitResult:
    report: str
    epochs: list[EpochMetrics] = field(default_factory=list)
    steps: int = 0
    precision: str = "fp32"
    compiled: bool = False


class ModelRunner:
    """Calls ``loss_fn(model, batch)``: through torch.compile when asked, eagerly (logged, not fatal) when
    compiling or the compiled model's first call fails."""

    def __init__(self, model: nn.Module, compile: bool, say: Say) -> None:
        self.model = model
        self.run: nn.Module = model
        self.compiled = False
        self._say = say
        if compile:
            try:
                self.run = torch.compile(model)  # type: ignore[assignment]
                self.compiled = True
            except Exception as e:  # noqa: BLE001 - any failure means: train eagerly
                say(f"torch.compile failed ({type(e).__name__}: {e}); training in eager mode")

    def no_sync(self, sync: bool) -> AbstractContextManager[Any]:
        """DDP's ``no_sync()`` when this backward should not all-reduce (``sync`` False), else a no-op."""
        no_sync = getattr(self.run, "no_sync", None)
        return no_sync() if (not sync and no_sync is not None) else contextlib.nullcontext()

    def loss(self, loss_fn: LossFn, batch: Any, autocast: Callable[[], AbstractContextManager[Any]]) -> torch.Tensor:
        """The loss of one batch under ``autocast()``; a compiled model that raises is dropped for the eager one."""
        try:
            with autocast():
                return loss_fn(self.run, batch)
        except Exception as e:
            if not self.compiled:  # (compiled: self.run is torch.compile's wrapper of self.model)
                raise
            self._say(f"torch.compile failed at the first step ({type(e).__name__}: {e}); falling back to eager")
            self.run, self.compiled = self.model, False
            with autocast():
                return loss_fn(self.run, batch)


def scale_on_device(scaler: torch.amp.GradScaler, device: torch.device | str) -> torch.Tensor:
    """The (enabled) scaler's current scale as a 0-dim float32 tensor on ``device``, without the host sync of
    ``get_scale()``."""
    return scaler.scale(torch.ones((), dtype=torch.float32, device=device))


def _optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, params: Sequence[torch.Tensor],
                    clip: float | None) -> torch.Tensor:
    """Unscale, clip, step, update; returns 1 (a device tensor, no sync) if the scaler skipped the step (seen as
    the scale backing off in ``update()``)."""
    device = params[0].device if params else torch.device("cpu")
    if clip is not None:
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(params, clip)
    before = scale_on_device(scaler, device) if scaler.is_enabled() else None
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if before is None:
        return torch.zeros((), dtype=torch.int64, device=device)
    return (scale_on_device(scaler, device) < before).long().reshape(())


class TrainStep:
    """One micro-batch at a time: forward under autocast, scaled backward (DDP ``no_sync`` on all but the
    last micro-batch of an accumulation group), and the optimizer step once ``grad_accum`` are in."""

    def __init__(self, runner: ModelRunner, loss_fn: LossFn, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, plan: PrecisionPlan, grad_accum: int = 1,
                 clip_grad_norm: float | None = None) -> None:
        self.runner, self.loss_fn, self.optimizer, self.scaler, self.plan = runner, loss_fn, optimizer, scaler, plan
        self.grad_accum, self.clip = grad_accum, clip_grad_norm
        self.params = [p for p in runner.model.parameters() if p.requires_grad]
        self.pending = 0  # micro-batches whose gradients wait for an optimizer step

    def forward_backward(self, batch: Any) -> tuple[torch.Tensor, bool]:
        """Accumulate one batch's gradients; returns its loss (detached, fp32, on the device) and whether
        it completed an accumulation group (then call ``optimizer_step``)."""
        self.pending += 1
        last = self.pending == self.grad_accum
        with self.runner.no_sync(sync=last):
            loss = self.runner.loss(self.loss_fn, batch, self.plan.autocast)
            self.scaler.scale(loss / self.grad_accum).backward()
        return loss.detach().float(), last

    def optimizer_step(self) -> torch.Tensor:
        """Step on the accumulated gradients (also a partial group); returns 1 on the device if the scaler skipped it."""
        self.pending = 0
        return _optimizer_step(self.optimizer, self.scaler, self.params, self.clip)


@contextlib.contextmanager
def shown_by_default(enabled: bool) -> Iterator[None]:
    """While ``fit`` runs, show ``fastdata.train``'s INFO lines on stderr if the program configured no logging
    for it; nothing stays behind."""
    if not enabled or log.hasHandlers():
        yield
        return
    handler = logging.StreamHandler()  # stderr, like every logging default
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = log.level
    log.addHandler(handler)
    if level == logging.NOTSET:
        log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def run_epoch(loader: Any, epoch: int, step: int, trainer: TrainStep, *, say: Say,
              save: Callable[[int, int], None], log_every: int = 0, checkpoint_every: int | None = None,
              max_steps: int | None = None) -> tuple[EpochMetrics, int, bool]:
    """One pass over ``loader`` from global step ``step``: the epoch's metrics, the new global step, and whether
    ``max_steps`` stopped it; ``save(epoch, step)`` checkpoints every ``checkpoint_every`` steps."""
    if hasattr(loader, "set_epoch") and getattr(loader, "epoch", epoch) != epoch:
        loader.set_epoch(epoch)
    first_step, stopped = step, False
    trainer.optimizer.zero_grad(set_to_none=True)
    meter = EpochMeter(trainer.plan.device)
    it = iter(loader)
    while (batch := meter.fetch(it, trainer.plan.device)) is not _END:
        loss, last = trainer.forward_backward(batch)
        meter.add(loss, batch_len(batch))
        if last:
            meter.skipped += trainer.optimizer_step()
            step += 1
            if checkpoint_every and step % checkpoint_every == 0:
                save(epoch, step)
        meter.end_compute()
        if log_every and meter.micro % log_every == 0:
            say(f"epoch {epoch} step {step}: loss {meter.mean_loss():.4f}")
        if max_steps is not None and step >= max_steps and last:
            stopped = True
            break
    if trainer.pending and not stopped:  # leftover micro-batches at the end of an epoch still step
        meter.skipped += trainer.optimizer_step()
        step += 1
    metrics = meter.finish(epoch, step - first_step)
    say(epoch_summary(metrics))
    return metrics, step, stopped


def _whole(v: object) -> bool:
    """An integer of at least 1 (numpy's too; not a bool, not 1.5)."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= 1


def _check_limits(clip: float | None, max_steps: int | None, checkpoint_every: int | None,
                  checkpoint: str | os.PathLike[str] | None) -> None:
    """Refuse what ``fit`` could not honour: a clip norm <= 0 (zero gradients; a negative one reverses them), a
    max_steps or checkpoint_every below 1 (a step would still run; no checkpoint would be written), checkpoint_every
    without checkpoint= (nowhere to write), a checkpoint path that is a folder or under a file."""
    if clip is not None and not clip > 0:
        raise UsageError(f"clip_grad_norm must be a positive number (or None: no clipping), not {clip!r}")
    for name, v in (("max_steps", max_steps), ("checkpoint_every", checkpoint_every)):
        if v is not None and not _whole(v):
            raise UsageError(f"{name} must be a positive integer (or None), not {v!r}")
    if checkpoint_every is not None and checkpoint is None:
        raise UsageError("checkpoint_every needs checkpoint= (the file to write every checkpoint_every steps)")
    if checkpoint is not None:  # found now, not when the first epoch's checkpoint is written
        path = Path(checkpoint)
        if path.is_dir():
            raise UsageError(f"checkpoint={str(checkpoint)!r} is a folder; name a file in it (e.g. {str(path / 'ckpt.pt')!r})")
        folder = next((q for q in path.parents if q.exists()), None)
        if folder is not None and not folder.is_dir():
            raise UsageError(f"checkpoint={str(checkpoint)!r}: {str(folder)!r} is a file, not a folder")


def fit(
    model: nn.Module,
    loader: Any,
    optimizer: torch.optim.Optimizer,
    loss_fn: LossFn,
    *,
    epochs: int,
    precision: Precision = "auto",
    compile: bool = False,  # the name users know from torch.compile
    grad_accum: int = 1,
    clip_grad_norm: float | None = None,
    channels_last: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    checkpoint_every: int | None = None,
    resume: str | os.PathLike[str] | None = None,
    max_steps: int | None = None,
    log_every: int = 50,
    on_log: Callable[[str], None] | None = None,
    verbose: bool = True,
) -> FitResult:
    """Train ``model`` for ``epochs`` over ``loader`` with ``loss_fn(model, batch)`` returning the loss,
    checkpointing to ``checkpoint`` and resuming from ``resume`` (parameters and logging: docs/training.md)."""
    for name, v in (("epochs", epochs), ("grad_accum", grad_accum)):  # 1.5 batches per step would never step
        if not _whole(v):
            raise UsageError(f"{name} must be an integer of at least 1, not {v!r}")
    _check_limits(clip_grad_norm, max_steps, checkpoint_every, checkpoint)
    world = World.detect()
    say: Say = (on_log or log.info) if world.rank == 0 else (lambda _msg: None)
    with shown_by_default(verbose and on_log is None and world.rank == 0):
        device = getattr(loader, "device", None) or next(model.parameters()).device  # the loader's, else the model's
        plan = PrecisionPlan.choose(torch.device(device), precision, _unwrap(model), channels_last, fixed_shapes(loader))
        plan.apply_flags()
        plan.place(model)
        scaler = plan.make_scaler()
        start_epoch, step, history = 0, 0, list[EpochMetrics]()
        if resume is not None:
            start_epoch, step, history = restore_checkpoint(resume, model, optimizer, scaler, loader)
            say(f"resumed from {resume}: epoch {start_epoch}, step {step}")
        runner = ModelRunner(model, compile, say)
        report = startup_report(plan, runner.compiled, grad_accum, clip_grad_norm)
        say(report)

        def save(epoch: int, step: int) -> None:
            if checkpoint is not None and world.rank == 0:
                save_checkpoint(checkpoint, checkpoint_state(model, optimizer, scaler, loader, epoch=epoch, step=step,
                                                             precision=plan.precision, history=history))

        trainer = TrainStep(runner, loss_fn, optimizer, scaler, plan, grad_accum, clip_grad_norm)
        model.train()
        for epoch in range(start_epoch, epochs):
            metrics, step, stopped = run_epoch(loader, epoch, step, trainer, say=say, save=save, log_every=log_every,
                                               checkpoint_every=checkpoint_every, max_steps=max_steps)
            if stopped:
                save(epoch, step)
                return FitResult(report, history + [metrics], step, plan.precision, runner.compiled)
            history.append(metrics)
            save(epoch + 1, step)
        return FitResult(report, history, step, plan.precision, runner.compiled)


__all__ = ["EpochMetrics", "FitResult", "fit", "save_checkpoint", "startup_report"]
