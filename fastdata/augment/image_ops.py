"""The built-in image ops and what they share (per-sample draws, the sequence ops' too; the op protocol;
resampling; the batch generator): the colour and value ops, which move no pixel, and the ops that move pixels
(crops and Resize give every image one size; the flips; Pad and RandomAffine keep or grow the canvas)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Sequence

import torch
import torch.nn.functional as F

from fastdata.augment.targets import Geometry
from fastdata.errors import UsageError
from fastdata.seeds import Stream, int_seed

Tensor = torch.Tensor
Params = dict[str, Tensor]


def _uniform(g: torch.Generator, b: int, lo: float, hi: float) -> Tensor:
    return torch.rand(b, generator=g, device=g.device) * (hi - lo) + lo


def child_seed(g: torch.Generator) -> Tensor:
    """One draw from ``g`` that seeds a generator elsewhere (noise ops', on the batch's device)."""
    return torch.randint(0, 2**62, (1,), generator=g, device=g.device)


def seeded_noise(x: Tensor, seed: Tensor) -> Tensor:
    """N(0, 1) noise like ``x`` from a generator on ``x``'s device seeded ``seed`` (a :func:`child_seed`)."""
    gn = torch.Generator(device=x.device)
    gn.manual_seed(int(seed))
    return torch.randn(x.shape, generator=gn, device=x.device, dtype=x.dtype)


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


def check_fits(op: str, size: tuple[int, int], hw: Tensor) -> None:
    """A fixed-size crop ``size`` must fit inside every image of the batch (``hw``: (B, 2) sizes)."""
    small = [int(v) for v in hw.min(dim=0).values.tolist()] if len(hw) else size
    if size[0] > small[0] or size[1] > small[1]:
        raise UsageError(f"{op}{size} is larger than an image of the batch ({small[0]}x{small[1]}); "
                         "crop to at most the smallest image size")


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
        """Each image's (H, W) after the op ((B, 2), ``sizes``' dtype and device), from its (H, W) before; the one
        place both backends and the crop-decoding reader take it from."""
        return sizes


class _FixedSize(_Geometric):
    """A geometric op whose every output image is ``size`` (crops, Resize)."""

    size: int | tuple[int, int]
    fixed_size: ClassVar[bool] = True

    def out_sizes(self, sizes: Tensor) -> Tensor:
        return torch.tensor(pair(self.size), dtype=sizes.dtype, device=sizes.device).expand(len(sizes), 2)


def _resample(x4: Tensor, fw: Tensor, fh: Tensor, cx: Tensor, cy: Tensor, oh: int, ow: int,
              limit: tuple[Tensor, Tensor] | None = None, nearest: bool = False) -> Tensor:
    """Bilinear (or nearest) resampling of the boxes (centre, size as fractions of the canvas) to
    (oh, ow); ``limit``: the largest grid x, y per sample (sampling clamps there)."""
    b = x4.shape[0]
    lim = limit if limit is not None else (None, None)
    if nearest:  # separable: one source row per output row, one column per column (any dtype, exact)
        hc, wc = x4.shape[-2:]
        cols = _nearest_index(cx * 2 - 1, fw, ow, wc, lim[0])
        rows = _nearest_index(cy * 2 - 1, fh, oh, hc, lim[1])
        return _gather(x4, rows, cols)
    # the sampling grid is separable too: each output column's x and each row's y, broadcast into place
    grid = torch.empty(b, oh, ow, 2, device=x4.device, dtype=torch.float32)
    grid[..., 0] = _grid_line(cx * 2 - 1, fw, ow, lim[0]).view(b, 1, ow)
    grid[..., 1] = _grid_line(cy * 2 - 1, fh, oh, lim[1]).view(b, oh, 1)
    return _sample(x4, grid)


def _grid_line(centre: Tensor, extent: Tensor, n_out: int, limit: Tensor | None) -> Tensor:
    """(B, n_out) normalised grid positions ``centre + extent * o`` of the output pixels' centres along one axis
    (what affine_grid gives for an axis-aligned box), clamped at ``limit``."""
    o = (torch.arange(n_out, device=centre.device, dtype=torch.float32) + 0.5) * (2 / n_out) - 1
    g = centre.float().view(-1, 1) + extent.float().view(-1, 1) * o
    return g if limit is None else torch.minimum(g, limit.float().view(-1, 1))


def _nearest_index(centre: Tensor, extent: Tensor, n_out: int, n_in: int, limit: Tensor | None) -> Tensor:
    """(B, n_out) source pixel of each output pixel along one axis, as grid_sample's nearest mode picks it
    (normalised grid ``centre + extent * o``)."""
    g = _grid_line(centre, extent, n_out, limit)
    return torch.round((g + 1) / 2 * n_in - 0.5).clamp(0, n_in - 1).long()


def _gather(x4: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """(B, C, len(rows), len(cols)): per-sample rows (B, oh) and columns (B, ow) of a (B, C, H, W) batch, the
    rows gathered first, then the columns of those rows only."""
    b, c, _, w = x4.shape
    oh, ow = rows.shape[1], cols.shape[1]
    picked = x4.gather(2, rows.view(b, 1, oh, 1).expand(b, c, oh, w))
    return picked.gather(3, cols.view(b, 1, 1, ow).expand(b, c, oh, ow))


def _sample(x4: Tensor, grid: Tensor) -> Tensor:
    """Bilinear grid_sample in the batch's float dtype (integer images go through float32, rounded back)."""
    work = x4 if x4.is_floating_point() else x4.float()
    out = F.grid_sample(work, grid.to(work.dtype), mode="bilinear", padding_mode="border", align_corners=False)
    return out.to(x4.dtype) if x4.is_floating_point() else out.round().to(x4.dtype)


def batch_generator(seed: int, epoch: int, batch: int, device: torch.device, rank: int = 0) -> torch.Generator:
    """The generator for one batch, a pure function of (seed, epoch, rank, batch index): resumes repeat it
    and ranks draw differently; the loaders draw on the CPU, so both backends draw the same."""
    g = torch.Generator(device=device)
    g.manual_seed(int_seed(seed, epoch, Stream.AUGMENT, rank, batch))
    return g


# -- colour and value ops: no pixel moves --------------------------------------------------------------
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
            x = torch.einsum("bij,bjhw->bihw", hue_matrix(p["hue"].to(x.device, x.dtype)), x).clamp(0, 1)
        return x


def _gray(x: Tensor) -> Tensor:
    return (0.299 * x[:, 0:1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:3])


def hue_matrix(angle: Tensor) -> Tensor:
    """(B, 3, 3) RGB matrices rotating the YIQ plane by ``angle`` (radians), in ``angle``'s dtype."""
    c, s = torch.cos(angle), torch.sin(angle)
    rot = torch.zeros(len(angle), 3, 3, device=angle.device, dtype=angle.dtype)
    rot[:, 0, 0] = 1
    rot[:, 1, 1], rot[:, 1, 2], rot[:, 2, 1], rot[:, 2, 2] = c, -s, s, c
    return YIQ2RGB.to(angle) @ rot @ RGB2YIQ.to(angle)


@dataclass(frozen=True)
class GaussianNoise(_Op):
    """Add noise with standard deviation ``std`` (in the batch's units: [0, 1] for images), from a generator on
    the batch's device seeded by one draw from the batch's generator."""

    std: float

    def draw(self, g: torch.Generator, hw: Tensor) -> Params:
        return {"seed": child_seed(g)}

    def image(self, x: Tensor, p: Params, sizes: Tensor | None) -> Tensor:
        noise = seeded_noise(x, p["seed"])
        if sizes is not None and x.dim() == 4:
            noise = noise * _mask(sizes, x.shape[2], x.shape[3], x.dtype)
        return x + self.std * noise


def _channels_last_cpu(x: Tensor) -> bool:
    """A float 4-D CPU tensor whose memory is (B, H, W, C), densely."""
    return (x.device.type == "cpu" and x.dim() == 4 and x.is_floating_point()
            and x.permute(0, 2, 3, 1).is_contiguous())


@dataclass(frozen=True)
class Normalize(_Op):
    """``(x - mean) / std`` per channel (axis 1)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.mean) != len(self.std) or not self.std or min(self.std) <= 0:
            raise UsageError(f"Normalize needs one std > 0 per mean, got mean={self.mean}, std={self.std}")

    def check(self, x: Tensor, sizes: Tensor | None) -> None:
        if x.dim() > 2 and len(self.mean) not in (1, x.shape[1]):
            raise UsageError(f"Normalize has {len(self.mean)} means and stds for images of {x.shape[1]} channels")

    def image(self, x: Tensor, p: Params, sizes: Tensor | None) -> Tensor:
        """Padding becomes ``-mean / std``: a stored 0 normalised like the pixels (as in the DALI backend)."""
        return self.into(x, torch.empty_like(x))

    def into(self, x: Tensor, out: Tensor) -> Tensor:
        """The same, written into ``out`` (which may be ``x``: the loader's own buffer)."""
        if _channels_last_cpu(x) and _channels_last_cpu(out) and x.shape[1] == len(self.mean):
            return self._into_rows(x, out)
        shape = (1, -1) + (1,) * (x.dim() - 2)
        torch.sub(x, torch.tensor(self.mean, device=x.device, dtype=x.dtype).view(shape), out=out)
        return out.div_(torch.tensor(self.std, device=x.device, dtype=x.dtype).view(shape))

    def _into_rows(self, x: Tensor, out: Tensor) -> Tensor:
        """Channels-last on the CPU: each image row times a row of 1/std plus a row of -mean/std, in one pass
        (a broadcast over the innermost C=3 axis does not vectorise)."""
        b, c, h, w = x.shape
        std = torch.tensor(self.std, dtype=torch.float64)
        scale = (1 / std).repeat(w).to(x.dtype)
        shift = (-torch.tensor(self.mean, dtype=torch.float64) / std).repeat(w).to(x.dtype)
        rows = out.permute(0, 2, 3, 1).view(b * h, w * c)
        return torch.addcmul(shift, x.permute(0, 2, 3, 1).view(b * h, w * c), scale, out=rows).view(
            b, h, w, c).permute(0, 3, 1, 2)


# -- ops that move pixels ------------------------------------------------------------------------------
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
