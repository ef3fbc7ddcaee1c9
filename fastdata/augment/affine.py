"""Ops that keep or grow the canvas and move pixels inside it: Pad and RandomAffine."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fastdata.augment.base import Params, Tensor, _affine, _as4d, _Geometric, _mask, _sample, _uniform, image_hw
from fastdata.augment.targets import Geometry
from fastdata.errors import UsageError


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
                ix = src[..., 0].floor().clamp(0, wc - 1).long()
                iy = src[..., 1].floor().clamp(0, hc - 1).long()
                p[key] = (iy * wc + ix).view(b, 1, -1)
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
