"""Decode, crop and resize one image at a time in the reader threads when ``augment`` starts with an op that
gives every image one size; the device stage draws those ops again, so draws, resume and shares are unchanged."""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
import torch

from fastdata.augment import (
    Augment,
    CenterCrop,
    HorizontalFlip,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    VerticalFlip,
    batch_generator,
    pair,
)
from fastdata.augment.image_ops import check_fits
from fastdata.augment.targets import Mask
from fastdata.errors import CorruptShardError
from fastdata.format.spec import (
    CODEC_SUFFIX,
    ENCODING_PIXELS,
    IMAGE_ENCODINGS,
    LENGTHS_SUFFIX,
    SHAPE_SUFFIX,
    FieldSpec,
)
from fastdata.loaders.base import LoaderConfig
from fastdata.loaders.buffers import Recycler
from fastdata.reading.cropdecode import decode_crop, resample_into
from fastdata.reading.dataset import Dataset
from fastdata.reading.decode import DecodeError, check_shapes

log = logging.getLogger(__name__)
FIRST_OPS = (RandomResizedCrop, RandomCrop, CenterCrop, Resize)
FLIPS = (HorizontalFlip, VerticalFlip)  # right after the first op: the reader mirrors while it samples


def crop_field(dataset: Dataset, augment: Augment | None, images: tuple[str, ...], config: LoaderConfig,
               threads: bool) -> str | None:
    """The image field the readers can decode window by window (one augmented image field whose chain starts
    with a crop or Resize), or None, and then why is logged."""
    why = _why_not(dataset, augment, images, config, threads)
    if why is not None:
        log.debug("crop decoding off: %s", why)
        return None
    return images[0] if augment is None or augment.fields is None else tuple(augment.fields)[0]


def _why_not(dataset: Dataset, augment: Augment | None, images: tuple[str, ...], config: LoaderConfig,
             threads: bool) -> str | None:
    if augment is None or not augment.enabled_ops or augment.op_kind != "image":
        return "no image augmentation"
    if config.crop_decode == "off" or config.image_dtype != "float32" or config.ragged != "padded" or not threads:
        return "LoaderConfig (crop_decode='off', uint8 images, packed batches or worker processes)"
    if augment.views != 1 or not augment.ops or type(augment.ops[0]) not in FIRST_OPS:
        return "the augmentation does not start with a crop or Resize (or has several views)"
    if any(isinstance(t, Mask) for t in augment.targets.values()):
        return "a Mask target is warped on the image's whole canvas"
    names = tuple(augment.fields) if augment.fields is not None else images
    decoded = [f for f in dataset.schema if f.encoding in IMAGE_ENCODINGS]
    if len(names) != 1 or [f.name for f in decoded] != list(names):
        return f"needs exactly one image field to decode and augment, here {list(names)}"
    f = decoded[0]
    if f.encoding == ENCODING_PIXELS and not f.ragged:
        return "raw pixels of one size: already read without padding"
    if dataset.options.get("decode") is False or dataset.remote is not None:
        return "the dataset does not decode, or is remote"
    return None


class CropStage:
    """Turns a batch read with ``decode=False`` into the output of the chain's first ops for ``field`` (the crop or
    Resize and the flips right after it), one image at a time, in the calling reader thread."""

    def __init__(self, field: FieldSpec, chain: tuple[Any, ...], seed: int, pin: bool) -> None:
        self.field = field
        self.op = chain[0]
        n = 1
        while n < len(chain) and type(chain[n]) in FLIPS:
            n += 1
        self.ops = tuple(chain[:n])
        self.seed = seed
        self.size = pair(self.op.size)
        self._floats = Recycler(pin)

    def boxes(self, shapes: np.ndarray, epoch: int, rank: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(B, 4) float64 windows (x0, y0, w, h, in each image's pixels) from the first op's draw for batch ``k``,
        and (B, 2) bool mirrors (left-right, top-bottom) from the flips' draws after it."""
        hw = torch.from_numpy(np.ascontiguousarray(shapes[:, :2], dtype=np.float32))
        oh, ow = self.size
        if isinstance(self.op, (RandomCrop, CenterCrop)):
            check_fits(type(self.op).__name__, self.size, hw)
        g = batch_generator(self.seed, epoch, k, torch.device("cpu"), rank)
        p = self.op.draw(g, hw)
        flips = np.zeros((len(hw), 2), dtype=bool)
        after = self.op.out_sizes(hw)
        for f in self.ops[1:]:  # drawn in the chain's order, from the same generator
            flips[:, 0 if isinstance(f, HorizontalFlip) else 1] ^= f.draw(g, after)["flip"].numpy()
        h, w = hw[:, 0].double().numpy(), hw[:, 1].double().numpy()
        if isinstance(self.op, RandomResizedCrop):
            fw, fh, cx, cy = (p[n].double().numpy() for n in ("fw", "fh", "cx", "cy"))
            return np.stack([(cx - fw / 2) * w, (cy - fh / 2) * h, fw * w, fh * h], 1), flips
        if isinstance(self.op, Resize):
            return np.stack([np.zeros_like(w), np.zeros_like(h), w, h], 1), flips
        start = p["start"].double().numpy()
        return np.stack([start[:, 1], start[:, 0], np.full_like(w, ow), np.full_like(h, oh)], 1), flips

    def __call__(self, batch: dict[str, Any], epoch: int, rank: int, k: int, where: Callable[[int], str]) -> dict[str, Any]:
        """Replace ``batch[name]`` (stored bytes, padded per row) by the float32 (B, oh, ow, C) first-op
        output in [0, 1]; ``<name>_shape`` keeps the stored sizes (the device stage draws from them)."""
        f, spec = self.field, self.field.image
        assert spec is not None
        name = f.name
        data = batch[name]
        lengths = batch.pop(name + LENGTHS_SUFFIX)
        shapes = batch[name + SHAPE_SUFFIX]
        check_shapes(f, shapes, lengths, where)
        boxes, flips = self.boxes(shapes, epoch, rank, k)
        oh, ow = self.size
        out = self._floats.take((len(shapes), oh, ow, spec.channels), torch.float32)
        self._floats.lend(out)  # reused once the consumer has let go of the batch
        arr = out.numpy()
        codecs = batch.get(name + CODEC_SUFFIX)
        for j, (h, w, _) in enumerate(shapes.tolist()):
            box: tuple[float, float, float, float] = tuple(boxes[j].tolist())
            flip = (bool(flips[j, 0]), bool(flips[j, 1]))
            try:
                if f.encoding == ENCODING_PIXELS:
                    pixels = data[j][: h * w * spec.channels].reshape(h, w, spec.channels)
                    resample_into(pixels, box, (h, w), arr[j], flip, exact=True)
                else:
                    assert codecs is not None, "an encoded image field is read with its codec field"
                    decode_crop(data[j, : int(lengths[j])], int(codecs[j]), spec, (h, w), box, arr[j], flip)
            except DecodeError as e:
                raise CorruptShardError(f"{where(j)}: field {name!r}: {e}") from None
        batch[name] = out
        return batch
