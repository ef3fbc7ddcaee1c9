"""The ops that give every image one size (crops, Resize) and the flips."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from fastdata.augment.base import (
    Params,
    Tensor,
    _affine,
    _as4d,
    _FixedSize,
    _gather,
    _Geometric,
    _resample,
    _uniform,
    check_fits,
    pair,
)
from fastdata.augment.targets import Geometry


@dataclass(frozen=True)
class RandomResizedCrop(_FixedSize):
    """Crop a random area fraction in ``scale`` with aspect ratio in ``ratio``, resize to ``size`` (bilinear);
    crops that would not fit are clamped to the image."""

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def draw(self, g: torch.Generator, hw: Tensor) -> Params:
        b = hw.shape[0]
        h, w = hw[:, 0], hw[:, 1]
        area = _uniform(g, b, *self.scale)
        r = torch.exp(_uniform(g, b, math.log(self.ratio[0]), math.log(self.ratio[1])))
        # crop width and height as fractions of the image: area = fw * fh * (w*h), fw*w / (fh*h) = r
        fw = torch.sqrt(area * r * h / w).clamp(max=1.0)
        fh = torch.sqrt(area / r * w / h).clamp(max=1.0)
        cx = (torch.rand(b, generator=g, device=g.device) * (1 - fw)) + fw / 2  # centre in [0, 1]
        cy = (torch.rand(b, generator=g, device=g.device) * (1 - fh)) + fh / 2
        return {"fw": fw, "fh": fh, "cx": cx, "cy": cy}

    def warp(self, x: Tensor, p: Params, sizes: Tensor | None, nearest: bool, fill: float) -> Tensor:
        x4, lead = _as4d(x)
        b, _, hc, wc = x4.shape
        oh, ow = pair(self.size)
        fw, fh, cx, cy = (p[k].to(x.device) for k in ("fw", "fh", "cx", "cy"))
        limit = None
        if sizes is not None:  # fractions of each image -> of the padded canvas
            h, w = sizes[:, 0].float(), sizes[:, 1].float()
            fw, cx, fh, cy = fw * w / wc, cx * w / wc, fh * h / hc, cy * h / hc
            # each image's last pixel centre, pulled in by 1/1000 pixel so rounding gives the padding no weight
            limit = ((2 * w - 1.002) / wc - 1, (2 * h - 1.002) / hc - 1)
        return _resample(x4, fw, fh, cx, cy, oh, ow, limit, nearest).reshape(b, *lead[1:], oh, ow)

    def geometry(self, p: Params, hw: Tensor) -> Geometry:
        oh, ow = pair(self.size)
        fw, fh, cx, cy = (p[k].double().cpu() for k in ("fw", "fh", "cx", "cy"))
        w, h = hw[:, 1], hw[:, 0]
        sx, sy = ow / (fw * w), oh / (fh * h)
        x0, y0 = (cx - fw / 2) * w, (cy - fh / 2) * h
        m = _affine([[sx, 0, -x0 * sx], [0, sy, -y0 * sy]], len(hw))
        return Geometry(m, self.out_sizes(hw))


class _Window(_FixedSize):
    """A fixed-size window: no resampling, so any dtype."""

    size: int | tuple[int, int]

    def check(self, x: Tensor, sizes: Tensor | None) -> None:
        size = pair(self.size)
        if size[0] > x.shape[-2] or size[1] > x.shape[-1]:
            raise ValueError(f"{type(self).__name__}{size} is larger than the input {tuple(x.shape[-2:])}")
        if sizes is not None:  # in a mixed-size batch, inside every image (one device sync)
            check_fits(type(self).__name__, size, sizes)

    def warp(self, x: Tensor, p: Params, sizes: Tensor | None, nearest: bool, fill: float) -> Tensor:
        oh, ow = pair(self.size)
        start = p["start"].to(x.device)
        x4, lead = _as4d(x)
        rows = start[:, :1] + torch.arange(oh, device=x.device)
        cols = start[:, 1:] + torch.arange(ow, device=x.device)
        return _gather(x4, rows, cols).reshape(x.shape[0], *lead[1:], oh, ow)

    def geometry(self, p: Params, hw: Tensor) -> Geometry:
        start = p["start"].double().cpu()
        m = _affine([[1, 0, -start[:, 1]], [0, 1, -start[:, 0]]], len(hw))
        return Geometry(m, self.out_sizes(hw))


@dataclass(frozen=True)
class RandomCrop(_Window):
    """Crop a random ``size`` window (per sample, uniform over the positions inside the image), no resampling."""

    size: int | tuple[int, int]

    def draw(self, g: torch.Generator, hw: Tensor) -> Params:
        oh, ow = pair(self.size)
        room = hw.long() - torch.tensor([oh, ow], device=hw.device) + 1  # positions per axis
        u = torch.rand(hw.shape[0], 2, generator=g, device=g.device)
        return {"start": torch.minimum((u * room).long(), room - 1)}


@dataclass(frozen=True)
class CenterCrop(_Window):
    """Crop the central ``size`` window."""

    size: int | tuple[int, int]

    def draw(self, g: torch.Generator, hw: Tensor) -> Params:
        return {"start": (hw.long() - torch.tensor(pair(self.size), device=hw.device)) // 2}

    def warp(self, x: Tensor, p: Params, sizes: Tensor | None, nearest: bool, fill: float) -> Tensor:
        if sizes is None:
            oh, ow = pair(self.size)
            top, left = (x.shape[-2] - oh) // 2, (x.shape[-1] - ow) // 2
            return x[..., top : top + oh, left : left + ow]
        return super().warp(x, p, sizes, nearest, fill)


@dataclass(frozen=True)
class _Flip(_Geometric):
    """Mirror along ``_axis`` with probability ``p``, per sample."""

    p: float = 0.5
    _axis: ClassVar[int]  # -1: left-right (sizes column 1, W), -2: top-bottom (column 0, H)

    def draw(self, g: torch.Generator, hw: Tensor) -> Params:
        return {"flip": torch.rand(hw.shape[0], generator=g, device=g.device) < self.p}

    def warp(self, x: Tensor, p: Params, sizes: Tensor | None, nearest: bool, fill: float) -> Tensor:
        if x.device.type == "cpu":
            return _flip_samples(x, p["flip"], self._axis, sizes, torch.empty_like(x))
        extent = sizes[:, self._axis + 2] if sizes is not None else torch.full((len(x),), x.shape[self._axis])
        return _flip_inside(x, p["flip"].to(x.device), extent.to(x.device), axis=self._axis)

    def geometry(self, p: Params, hw: Tensor) -> Geometry:
        flip = p["flip"].cpu()
        s = torch.where(flip, -1.0, 1.0).double()
        if self._axis == -1:
            m = _affine([[s, 0, torch.where(flip, hw[:, 1], 0.0)], [0, 1, 0]], len(hw))
            return Geometry(m, hw, hflip=flip)
        m = _affine([[1, 0, 0], [0, s, torch.where(flip, hw[:, 0], 0.0)]], len(hw))
        return Geometry(m, hw, vflip=flip)


@dataclass(frozen=True)
class HorizontalFlip(_Flip):
    """Mirror left-right with probability ``p``, per sample."""

    _axis = -1


@dataclass(frozen=True)
class VerticalFlip(_Flip):
    """Mirror top-bottom with probability ``p``, per sample."""

    _axis = -2


def _flip_samples(x: Tensor, flip: Tensor, axis: int, sizes: Tensor | None, out: Tensor) -> Tensor:
    """On the CPU, sample by sample: ``out[i]`` is ``x[i]``, mirrored along ``axis`` where flagged, within
    its image (``sizes``: the padding after it stays); ``out`` may be ``x`` (in place)."""
    for i, f in enumerate(flip.tolist()):
        src, dst = x[i], out[i]
        if out is not x and (not f or sizes is not None):
            dst.copy_(src)  # (a padded image: its padding too)
        if f:
            if sizes is not None:
                n = int(sizes[i, axis + 2])
                src, dst = src.narrow(axis, 0, n), dst.narrow(axis, 0, n)
            dst.copy_(src.flip(axis))  # (flip makes a copy first: in place is safe)
    return out


def _flip_inside(x: Tensor, flip: Tensor, extent: Tensor, axis: int) -> Tensor:
    """Mirror the flagged samples along ``axis`` within their first ``extent`` positions (the
    image; the padding after it stays where it is)."""
    n = x.shape[axis]
    pos = torch.arange(n, device=x.device).view(1, n)
    last = (extent - 1).view(-1, 1)
    src = torch.where(flip.view(-1, 1) & (pos <= last), last - pos, pos)  # (B, n)
    shape = [x.shape[0]] + [1] * (x.dim() - 1)
    shape[axis] = n
    return x.gather(axis, src.view(shape).expand_as(x))


@dataclass(frozen=True)
class Resize(_FixedSize):
    """Resize every image (each from its own size) to exactly ``size`` (H, W), bilinear, no antialiasing:
    a RandomResizedCrop of the whole image."""

    size: int | tuple[int, int]

    def warp(self, x: Tensor, p: Params, sizes: Tensor | None, nearest: bool, fill: float) -> Tensor:
        return RandomResizedCrop.warp(self, x, _whole(len(x), x.device), sizes, nearest, fill)  # type: ignore[arg-type]

    def geometry(self, p: Params, hw: Tensor) -> Geometry:
        return RandomResizedCrop.geometry(self, _whole(len(hw), hw.device), hw)  # type: ignore[arg-type]


def _whole(b: int, device: torch.device) -> Params:
    """RandomResizedCrop's parameters for the whole image."""
    one = torch.ones(b, device=device)
    return {"fw": one, "fh": one, "cx": one / 2, "cy": one / 2}
