"""The ops that move pixels: those that give every image one size (crops, Resize), the flips, and those that
keep or grow the canvas (Pad, RandomAffine)."""

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
    _mask,
    _resample,
    _sample,
    _uniform,
    check_fits,
    image_hw,
    pair,
)
from fastdata.augment.targets import Geometry
from fastdata.errors import UsageError


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


@dataclass(frozen=True, kw_only=True)
class Pad(_Geometric):
    """Add ``top``, ``bottom``, ``left`` and ``right`` pixels of ``fill`` (image units) around each image."""

    top: int = 0
    bottom: int = 0
    left: int = 0
    right: int = 0
    fill: float = 0.0

    def __post_init__(self) -> None:
        if min(self.top, self.bottom, self.left, self.right) < 0:
            raise UsageError(f"Pad sizes must be >= 0, got {self}")

    def warp(self, x: Tensor, p: Params, sizes: Tensor | None, nearest: bool, fill: float) -> Tensor:
        t, l = self.top, self.left
        hc, wc = x.shape[-2:]
        out = x.new_full((*x.shape[:-2], hc + t + self.bottom, wc + l + self.right), fill)
        out[..., t : t + hc, l : l + wc] = x
        if sizes is not None:  # inside the new image but outside the old one: fill; beyond it: padding (0)
            h, w = out.shape[-2:]
            shape = (-1,) + (1,) * (x.dim() - 3) + (h, w)
            rows = torch.arange(h, device=x.device).view(1, h, 1) - t
            cols = torch.arange(w, device=x.device).view(1, 1, w) - l
            old = ((rows >= 0) & (rows < sizes[:, 0].view(-1, 1, 1)) & (cols >= 0)
                   & (cols < sizes[:, 1].view(-1, 1, 1))).view(shape)
            new = _mask(self.out_sizes(sizes), h, w, torch.bool)[:, 0].view(shape)
            zero = torch.zeros((), dtype=x.dtype, device=x.device)
            out = torch.where(old, out, torch.where(new, torch.full_like(zero, fill), zero))
        return out

    def out_sizes(self, sizes: Tensor) -> Tensor:
        return sizes + torch.tensor([self.top + self.bottom, self.left + self.right], device=sizes.device)

    def geometry(self, p: Params, hw: Tensor) -> Geometry:
        m = _affine([[1, 0, self.left], [0, 1, self.top]], len(hw))
        return Geometry(m, self.out_sizes(hw))


@dataclass(frozen=True)
class RandomAffine(_Geometric):
    """Rotate by U(-degrees, degrees) (counterclockwise as seen), scale by U(scale) about the centre and shift by
    U(-t, t) of (W, H) (``translate``), with probability ``p``; bilinear, ``fill`` outside, the size kept."""

    degrees: float = 0.0
    translate: tuple[float, float] = (0.0, 0.0)
    scale: tuple[float, float] = (1.0, 1.0)
    p: float = 1.0
    fill: float = 0.0

    def __post_init__(self) -> None:
        if self.degrees < 0 or min(self.translate) < 0 or min(self.scale) <= 0 or self.scale[0] > self.scale[1]:
            raise UsageError(f"RandomAffine needs degrees >= 0, translate >= 0 and 0 < scale[0] <= scale[1]: {self}")

    def draw(self, g: torch.Generator, hw: Tensor) -> Params:
        b = hw.shape[0]
        on = torch.rand(b, generator=g, device=g.device) < self.p
        angle = _uniform(g, b, -self.degrees, self.degrees)
        scale = _uniform(g, b, *self.scale)
        tx = _uniform(g, b, -self.translate[0], self.translate[0]) * hw[:, 1]
        ty = _uniform(g, b, -self.translate[1], self.translate[1]) * hw[:, 0]
        zero = torch.zeros_like(angle)
        return {"angle": torch.where(on, angle, zero), "scale": torch.where(on, scale, zero + 1),
                "tx": torch.where(on, tx, zero), "ty": torch.where(on, ty, zero)}

    def geometry(self, p: Params, hw: Tensor) -> Geometry:
        a = p["angle"].double().cpu() * (math.pi / 180)
        s = p["scale"].double().cpu()
        tx, ty = p["tx"].double().cpu(), p["ty"].double().cpu()
        cx, cy = hw[:, 1] / 2, hw[:, 0] / 2
        c, sn = torch.cos(a) * s, torch.sin(a) * s
        # y points down: counterclockwise as seen is x' = c*dx + s*dy, y' = -s*dx + c*dy around the centre
        m = _affine([[c, sn, cx + tx - c * cx - sn * cy], [-sn, c, cy + ty + sn * cx - c * cy]], len(hw))
        return Geometry(m, hw, angle=p["angle"].double().cpu())

    def _source(self, p: Params, x: Tensor, sizes: Tensor | None) -> tuple[Tensor, Tensor]:
        """Each output pixel's source point (B, H, W, 2) and whether it lies inside its image; kept
        in ``p`` for the targets (the mask) of the same batch."""
        b, hc, wc = x.shape[0], x.shape[-2], x.shape[-1]
        key = f"_source_{hc}x{wc}_{x.device}"
        if key in p:
            return p[key], p[key + "_valid"]
        hw = image_hw(x, sizes, torch.device("cpu")).double()
        inv = torch.linalg.inv(self.geometry(p, hw).matrix).to(x.device, torch.float32)
        ys = torch.arange(hc, device=x.device, dtype=torch.float32) + 0.5
        xs = torch.arange(wc, device=x.device, dtype=torch.float32) + 0.5
        pts = torch.stack(torch.broadcast_tensors(xs.view(1, -1), ys.view(-1, 1)), -1)  # (H, W, 2) x, y
        src = torch.einsum("bij,hwj->bhwi", inv[:, :2, :2], pts) + inv[:, None, None, :2, 2]
        size = hw.to(x.device, torch.float32).flip(-1).view(b, 1, 1, 2)  # (W, H)
        valid = ((src >= 0) & (src < size)).all(-1)
        if sizes is not None:
            valid &= _mask(sizes, hc, wc, torch.bool)[:, 0]  # the output image keeps its own size
            src = torch.minimum(torch.maximum(src, torch.full_like(src, 0.5)), size - 0.5)  # stay in the image
        p[key], p[key + "_valid"] = src, valid
        return src, valid

    def warp(self, x: Tensor, p: Params, sizes: Tensor | None, nearest: bool, fill: float) -> Tensor:
        x4, lead = _as4d(x)
        b, _, hc, wc = x4.shape
        src, valid = self._source(p, x4, sizes)
        if nearest:  # the pixel each source point falls in (any dtype, exact)
            key = f"_nearest_{hc}x{wc}_{x.device}"
            if key not in p:
                ix = src[..., 0].floor().clamp_(0, wc - 1).int()  # int32 sums, one conversion to int64
                iy = src[..., 1].floor().clamp_(0, hc - 1).int()
                p[key] = iy.mul_(wc).add_(ix).long().view(b, 1, -1)
            flat = p[key].expand(-1, x4.shape[1], -1)
            out = x4.reshape(b, x4.shape[1], -1).gather(2, flat).view(x4.shape)
        else:
            grid = src / torch.tensor([wc, hc], device=x.device, dtype=torch.float32) * 2 - 1
            out = _sample(x4, grid)
        outside = torch.full((), fill, dtype=out.dtype, device=x.device)
        if sizes is not None:  # the canvas padding beyond each image stays 0
            inside = _mask(sizes, hc, wc, torch.bool)
            outside = torch.where(inside, outside, torch.zeros_like(outside))
        return torch.where(valid.unsqueeze(1), out, outside).reshape(b, *lead[1:], hc, wc)
