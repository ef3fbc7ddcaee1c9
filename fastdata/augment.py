"""Batched augmentation on the device: per-sample random parameters from a seeded generator.

A pipeline is a tuple of small frozen dataclasses (the declarative spec), so the DALI backend
can map the same spec to its own operators. Every op takes a float batch ``(B, C, H, W)``
(more leading axes are folded into C) and a ``torch.Generator`` on the batch's device, and
draws one set of parameters per sample. Images arrive as floats in [0, 1].

A batch of images of mixed sizes arrives padded to its largest (H, W), each image at the
top-left, with ``sizes`` ((B, 2) true heights and widths): the built-in ops then treat each
image at its own size (crops and flips stay inside it, contrast and noise ignore the padding), as
the DALI backend does. After a crop every image has the crop's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Sequence, Union, cast

import torch
import torch.nn.functional as F

from .errors import UsageError
from .seeds import Stream, int_seed

Tensor = torch.Tensor


def _uniform(g: torch.Generator, b: int, lo: float, hi: float, device: torch.device) -> Tensor:
    return torch.rand(b, generator=g, device=device) * (hi - lo) + lo


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


@dataclass(frozen=True)
class RandomResizedCrop:
    """Crop a random area fraction in ``scale`` with aspect ratio in ``ratio``, resize to ``size``.

    Crops that would not fit are clamped to the image (no retry loop), bilinear resampling.
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def apply(self, x: Tensor, g: torch.Generator, sizes: Tensor | None = None) -> Tensor:
        x4, lead = _as4d(x)
        b, _, hc, wc = x4.shape
        oh, ow = pair(self.size)
        dev = x.device
        h: Tensor | int = hc
        w: Tensor | int = wc
        if sizes is not None:
            h, w = sizes[:, 0].float(), sizes[:, 1].float()
        area = _uniform(g, b, *self.scale, dev)
        logr = _uniform(g, b, math.log(self.ratio[0]), math.log(self.ratio[1]), dev)
        r = torch.exp(logr)
        # crop width and height as fractions of the image: area = fw * fh * (w*h), fw*w / (fh*h) = r
        fw = torch.sqrt(area * r * h / w).clamp(max=1.0)
        fh = torch.sqrt(area / r * w / h).clamp(max=1.0)
        cx = (torch.rand(b, generator=g, device=dev) * (1 - fw)) + fw / 2  # centre in [0, 1]
        cy = (torch.rand(b, generator=g, device=dev) * (1 - fh)) + fh / 2
        limit = None
        if sizes is not None:  # fractions of each image -> of the padded canvas
            fw, cx, fh, cy = fw * w / wc, cx * w / wc, fh * h / hc, cy * h / hc
            # each image's last pixel centre, pulled in by 1/1000 pixel: float rounding must not
            # give the padding beyond it any bilinear weight
            limit = ((2 * w - 1.002) / wc - 1, (2 * h - 1.002) / hc - 1)
        return _resample(x4, fw, fh, cx, cy, oh, ow, cast("tuple[Tensor, Tensor] | None", limit)).reshape(b, *lead[1:], oh, ow)


def _resample(x4: Tensor, fw: Tensor, fh: Tensor, cx: Tensor, cy: Tensor, oh: int, ow: int,
              limit: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Bilinear resampling of the boxes (centre, size as fractions of the canvas) to (oh, ow);
    ``limit``: the largest grid x, y per sample (sampling clamps there, as at the canvas border)."""
    b = x4.shape[0]
    theta = torch.zeros(b, 2, 3, device=x4.device, dtype=torch.float32)
    theta[:, 0, 0] = fw
    theta[:, 0, 2] = cx * 2 - 1
    theta[:, 1, 1] = fh
    theta[:, 1, 2] = cy * 2 - 1
    grid = F.affine_grid(theta, [b, x4.shape[1], oh, ow], align_corners=False)
    if limit is not None:
        grid = torch.minimum(grid, torch.stack(limit, dim=1).to(grid.dtype).view(b, 1, 1, 2))
    return F.grid_sample(x4.float(), grid.to(x4.dtype if x4.is_floating_point() else torch.float32),
                         mode="bilinear", padding_mode="border", align_corners=False).to(x4.dtype)


@dataclass(frozen=True)
class RandomCrop:
    """Crop a random ``size`` window (per sample), no resampling."""

    size: int | tuple[int, int]

    def apply(self, x: Tensor, g: torch.Generator, sizes: Tensor | None = None) -> Tensor:
        oh, ow = _crop_size(self.size, x, sizes, "RandomCrop")
        b, h, w = x.shape[0], x.shape[-2], x.shape[-1]
        if sizes is not None:
            room = sizes - torch.tensor([oh, ow], device=sizes.device) + 1  # positions per axis
            u = torch.rand(b, 2, generator=g, device=x.device)
            start = torch.minimum((u * room).long(), room - 1)
            return _gather_window(x, start[:, 0], start[:, 1], oh, ow)
        y0 = torch.randint(0, h - oh + 1, (b,), generator=g, device=x.device)
        x0 = torch.randint(0, w - ow + 1, (b,), generator=g, device=x.device)
        return _gather_window(x, y0, x0, oh, ow)


@dataclass(frozen=True)
class CenterCrop:
    """Crop the central ``size`` window."""

    size: int | tuple[int, int]

    def apply(self, x: Tensor, g: torch.Generator, sizes: Tensor | None = None) -> Tensor:
        oh, ow = _crop_size(self.size, x, sizes, "CenterCrop")
        if sizes is not None:
            return _gather_window(x, (sizes[:, 0] - oh) // 2, (sizes[:, 1] - ow) // 2, oh, ow)
        top, left = (x.shape[-2] - oh) // 2, (x.shape[-1] - ow) // 2
        return x[..., top : top + oh, left : left + ow]


def _gather_window(x: Tensor, y0: Tensor, x0: Tensor, oh: int, ow: int) -> Tensor:
    b = x.shape[0]
    rows = (y0[:, None] + torch.arange(oh, device=x.device)).view(b, 1, oh, 1)
    cols = (x0[:, None] + torch.arange(ow, device=x.device)).view(b, 1, 1, ow)
    x4, lead = _as4d(x)
    idx_b = torch.arange(b, device=x.device).view(b, 1, 1, 1)
    idx_c = torch.arange(x4.shape[1], device=x.device).view(1, -1, 1, 1)
    return x4[idx_b, idx_c, rows, cols].reshape(b, *lead[1:], oh, ow)


@dataclass(frozen=True)
class _Flip:
    """Mirror along ``_axis`` with probability ``p``, per sample."""

    p: float = 0.5
    _axis: ClassVar[int]  # -1: left-right (sizes column 1, W), -2: top-bottom (column 0, H)

    def apply(self, x: Tensor, g: torch.Generator, sizes: Tensor | None = None) -> Tensor:
        flip = torch.rand(x.shape[0], generator=g, device=x.device) < self.p
        if sizes is not None:
            return _flip_inside(x, flip, sizes[:, self._axis + 2], axis=self._axis)
        return torch.where(flip.view(-1, *([1] * (x.dim() - 1))), x.flip(self._axis), x)


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


# RGB <-> YIQ: hue is a rotation of the IQ plane (the same model DALI's color_twist uses).
RGB2YIQ = torch.tensor([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
YIQ2RGB = torch.linalg.inv(RGB2YIQ)


@dataclass(frozen=True)
class ColorJitter:
    """Per-sample brightness, contrast and saturation factors drawn from ``[1-v, 1+v]`` and a hue
    rotation from ``[-hue, hue]`` turns (``hue <= 0.5``), applied in that order. RGB only."""

    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0
    hue: float = 0.0

    def __post_init__(self) -> None:
        if min(self.brightness, self.contrast, self.saturation, self.hue) < 0 or self.hue > 0.5:
            raise ValueError("ColorJitter values must be >= 0 and hue <= 0.5")

    def apply(self, x: Tensor, g: torch.Generator, sizes: Tensor | None = None) -> Tensor:
        if x.dim() != 4 or x.shape[1] != 3:
            raise ValueError(f"ColorJitter needs RGB batches (B, 3, H, W), got {tuple(x.shape)}")
        b, dev = x.shape[0], x.device

        def factor(v: float) -> Tensor:
            return _uniform(g, b, max(0.0, 1 - v), 1 + v, dev).view(b, 1, 1, 1)

        if self.brightness:
            x = (x * factor(self.brightness)).clamp(0, 1)
        if self.contrast:
            if sizes is None:
                mean = _gray(x).mean(dim=(1, 2, 3), keepdim=True)
                x = ((x - mean) * factor(self.contrast) + mean).clamp(0, 1)
            else:  # the mean of each image, and its padding left at 0
                inside = _mask(sizes, x.shape[2], x.shape[3], x.dtype)
                area = (sizes[:, 0] * sizes[:, 1]).to(x.dtype).view(b, 1, 1, 1)
                mean = (_gray(x) * inside).sum(dim=(1, 2, 3), keepdim=True) / area
                x = ((x - mean) * factor(self.contrast) + mean).clamp(0, 1) * inside
        if self.saturation:
            gray = _gray(x)
            x = ((x - gray) * factor(self.saturation) + gray).clamp(0, 1)
        if self.hue:
            angle = _uniform(g, b, -self.hue, self.hue, dev) * 2 * math.pi
            x = _rotate_hue(x, angle).clamp(0, 1)
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


@dataclass(frozen=True)
class GaussianNoise:
    """Add noise with standard deviation ``std`` (in the batch's units: [0, 1] for images)."""

    std: float

    def apply(self, x: Tensor, g: torch.Generator, sizes: Tensor | None = None) -> Tensor:
        noise = torch.randn(x.shape, generator=g, device=x.device, dtype=x.dtype)
        if sizes is not None and x.dim() == 4:
            noise = noise * _mask(sizes, x.shape[2], x.shape[3], x.dtype)
        return x + self.std * noise


@dataclass(frozen=True)
class Normalize:
    """``(x - mean) / std`` per channel (axis 1)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def apply(self, x: Tensor, g: torch.Generator, sizes: Tensor | None = None) -> Tensor:
        """Padding becomes ``-mean / std``: a stored 0 normalised like the pixels (as in the DALI backend)."""
        shape = (1, -1) + (1,) * (x.dim() - 2)
        mean = torch.tensor(self.mean, device=x.device, dtype=x.dtype).view(shape)
        std = torch.tensor(self.std, device=x.device, dtype=x.dtype).view(shape)
        return (x - mean) / std


Op = Union[RandomResizedCrop, RandomCrop, CenterCrop, HorizontalFlip, VerticalFlip, ColorJitter, GaussianNoise, Normalize]

_BUILTIN = (RandomResizedCrop, RandomCrop, CenterCrop, HorizontalFlip, VerticalFlip, ColorJitter, GaussianNoise,
            Normalize)
CROPS = (RandomResizedCrop, RandomCrop, CenterCrop)  # ops whose output has one size

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Augment:
    """An augmentation pipeline: ``ops`` applied in order to each field in ``fields``.

    ``fields=None`` means the image fields (uint8 HWC) when the dataset has any, else every
    floating-point field with at least two axes per sample.
    """

    ops: tuple[Op, ...] = ()
    fields: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        for op in self.ops:
            if not hasattr(op, "apply"):
                raise TypeError(f"not an augmentation op: {op!r}")

    def __call__(self, x: Tensor, g: torch.Generator, sizes: Tensor | None = None) -> Tensor:
        """Apply the ops in order; ``sizes``: (B, 2) true (H, W) of top-left images in a padded batch
        (ops of your own see the padded batch)."""
        for op in self.ops:
            if sizes is None:
                x = op.apply(x, g)
            elif type(op) in _BUILTIN:  # (a subclass may override apply without sizes)
                x = op.apply(x, g, sizes)
                if type(op) in CROPS:
                    sizes = None  # every image now has the crop's size
            else:
                canvas = x.shape[-2:]
                x = op.apply(x, g)
                if x.shape[-2:] != canvas:
                    sizes = None  # resized by your op: the true sizes are unknown from here on
        return x


def batch_generator(seed: int, epoch: int, batch: int, device: torch.device, rank: int = 0) -> torch.Generator:
    """The generator for one batch: a pure function of (seed, epoch, rank, batch index) (fastdata.seeds),
    so resumes repeat it and distributed ranks draw different parameters."""
    g = torch.Generator(device=device)
    g.manual_seed(int_seed(seed, epoch, Stream.AUGMENT, rank, batch))
    return g
