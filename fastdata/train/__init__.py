"""The AMP training core: ``fit`` runs ``loss_fn(model, batch)`` over a loader with the GPU's precision,
optional torch.compile, accumulation, clipping, checkpoints with exact resume and per-epoch metrics."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from fastdata.loaders.transform import batch_len
from fastdata.train.checkpoint import _unwrap, checkpoint_state, restore_checkpoint, save_checkpoint
from fastdata.train.meter import _END, EpochMeter, EpochMetrics, epoch_summary
from fastdata.train.precision import Precision, PrecisionPlan, fixed_shapes, startup_report
from fastdata.world import World

log = logging.getLogger("fastdata.train")

LossFn = Callable[[nn.Module, dict[str, torch.Tensor]], torch.Tensor]
Say = Callable[[str], None]


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
    if epochs < 1 or grad_accum < 1:
        raise ValueError("epochs and grad_accum must be at least 1")
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
