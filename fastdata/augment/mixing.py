"""MixUp and CutMix for a whole batch on the device, with the label mixing timm and torchvision use: one
draw per batch, sample i mixed with sample i - 1 (docs/augment.md, "MixUp and CutMix")."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fastdata.augment.targets import VALID_SUFFIX, Boxes, Mask, Target
from fastdata.errors import UsageError
from fastdata.format.spec import LENGTHS_SUFFIX

Tensor = torch.Tensor


@dataclass(frozen=True)
class MixDraw:
    """What one batch got: whether it was mixed, how, the kept fraction and the pasted box (fractions
    of the image: x0, y0, x1, y1; CutMix only)."""

    mixed: bool
    cutmix: bool
    lam: float
    box: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def pixel_box(self, h: int, w: int) -> tuple[int, int, int, int]:
        """The pasted box in pixels (x0, y0, x1, y1) of an (h, w) image."""
        x0, y0, x1, y1 = self.box
        return round(x0 * w), round(y0 * h), round(x1 * w), round(y1 * h)


@dataclass(frozen=True)
class Mix:
    """MixUp and CutMix (``Augment(mix=Mix(...))``), after the ops, on the augmented images, ``label`` and targets;
    an alpha of 0 turns one off, ``num_classes`` is needed for integer labels, ``min_visible`` filters CutMix boxes."""

    mixup_alpha: float = 0.8
    cutmix_alpha: float = 1.0
    prob: float = 1.0
    switch_prob: float = 0.5
    label_smoothing: float = 0.0
    num_classes: int | None = None
    label: str = "label"
    min_visible: float = 0.25

    def __post_init__(self) -> None:
        if self.mixup_alpha < 0 or self.cutmix_alpha < 0 or (self.mixup_alpha == 0 and self.cutmix_alpha == 0):
            raise UsageError("Mix needs mixup_alpha > 0 or cutmix_alpha > 0 (both >= 0)")
        if not (0 <= self.prob <= 1 and 0 <= self.switch_prob <= 1 and 0 <= self.label_smoothing < 1):
            raise UsageError("Mix: prob and switch_prob must be in [0, 1], label_smoothing in [0, 1)")

    def draw(self, g: torch.Generator) -> MixDraw:
        """The batch's parameters: 5 uniform draws from ``g`` (always 5, so later draws stay in step)."""
        u = torch.rand(5, generator=g, device=g.device).tolist()
        seed = int(u[2] * 2**53)
        cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha == 0 or u[1] < self.switch_prob)
        alpha = self.cutmix_alpha if cutmix else self.mixup_alpha
        lam = float(np.random.default_rng(seed).beta(alpha, alpha))
        if u[0] >= self.prob:
            return MixDraw(False, False, 1.0)
        if not cutmix:
            return MixDraw(True, False, lam)
        r = math.sqrt(1.0 - lam) / 2  # half the box side, as fractions of the image
        cx, cy = u[3], u[4]
        box = (max(cx - r, 0.0), max(cy - r, 0.0), min(cx + r, 1.0), min(cy + r, 1.0))
        return MixDraw(True, True, lam, box)

    def labels(self, y: Tensor, lam: float) -> Tensor:
        """(B, K) float32 mixed targets from integer (B,) or soft (B, K) labels."""
        if y.is_floating_point() and y.dim() == 2:
            if self.num_classes is not None and y.shape[1] != self.num_classes:
                raise UsageError(f"Mix: the soft labels of {self.label!r} have {y.shape[1]} classes, and "
                                 f"num_classes is {self.num_classes}")
            soft = y.float()
        else:
            if y.dim() != 1 or y.is_floating_point():  # (floats (B,) were cut to integers: 1.7 became class 1)
                raise UsageError(f"label field {self.label!r} must be (batch,) integers or (batch, classes) floats, "
                                 f"got {tuple(y.shape)} {str(y.dtype).replace('torch.', '')}")
            if self.num_classes is None:
                raise UsageError(f"Mix needs num_classes for the integer labels of {self.label!r}")
            lo, hi = (int(v) for v in torch.aminmax(y)) if y.device.type == "cpu" and len(y) else (0, 0)  # (a GPU: sync)
            if lo < 0 or hi >= self.num_classes:
                v = lo if lo < 0 else hi
                raise UsageError(f"Mix: label {v} of field {self.label!r} is not a class 0..{self.num_classes - 1} "
                                 f"(num_classes={self.num_classes}); set num_classes to the dataset's number of classes")
            off = self.label_smoothing / self.num_classes
            soft = torch.full((len(y), self.num_classes), off, device=y.device)
            soft.scatter_(1, y.long().view(-1, 1), 1.0 - self.label_smoothing + off)
        return torch.lerp(soft.roll(1, 0), soft, lam)

    def check_targets(self, targets: dict[str, Target]) -> None:
        """Refuse targets that mixing cannot carry (before anything runs)."""
        for name, t in targets.items():
            if isinstance(t, Boxes):
                continue
            if isinstance(t, Mask) and self.mixup_alpha == 0:
                continue  # CutMix pastes the mask's region too
            what = "a mask (only CutMix can paste it: set mixup_alpha=0)" if isinstance(t, Mask) else \
                f"{type(t).__name__.lower()}"
            raise UsageError(f"Mix cannot carry target {name!r}, {what}: drop it from targets or drop mix")


def mix_images(x: Tensor, d: MixDraw) -> Tensor:
    """The image batch (B, C, H, W) mixed as drawn: CutMix pastes its region in place (the loader's own batch),
    MixUp is one ``lerp`` into a new batch."""
    if not d.mixed or x.shape[0] < 2:
        return x
    if d.cutmix:
        x0, y0, x1, y1 = d.pixel_box(x.shape[-2], x.shape[-1])
        region = x[..., y0:y1, x0:x1]
        region.copy_(region.roll(1, 0))
        return x
    out = torch.empty_like(x)
    torch.lerp(x[:-1], x[1:], d.lam, out=out[1:])  # lam * x[i] + (1 - lam) * x[i - 1]
    torch.lerp(x[-1:], x[:1], d.lam, out=out[:1])
    return out


def mix_mask(v: Tensor, d: MixDraw, hw: tuple[int, int]) -> Tensor:
    """A mask target (B, H, W), (B, H, W, C) or (B, C, H, W) with the pasted region of CutMix."""
    if not d.mixed or v.shape[0] < 2:
        return v
    x0, y0, x1, y1 = d.pixel_box(*hw)
    out = v.clone()
    if v.dim() == 4 and tuple(v.shape[1:3]) == hw and tuple(v.shape[2:]) != hw:
        region = out[:, y0:y1, x0:x1, :]
    else:
        region = out[..., y0:y1, x0:x1]
    region.copy_(region.roll(1, 0))
    return out


def kept_fraction(d: MixDraw, h: int, w: int) -> float:
    """The fraction of each image that is still its own (the label weight): lam, or for CutMix the
    pixel area outside the pasted box."""
    if not d.mixed:
        return 1.0
    if not d.cutmix:
        return d.lam
    x0, y0, x1, y1 = d.pixel_box(h, w)
    return 1.0 - (x1 - x0) * (y1 - y0) / (h * w)


def mix_boxes(batch: dict[str, Tensor], name: str, t: Boxes, d: MixDraw, hw: tuple[int, int],
              min_visible: float) -> None:
    """Boxes after mixing (B, 2N, 4): the sample's own, then the partner's (CutMix: clipped to the pasted region);
    boxes under ``min_visible`` become zeros flagged False in ``<name>_valid`` (``<name>_lengths`` is removed)."""
    v = batch[name]
    xyxy = t.to_xyxy(v)
    valid = batch[name + VALID_SUFFIX] if name + VALID_SUFFIX in batch else t.rows(batch, name)
    other, other_valid = xyxy.roll(1, 0), valid.roll(1, 0)
    if d.cutmix:
        h, w = hw
        x0, y0, x1, y1 = d.pixel_box(h, w)
        region = torch.tensor([x0, y0, x1, y1], dtype=xyxy.dtype, device=xyxy.device)
        area = _area(xyxy)
        covered = _area(_intersect(xyxy, region))
        own_ok = valid & ((area - covered) >= min_visible * area) & (area > 0)
        clipped = _intersect(other, region)
        other_ok = other_valid & (_area(clipped) > 0) & (_area(clipped) >= min_visible * _area(other))
        own, other = xyxy, clipped
    else:
        own_ok, other_ok, own = valid, other_valid, xyxy
    keep = torch.cat([own_ok, other_ok], 1)
    both = torch.where(keep.unsqueeze(-1), torch.cat([own, other], 1), torch.zeros((), dtype=xyxy.dtype,
                                                                                  device=xyxy.device))
    batch[name] = t.from_xyxy(both).to(v.dtype if v.is_floating_point() else torch.float32)
    batch[name + VALID_SUFFIX] = keep
    batch.pop(name + LENGTHS_SUFFIX, None)


def _area(b: Tensor) -> Tensor:
    return (b[..., 2] - b[..., 0]).clamp(min=0) * (b[..., 3] - b[..., 1]).clamp(min=0)


def _intersect(b: Tensor, region: Tensor) -> Tensor:
    lo = torch.maximum(b[..., :2], region[:2])
    hi = torch.minimum(b[..., 2:], region[2:])
    return torch.cat([lo, torch.maximum(hi, lo)], -1)


__all__ = ["Mix", "MixDraw", "kept_fraction", "mix_boxes", "mix_images", "mix_mask"]
