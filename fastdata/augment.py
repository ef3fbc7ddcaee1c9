"""Batched augmentation on the device: per-sample random parameters from a seeded generator.

A pipeline is a tuple of small frozen dataclasses (the declarative spec), so the DALI backend
can map the same spec to its own operators. Every op takes a float batch ``(B, C, H, W)``
(more leading axes are folded into C) and a ``torch.Generator``, and draws one set of parameters
per sample (``draw``, on the generator's device: the loaders draw on the CPU, so both backends
draw the same parameters) before transforming the batch (``image``). Images arrive as floats in [0, 1].

Geometric ops (crops, flips, Resize, Pad, RandomAffine) also say what they did as a
:class:`fastdata.targets.Geometry`, so ``Augment(ops, targets={...})`` moves keypoints, boxes,
masks and targets of your own with the image, with the same draw (docs/augment.md).

A batch of images of mixed sizes arrives padded to its largest (H, W), each image at the
top-left, with ``sizes`` ((B, 2) true heights and widths): the built-in ops then treat each
image at its own size (crops and flips stay inside it, contrast and noise ignore the padding), as
the DALI backend does. After a crop or a Resize every image has the same size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence, Union

import torch
import torch.nn.functional as F

from .errors import UsageError
from .format.spec import LENGTHS_SUFFIX, SHAPE_SUFFIX
from .mixing import Mix
from .seeds import Stream, int_seed
from .seqaug import ops_kind
from .targets import VALID_SUFFIX, Boxes, Custom, Geometry, Keypoints, Mask, Target

Tensor = torch.Tensor
Params = dict[str, Tensor]


def _uniform(g: torch.Generator, b: int, lo: float, hi: float) -> Tensor:
    return torch.rand(b, generator=g, device=g.device) * (hi - lo) + lo


def pair(v: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    h, w = v
    return (int(h), int(w))


def _as4d(x: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    lead = x.shape[:-2]
    return x.reshape(x.shape[0], -1, *x.shape[-2:]), lead


def _mask(sizes: Tensor, h: int, w: int, dtype: torch.dtype) -> Tensor:
    """(B, 1, H, W): 1 inside each image (top-left, ``sizes`` high and wide), 0 in the padding."""
    rows = torch.arange(h, device=sizes.device).view(1, h, 1) < sizes[:, 0].view(-1, 1, 1)
    cols = torch.arange(w, device=sizes.device).view(1, 1, w) < sizes[:, 1].view(-1, 1, 1)
    return (rows & cols).unsqueeze(1).to(dtype)


def _crop_size(size: int | Sequence[int], x: Tensor, sizes: Tensor | None, op: str) -> tuple[int, int]:
    """A fixed-size crop's (H, W); it must fit inside the batch and, in a mixed-size batch, inside
    every image (one device sync)."""
    oh, ow = pair(size)
    h, w = x.shape[-2:]
    if oh > h or ow > w:
        raise ValueError(f"{op}{(oh, ow)} is larger than the input {(h, w)}")
    if sizes is not None:
        small = sizes.min(dim=0).values.tolist()
        if oh > small[0] or ow > small[1]:
            raise UsageError(f"{op}{(oh, ow)} is larger than an image of the batch ({small[0]}x{small[1]}); "
                             "crop to at most the smallest image size")
    return oh, ow


def image_hw(x: Tensor, sizes: Tensor | None, device: torch.device) -> Tensor:
    """(B, 2) float32 (H, W) of each image on ``device``: ``sizes``, or the batch's own size."""
    if sizes is not None:
        return sizes.to(device).float()
    return torch.tensor([float(x.shape[-2]), float(x.shape[-1])], device=device).expand(x.shape[0], 2)


def _affine(rows: Sequence[Sequence[Tensor | float]], b: int) -> Tensor:
    """(B, 3, 3) float64 matrices from 2 rows of 3 per-sample values (tensors or numbers)."""
    m = torch.zeros(b, 3, 3, dtype=torch.float64)
    for i, row in enumerate(rows):
        for j, v in enumerate(row):
            m[:, i, j] = v.double().cpu() if isinstance(v, torch.Tensor) else float(v)
    m[:, 2, 2] = 1
    return m


class _Op:
    """A built-in op: ``draw`` the batch's parameters (on the generator's device), then ``image``."""

    def draw(self, g: torch.Generator, hw: Tensor) -> Params:
        """Per-sample parameters for images of sizes ``hw`` ((B, 2) float32 on ``g.device``)."""
        return {}

    def check(self, x: Tensor, sizes: Tensor | None) -> None:
        """Raise when the op cannot apply to this batch (before anything is drawn)."""

    def image(self, x: Tensor, p: Params, sizes: Tensor | None) -> Tensor:
        raise NotImplementedError

    def apply(self, x: Tensor, g: torch.Generator, sizes: Tensor | None = None) -> Tensor:
        """Draw and transform; ``sizes``: (B, 2) true (H, W) of top-left images in a padded batch."""
        self.check(x, sizes)
        return self.image(x, self.draw(g, image_hw(x, sizes, g.device)), sizes)


class _Geometric(_Op):
    """An op that moves pixels: the same parameters move masks (``warp`` by nearest neighbour) and
    coordinates (``geometry``)."""

    fixed_size: ClassVar[bool] = False  # every output image has one size (crops, Resize)

    def image(self, x: Tensor, p: Params, sizes: Tensor | None) -> Tensor:
        return self.warp(x, p, sizes, nearest=False, fill=float(getattr(self, "fill", 0.0)))

    def warp(self, x: Tensor, p: Params, sizes: Tensor | None, nearest: bool, fill: float) -> Tensor:
        raise NotImplementedError

    def geometry(self, p: Params, hw: Tensor) -> Geometry:
        """What the op did to each sample (``hw``: (B, 2) float64 input sizes, CPU)."""
        raise NotImplementedError

    def out_sizes(self, sizes: Tensor) -> Tensor:
        """Each image's (H, W) after the op, from its (H, W) before (in a padded batch)."""
        return sizes


def _resample(x4: Tensor, fw: Tensor, fh: Tensor, cx: Tensor, cy: Tensor, oh: int, ow: int,
              limit: tuple[Tensor, Tensor] | None = None, nearest: bool = False) -> Tensor:
    """Bilinear (or nearest) resampling of the boxes (centre, size as fractions of the canvas) to
    (oh, ow); ``limit``: the largest grid x, y per sample (sampling clamps there, as at the canvas border)."""
    b = x4.shape[0]
    theta = torch.zeros(b, 2, 3, device=x4.device, dtype=torch.float32)
    theta[:, 0, 0] = fw
    theta[:, 0, 2] = cx * 2 - 1
    theta[:, 1, 1] = fh
    theta[:, 1, 2] = cy * 2 - 1
    if nearest:  # separable: one source row per output row, one column per column (any dtype, exact)
        hc, wc = x4.shape[-2:]
        lim = limit if limit is not None else (None, None)
        cols = _nearest_index(cx * 2 - 1, fw, ow, wc, lim[0])
        rows = _nearest_index(cy * 2 - 1, fh, oh, hc, lim[1])
        return _gather(x4, rows, cols)
    grid = F.affine_grid(theta, [b, x4.shape[1], oh, ow], align_corners=False)
    if limit is not None:
        grid = torch.minimum(grid, torch.stack(limit, dim=1).to(grid.dtype).view(b, 1, 1, 2))
    return _sample(x4, grid, nearest)


def _nearest_index(centre: Tensor, extent: Tensor, n_out: int, n_in: int, limit: Tensor | None) -> Tensor:
    """(B, n_out) source pixel of each output pixel along one axis, as grid_sample's nearest mode picks it
    (normalised grid ``centre + extent * o``, ``o`` the output pixel centres in [-1, 1])."""
    o = (torch.arange(n_out, device=centre.device, dtype=torch.float32) + 0.5) * (2 / n_out) - 1
    g = centre.float().view(-1, 1) + extent.float().view(-1, 1) * o
    if limit is not None:
        g = torch.minimum(g, limit.float().view(-1, 1))
    return torch.round((g + 1) / 2 * n_in - 0.5).clamp(0, n_in - 1).long()


def _gather(x4: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """(B, C, len(rows), len(cols)): per-sample rows (B, oh) and columns (B, ow) of a (B, C, H, W) batch."""
    b = x4.shape[0]
    idx_b = torch.arange(b, device=x4.device).view(b, 1, 1, 1)
    idx_c = torch.arange(x4.shape[1], device=x4.device).view(1, -1, 1, 1)
    return x4[idx_b, idx_c, rows.view(b, 1, -1, 1), cols.view(b, 1, 1, -1)]


def _sample(x4: Tensor, grid: Tensor, nearest: bool, padding: str = "border") -> Tensor:
    """grid_sample in the batch's float dtype (integer masks go through float32 and come back exact)."""
    work = x4 if x4.is_floating_point() else x4.float()
    out = F.grid_sample(work, grid.to(work.dtype), mode="nearest" if nearest else "bilinear",
                        padding_mode=padding, align_corners=False)
    return out.to(x4.dtype) if x4.is_floating_point() else out.round().to(x4.dtype)


@dataclass(frozen=True)
class RandomResizedCrop(_Geometric):
    """Crop a random area fraction in ``scale`` with aspect ratio in ``ratio``, resize to ``size``.

    Crops that would not fit are clamped to the image (no retry loop), bilinear resampling.
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    fixed_size: ClassVar[bool] = True

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
            # each image's last pixel centre, pulled in by 1/1000 pixel: float rounding must not
            # give the padding beyond it any bilinear weight
            limit = ((2 * w - 1.002) / wc - 1, (2 * h - 1.002) / hc - 1)
        return _resample(x4, fw, fh, cx, cy, oh, ow, limit, nearest).reshape(b, *lead[1:], oh, ow)

    def geometry(self, p: Params, hw: Tensor) -> Geometry:
        oh, ow = pair(self.size)
        fw, fh, cx, cy = (p[k].double().cpu() for k in ("fw", "fh", "cx", "cy"))
        w, h = hw[:, 1], hw[:, 0]
        sx, sy = ow / (fw * w), oh / (fh * h)
        x0, y0 = (cx - fw / 2) * w, (cy - fh / 2) * h
        m = _affine([[sx, 0, -x0 * sx], [0, sy, -y0 * sy]], len(hw))
        return Geometry(m, torch.tensor([[float(oh), float(ow)]], dtype=torch.float64).expand(len(hw), 2))


class _Window(_Geometric):
    """A fixed-size window: no resampling, so any dtype."""

    size: int | tuple[int, int]
    fixed_size: ClassVar[bool] = True

    def check(self, x: Tensor, sizes: Tensor | None) -> None:
        _crop_size(self.size, x, sizes, type(self).__name__)

    def warp(self, x: Tensor, p: Params, sizes: Tensor | None, nearest: bool, fill: float) -> Tensor:
        oh, ow = pair(self.size)
        start = p["start"].to(x.device)
        return _gather_window(x, start[:, 0], start[:, 1], oh, ow)

    def geometry(self, p: Params, hw: Tensor) -> Geometry:
        oh, ow = pair(self.size)
        start = p["start"].double().cpu()
        m = _affine([[1, 0, -start[:, 1]], [0, 1, -start[:, 0]]], len(hw))
        return Geometry(m, torch.tensor([[float(oh), float(ow)]], dtype=torch.float64).expand(len(hw), 2))


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


def _gather_window(x: Tensor, y0: Tensor, x0: Tensor, oh: int, ow: int) -> Tensor:
    rows = y0[:, None] + torch.arange(oh, device=x.device)
    cols = x0[:, None] + torch.arange(ow, device=x.device)
    x4, lead = _as4d(x)
    return _gather(x4, rows, cols).reshape(x.shape[0], *lead[1:], oh, ow)


@dataclass(frozen=True)
class _Flip(_Geometric):
    """Mirror along ``_axis`` with probability ``p``, per sample."""

    p: float = 0.5
    _axis: ClassVar[int]  # -1: left-right (sizes column 1, W), -2: top-bottom (column 0, H)

    def draw(self, g: torch.Generator, hw: Tensor) -> Params:
        return {"flip": torch.rand(hw.shape[0], generator=g, device=g.device) < self.p}

    def warp(self, x: Tensor, p: Params, sizes: Tensor | None, nearest: bool, fill: float) -> Tensor:
        flip = p["flip"].to(x.device)
        if sizes is not None:
            return _flip_inside(x, flip, sizes[:, self._axis + 2], axis=self._axis)
        return torch.where(flip.view(-1, *([1] * (x.dim() - 1))), x.flip(self._axis), x)

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
class Resize(_Geometric):
    """Resize every image (each from its own size) to exactly ``size`` (H, W), bilinear, no antialiasing."""

    size: int | tuple[int, int]
    fixed_size: ClassVar[bool] = True

    def warp(self, x: Tensor, p: Params, sizes: Tensor | None, nearest: bool, fill: float) -> Tensor:
        x4, lead = _as4d(x)
        b, _, hc, wc = x4.shape
        oh, ow = pair(self.size)
        one = torch.ones(b, device=x.device)
        fw, fh, limit = one, one, None
        if sizes is not None:
            h, w = sizes[:, 0].float(), sizes[:, 1].float()
            fw, fh = w / wc, h / hc
            limit = ((2 * w - 1.002) / wc - 1, (2 * h - 1.002) / hc - 1)
        return _resample(x4, fw, fh, fw / 2, fh / 2, oh, ow, limit, nearest).reshape(b, *lead[1:], oh, ow)

    def geometry(self, p: Params, hw: Tensor) -> Geometry:
        oh, ow = pair(self.size)
        m = _affine([[ow / hw[:, 1], 0, 0], [0, oh / hw[:, 0], 0]], len(hw))
        return Geometry(m, torch.tensor([[float(oh), float(ow)]], dtype=torch.float64).expand(len(hw), 2))


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
    """Rotate by U(-degrees, degrees) (counterclockwise as seen) and scale by U(scale) about the image
    centre, then shift by U(-t, t) of the width and height (``translate`` = (tx, ty) fractions),
    per sample, with probability ``p`` (otherwise the identity). Bilinear; ``fill`` where the output
    shows what was outside the image. The image keeps its size.
    """

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
            out = _sample(x4, grid, nearest)
        outside = torch.full((), fill, dtype=out.dtype, device=x.device)
        if sizes is not None:  # the canvas padding beyond each image stays 0
            inside = _mask(sizes, hc, wc, torch.bool)
            outside = torch.where(inside, outside, torch.zeros_like(outside))
        return torch.where(valid.unsqueeze(1), out, outside).reshape(b, *lead[1:], hc, wc)


# RGB <-> YIQ: hue is a rotation of the IQ plane (the same model DALI's color_twist uses).
RGB2YIQ = torch.tensor([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
YIQ2RGB = torch.linalg.inv(RGB2YIQ)


@dataclass(frozen=True)
class ColorJitter(_Op):
    """Per-sample brightness, contrast and saturation factors drawn from ``[1-v, 1+v]`` and a hue
    rotation from ``[-hue, hue]`` turns (``hue <= 0.5``), applied in that order. RGB only."""

    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0
    hue: float = 0.0

    def __post_init__(self) -> None:
        if min(self.brightness, self.contrast, self.saturation, self.hue) < 0 or self.hue > 0.5:
            raise ValueError("ColorJitter values must be >= 0 and hue <= 0.5")

    def check(self, x: Tensor, sizes: Tensor | None) -> None:
        if x.dim() != 4 or x.shape[1] != 3:
            raise ValueError(f"ColorJitter needs RGB batches (B, 3, H, W), got {tuple(x.shape)}")

    def draw(self, g: torch.Generator, hw: Tensor) -> Params:
        b, p = hw.shape[0], {}
        for name in ("brightness", "contrast", "saturation"):
            v = getattr(self, name)
            if v:
                p[name] = _uniform(g, b, max(0.0, 1 - v), 1 + v)
        if self.hue:
            p["hue"] = _uniform(g, b, -self.hue, self.hue) * 2 * math.pi
        return p

    def image(self, x: Tensor, p: Params, sizes: Tensor | None) -> Tensor:
        b = x.shape[0]

        def factor(name: str) -> Tensor:
            return p[name].to(x.device, x.dtype).view(b, 1, 1, 1)

        if "brightness" in p:
            x = (x * factor("brightness")).clamp(0, 1)
        if "contrast" in p:
            if sizes is None:
                mean = _gray(x).mean(dim=(1, 2, 3), keepdim=True)
                x = ((x - mean) * factor("contrast") + mean).clamp(0, 1)
            else:  # the mean of each image, and its padding left at 0
                inside = _mask(sizes, x.shape[2], x.shape[3], x.dtype)
                area = (sizes[:, 0] * sizes[:, 1]).to(x.dtype).view(b, 1, 1, 1)
                mean = (_gray(x) * inside).sum(dim=(1, 2, 3), keepdim=True) / area
                x = ((x - mean) * factor("contrast") + mean).clamp(0, 1) * inside
        if "saturation" in p:
            gray = _gray(x)
            x = ((x - gray) * factor("saturation") + gray).clamp(0, 1)
        if "hue" in p:
            x = _rotate_hue(x, p["hue"].to(x.device, x.dtype)).clamp(0, 1)
        return x


def _gray(x: Tensor) -> Tensor:
    return (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3])


def _rotate_hue(x: Tensor, angle: Tensor) -> Tensor:
    c, s = torch.cos(angle), torch.sin(angle)
    b = x.shape[0]
    rot = torch.zeros(b, 3, 3, device=x.device, dtype=x.dtype)
    rot[:, 0, 0] = 1
    rot[:, 1, 1], rot[:, 1, 2] = c, -s
    rot[:, 2, 1], rot[:, 2, 2] = s, c
    m = YIQ2RGB.to(x.device, x.dtype) @ rot @ RGB2YIQ.to(x.device, x.dtype)  # (B, 3, 3)
    return torch.einsum("bij,bjhw->bihw", m, x)


def child_seed(g: torch.Generator) -> Tensor:
    """One draw from ``g`` that seeds a generator elsewhere (GaussianNoise's, on the batch's device)."""
    return torch.randint(0, 2**62, (1,), generator=g, device=g.device)


@dataclass(frozen=True)
class GaussianNoise(_Op):
    """Add noise with standard deviation ``std`` (in the batch's units: [0, 1] for images).

    The noise comes from a generator on the batch's device seeded by one draw from the batch's
    generator (the DALI backend draws its noise inside DALI)."""

    std: float

    def draw(self, g: torch.Generator, hw: Tensor) -> Params:
        return {"seed": child_seed(g)}

    def image(self, x: Tensor, p: Params, sizes: Tensor | None) -> Tensor:
        g = torch.Generator(device=x.device)
        g.manual_seed(int(p["seed"]))
        noise = torch.randn(x.shape, generator=g, device=x.device, dtype=x.dtype)
        if sizes is not None and x.dim() == 4:
            noise = noise * _mask(sizes, x.shape[2], x.shape[3], x.dtype)
        return x + self.std * noise


@dataclass(frozen=True)
class Normalize(_Op):
    """``(x - mean) / std`` per channel (axis 1)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def image(self, x: Tensor, p: Params, sizes: Tensor | None) -> Tensor:
        """Padding becomes ``-mean / std``: a stored 0 normalised like the pixels (as in the DALI backend)."""
        shape = (1, -1) + (1,) * (x.dim() - 2)
        mean = torch.tensor(self.mean, device=x.device, dtype=x.dtype).view(shape)
        std = torch.tensor(self.std, device=x.device, dtype=x.dtype).view(shape)
        return (x - mean) / std

    def into(self, x: Tensor, out: Tensor) -> Tensor:
        """The same, written into ``out`` (a view's slice of a stacked batch: no copy to stack it)."""
        shape = (1, -1) + (1,) * (x.dim() - 2)
        torch.sub(x, torch.tensor(self.mean, device=x.device, dtype=x.dtype).view(shape), out=out)
        return out.div_(torch.tensor(self.std, device=x.device, dtype=x.dtype).view(shape))


Op = Union[RandomResizedCrop, RandomCrop, CenterCrop, HorizontalFlip, VerticalFlip, Resize, Pad, RandomAffine,
           ColorJitter, GaussianNoise, Normalize]

_BUILTIN = (RandomResizedCrop, RandomCrop, CenterCrop, HorizontalFlip, VerticalFlip, Resize, Pad, RandomAffine,
            ColorJitter, GaussianNoise, Normalize)
CROPS = (RandomResizedCrop, RandomCrop, CenterCrop)  # crops: ops whose output has one size (so does Resize)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _builtin(op: Any) -> bool:
    return type(op) in _BUILTIN  # a subclass may override apply without sizes: treated as an op of your own


@dataclass(frozen=True)
class Augment:
    """An augmentation pipeline: ``ops`` applied in order to each field in ``fields``.

    ``fields=None`` means the image fields (uint8 HWC) when the dataset has any, else every
    floating-point field with at least two axes per sample. ``targets``: fields that move with the
    image ({name: Keypoints(...) | Boxes(...) | Mask() | Custom(...)}): every geometric op
    transforms them with the image's own random draw; then exactly one image field is augmented.
    Ops of your own (an object with ``apply(x, g)``) must not move pixels when targets are declared.

    ``fields`` may give each field's kind, ``{"x": "sequence"}`` ("image", "sequence", "array"; sequence
    ops: fastdata.seqaug). ``views``: a number of views made with ``ops``, or one list of ops (or an
    ``Augment`` of ops only) per view; ``mix``: MixUp/CutMix after the ops (fastdata.mixing). How
    views appear in the batch, and the draw order: fastdata/views.py, docs/augment.md.
    """

    ops: tuple[Op, ...] = ()
    fields: tuple[str, ...] | Mapping[str, str] | None = None
    targets: Mapping[str, Target] = field(default_factory=dict, hash=False)
    views: int | tuple[tuple[Any, ...], ...] = 1
    mix: Mix | None = None
    kinds: Mapping[str, str] = field(default_factory=dict, init=False, hash=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "targets", dict(self.targets))
        if isinstance(self.fields, Mapping):
            bad = {k: v for k, v in self.fields.items() if v not in ("image", "sequence", "array")}
            if bad:
                raise UsageError(f"field kinds must be 'image', 'sequence' or 'array', not {bad}")
            object.__setattr__(self, "kinds", dict(self.fields))
        if self.fields is not None:
            object.__setattr__(self, "fields", tuple(self.fields))
        object.__setattr__(self, "views", _views(self.views, self.ops))
        if self.mix is not None:
            if not isinstance(self.mix, Mix):
                raise TypeError(f"mix must be a fastdata.mixing.Mix, not {self.mix!r}")
            if len(self.view_ops) > 1:
                raise UsageError("Mix with several views is not supported: mix one view, or make views without mix")
            self.mix.check_targets(dict(self.targets))
        self.op_kind  # noqa: B018 - raises on a list mixing image and sequence ops
        for op in (op for ops in self.view_ops for op in ops):
            if not hasattr(op, "apply"):
                raise TypeError(f"not an augmentation op: {op!r}")
        for name, t in self.targets.items():
            if not isinstance(t, (Keypoints, Boxes, Mask, Custom)):
                raise TypeError(f"target {name!r} must be Keypoints, Boxes, Mask or Custom, not {t!r}")
        if self.fields is not None:
            both = sorted(set(self.fields) & set(self.targets))
            if both:
                raise UsageError(f"{both[0]!r} is both an augmented image field and a target")

    @property
    def view_ops(self) -> tuple[tuple[Any, ...], ...]:
        """Each view's ops (one view: ``(ops,)``)."""
        return (self.ops,) * self.views if isinstance(self.views, int) else self.views

    @property
    def op_kind(self) -> str:
        """"sequence" when the ops are sequence ops (fastdata.seqaug), else "image"."""
        return ops_kind(tuple(op for ops in self.view_ops for op in ops))

    @property
    def enabled_ops(self) -> bool:
        """Some view has an op."""
        return any(self.view_ops)

    @property
    def enabled(self) -> bool:
        """Anything to do: ops, several views or mixing."""
        return self.enabled_ops or len(self.view_ops) > 1 or self.mix is not None

    def __call__(self, x: Tensor, g: torch.Generator, sizes: Tensor | None = None) -> Tensor:
        """Apply the ops in order; ``sizes``: (B, 2) true (H, W) of top-left images in a padded batch
        (ops of your own see the padded batch)."""
        if len(self.view_ops) > 1 or self.mix is not None:
            raise UsageError("calling an Augment applies its ops to one tensor; views and mix need the batch: "
                             "fastdata.views.augment_batch(augment, batch, g)")
        return self.run({"": x}, g, "", sizes, targets=False)[""]

    def run(self, batch: dict[str, Tensor], g: torch.Generator, image: str | None, sizes: Tensor | None = None,
            hw: Tensor | None = None, targets: bool = True, ops: Sequence[Any] | None = None,
            into: Tensor | None = None) -> dict[str, Tensor]:
        """Augment ``batch[image]`` (float (B, C, H, W)) and the declared targets in ``batch`` with
        one draw per op; returns the batch with them replaced (and ``<boxes>_valid`` added).

        ``image=None``: the targets alone, with the draws the image would have had: ``hw`` gives
        the images' (B, 2) sizes (the DALI backend transforms the image itself). ``into``: where a final
        ``Normalize`` writes the image when the shapes match (fastdata.views stacks views so).
        """
        x = batch[image] if image is not None else None
        if x is not None:
            hw = image_hw(x, sizes, g.device)
        elif hw is None:
            raise ValueError("Augment.run without an image needs hw, the images' sizes")
        else:
            hw = hw.to(g.device).float()
        out = dict(batch)
        chain = list(self.ops if ops is None else ops)
        work = _Targets(self.targets if targets else {}, out, x)
        for k, op in enumerate(chain):
            if not _builtin(op):
                if x is None:
                    raise UsageError(f"{op!r} is not a built-in op: it cannot run without the image")
                canvas = x.shape[-2:]
                x = op.apply(x, g)
                if x.shape[-2:] != canvas:
                    if work.active:
                        raise UsageError(f"{type(op).__name__} changed the image size; declared targets cannot "
                                         "follow an op of your own that moves pixels")
                    sizes = None  # resized by your op: the true sizes are unknown from here on
                    hw = image_hw(x, None, g.device)
                continue
            if x is not None:
                op.check(x, sizes)
            p = op.draw(g, hw)
            if x is not None:
                last = k == len(chain) - 1 and type(op) is Normalize and into is not None and into.shape == x.shape
                x = op.into(x, into) if last else op.image(x, p, sizes)
            if isinstance(op, _Geometric):
                if work.active:
                    work.apply(op, p, hw, sizes)
                if op.fixed_size:
                    sizes = None
                    hw = op.geometry(p, hw.double().cpu()).hw.to(g.device, torch.float32)
                else:
                    sizes = op.out_sizes(sizes) if sizes is not None else None
                    hw = op.out_sizes(hw)
        if x is not None:
            out[image] = x  # type: ignore[index]
            _update_shapes(out, image + SHAPE_SUFFIX, hw)  # type: ignore[operator]
        work.finish(out)
        return out


def _views(views: Any, ops: tuple[Any, ...]) -> int | tuple[tuple[Any, ...], ...]:
    """``views`` as a count, or one tuple of ops per view (from lists of ops or Augments of ops only)."""
    if isinstance(views, bool) or not isinstance(views, (int, Sequence)) or isinstance(views, str):
        raise UsageError(f"views must be a number of views or a list of augmentations, not {views!r}")
    if isinstance(views, int):
        if views < 1:
            raise UsageError(f"views must be >= 1, not {views}")
        return views
    if ops:
        raise UsageError("give the ops either as ops= (the same for every view) or in views=[...], not both")
    out = []
    for v in views:
        if isinstance(v, Augment):
            if v.fields is not None or v.targets or v.mix is not None or v.view_ops != (v.ops,):
                raise UsageError("a view is ops only: give fields, targets and mix to the outer Augment")
            v = v.ops
        out.append(tuple(v))
    if not out:
        raise UsageError("views=[] has no view")
    return tuple(out)


def shapes_after(ops: Sequence[Any], shapes: Tensor) -> Tensor:
    """``<image>_shape`` rows ((B, 3): H, W, C) after the built-in ``ops``, for the DALI backend (the torch backend
    follows the images themselves): no random draw changes a size; crops and Resize give theirs, Pad adds its
    borders, the other ops keep it."""
    hw = shapes[:, :2]
    for op in ops:
        if _builtin(op) and isinstance(op, _Geometric):
            hw = torch.tensor(pair(op.size)).to(hw).expand(len(hw), 2) if op.fixed_size else op.out_sizes(hw)  # type: ignore[attr-defined]
    out = shapes.clone()
    out[:, :2] = hw
    return out


def _update_shapes(batch: dict[str, Tensor], name: str, hw: Tensor) -> None:
    """Set the (H, W) columns of the ``<image>_shape`` field, if the batch has one, to the sizes after the ops
    (``hw``, (B, 2)), so the field describes the images it comes with; other columns (channels) are kept."""
    shapes = batch.get(name)
    if shapes is None or shapes.dim() != 2 or shapes.shape[1] < 2:
        return
    shapes = shapes.clone()
    shapes[:, :2] = hw.round().to(shapes.device, shapes.dtype)
    batch[name] = shapes


class _Targets:
    """The declared targets while a chain runs: working copies, updated op by op."""

    def __init__(self, targets: Mapping[str, Target], batch: dict[str, Tensor], x: Tensor | None) -> None:
        self.targets = targets
        self.active = bool(targets)
        self.values: dict[str, Tensor] = {}
        self.valid: dict[str, Tensor] = {}
        self.layout: dict[str, tuple[str, torch.Size]] = {}
        for name, t in targets.items():
            if name not in batch:
                raise UsageError(f"target field {name!r} is not in the batch (fields: {sorted(batch)})")
            v = batch[name]
            if isinstance(t, Keypoints):
                t.check(name, v)
                self.values[name] = v if v.is_floating_point() else v.float()
            elif isinstance(t, Boxes):
                t.check(name, v)
                self.values[name] = t.to_xyxy(v)
                n = v.shape[1]
                lengths = batch.get(name + LENGTHS_SUFFIX)
                rows = torch.arange(n, device=v.device).view(1, n)
                self.valid[name] = rows < lengths.view(-1, 1) if lengths is not None else \
                    torch.ones(v.shape[:2], dtype=torch.bool, device=v.device)
            elif isinstance(t, Mask):
                self.values[name] = self._mask_in(name, v, x)
            else:
                self.values[name] = v

    def _mask_in(self, name: str, v: Tensor, x: Tensor | None) -> Tensor:
        """The mask as (B, C, H, W), remembering how it came."""
        canvas = x.shape[-2:] if x is not None else None
        if v.dim() == 3 and (canvas is None or v.shape[1:] == canvas):
            self.layout[name] = ("HW", v.shape)
            return v.unsqueeze(1)
        if v.dim() == 4 and (canvas is None and v.shape[-1] <= 4 or canvas is not None and v.shape[1:3] == canvas):
            self.layout[name] = ("HWC", v.shape)
            return v.permute(0, 3, 1, 2)
        if v.dim() == 4 and (canvas is None or v.shape[2:] == canvas):
            self.layout[name] = ("CHW", v.shape)
            return v
        raise UsageError(f"mask field {name!r} has shape {tuple(v.shape)}; it must be (B, H, W), (B, H, W, C) "
                         f"or (B, C, H, W) with the image's (H, W) {tuple(canvas) if canvas is not None else ''}")

    def apply(self, op: _Geometric, p: Params, hw: Tensor, sizes: Tensor | None) -> None:
        geo = op.geometry(p, hw.double().cpu())
        for name, t in self.targets.items():
            v = self.values[name]
            if isinstance(t, Keypoints):
                self.values[name] = t.transform(v, geo)
            elif isinstance(t, Boxes):
                self.values[name], self.valid[name] = t.transform(v, self.valid[name], geo)
            elif isinstance(t, Mask):
                self.values[name] = op.warp(v, p, sizes, nearest=True, fill=t.fill)
            else:
                self.values[name] = t.transform(name, v, geo)

    def finish(self, batch: dict[str, Tensor]) -> None:
        for name, t in self.targets.items():
            v = self.values[name]
            if isinstance(t, Boxes):
                batch[name] = t.from_xyxy(v).to(batch[name].dtype if batch[name].is_floating_point()
                                                else torch.float32)
                batch[name + VALID_SUFFIX] = self.valid[name]
            elif isinstance(t, Mask):
                kind, _ = self.layout[name]
                batch[name] = v[:, 0] if kind == "HW" else v.permute(0, 2, 3, 1) if kind == "HWC" else v
            else:
                batch[name] = v


def batch_generator(seed: int, epoch: int, batch: int, device: torch.device, rank: int = 0) -> torch.Generator:
    """The generator for one batch: a pure function of (seed, epoch, rank, batch index) (fastdata.seeds),
    so resumes repeat it and distributed ranks draw different parameters. The loaders draw on the CPU
    (``device="cpu"``), so the torch and DALI backends draw the same parameters."""
    g = torch.Generator(device=device)
    g.manual_seed(int_seed(seed, epoch, Stream.AUGMENT, rank, batch))
    return g
