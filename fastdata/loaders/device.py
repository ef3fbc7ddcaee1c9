"""Device side of the torch backend: images to float NCHW and augmentation, on the device; on CUDA batch
N+1 is copied (as uint8) and transformed on a side stream while step N computes."""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterable, Iterator

import torch

from fastdata.augment import Augment, batch_generator
from fastdata.augment.pipeline import augment_batch
from fastdata.errors import UsageError
from fastdata.format.spec import SHAPE_SUFFIX
from fastdata.loaders.buffers import Recycler
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
        self.precropped: dict[str, int] = {}  # fields whose first ops the reader threads ran, how many (crop.py)

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
            out = x  # decoded straight to float in [0, 1] by the reader (Dataset(decode="float"), crop.py)
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
