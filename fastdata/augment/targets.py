"""Targets that move with the image (keypoints, boxes, masks, your own), from each geometric op's
:class:`Geometry`; x right, y down, in pixels: keypoints pixel indices, boxes pixel edges (as COCO)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, Sequence

import torch

from fastdata.errors import UsageError
from fastdata.format.spec import LENGTHS_SUFFIX

Tensor = torch.Tensor
VALID_SUFFIX = "_valid"  # boxes: the (B, N) bool field that says which boxes are still non-empty


@dataclass
class Geometry:
    """What one geometric op did to each sample of a batch."""

    matrix: Tensor  # (B, 3, 3) float64: continuous input pixel coordinates (x, y, 1) -> output
    hw: Tensor  # (B, 2) float64: each output image's (H, W)
    hflip: Tensor | None = None  # (B,) bool: mirrored left-right
    vflip: Tensor | None = None  # (B,) bool: mirrored top-bottom
    angle: Tensor | None = None  # (B,) float64: rotation in degrees, counterclockwise as seen

    @property
    def mirrored(self) -> Tensor | None:
        """(B,) bool: the samples whose handedness changed (left and right swap)."""
        if self.hflip is None and self.vflip is None:
            return None
        h = self.hflip if self.hflip is not None else torch.zeros_like(self.vflip)  # type: ignore[arg-type]
        v = self.vflip if self.vflip is not None else torch.zeros_like(h)
        return h ^ v


def _map(points: Tensor, matrix: Tensor) -> Tensor:
    """(B, ..., 2) float64 points through (B, 3, 3) matrices."""
    b = points.shape[0]
    flat = points.reshape(b, -1, 2)
    out = torch.einsum("bij,bnj->bni", matrix[:, :2, :2], flat) + matrix[:, None, :2, 2]
    return out.reshape(points.shape)


@dataclass(frozen=True)
class Keypoints:
    """A (B, K, D) field, D >= 2: x, y in pixel indices, then e.g. a visibility flag (``visibility``: the column
    zeroed when a point leaves the frame); ``flip_pairs``: (left, right) index pairs swapped on every mirror."""

    flip_pairs: Sequence[tuple[int, int]] = ()
    visibility: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "flip_pairs", tuple((int(a), int(b)) for a, b in self.flip_pairs))
        if self.visibility is not None and self.visibility < 2:
            raise UsageError(f"Keypoints visibility={self.visibility}: columns 0 and 1 are x and y")

    def check(self, name: str, x: Tensor) -> None:
        k = x.shape[1] if x.dim() == 3 else -1
        if x.dim() != 3 or x.shape[2] < 2:
            raise UsageError(f"keypoints field {name!r} must be (batch, K, 2 or more), got {tuple(x.shape)}")
        if self.visibility is not None and self.visibility >= x.shape[2]:
            raise UsageError(f"keypoints field {name!r} has {x.shape[2]} columns, visibility={self.visibility}")
        bad = [p for p in self.flip_pairs if not (0 <= p[0] < k and 0 <= p[1] < k)]
        if bad:
            raise UsageError(f"keypoints field {name!r} has {k} points; flip pair {bad[0]} is out of range")

    def transform(self, kp: Tensor, geo: Geometry) -> Tensor:
        """Map the points (float), mark those that leave the frame invisible, swap pairs where mirrored."""
        m = geo.matrix.to(kp.device)
        xy = _map(kp[..., :2].double() + 0.5, m)  # pixel centre -> continuous coordinates
        kp = kp.clone()
        kp[..., :2] = (xy - 0.5).to(kp.dtype)
        if self.visibility is not None:
            hw = geo.hw.to(kp.device)
            inside = (xy >= 0).all(-1) & (xy[..., 0] < hw[:, 1:2]) & (xy[..., 1] < hw[:, 0:1])
            kp[..., self.visibility] = torch.where(inside, kp[..., self.visibility],
                                                   torch.zeros((), dtype=kp.dtype, device=kp.device))
        mirrored = geo.mirrored
        if self.flip_pairs and mirrored is not None:
            perm = list(range(kp.shape[1]))
            for a, b in self.flip_pairs:
                perm[a], perm[b] = b, a
            swapped = kp[:, perm]
            kp = torch.where(mirrored.to(kp.device).view(-1, 1, 1), swapped, kp)
        return kp


BoxFormat = Literal["xyxy", "xywh", "cxcywh"]


@dataclass(frozen=True)
class Boxes:
    """A (B, N, 4) field of boxes in pixel edges (``"xyxy"``, ``"xywh"`` or ``"cxcywh"``), ``<name>_lengths`` rows
    each; boxes with no area left are zeroed and flagged False in ``<name>_valid``, never dropped."""

    format: BoxFormat = "xyxy"

    def __post_init__(self) -> None:
        if self.format not in ("xyxy", "xywh", "cxcywh"):
            raise UsageError(f"Boxes format must be 'xyxy', 'xywh' or 'cxcywh', not {self.format!r}")

    def check(self, name: str, x: Tensor) -> None:
        if x.dim() != 3 or x.shape[2] != 4:
            raise UsageError(f"boxes field {name!r} must be (batch, N, 4), got {tuple(x.shape)}")

    @staticmethod
    def rows(batch: dict[str, Tensor], name: str) -> Tensor:
        """(B, N) bool: the rows of each sample that are boxes (``<name>_lengths`` when given, else all)."""
        v, lengths = batch[name], batch.get(name + LENGTHS_SUFFIX)
        if lengths is None:
            return torch.ones(v.shape[:2], dtype=torch.bool, device=v.device)
        return torch.arange(v.shape[1], device=v.device).view(1, -1) < lengths.view(-1, 1).to(v.device)

    def to_xyxy(self, b: Tensor) -> Tensor:
        b = b.double()
        if self.format == "xywh":
            return torch.cat([b[..., :2], b[..., :2] + b[..., 2:]], -1)
        if self.format == "cxcywh":
            return torch.cat([b[..., :2] - b[..., 2:] / 2, b[..., :2] + b[..., 2:] / 2], -1)
        return b

    def from_xyxy(self, b: Tensor) -> Tensor:
        if self.format == "xywh":
            return torch.cat([b[..., :2], b[..., 2:] - b[..., :2]], -1)
        if self.format == "cxcywh":
            return torch.cat([(b[..., :2] + b[..., 2:]) / 2, b[..., 2:] - b[..., :2]], -1)
        return b

    @staticmethod
    def transform(xyxy: Tensor, valid: Tensor, geo: Geometry) -> tuple[Tensor, Tensor]:
        """(B, N, 4) float64 corners and (B, N) validity after one op."""
        x0, y0, x1, y1 = xyxy.unbind(-1)
        corners = torch.stack([torch.stack(c, -1) for c in ((x0, y0), (x1, y0), (x0, y1), (x1, y1))], -2)
        mapped = _map(corners, geo.matrix.to(xyxy.device))  # (B, N, 4, 2)
        lo, hi = mapped.amin(-2), mapped.amax(-2)
        hw = geo.hw.to(xyxy.device)
        zero = torch.zeros_like(lo)
        size = hw.flip(-1).view(-1, 1, 2)  # (W, H)
        lo, hi = torch.minimum(torch.maximum(lo, zero), size), torch.minimum(torch.maximum(hi, zero), size)
        valid = valid & (hi > lo).all(-1)
        out = torch.where(valid.unsqueeze(-1), torch.cat([lo, hi], -1), torch.zeros_like(xyxy))
        return out, valid


@dataclass(frozen=True)
class Mask:
    """A per-pixel label field with the image's (H, W): (B, H, W), (B, H, W, C) or (B, C, H, W), resampled by
    nearest neighbour (``fill`` outside the image); photometric ops leave it alone."""

    fill: float = 0


HFlipHook = Callable[[Tensor], Tensor]
RotateHook = Callable[[Tensor, Tensor], Tensor]
TransformHook = Callable[[Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Custom:
    """A target of your own, changed by your batched functions ``on_hflip``, ``on_vflip``, ``on_rotate(values,
    degrees)`` and ``on_transform(values, matrix, hw)``, each returning new values of the same shape."""

    on_hflip: HFlipHook | None = field(default=None, compare=False)
    on_vflip: HFlipHook | None = field(default=None, compare=False)
    on_rotate: RotateHook | None = field(default=None, compare=False)
    on_transform: TransformHook | None = field(default=None, compare=False)

    def transform(self, name: str, values: Tensor, geo: Geometry) -> Tensor:
        values = values.clone()
        for flags, fn in ((geo.hflip, self.on_hflip), (geo.vflip, self.on_vflip)):
            if fn is not None and flags is not None:
                idx = flags.nonzero().flatten().to(values.device)
                if len(idx):
                    values[idx] = self._checked(name, fn(values[idx]), values[idx])
        if self.on_rotate is not None and geo.angle is not None:
            values = self._checked(name, self.on_rotate(values, geo.angle.to(values.device)), values)
        if self.on_transform is not None:
            values = self._checked(name, self.on_transform(values, geo.matrix.to(values.device),
                                                           geo.hw.to(values.device)), values)
        return values

    @staticmethod
    def _checked(name: str, new: Tensor, old: Tensor) -> Tensor:
        if not isinstance(new, torch.Tensor) or new.shape != old.shape:
            got = tuple(new.shape) if isinstance(new, torch.Tensor) else type(new).__name__
            raise UsageError(f"Custom target {name!r}: a hook returned {got}, expected shape {tuple(old.shape)}")
        return new.to(old.dtype)


Target = Keypoints | Boxes | Mask | Custom


__all__ = ["BoxFormat", "Boxes", "Custom", "Geometry", "HFlipHook", "Keypoints", "Mask", "RotateHook", "Target",
           "TransformHook", "VALID_SUFFIX"]
