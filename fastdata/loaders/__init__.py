"""``fastdata.loader``: batches of tensors on the device, read whole from fastdata shards.

The loader plans each epoch as a list of index batches (fastdata.sampling), reads each batch
with one ``get_batch`` call (host.py), and moves it to the device with prefetching and
augmentation (device.py). It knows its position, so ``state_dict()`` taken mid-epoch resumes
exactly. Semantics: docs/loader.md.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Sequence

import numpy as np
import torch

from ..augment import Augment
from ..dataset import Dataset
from ..errors import UsageError
from ..sampling import Shuffle, epoch_batches, num_batches
from ..world import World
from .device import DeviceStage
from .host import ProcessReader, ThreadReader

log = logging.getLogger("fastdata.loader")

_STATE_VERSION = 1


@dataclass(frozen=True)
class LoaderConfig:
    """Tuning knobs of the torch backend; the defaults were chosen by measurement (docs/tuning.md).

    ``mode``: ``"threads"`` reads batches in threads of this process into recycled (pinned)
    buffers; ``"processes"`` reads them in DataLoader worker processes. ``prefetch``: batches
    read ahead. ``pin_memory``: ``None`` pins when the device is CUDA. ``images``: names of
    uint8 HWC fields to turn into float NCHW (``None``: detected).
    """

    mode: Literal["threads", "processes"] = "threads"
    prefetch: int = 4
    pin_memory: bool | None = None
    channels_last: bool = True
    images: tuple[str, ...] | None = None
    block: int = 256
    window: int = 16

    def __post_init__(self) -> None:
        if self.mode not in ("threads", "processes"):
            raise UsageError(f"mode must be 'threads' or 'processes', not {self.mode!r}")
        if self.prefetch < 1:
            raise UsageError("prefetch must be at least 1")
        if self.block < 1 or self.window < 1:
            raise UsageError("block and window must be positive")


@dataclass
class _Stats:
    batches: int = 0
    samples: int = 0
    waits: list[float] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0

    def as_dict(self) -> dict[str, float]:
        wall = max(self.ended - self.started, 1e-9) if self.batches else 0.0
        w = np.array(self.waits) if self.waits else np.zeros(1)
        return {
            "batches": self.batches,
            "samples": self.samples,
            "seconds": wall,
            "samples_per_s": self.samples / wall if wall else 0.0,
            "wait_s": float(w.sum()) if self.waits else 0.0,
            "wait_fraction": float(w.sum() / wall) if wall else 0.0,
            "first_batch_s": float(self.waits[0]) if self.waits else 0.0,
            "wait_ms_median": float(np.median(w) * 1e3),
            "wait_ms_p95": float(np.percentile(w, 95) * 1e3),
        }


class Loader:
    """Iterate to get batches (dicts of tensors on the device). See :func:`fastdata.loader`."""

    def __init__(self, dataset: Dataset, batch_size: int, *, shuffle: Shuffle, drop_last: bool, seed: int,
                 device: torch.device, augment: Augment | None, workers: int, config: LoaderConfig,
                 world: World) -> None:
        if batch_size < 1:
            raise UsageError("batch_size must be positive")
        if shuffle not in (True, False, "block"):
            raise UsageError(f"shuffle must be True, False or 'block', not {shuffle!r}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.device = device
        self.world = world
        self.config = config
        self.workers = workers
        self.epoch = 0
        self._resume_at = 0  # batches to skip at the next iteration (from load_state_dict)
        self._done = 0  # batches consumed in the current pass
        self._stats = _Stats()
        pin = config.pin_memory if config.pin_memory is not None else device.type == "cuda"
        if config.mode == "processes" and workers > 0:
            self._reader: Any = ProcessReader(dataset, workers, config.prefetch, pin)
        else:
            self._reader = ThreadReader(dataset, workers, config.prefetch, pin)
        self._device = DeviceStage(device, augment, seed, config.channels_last, config.images)

    def __len__(self) -> int:
        return num_batches(len(self.dataset), self.world, self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields (the order is a function of seed and epoch)."""
        self.epoch = int(epoch)
        self._resume_at = 0

    def plan(self, epoch: int | None = None) -> list[np.ndarray]:
        """This rank's index batches for ``epoch`` (default: the current one)."""
        return epoch_batches(len(self.dataset), world=self.world, batch_size=self.batch_size, shuffle=self.shuffle,
                             drop_last=self.drop_last, seed=self.seed, epoch=self.epoch if epoch is None else epoch,
                             block=self.config.block, window=self.config.window)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        epoch, first = self.epoch, self._resume_at
        self._resume_at = 0
        plan = self.plan(epoch)[first:]
        self._done = first
        self._stats = _Stats(started=time.perf_counter())
        it = self._device.run(self._reader.run(plan, first), epoch, first)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            now = time.perf_counter()
            s = self._stats
            s.waits.append(now - t0)
            s.batches += 1
            s.samples += len(plan[s.batches - 1])
            s.ended = now
            self._done += 1
            yield batch
        if self._done == len(self) and self.epoch == epoch:
            self.epoch = epoch + 1  # a complete pass moves on; set_epoch overrides
            self._done = 0

    def stats(self) -> dict[str, float]:
        """Throughput and input wait of the current or last pass: samples/s, wait fraction, per-batch wait."""
        return self._stats.as_dict()

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: resuming from it yields exactly the rest of the epoch."""
        return {"version": _STATE_VERSION, "epoch": self.epoch, "batches_done": self._done, "seed": self.seed,
                "batch_size": self.batch_size, "num_samples": len(self.dataset), "shuffle": self.shuffle,
                "drop_last": self.drop_last, "world_size": self.world.size, "rank": self.world.rank}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != _STATE_VERSION:
            raise UsageError(f"unknown loader state version {state.get('version')!r}")
        mine = self.state_dict()
        for key in ("seed", "batch_size", "num_samples", "shuffle", "drop_last", "world_size"):
            if state[key] != mine[key]:
                raise UsageError(f"loader state was saved with {key}={state[key]!r}, this loader has {mine[key]!r}")
        done = int(state["batches_done"])
        if not 0 <= done <= len(self):
            raise UsageError(f"loader state has batches_done={done}, but an epoch has {len(self)} batches")
        self.epoch = int(state["epoch"])
        self._resume_at = done
        self._done = done

    def close(self) -> None:
        """Stop reader threads or worker processes."""
        self._reader.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _resolve_device(device: str | torch.device) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device={device!r} asked for, but CUDA is not available here")
    return dev


def _resolve_workers(num_workers: int | Literal["auto"], ds: Dataset, batch_size: int, device: torch.device,
                     config: LoaderConfig | None) -> tuple[int, LoaderConfig]:
    """Explicit workers win; ``"auto"`` takes ``fastdata tune``'s stored settings, else the default."""
    if num_workers != "auto":
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
            raise UsageError(f"num_workers must be 'auto' or an integer >= 0, not {num_workers!r}")
        return num_workers, config or LoaderConfig()
    from ..tune import load_tuned

    tuned = load_tuned(ds, batch_size, device.type)
    if tuned is not None:
        cfg = config or LoaderConfig(mode=tuned.get("mode", "threads"), prefetch=int(tuned.get("prefetch", 4)))
        log.info("num_workers='auto': using tuned settings %s (from fastdata tune)", tuned)
        return int(tuned["num_workers"]), cfg
    workers = min(4, os.cpu_count() or 1)
    log.info("num_workers='auto': %d reader threads (default; run `fastdata tune` to measure better ones)", workers)
    return workers, config or LoaderConfig()


def loader(
    source: str | os.PathLike[str] | Dataset,
    batch_size: int,
    *,
    shuffle: Shuffle = True,
    drop_last: bool = False,
    seed: int = 0,
    device: str | torch.device = "auto",
    augment: Augment | Sequence[Any] | None = None,
    fields: Sequence[str] | None = None,
    num_workers: int | Literal["auto"] = "auto",
    backend: Literal["torch", "dali", "auto"] = "torch",
    config: LoaderConfig | None = None,
) -> Loader:
    """Batches of a fastdata dataset as dicts of tensors on ``device``.

    Each epoch is a permutation drawn from ``(seed, epoch)`` (``shuffle="block"``: nearly
    sequential reads; ``False``: storage order), split into disjoint equal shares across
    torch.distributed ranks. ``augment`` is an :class:`fastdata.augment.Augment` or a list of
    its ops, applied on the device. ``num_workers`` is reader threads (or processes with
    ``LoaderConfig(mode="processes")``); 0 reads in the iterating thread.
    """
    if backend not in ("torch", "auto"):
        raise UsageError(f"backend={backend!r} is not available in this version; use backend='torch'")
    ds = source if isinstance(source, Dataset) else Dataset(source, fields=fields)
    if isinstance(source, Dataset) and fields is not None:
        ds = source.with_options(fields=fields)  # keeps the caller's decode settings
    if augment is not None and not isinstance(augment, Augment):
        augment = Augment(tuple(augment))
    dev = _resolve_device(device)
    workers, config = _resolve_workers(num_workers, ds, batch_size, dev, config)
    return Loader(ds, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, device=dev, augment=augment,
                  workers=workers, config=config, world=World.detect())


__all__ = ["Loader", "LoaderConfig", "loader"]
