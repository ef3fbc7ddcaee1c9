"""The torch backend: batches read by threads or worker processes (host.py, procs.py), moved to the device,
converted and augmented there; on CUDA batch N+1 is copied (as uint8) and transformed on a side stream while
step N computes."""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch

from fastdata.augment import Augment, batch_generator
from fastdata.augment.pipeline import augment_batch
from fastdata.errors import UsageError
from fastdata.format.spec import ENCODING_IMAGE, SHAPE_SUFFIX, image_fields
from fastdata.loaders.base import Loader
from fastdata.loaders.host import CropStage, Recycler, ThreadReader, crop_field, to_tensors
from fastdata.loaders.procs import ProcessReader
from fastdata.loaders.transform import BatchTransform, TransformFn
from fastdata.reading.dataset import Dataset
from fastdata.world import World

Batch = dict[str, torch.Tensor]
_MAX_INFLIGHT = 4  # host batches whose copy to the GPU may still be queued (each holds pinned buffers)


def to_unit_float(x: torch.Tensor, out: torch.Tensor) -> None:
    """``out = x / 255`` for a uint8 tensor into a float32 one, as two whole-batch ops."""
    out.copy_(x).mul_(1 / 255)


class DeviceStage:
    """Moves host batches to ``device`` and applies image conversion and augmentation there."""

    def __init__(self, device: torch.device, augment: Augment | None, seed: int, channels_last: bool,
                 images: tuple[str, ...], keep_uint8: bool = False) -> None:
        if keep_uint8 and augment is not None and augment.enabled and augment.op_kind == "image":
            raise UsageError("LoaderConfig(image_dtype='uint8') keeps images as stored; augmentation needs float "
                             "images: drop augment, or use image_dtype='float32'")
        self.keep_uint8 = keep_uint8
        self.device = device
        self.augment = augment
        self.seed = seed
        self.channels_last = channels_last
        self.images = images  # uint8 HWC fields that become float NCHW (fastdata.format.spec.image_fields)
        self.rank = 0  # this pass's rank: distributed ranks draw different augmentation parameters
        self._floats = Recycler()  # CPU: float image buffers, reused (fresh ones page-fault every batch)
        self.precropped: dict[str, int] = {}  # fields whose first ops the reader threads ran, how many (CropStage)

    def transform(self, batch: Batch, epoch: int, k: int, mixed: frozenset[str] = frozenset(),
                  precropped: dict[str, int] | None = None) -> Batch:
        """Images to float NCHW, then augmentation; ``mixed`` fields are augmented image by image, ``precropped``
        ones had their first ops run by the reader (drawn again here, not applied)."""
        if self.keep_uint8:
            return batch
        owned = set()
        for name in self.images:
            x = batch[name]
            batch[name] = self._to_float(x)
            if batch[name].data_ptr() != x.data_ptr():  # a float buffer of this stage's own
                owned.add(name)
        if self.augment is not None and self.augment.enabled:
            # parameters are drawn on the CPU on every device: the DALI backend draws the same ones
            g = batch_generator(self.seed, epoch, k, torch.device("cpu"), self.rank)
            augment_batch(self.augment, batch, g, self.images, mixed, self._finish, precropped=precropped,
                          owned=frozenset(owned))
        return batch

    def _finish(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """An augmented image field's memory layout: channels_last, as unaugmented images."""
        if self.channels_last and name in self.images and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def _to_float(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 (B, H, W, C) -> float (B, C, H, W) in [0, 1]; NHWC memory is channels_last NCHW."""
        if x.dtype == torch.float32:
            out = x  # decoded straight to float in [0, 1] by the reader (Dataset(decode="float"), CropStage)
        elif x.is_cuda:
            out = x.float().mul_(1 / 255)  # the caching allocator already reuses device memory
        else:
            out = self._floats.take(tuple(x.shape), torch.float32)
            to_unit_float(x, out)
            self._floats.lend(out)  # reused once the batch (and every view of it) is dropped
        y = out.permute(0, 3, 1, 2)
        return y if self.channels_last else y.contiguous()

    def mixed(self, host: Batch) -> frozenset[str]:
        """Image fields padded from mixed sizes, checked on the host batch (no device sync) when augmenting."""
        if self.augment is None or not self.augment.enabled:
            return frozenset()
        mixed = set()
        for name, x in host.items():  # padded image fields whose images differ in size (true sizes in <name>_shape)
            shapes = host.get(name + SHAPE_SUFFIX)
            if shapes is not None and isinstance(x, torch.Tensor) and x.dim() == 4 and shapes.dim() == 2 \
                    and shapes.shape[1] >= 2 and not bool((shapes[:, :2] == torch.tensor(x.shape[1:3])).all()):
                mixed.add(name)
        return frozenset(mixed - set(self.precropped))  # cropped in the reader: one size

    def host_transform(self, epoch: int) -> Callable[[Batch, int], Batch] | None:
        """On the CPU, the transform for the readers to apply (in parallel, off the training thread)."""
        if self.device.type == "cuda":
            return None
        return lambda batch, k: self.transform(dict(batch), epoch, k, self.mixed(batch), self.precropped)

    def run(self, host: Iterable[Batch], epoch: int, first: int) -> Iterator[Batch]:
        """Batches on the device; on the CPU the readers already transformed them (host_transform)."""
        if self.device.type != "cuda":
            yield from host
            return
        stream = torch.cuda.Stream(self.device)
        inflight: deque[tuple[Batch, torch.cuda.Event]] = deque()  # host buffers stay alive until copied
        staged = (self._stage(hb, epoch, k, stream, inflight) for k, hb in enumerate(host, first))
        nxt = next(staged, None)
        while nxt is not None:
            batch, ready = nxt
            current = torch.cuda.current_stream(self.device)
            current.wait_event(ready)  # the consumer's stream waits for the staging
            for t in batch.values():
                if isinstance(t, torch.Tensor):
                    t.record_stream(current)  # the allocator keeps the memory until that stream is done
            nxt = next(staged, None)  # the next batch's copy is queued before this one is used
            yield batch

    def _stage(self, hb: Batch, epoch: int, k: int, stream: torch.cuda.Stream,
               inflight: deque[tuple[Batch, torch.cuda.Event]]) -> tuple[Batch, torch.cuda.Event]:
        """Copy host batch ``hb`` (batch ``k``) on ``stream`` and transform it there; the event marks it
        ready. ``inflight`` keeps host batches alive until their copy is done."""
        with torch.cuda.stream(stream):
            db = {n: t.to(self.device, non_blocking=True) if isinstance(t, torch.Tensor) else t
                  for n, t in hb.items()}
            db = self.transform(db, epoch, k, self.mixed(hb), self.precropped)
        ev = torch.cuda.Event()
        ev.record(stream)
        inflight.append((hb, ev))
        while len(inflight) > _MAX_INFLIGHT:  # the training loop runs far ahead of the GPU: wait
            inflight[0][1].synchronize()  # here rather than pin a new buffer for every batch
            inflight.popleft()
        while inflight and inflight[0][1].query():  # copied: the host buffers may be recycled
            inflight.popleft()
        return db, ev


def resolve_device(device: str | torch.device) -> torch.device:
    """A device with an index: ``"cuda"`` is the GPU this process owns (the current device if set, else
    ``LOCAL_RANK``), so each rank of a multi-GPU run reads onto its own."""
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
        if config.pin_memory and config.mode == "processes" and self.workers > 0:  # it would be dropped silently
            raise UsageError("LoaderConfig(pin_memory=True) cannot be honoured with mode='processes': the worker "
                             "processes' shared-memory ring is not page-locked; use mode='threads' to pin")
        if config.pin_memory and not getattr(torch, "accelerator", torch.cuda).is_available():  # torch.accelerator: torch >= 2.6
            raise UsageError("LoaderConfig(pin_memory=True) asked for, but there is no GPU here to pin memory for: "
                             "leave pin_memory unset (it pins when the device is CUDA)")
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
        if crop is not None:  # the reader threads decode that field window by window (CropStage)
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
        if (self._bound is not None or self.augment is not None) and torch.utils.data.get_worker_info() is not None:
            raise UsageError("loader.collate_fn in a DataLoader worker process cannot tell which batch of the epoch "
                             "it finishes (its place seeds the transform's and augmentation's draws): build the "
                             "DataLoader with num_workers=0 (the loader's own readers read ahead)")
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
