"""Colour and value ops: ColorJitter, GaussianNoise, Normalize (no pixel moves)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fastdata.augment.base import Params, Tensor, _mask, _Op, _uniform, child_seed, seeded_noise

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
