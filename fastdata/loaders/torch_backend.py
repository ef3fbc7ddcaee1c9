"""The torch backend: batches read by threads or worker processes (host.py), moved to the device,
converted and augmented there (device.py). Order, epochs, resume and stats come from base.py."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch

from ..dataset import Dataset
from ..format.spec import image_fields
from .base import Loader
from .device import DeviceStage
from .host import ProcessReader, ThreadReader


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
        images = config.images if config.images is not None else image_fields(dataset.schema)
        self._device = DeviceStage(device, self.augment, self.seed, config.channels_last, images,
                                   self.world.rank)

    def _batches(self, plan: list[np.ndarray], epoch: int, first: int) -> Iterator[dict[str, torch.Tensor]]:
        return self._device.run(self._reader.run(plan, first, self._device.host_transform(epoch)), epoch, first)

    def close(self) -> None:
        """Stop reader threads or worker processes."""
        reader = getattr(self, "_reader", None)  # absent when __init__ failed part-way
        if reader is not None:
            reader.close()
