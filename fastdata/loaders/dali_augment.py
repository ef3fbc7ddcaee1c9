"""The augmentation spec (``fastdata.augment``) as DALI operators, with the same meaning and ranges.

Each op becomes a :class:`Step`: ``draw`` makes its per-sample parameters on the host, with
numpy, from the batch's generator and the images' sizes (known from the dataset before
decoding), using the same distributions as the torch op; ``apply`` adds the DALI operators
that use them (the parameters arrive as external-source outputs: argument inputs). A batch's
augmentation is therefore a pure function of ``(seed, epoch, rank, batch index)``: prefetch depth,
thread count and resuming do not change it. The draws come from the torch backend's generator
(:class:`TorchRng`, ``fastdata.augment.batch_generator`` on the CPU) in the torch ops' order and
float32 arithmetic, so both backends draw the same parameters. Only ``GaussianNoise`` draws inside DALI
(``fn.noise.gaussian``, seeded by the pipeline seed).

Images stay uint8 through geometric ops; the first colour op turns them into floats in
[0, 1] (the units of the spec). A final ``Normalize`` is fused into
``fn.crop_mirror_normalize``, which also sets the output layout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from fastdata.augment import (
    RGB2YIQ,
    YIQ2RGB,
    CenterCrop,
    ColorJitter,
    GaussianNoise,
    HorizontalFlip,
    Normalize,
    Pad,
    RandomAffine,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    VerticalFlip,
    child_seed,
    pair,
)
from fastdata.errors import UsageError

_GRAY = np.array([0.299, 0.587, 0.114], dtype=np.float32)  # the luma weights of augment._gray
_HUE_FROM = RGB2YIQ.numpy().astype(np.float64)
_HUE_TO = YIQ2RGB.numpy().astype(np.float64)


@dataclass
class Img:
    """An image field while the graph is built: the DALI node and what its values mean."""

    node: Any
    is_float: bool = False
    scale: float = 255.0  # 255 while values are 0..255 (uint8 or resized floats), 1 once in [0, 1]


class Graph:
    """Graph-building context: DALI's modules, and whether the images live on the GPU."""

    def __init__(self, fn: Any, types: Any, dmath: Any, gpu: bool) -> None:
        self.fn, self.types, self.math, self.gpu = fn, types, dmath, gpu

    def dev(self, node: Any) -> Any:
        """``node`` (a CPU external-source output) where the images are: regular inputs must match."""
        return node.gpu() if self.gpu else node

    def unit_float(self, img: Img) -> Img:
        """The image as float32 in [0, 1], the units the spec's colour ops are defined in."""
        node = img.node if img.is_float else self.fn.cast(img.node, dtype=self.types.FLOAT)
        if img.scale != 1.0:
            node = node * (1.0 / img.scale)
        return Img(node, True, 1.0)


class TorchRng:
    """numpy-style draws (``uniform``, ``random``) from a torch generator, in float32 as the torch ops
    draw them: the same generator gives the DALI steps the torch backend's parameters."""

    def __init__(self, g: torch.Generator) -> None:
        self.g = g

    def uniform(self, lo: float, hi: float, size: int) -> np.ndarray:
        return (torch.rand(size, generator=self.g) * (hi - lo) + lo).numpy().astype(np.float64)

    def random(self, size: int | tuple[int, ...]) -> np.ndarray:
        return torch.rand(size, generator=self.g).numpy()

    def child_seed(self) -> int:
        return int(child_seed(self.g))


class Step:
    """One op of the spec: host-side parameters (``draw``) and DALI operators (``apply``)."""

    params: tuple[np.dtype, ...] = ()  # dtype of each parameter output
    out_size: tuple[int, int] | None = None  # a fixed output (H, W), when the op makes one

    def draw(self, rng: Any, hw: np.ndarray) -> list[np.ndarray]:
        """Per-sample parameters for images of sizes ``hw`` (B, 2); one array (B, ...) per output.
        ``rng``: a :class:`TorchRng` (numpy's Generator has the same ``uniform`` and ``random``)."""
        return []

    def next_hw(self, hw: np.ndarray) -> np.ndarray:
        """The images' (B, 2) sizes after this step."""
        if self.out_size is not None:
            return np.broadcast_to(np.array(self.out_size, dtype=np.int64), hw.shape)
        return hw

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        raise NotImplementedError


class _ResizedCrop(Step):
    """RandomResizedCrop: area ~ U(scale), log aspect ~ U(log ratio), clamped to the image, bilinear."""

    params = (np.dtype(np.float32), np.dtype(np.float32))

    def __init__(self, op: RandomResizedCrop) -> None:
        self.op = op
        self.size = self.out_size = pair(op.size)

    def draw(self, rng: Any, hw: np.ndarray) -> list[np.ndarray]:
        b = len(hw)
        h, w = hw[:, 0].astype(np.float64), hw[:, 1].astype(np.float64)
        area = rng.uniform(*self.op.scale, b)
        r = np.exp(rng.uniform(math.log(self.op.ratio[0]), math.log(self.op.ratio[1]), b))
        fw = np.minimum(np.sqrt(area * r * h / w), 1.0)  # crop size as fractions of the image
        fh = np.minimum(np.sqrt(area / r * w / h), 1.0)
        cx = rng.random(b) * (1 - fw) + fw / 2
        cy = rng.random(b) * (1 - fh) + fh / 2
        start = np.stack([cy - fh / 2, cx - fw / 2], 1).astype(np.float32)
        end = np.stack([cy + fh / 2, cx + fw / 2], 1).astype(np.float32)
        return [start, end]

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        # Pixel-centre mapping, linear, no antialiasing: what the torch op's grid_sample computes.
        node = g.fn.resize(img.node, size=list(self.size), roi_start=params[0], roi_end=params[1],
                           roi_relative=True, interp_type=g.types.INTERP_LINEAR, antialias=False,
                           dtype=g.types.FLOAT)
        return Img(node, True, img.scale)


class _Window(Step):
    """RandomCrop (window uniform over valid positions) and CenterCrop: a slice, no resampling."""

    params = (np.dtype(np.int32),)

    def __init__(self, op: RandomCrop | CenterCrop) -> None:
        self.op = op
        self.size = self.out_size = pair(op.size)

    def draw(self, rng: Any, hw: np.ndarray) -> list[np.ndarray]:
        oh, ow = self.size
        small = (hw[:, 0] < oh) | (hw[:, 1] < ow)
        if small.any():
            k = int(np.flatnonzero(small)[0])
            raise UsageError(f"{type(self.op).__name__}{(oh, ow)} is larger than an image of the batch "
                             f"({int(hw[k, 0])}x{int(hw[k, 1])}); crop to at most the smallest image size")
        if isinstance(self.op, CenterCrop):
            top, left = (hw[:, 0] - oh) // 2, (hw[:, 1] - ow) // 2
            return [np.stack([top, left], 1).astype(np.int32)]
        room = (hw - np.array([oh, ow])) + 1  # positions per axis; u * room in float32, as the torch op
        u = rng.random((len(hw), 2)).astype(np.float32)
        start = np.minimum(np.floor(u * room.astype(np.float32)).astype(np.int64), room - 1)
        return [start.astype(np.int32)]

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        node = g.fn.slice(img.node, start=params[0], shape=list(self.size), axis_names="HW")
        return Img(node, img.is_float, img.scale)


class _Flip(Step):
    """HorizontalFlip / VerticalFlip: mirror with probability ``p``, per sample."""

    params = (np.dtype(np.int32),)

    def __init__(self, op: HorizontalFlip | VerticalFlip) -> None:
        self.op = op

    def draw(self, rng: Any, hw: np.ndarray) -> list[np.ndarray]:
        return [(rng.random(len(hw)) < self.op.p).astype(np.int32)]

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        if isinstance(self.op, HorizontalFlip):
            node = g.fn.flip(img.node, horizontal=params[0], vertical=0)
        else:
            node = g.fn.flip(img.node, horizontal=0, vertical=params[0])
        return Img(node, img.is_float, img.scale)


class _Resize(Step):
    """Resize: the whole image to ``size``, bilinear, pixel centres, no antialiasing (as the torch op)."""

    def __init__(self, op: Resize) -> None:
        self.size = self.out_size = pair(op.size)

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        node = g.fn.resize(img.node, size=list(self.size), roi_start=[0.0, 0.0], roi_end=[1.0, 1.0],
                           roi_relative=True, interp_type=g.types.INTERP_LINEAR, antialias=False,
                           dtype=g.types.FLOAT)
        return Img(node, True, img.scale)


def _fill_units(g: Graph, img: Img, fill: float) -> tuple[Img, float]:
    """``fill`` (image units, [0, 1]) in the node's units; a uint8 image that cannot hold it becomes float."""
    value = fill * img.scale
    if not img.is_float and value != round(value):
        img = g.unit_float(img)
        value = fill
    return img, value


class _Pad(Step):
    """Pad: a slice reaching ``top``/``left`` before and ``bottom``/``right`` beyond each image, filled."""

    params = (np.dtype(np.int32), np.dtype(np.int32))

    def __init__(self, op: Pad) -> None:
        self.op = op
        self.grow = np.array([op.top + op.bottom, op.left + op.right], dtype=np.int64)

    def draw(self, rng: Any, hw: np.ndarray) -> list[np.ndarray]:
        start = np.broadcast_to(np.array([-self.op.top, -self.op.left], dtype=np.int32), hw.shape)
        return [np.ascontiguousarray(start), (hw + self.grow).astype(np.int32)]

    def next_hw(self, hw: np.ndarray) -> np.ndarray:
        return hw + self.grow

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        img, fill = _fill_units(g, img, self.op.fill)
        node = g.fn.slice(img.node, start=params[0], shape=params[1], axis_names="HW", out_of_bounds_policy="pad",
                          fill_values=fill)
        return Img(node, img.is_float, img.scale)


class _Affine(Step):
    """RandomAffine: the torch op's draw and matrix, inverted (output -> input pixel coordinates, the
    corner of the first pixel at 0, as fastdata's), for ``fn.warp_affine``; bilinear, filled outside."""

    params = (np.dtype(np.float32),)

    def __init__(self, op: RandomAffine) -> None:
        self.op = op

    def draw(self, rng: Any, hw: np.ndarray) -> list[np.ndarray]:
        p = self.op.draw(rng.g, torch.from_numpy(np.ascontiguousarray(hw)).float())
        m = self.op.geometry(p, torch.from_numpy(np.ascontiguousarray(hw)).double()).matrix
        return [torch.linalg.inv(m)[:, :2, :].float().numpy()]

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        img, fill = _fill_units(g, img, self.op.fill)
        node = g.fn.warp_affine(img.node, matrix=params[0], fill_value=fill, interp_type=g.types.INTERP_LINEAR)
        return Img(node, img.is_float, img.scale)


class _Jitter(Step):
    """ColorJitter: brightness, contrast, saturation factors ~ U(1-v, 1+v) and a hue rotation of the
    YIQ plane ~ U(-hue, hue) turns, in that order, clamped to [0, 1] after each (as the torch op).

    Brightness, saturation and hue are per-sample 3x3 colour matrices (``fn.coord_transform``);
    contrast mixes with the image's mean luma, computed on the device.
    """

    def __init__(self, op: ColorJitter) -> None:
        self.parts = [(k, v) for k, v in (("brightness", op.brightness), ("contrast", op.contrast),
                                          ("saturation", op.saturation), ("hue", op.hue)) if v]
        self.params = tuple(np.dtype(np.float32) for _ in self.parts)

    def draw(self, rng: Any, hw: np.ndarray) -> list[np.ndarray]:
        b, out = len(hw), []
        eye = np.eye(3)
        for kind, v in self.parts:
            if kind == "hue":
                a = rng.uniform(-v, v, b) * 2 * math.pi
                rot = np.zeros((b, 3, 3))
                rot[:, 0, 0] = 1
                rot[:, 1, 1], rot[:, 1, 2], rot[:, 2, 1], rot[:, 2, 2] = np.cos(a), -np.sin(a), np.sin(a), np.cos(a)
                out.append((_HUE_TO @ rot @ _HUE_FROM).astype(np.float32))
                continue
            f = rng.uniform(max(0.0, 1 - v), 1 + v, b)
            if kind == "brightness":
                out.append((f[:, None, None] * eye).astype(np.float32))
            elif kind == "contrast":
                out.append(f.astype(np.float32))
            else:  # saturation: f * x + (1 - f) * luma, as a matrix
                mix = f[:, None, None] * eye + (1 - f)[:, None, None] * np.outer(np.ones(3), _GRAY)
                out.append(mix.astype(np.float32))
        return out

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        x = g.unit_float(img).node
        for (kind, _), p in zip(self.parts, params):
            if kind == "contrast":
                mean = g.fn.reductions.mean(g.fn.coord_transform(x, M=_GRAY.tolist()))  # per-sample scalar
                x = (x - mean) * g.dev(p) + mean
            else:
                x = g.fn.coord_transform(x, M=p)
            x = g.math.clamp(x, 0.0, 1.0)
        return Img(x, True, 1.0)


class _Noise(Step):
    """GaussianNoise: add N(0, std) per pixel, in [0, 1] units, no clamping (as the torch op)."""

    def __init__(self, op: GaussianNoise) -> None:
        self.std = float(op.std)

    def draw(self, rng: Any, hw: np.ndarray) -> list[np.ndarray]:
        rng.child_seed()  # the torch op's draw (its noise generator's seed): later ops stay in step
        return []

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        x = g.unit_float(img).node
        return Img(g.fn.noise.gaussian(x, stddev=self.std), True, 1.0)


class _Normalize(Step):
    """Normalize before other ops: ``(x - mean) / std`` per channel as one affine colour transform."""

    def __init__(self, op: Normalize, channels: int) -> None:
        self.mean, self.std = _check_norm(op, channels)

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        x = g.unit_float(img).node
        inv = 1.0 / np.asarray(self.std, dtype=np.float64)
        m = np.diag(inv).astype(np.float32).reshape(-1).tolist()
        t = (-np.asarray(self.mean) * inv).astype(np.float32).tolist()
        return Img(g.fn.coord_transform(x, M=m, T=t), True, 1.0)


def _check_norm(op: Normalize, channels: int) -> tuple[list[float], list[float]]:
    mean, std = [float(v) for v in op.mean], [float(v) for v in op.std]
    if len(mean) != channels or len(std) != channels:
        raise UsageError(f"Normalize has {len(mean)} means and {len(std)} stds for images of {channels} channels")
    if min(std) <= 0:
        raise UsageError("Normalize std must be positive")
    return mean, std


@dataclass
class Chain:
    """The compiled spec for one image field: steps, and a final Normalize fused into the output."""

    steps: list[Step]
    final_mean: list[float] | None = None
    final_std: list[float] | None = None

    @property
    def out_size(self) -> tuple[int, int] | None:
        """The fixed (H, W) the chain produces, if one of its ops sets it."""
        size = None
        for s in self.steps:
            size = s.out_size or size
        return size

    def draw(self, rng: Any, hw: np.ndarray) -> list[np.ndarray]:
        """Every step's parameters for one batch, in order (sizes follow the crops)."""
        out: list[np.ndarray] = []
        hw = hw.astype(np.int64)
        for s in self.steps:
            out.extend(np.ascontiguousarray(a) for a in s.draw(rng, hw))  # DALI takes dense arrays only
            hw = s.next_hw(hw)
        return out

    def out_hw(self, hw: np.ndarray) -> np.ndarray:
        """The images' (B, 2) sizes at the end of the chain."""
        hw = hw.astype(np.int64)
        for s in self.steps:
            hw = s.next_hw(hw)
        return hw

    @property
    def param_dtypes(self) -> list[np.dtype]:
        return [d for s in self.steps for d in s.params]

    def apply(self, g: Graph, img: Img, params: Sequence[Any]) -> Img:
        k = 0
        for s in self.steps:
            img = s.apply(g, img, list(params[k : k + len(s.params)]))
            k += len(s.params)
        return img


def compile_chain(ops: Sequence[Any], channels: int) -> Chain:
    """Map the spec's ops for an image field of ``channels`` channels; an op DALI cannot express raises."""
    steps: list[Step] = []
    ops = list(ops)
    final = None
    if ops and isinstance(ops[-1], Normalize):
        final = _check_norm(ops.pop(), channels)
    for op in ops:
        if isinstance(op, RandomResizedCrop):
            steps.append(_ResizedCrop(op))
        elif isinstance(op, (RandomCrop, CenterCrop)):
            steps.append(_Window(op))
        elif isinstance(op, (HorizontalFlip, VerticalFlip)):
            steps.append(_Flip(op))
        elif isinstance(op, Resize):
            steps.append(_Resize(op))
        elif isinstance(op, Pad):
            steps.append(_Pad(op))
        elif isinstance(op, RandomAffine):
            steps.append(_Affine(op))
        elif isinstance(op, ColorJitter):
            if channels != 3:
                raise UsageError(f"ColorJitter needs RGB images, this field has {channels} channel(s)")
            steps.append(_Jitter(op))
        elif isinstance(op, GaussianNoise):
            steps.append(_Noise(op))
        elif isinstance(op, Normalize):
            steps.append(_Normalize(op, channels))
        else:
            raise UsageError(f"the DALI backend cannot map the augmentation op {op!r}; "
                             "use backend='torch' for it")
    return Chain(steps, *(final if final else (None, None)))
