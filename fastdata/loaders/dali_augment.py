"""The augmentation spec as DALI operators with the same meaning: each op a :class:`Step` that draws its
parameters on the host with the torch op's own ``draw`` (both backends draw the same) and adds DALI operators."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from fastdata.augment import (
    RGB2YIQ,
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
    pair,
)
from fastdata.augment.image_ops import _FixedSize, _Geometric, check_fits, hue_matrix
from fastdata.errors import UsageError

_GRAY = RGB2YIQ[0].numpy()  # the luma weights


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


class Step:
    """One op of the spec: host-side parameters (``draw``) and DALI operators (``apply``)."""

    params: tuple[np.dtype, ...] = ()  # dtype of each parameter output
    out_size: tuple[int, int] | None = None  # a fixed output (H, W), when the op makes one

    def __init__(self, op: Any, region: bool = False) -> None:
        self.op, self.region = op, region
        if isinstance(op, _FixedSize):  # a crop or Resize: every image comes out at the op's size
            self.size = self.out_size = pair(op.size)

    def draw(self, g: torch.Generator, hw: np.ndarray) -> list[np.ndarray]:
        """Per-sample parameters for images of sizes ``hw`` (B, 2); one array (B, ...) per output."""
        return []

    def next_hw(self, hw: np.ndarray) -> np.ndarray:
        """The images' (B, 2) sizes after this step: the torch op's ``out_sizes``, for a geometric op."""
        return self.op.out_sizes(torch.from_numpy(hw)).numpy() if isinstance(self.op, _Geometric) else hw

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        raise NotImplementedError


def _hw(hw: np.ndarray) -> torch.Tensor:
    """(B, 2) sizes as the torch ops take them (float32)."""
    return torch.from_numpy(np.ascontiguousarray(hw, dtype=np.float32))


_I32, _F32 = np.dtype(np.int32), np.dtype(np.float32)


class _ResizedCrop(Step):
    """RandomResizedCrop: the torch op's window, bilinear, no antialiasing; with ``region`` the decoder decodes
    the window grown by one pixel (the params: that region, then the window inside it)."""

    def __init__(self, op: RandomResizedCrop, region: bool = False) -> None:
        super().__init__(op, region)
        self.params = (_I32, _I32, _F32, _F32) if region else (_F32, _F32)

    def draw(self, g: torch.Generator, hw: np.ndarray) -> list[np.ndarray]:
        p = self.op.draw(g, _hw(hw))
        fw, fh, cx, cy = (p[k].numpy() for k in ("fw", "fh", "cx", "cy"))
        start = np.stack([cy - fh / 2, cx - fw / 2], 1).astype(np.float32)  # relative (y, x)
        end = np.stack([cy + fh / 2, cx + fw / 2], 1).astype(np.float32)
        if not self.region:
            return [start, end]
        size = hw.astype(np.float64)
        lo, hi = start.astype(np.float64) * size, end.astype(np.float64) * size
        r0 = np.maximum(np.floor(lo) - 1, 0)
        r1 = np.minimum(np.ceil(hi) + 1, size)
        return [r0.astype(np.int32), r1.astype(np.int32), (lo - r0).astype(np.float32), (hi - r0).astype(np.float32)]

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        # Pixel-centre mapping, linear, no antialiasing: what the torch op's grid_sample computes.
        roi = params[2:] if self.region else params
        node = g.fn.resize(img.node, size=list(self.size), roi_start=roi[0], roi_end=roi[1],
                           roi_relative=not self.region, interp_type=g.types.INTERP_LINEAR, antialias=False,
                           dtype=g.types.FLOAT)
        return Img(node, True, img.scale)


class _Window(Step):
    """RandomCrop and CenterCrop: the torch op's window, a slice, no resampling; with ``region`` the decoder
    decodes exactly the window."""

    def __init__(self, op: RandomCrop | CenterCrop, region: bool = False) -> None:
        super().__init__(op, region)
        self.params = (_I32, _I32) if region else (_I32,)

    def draw(self, g: torch.Generator, hw: np.ndarray) -> list[np.ndarray]:
        check_fits(type(self.op).__name__, self.size, _hw(hw))
        start = self.op.draw(g, _hw(hw))["start"].numpy().astype(np.int32)
        return [start, start + np.array(self.size, dtype=np.int32)] if self.region else [start]

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        if self.region:
            return img
        node = g.fn.slice(img.node, start=params[0], shape=list(self.size), axis_names="HW")
        return Img(node, img.is_float, img.scale)


class _Flip(Step):
    """HorizontalFlip / VerticalFlip: mirror with probability ``p``, per sample."""

    params = (np.dtype(np.int32),)

    def draw(self, g: torch.Generator, hw: np.ndarray) -> list[np.ndarray]:
        return [self.op.draw(g, _hw(hw))["flip"].numpy().astype(np.int32)]

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        horizontal = isinstance(self.op, HorizontalFlip)
        node = g.fn.flip(img.node, horizontal=params[0] if horizontal else 0, vertical=0 if horizontal else params[0])
        return Img(node, img.is_float, img.scale)


class _Resize(Step):
    """Resize: the whole image to ``size``, bilinear, pixel centres, no antialiasing (as the torch op)."""

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

    def draw(self, g: torch.Generator, hw: np.ndarray) -> list[np.ndarray]:
        start = np.broadcast_to(np.array([-self.op.top, -self.op.left], dtype=np.int32), hw.shape)
        return [np.ascontiguousarray(start), self.next_hw(hw).astype(np.int32)]

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        img, fill = _fill_units(g, img, self.op.fill)
        node = g.fn.slice(img.node, start=params[0], shape=params[1], axis_names="HW", out_of_bounds_policy="pad",
                          fill_values=fill)
        return Img(node, img.is_float, img.scale)


class _Affine(Step):
    """RandomAffine: the torch op's draw and matrix, inverted (output -> input pixel coordinates) for
    ``fn.warp_affine``; bilinear, filled outside."""

    params = (np.dtype(np.float32),)

    def draw(self, g: torch.Generator, hw: np.ndarray) -> list[np.ndarray]:
        p = self.op.draw(g, _hw(hw))
        m = self.op.geometry(p, _hw(hw).double()).matrix
        return [torch.linalg.inv(m)[:, :2, :].float().numpy()]

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        img, fill = _fill_units(g, img, self.op.fill)
        node = g.fn.warp_affine(img.node, matrix=params[0], fill_value=fill, interp_type=g.types.INTERP_LINEAR)
        return Img(node, img.is_float, img.scale)


class _Jitter(Step):
    """ColorJitter, clamped after each part as the torch op: brightness, saturation and hue as per-sample
    3x3 colour matrices, contrast against the image's mean luma on the device."""

    def __init__(self, op: ColorJitter) -> None:
        super().__init__(op)
        self.parts = [k for k in ("brightness", "contrast", "saturation", "hue") if getattr(op, k)]
        self.params = tuple(_F32 for _ in self.parts)

    def draw(self, g: torch.Generator, hw: np.ndarray) -> list[np.ndarray]:
        p = {k: v.double().numpy() for k, v in self.op.draw(g, _hw(hw)).items()}
        out, eye = [], np.eye(3)
        for kind in self.parts:
            f = p[kind]
            if kind == "hue":  # f: the angle
                out.append(hue_matrix(torch.from_numpy(f)).float().numpy())
            elif kind == "brightness":
                out.append((f[:, None, None] * eye).astype(np.float32))
            elif kind == "contrast":
                out.append(f.astype(np.float32))
            else:  # saturation: f * x + (1 - f) * luma, as a matrix
                mix = f[:, None, None] * eye + (1 - f)[:, None, None] * np.outer(np.ones(3), _GRAY)
                out.append(mix.astype(np.float32))
        return out

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        x = g.unit_float(img).node
        for kind, p in zip(self.parts, params):
            if kind == "contrast":
                mean = g.fn.reductions.mean(g.fn.coord_transform(x, M=_GRAY.tolist()))  # per-sample scalar
                x = (x - mean) * g.dev(p) + mean
            else:
                x = g.fn.coord_transform(x, M=p)
            x = g.math.clamp(x, 0.0, 1.0)
        return Img(x, True, 1.0)


class _Noise(Step):
    """GaussianNoise: add N(0, std) per pixel, in [0, 1] units, no clamping (as the torch op)."""

    def draw(self, g: torch.Generator, hw: np.ndarray) -> list[np.ndarray]:
        self.op.draw(g, _hw(hw))  # its noise generator's seed, unused: later ops stay in step
        return []

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        x = g.unit_float(img).node
        return Img(g.fn.noise.gaussian(x, stddev=float(self.op.std)), True, 1.0)


class _Normalize(Step):
    """Normalize before other ops: ``(x - mean) / std`` per channel as one affine colour transform."""

    def __init__(self, op: Normalize, channels: int) -> None:
        super().__init__(op)
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
    return mean, std


@dataclass
class Chain:
    """The compiled spec for one image field: steps, and a final Normalize fused into the output."""

    steps: list[Step]
    final_mean: list[float] | None = None
    final_std: list[float] | None = None

    @property
    def out_size(self) -> tuple[int, int] | None:
        """The fixed (H, W) the chain produces, if one of its ops sets it (the last that does)."""
        return next((s.out_size for s in reversed(self.steps) if s.out_size), None)

    @property
    def region(self) -> bool:
        """The first step takes its window from the decoder (its first two parameters)."""
        return bool(self.steps) and self.steps[0].region

    def draw(self, g: torch.Generator, hw: np.ndarray) -> list[np.ndarray]:
        """Every step's parameters for one batch, in order (sizes follow the crops)."""
        out: list[np.ndarray] = []
        hw = hw.astype(np.int64)
        for s in self.steps:
            out.extend(np.ascontiguousarray(a) for a in s.draw(g, hw))  # DALI takes dense arrays only
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


_STEPS: tuple[tuple[type, type[Step]], ...] = (
    (RandomResizedCrop, _ResizedCrop), (RandomCrop, _Window), (CenterCrop, _Window), (HorizontalFlip, _Flip),
    (VerticalFlip, _Flip), (Resize, _Resize), (Pad, _Pad), (RandomAffine, _Affine), (ColorJitter, _Jitter),
    (GaussianNoise, _Noise))


def compile_chain(ops: Sequence[Any], channels: int, region: bool = False) -> Chain:
    """Map the spec's ops for an image field of ``channels`` channels; an op DALI cannot express raises.
    ``region``: a first crop takes its window from the decoder."""
    steps: list[Step] = []
    ops = list(ops)
    final = _check_norm(ops.pop(), channels) if ops and isinstance(ops[-1], Normalize) else None
    for op in ops:
        if isinstance(op, ColorJitter) and channels != 3:
            raise UsageError(f"ColorJitter needs RGB images, this field has {channels} channel(s)")
        step = next((cls for kind, cls in _STEPS if isinstance(op, kind)), None)
        if isinstance(op, Normalize):
            steps.append(_Normalize(op, channels))
        elif step is None:
            raise UsageError(f"the DALI backend cannot map the augmentation op {op!r}; use backend='torch' for it")
        elif step in (_ResizedCrop, _Window) and region and not steps:
            steps.append(step(op, region=True))
        else:
            steps.append(step(op))
    return Chain(steps, *(final if final else (None, None)))
