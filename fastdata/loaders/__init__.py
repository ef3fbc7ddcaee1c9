"""``fastdata.loader``: batches of tensors on the device, read whole from fastdata shards.

The loader plans each epoch as a list of index batches (fastdata.sampling), reads each batch
with one ``get_batch`` call (host.py), and moves it to the device with prefetching and
augmentation (device.py). It knows its position, so ``state_dict()`` taken mid-epoch resumes
exactly. Semantics: docs/loader.md. Order, epochs, resume and stats live in base.py, shared by
the torch backend here and the DALI backend (dali.py, docs/backends.md).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Iterator, Literal, Sequence

import numpy as np
import torch

from ..augment import Augment
from ..dataset import Dataset
from ..errors import UsageError
from ..format.images import ENCODING_IMAGE
from ..sampling import Shuffle
from ..world import World, usable_cpus
from .base import Loader
from .device import DeviceStage
from .host import ProcessReader, ThreadReader

log = logging.getLogger("fastdata.loader")


@dataclass(frozen=True)
class LoaderConfig:
    """Tuning knobs of the torch backend; the defaults were chosen by measurement (docs/tuning.md).

    ``mode``: ``"threads"`` reads batches in threads of this process into recycled (pinned)
    buffers; ``"processes"`` reads them in DataLoader worker processes. ``prefetch``: batches
    read ahead. ``pin_memory``: ``None`` pins when the device is CUDA. ``images``: names of
    uint8 HWC fields to turn into float NCHW (``None``: detected). The DALI backend uses
    ``prefetch`` (its queue depth), ``channels_last``, ``images``, ``block`` and ``window``.
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


class TorchLoader(Loader):
    """The torch backend: batches read by threads or worker processes, moved and augmented by torch."""

    backend = "torch"

    def __init__(self, dataset: Dataset, batch_size: int, *, workers: int, **common: Any) -> None:
        """``workers``: reader threads (or processes); ``common``: :class:`Loader`'s arguments."""
        super().__init__(dataset, batch_size, **common)
        self.workers = workers
        config, device = self.config, self.device
        pin = config.pin_memory if config.pin_memory is not None else device.type == "cuda"
        if config.mode == "processes" and workers > 0:
            self._reader: Any = ProcessReader(dataset, workers, config.prefetch, pin)
        else:
            self._reader = ThreadReader(dataset, workers, config.prefetch, pin)
        self._device = DeviceStage(device, self.augment, self.seed, config.channels_last, config.images,
                                   self.world.rank)

    def _batches(self, plan: list[np.ndarray], epoch: int, first: int) -> Iterator[dict[str, torch.Tensor]]:
        return self._device.run(self._reader.run(plan, first, self._device.host_transform(epoch)), epoch, first)

    def close(self) -> None:
        """Stop reader threads or worker processes."""
        reader = getattr(self, "_reader", None)  # absent when __init__ failed part-way
        if reader is not None:
            reader.close()


def _resolve_device(device: str | torch.device) -> torch.device:
    """A device with an index: ``"cuda"`` is the GPU this process owns (the current device if it
    was set, else ``LOCAL_RANK`` under torchrun), so each rank of a multi-GPU run reads onto its own."""
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise UsageError(f"device={device!r} asked for, but CUDA is not available here")
    count = torch.cuda.device_count()
    if dev.index is None:
        current, local = torch.cuda.current_device(), World.cuda_index(count)
        return torch.device("cuda", local if current == 0 and local is not None else current)
    if dev.index >= count:
        raise UsageError(f"device={device!r}: this machine has {count} GPU(s) (cuda:0 to cuda:{count - 1})")
    return dev


def _resolve_workers(num_workers: int | Literal["auto"], ds: Dataset, batch_size: int, device: torch.device,
                     config: LoaderConfig | None) -> tuple[int, LoaderConfig]:
    """Explicit workers (checked by :func:`loader`) win; ``"auto"`` takes ``fastdata tune``'s stored
    settings, else the default."""
    if num_workers != "auto":
        return num_workers, config or LoaderConfig()
    from ..tune import load_tuned

    tuned = load_tuned(ds, batch_size, device.type)
    if tuned is not None:
        stored = {k: int(v) if k == "prefetch" else v for k, v in tuned.items() if k in ("mode", "prefetch")}
        cfg = config or LoaderConfig(**stored)  # what the cache does not say keeps LoaderConfig's default
        log.info("num_workers='auto': using tuned settings %s (from fastdata tune)", tuned)
        return int(tuned["num_workers"]), cfg
    workers = min(4, usable_cpus())
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

    ``backend="dali"`` decodes and augments with NVIDIA DALI (docs/backends.md; there
    ``num_workers`` is DALI's CPU threads); ``"auto"`` picks DALI when it is installed, the
    device is CUDA and the dataset has encoded images DALI can decode and augment as asked,
    torch otherwise.
    """
    if backend not in ("torch", "dali", "auto"):
        raise UsageError(f"backend must be 'torch', 'dali' or 'auto', not {backend!r}")
    ds = source if isinstance(source, Dataset) else Dataset(source, fields=fields)
    if isinstance(source, Dataset) and fields is not None:
        ds = source.with_options(fields=fields)  # keeps the caller's decode settings
    if augment is not None and not isinstance(augment, Augment):
        augment = Augment(tuple(augment))
    dev = _resolve_device(device)
    if backend == "auto":
        backend = _pick_backend(dev, ds, augment, config)
    if num_workers != "auto" and (not isinstance(num_workers, int) or isinstance(num_workers, bool)
                                  or num_workers < 0):
        raise UsageError(f"num_workers must be 'auto' or an integer >= 0, not {num_workers!r}")
    common: dict[str, Any] = dict(shuffle=shuffle, drop_last=drop_last, seed=seed, device=dev, augment=augment,
                                  world=World.detect())
    if backend == "dali":
        from .dali import dali_loader

        return dali_loader(ds, batch_size, num_workers=num_workers, config=config, **common)
    workers, config = _resolve_workers(num_workers, ds, batch_size, dev, config)
    return TorchLoader(ds, batch_size, workers=workers, config=config, **common)


def _pick_backend(device: torch.device, ds: Dataset | None = None, augment: Augment | None = None,
                  config: LoaderConfig | None = None) -> str:
    """``backend="auto"``: DALI when it is installed, the device is CUDA and ``ds`` has encoded
    images (GPU decoding is what DALI adds) that DALI can take with ``augment``; else torch. The
    choice and its reason are logged at DEBUG."""
    if device.type != "cuda":
        log.debug("backend='auto': torch (device %s; DALI is picked for CUDA devices only)", device)
        return "torch"
    if ds is not None and not any(f.encoding == ENCODING_IMAGE for f in ds.schema):
        log.debug("backend='auto': torch (no encoded images to decode on the GPU)")
        return "torch"
    from .dali import dali_problem, dali_unsupported

    problem = dali_problem(device) or (dali_unsupported(ds, augment, config) if ds is not None else None)
    if problem is not None:
        log.debug("backend='auto': torch (%s)", problem)
        return "torch"
    log.debug("backend='auto': dali (installed, device %s, encoded images)", device)
    return "dali"


__all__ = ["Loader", "LoaderConfig", "TorchLoader", "loader"]
