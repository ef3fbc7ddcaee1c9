"""The DALI backend's host side: how each field travels into ``fn.external_source`` (whole batches, encoded
images as stored bytes), and the callback that reads batches and draws their parameters; no DALI import."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Collection, Literal

import numpy as np
import torch

from fastdata.augment import Augment, batch_generator
from fastdata.augment.pipeline import join_views
from fastdata.errors import UsageError
from fastdata.format import LENGTHS_SUFFIX
from fastdata.format.spec import ENCODING_IMAGE, ENCODING_PIXELS, SHAPE_SUFFIX, is_image_field, is_string
from fastdata.loaders.base import wrap_error
from fastdata.loaders.dali_augment import Chain
from fastdata.reading.dataset import Dataset

GENERATOR_STATE = "\0generator"  # bypassed entry: the batch generator's state after DALI's draws
Kind = Literal["encoded", "pixels", "raw_image", "plain"]

# DALI's torch plugin lacks unsigned types over 8 bits and complex: they cross as same-size signed views
_SIGNED_VIEW: dict[np.dtype, np.dtype] = {np.dtype(np.uint16): np.dtype(np.int16), np.dtype(np.uint32): np.dtype(np.int32),
                np.dtype(np.uint64): np.dtype(np.int64)}
_PAIR_VIEW: dict[np.dtype, np.dtype] = {np.dtype(np.complex64): np.dtype(np.float32), np.dtype(np.complex128): np.dtype(np.float64)}
_CARRIED = {np.dtype(t) for t in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")}


@dataclass
class Route:
    """How one output field travels: ``kind``, whether it becomes a float NCHW image, its augmentation."""

    name: str
    kind: Kind
    dtype: np.dtype  # the dtype the caller gets (native byte order)
    image: bool = False  # uint8 HWC -> float (B, C, H, W) in [0, 1]
    channels: int = 0
    variable_size: bool = False  # images of one batch may differ in size
    hw: tuple[int, int] | None = None  # the fixed (H, W) of a raw image field
    chain: Chain | None = None
    more: list[Chain] = field(default_factory=list)  # the chains of views 1, 2, ... (Augment(views=...))
    bypass: bool = False  # a plain field that goes around DALI, straight to torch (CPU mode)

    @property
    def chains(self) -> list[Chain]:
        """One compiled chain per view (none: not augmented by DALI)."""
        return [self.chain, *self.more] if self.chain is not None else []

    @property
    def carrier(self) -> np.dtype:
        """The dtype the field has inside DALI."""
        return _SIGNED_VIEW.get(self.dtype) or _PAIR_VIEW.get(self.dtype) or self.dtype

    @property
    def outputs(self) -> list[tuple[np.dtype, str]]:
        """dtype and layout of each external-source output this field uses."""
        if self.kind == "encoded":
            return [(np.dtype(np.uint8), ""), (np.dtype(np.int32), "")]  # padded bytes, lengths
        return [(self.carrier, "HWC" if self.kind in ("pixels", "raw_image") else "")]

    @property
    def pads(self) -> bool:
        """A float image field whose batches can mix image sizes: padded to the batch's largest image, in
        crop_mirror_normalize."""
        return self.image and self.variable_size and (self.chain is None or self.chain.out_size is None)

    def host(self, batch: dict[str, np.ndarray]) -> list[Any]:
        """This field of a ``get_batch`` result, as the external source takes it (see ``outputs``)."""
        data = batch[self.name]
        if self.kind == "encoded":
            return [data, batch[self.name + LENGTHS_SUFFIX].astype(np.int32).reshape(-1, 1)]
        if self.kind == "pixels":
            shapes = batch[self.name + SHAPE_SUFFIX]
            return [[data[k, : h * w * c].reshape(h, w, c) for k, (h, w, c) in enumerate(shapes.tolist())]]
        if not data.dtype.isnative:
            data = data.astype(data.dtype.newbyteorder("="))
        if self.bypass:
            return [data]
        if self.dtype in _PAIR_VIEW:
            return [np.ascontiguousarray(data)[..., None].view(self.carrier)]
        return [data.view(self.carrier) if self.dtype in _SIGNED_VIEW else data]

    def sizes(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """(B, 2) heights and widths of this image field's samples, known before decoding."""
        if self.kind in ("encoded", "pixels"):
            return batch[self.name + SHAPE_SUFFIX][:, :2]
        assert self.hw is not None, "a raw image field has a fixed shape"
        return np.broadcast_to(np.array(self.hw, dtype=np.int64), (len(batch[self.name]), 2))


def plan_routes(dataset: Dataset, images: tuple[str, ...] | None, targets: Collection[str] = ()) -> list[Route]:
    """One route per output field, in schema order (a ragged field's ``_lengths`` right after it);
    ``targets``: fields declared as augmentation targets (raw arrays, kept on the host)."""
    routes: list[Route] = []
    schema = {f.name: f for f in dataset.schema}
    for name in targets:
        f = schema.get(name)
        if f is not None and f.encoding in (ENCODING_IMAGE, ENCODING_PIXELS):
            raise UsageError(f"target field {name!r} is stored as {f.encoding} images; the DALI backend takes "
                             "targets stored as arrays: convert it as an array field, or use backend='torch'")
    text = [f.name for f in dataset.schema if is_string(f)] + [n for n in dataset.fields if n not in schema]
    if text:
        raise UsageError(f"the DALI backend carries tensors only, not the text of {text[0]!r} (string fields and "
                         "keys); use backend='torch', or leave it out of fields=")
    if images is not None:
        bad = [n for n in images if n not in schema or not is_image_field(schema[n])]
        if bad:
            raise UsageError(f"LoaderConfig.images names {bad[0]!r}, which is not a uint8 HWC image field here")
    for f in dataset.schema:
        chosen = (images is None or f.name in images) and f.name not in targets
        if f.encoding in (ENCODING_IMAGE, ENCODING_PIXELS):
            assert f.image is not None, "image encodings always carry an image spec"
            kind: Kind = "encoded" if f.encoding == ENCODING_IMAGE else "pixels"
            routes.append(Route(f.name, kind, np.dtype(np.uint8), chosen, f.image.channels, True))
        elif is_image_field(f):
            routes.append(Route(f.name, "raw_image" if chosen else "plain", np.dtype(np.uint8), chosen,
                                int(f.trailing[-1]), hw=(int(f.trailing[0]), int(f.trailing[1]))))
        else:
            dt = f.np_dtype.newbyteorder("=")
            if dt not in _SIGNED_VIEW and dt not in _PAIR_VIEW and dt not in _CARRIED:
                raise UsageError(f"field {f.name!r} has dtype {dt}, which the DALI backend cannot carry; "
                                 "use backend='torch'")
            routes.append(Route(f.name, "plain", dt))
            if f.ragged:
                routes.append(Route(f.name + LENGTHS_SUFFIX, "plain", np.dtype(np.int64)))
    return routes


@dataclass
class HostTargets:
    """Declared targets, transformed on the host by the torch backend's code with the parameters the image
    field ``image`` gets in DALI (the same generator, replayed)."""

    augment: Augment
    image: Route
    inputs: tuple[str, ...]  # the batch fields the targets read (with ``<boxes>_lengths``)

    def __call__(self, batch: dict[str, np.ndarray], g: torch.Generator) -> dict[str, np.ndarray]:
        hw = torch.from_numpy(np.ascontiguousarray(self.image.sizes(batch)))
        tb = {n: torch.from_numpy(np.ascontiguousarray(batch[n])) for n in self.inputs}
        outs = [self.augment.run(tb, g, None, hw=hw, ops=ops) for ops in self.augment.view_ops]
        out = dict(tb)
        written = [k for k in outs[0] if k not in tb or k in self.augment.targets]
        join_views(out, outs, written, stack=len({c.out_size for c in self.image.chains}) == 1)
        return {n: v.numpy() for n, v in out.items()}


@dataclass
class Pass:
    """One pass over the data: this rank's index batches from batch ``first`` of ``epoch`` on."""

    plan: list[np.ndarray]
    first: int
    epoch: int


class Feed:
    """The external-source callback: batch ``info.iteration`` of the pass registered for DALI's epoch; a read
    error ends the pass (``error``), raised by the loader after the last good batch."""

    def __init__(self, dataset: Dataset, routes: list[Route], seed: int, rank: int, keep: int,
                 targets: HostTargets | None = None, rest: bool = False) -> None:
        self.dataset, self.routes, self.seed, self.rank = dataset, routes, seed, rank
        self.rest = rest  # torch code runs after DALI: hand it the generator's state
        self.targets = targets
        self._alive: deque[tuple[Any, ...]] = deque(maxlen=keep)  # fed without a copy: DALI reads them later
        self._augmented = [r for r in routes if any(c.steps for c in r.chains)]
        self._padded = [r for r in routes if r.pads]
        self.passes: dict[int, Pass] = {}
        self.bypassed: deque[dict[str, np.ndarray]] = deque()
        self.error: BaseException | None = None

    def add(self, dali_epoch: int, p: Pass) -> None:
        """Serve ``p`` when DALI asks for epoch ``dali_epoch`` (older passes are forgotten)."""
        self.passes = {k: v for k, v in self.passes.items() if k >= dali_epoch - 1}
        self.passes[dali_epoch] = p

    def _generator(self, p: Pass, i: int) -> torch.Generator:
        """Batch ``i`` of pass ``p``'s augmentation generator: the torch backend's (the same draws)."""
        return batch_generator(self.seed, p.epoch, p.first + i, torch.device("cpu"), self.rank)

    def __call__(self, info: Any) -> tuple[Any, ...]:
        p, i = self.passes.get(info.epoch_idx), info.iteration
        if p is None or i >= len(p.plan) or self.error is not None:
            raise StopIteration
        try:
            try:
                batch = self.dataset.get_batch(p.plan[i], companions=True)
            except Exception as e:
                raise wrap_error(e, f"DALI source, batch {p.first + i}") from e
            out = [a for r in self.routes if not r.bypass for a in r.host(batch)]
            bypassed = {r.name: r.host(batch)[0] for r in self.routes if r.bypass}
            g = self._generator(p, i)
            for r in self._augmented:  # each view in turn, as the torch backend draws them
                for c in r.chains:
                    out.extend(c.draw(g, r.sizes(batch)))
            if self.rest:  # where the torch code after DALI goes on drawing (sequence ops, Mix)
                bypassed[GENERATOR_STATE] = g.get_state().numpy()
            if self.targets is not None:  # the same draws, replayed
                bypassed.update(self.targets({**batch, **bypassed}, self._generator(p, i)))
            for r in self._padded:
                hw = r.chain.out_hw(r.sizes(batch)).max(axis=0) if r.chain is not None else r.sizes(batch).max(axis=0)
                out.extend(np.full(len(p.plan[i]), v, dtype=np.float32) for v in hw)
        except Exception as e:  # delivered after the batches before it
            self.error = e
            raise StopIteration from None
        self.bypassed.append(bypassed)
        fed = tuple(out)
        self._alive.append(fed)
        return fed
