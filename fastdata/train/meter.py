"""Measuring a training epoch (``fastdata.train``): input wait against compute time, and the loss,
non-finite and skipped-step counters, kept on the device; :class:`EpochMetrics` is what an epoch did."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch


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
        """Mean loss so far (a host sync: for log lines only)."""
        return self.loss_sum.item() / max(self.micro, 1)

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
    peak = f", peak memory {m.peak_memory_bytes / 2**20:.0f} MiB" if m.peak_memory_bytes is not None else ""
    return (f"epoch {m.epoch}: {m.samples_per_s:.0f} samples/s, waited for input {100 * m.wait_fraction:.1f}% "
            f"({m.wait_s:.2f} s of {m.seconds:.2f} s), loss {m.loss:.4f}, skipped steps {m.skipped_steps}{peak}")


__all__ = ["EpochMeter", "EpochMetrics", "epoch_summary", "to_device"]
