"""Declared targets (keypoints, boxes, masks, your own) moved op by op with the image's draws."""

from __future__ import annotations

from typing import Mapping

import torch

from fastdata.augment.base import Params, Tensor, _Geometric
from fastdata.augment.targets import VALID_SUFFIX, Boxes, Keypoints, Mask, Target
from fastdata.errors import UsageError


class _Targets:
    """The declared targets while a chain runs: working copies, updated op by op."""

    def __init__(self, targets: Mapping[str, Target], batch: dict[str, Tensor], x: Tensor | None) -> None:
        self.targets = targets
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
                self.valid[name] = t.rows(batch, name)
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
