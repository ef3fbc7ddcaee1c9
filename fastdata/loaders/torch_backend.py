"""The torch backend: batches read by threads or worker processes (host.py), moved to the device,
converted and augmented there (device.py)."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch

from fastdata.errors import UsageError
from fastdata.format.spec import ENCODING_IMAGE, image_fields
from fastdata.loaders.base import Loader
from fastdata.loaders.crop import CropStage, crop_field
from fastdata.loaders.device import DeviceStage
from fastdata.loaders.host import ThreadReader, to_tensors
from fastdata.loaders.procs import ProcessReader
from fastdata.loaders.transform import BatchTransform, TransformFn
from fastdata.reading.dataset import Dataset


class TorchLoader(Loader):
    """The torch backend: batches read by threads or worker processes, moved and augmented by torch."""

    backend = "torch"
    _unpicklable = ("_reader", "_device", "_read_ds")

    def __init__(self, dataset: Dataset, batch_size: int, *, workers: int, transform: TransformFn | None = None,
                 **common: Any) -> None:
        """``workers``: reader threads (or processes); ``transform``: run by the readers on each host batch."""
        super().__init__(dataset, batch_size, **common)
        self.workers = workers
        self._bound = BatchTransform(transform, self.seed) if transform is not None else None  # checks it
        self._make_stages()

    def _make_stages(self) -> None:
        """The reader (threads or worker processes, started on the first pass) and the device stage."""
        config, device = self.config, self.device
        pin = config.pin_memory if config.pin_memory is not None else device.type == "cuda"
        targets = self.augment.targets if self.augment is not None else {}
        # a declared target (a uint8 (H, W, 1) mask) is never an image
        images = config.images if config.images is not None else \
            tuple(n for n in image_fields(self.dataset.schema) if n not in targets)
        if config.ragged == "packed":
            self._check_packed(images)
        processes = config.mode == "processes" and self.workers > 0
        if config.timeout is not None and self.workers == 0:
            raise UsageError("LoaderConfig(timeout=...) bounds the wait for reader threads or processes, and "
                             "num_workers=0 reads in the iterating thread: use num_workers >= 1, or no timeout")
        # On the CPU, reader threads decode images straight to float (a view of the dataset; not for a URL dataset)
        # when the dataset decodes, the output is float and every encoded field is among the images
        view = not processes and self.dataset.remote is None
        encoded = [f.name for f in self.dataset.schema if f.encoding == ENCODING_IMAGE]
        to_float = (bool(encoded) and device.type == "cpu" and config.image_dtype == "float32"
                    and self.dataset.options.get("decode") is True and all(n in images for n in encoded))
        changes: dict[str, Any] = {"decode": "float"} if view and to_float else {}
        if (processes or view and self.workers >= 2) and encoded and self.dataset.options.get("decode_threads") is None:
            changes["decode_threads"] = 1  # the readers are the parallelism
        crop = crop_field(self.dataset, self.augment, images, config, view and self._bound is None)
        stage = None
        if crop is not None:  # the reader threads decode that field window by window (crop.py)
            assert self.augment is not None
            changes["decode"] = False
            field = next(f for f in self.dataset.schema if f.name == crop)
            stage = CropStage(field, self.augment.ops, self.seed, pin)
        self._read_ds = self.dataset.with_options(**changes) if changes else self.dataset
        if processes:
            self._reader: Any = ProcessReader(self._read_ds, self.workers, config.prefetch, config.ragged,
                                              self._bound, config.timeout)
        else:
            self._reader = ThreadReader(self._read_ds, self.workers, config.prefetch, pin, config.ragged, self._bound,
                                        stage, config.timeout)
        self._device = DeviceStage(device, self.augment, self.seed, config.channels_last, images,
                                   keep_uint8=config.image_dtype == "uint8")
        self._device.precropped = {crop: len(stage.ops)} if crop is not None and stage is not None else {}

    def _check_packed(self, images: tuple[str, ...]) -> None:
        """Packed batches: what can be packed (Dataset.check_ragged), and mixed-size images kept as bytes."""
        self.dataset.check_ragged("packed")
        flat = [f.name for f in self.dataset.schema if f.ragged and f.name in images]
        if flat and self.config.image_dtype != "uint8":
            raise UsageError(f"LoaderConfig(ragged='packed') gives the mixed-size images of {flat[0]!r} as flat uint8 "
                             "bytes (with <name>_offsets and <name>_shape), which cannot become float NCHW batches: "
                             "add image_dtype='uint8' (and convert after unpacking), or use ragged='padded'")

    def _batches(self, plan: list[np.ndarray], epoch: int, first: int) -> Iterator[dict[str, torch.Tensor]]:
        rank = self._device.rank = self.world.rank  # the world of this pass (read when it started)
        host = self._reader.run(plan, first, self._device.host_transform(epoch), epoch, rank)
        return self._device.run(host, epoch, first)

    def stats(self) -> dict[str, float]:
        """:meth:`Loader.stats`, and in mode="processes" the ring's (:meth:`ProcessReader.stats`)."""
        ring = self._reader.stats() if isinstance(self._reader, ProcessReader) else {}
        return {**super().stats(), **ring}

    def collate_fn(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """A batch read by ``dataset.get_batch`` made into what this loader yields (on the device, augmentation
        seeded by its place in the epoch); :attr:`batch_sampler` says which batch comes next."""
        if self.config.ragged == "packed":
            raise UsageError("LoaderConfig(ragged='packed') batches come from the loader's own pipeline, not from a "
                             "DataLoader over its dataset: restore the position with load_state_dict instead")
        epoch, k = self._collate_at
        self._device.rank = self.world.rank
        if self._bound is not None:
            batch = self._bound(batch, epoch, self.world.rank, k)
        host = to_tensors(batch)
        moved = {n: t.to(self.device) for n, t in host.items()} if self.device.type == "cuda" else dict(host)
        return self.dataset.trim(self._device.transform(moved, epoch, k, self._device.mixed(host)))

    def __getstate__(self) -> dict[str, Any]:
        if self._bound is not None:  # say what to do, rather than a PicklingError from deep inside
            self._bound.check_pickles("pickling the loader (ddp_spawn, spawn-started processes)")
        return super().__getstate__()

    def _release(self) -> None:
        """Stop reader threads or worker processes."""
        reader = getattr(self, "_reader", None)  # absent when __init__ failed part-way
        if reader is not None:
            reader.close()
        read_ds = getattr(self, "_read_ds", None)
        if read_ds is not None and read_ds is not self.dataset:
            read_ds.close()  # the float-decoding view this loader opened (handles reopen on the next pass)
