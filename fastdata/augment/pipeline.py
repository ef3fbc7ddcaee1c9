"""The pipeline: :class:`Augment` runs its ops in order on a batch, one draw per op, targets following."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, Union, get_args

import torch

from fastdata.augment.base import Params, Tensor, _Geometric, image_hw
from fastdata.augment.color import ColorJitter, GaussianNoise, Normalize
from fastdata.augment.geometric import (
    CenterCrop,
    HorizontalFlip,
    Pad,
    RandomAffine,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    VerticalFlip,
    _Flip,
    _flip_samples,
)
from fastdata.augment.mixing import Mix
from fastdata.augment.sequence import ops_kind
from fastdata.augment.targets import VALID_SUFFIX, Boxes, Custom, Keypoints, Mask, Target
from fastdata.errors import UsageError
from fastdata.format.spec import SHAPE_SUFFIX

Op = Union[RandomResizedCrop, RandomCrop, CenterCrop, HorizontalFlip, VerticalFlip, Resize, Pad, RandomAffine,
           ColorJitter, GaussianNoise, Normalize]

_BUILTIN = get_args(Op)
CROPS = (RandomResizedCrop, RandomCrop, CenterCrop)  # crops: ops whose output has one size (so does Resize)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _builtin(op: Any) -> bool:
    return type(op) in _BUILTIN  # a subclass may override apply without sizes: treated as an op of your own


@dataclass(frozen=True)
class Augment:
    """An augmentation pipeline: ``ops`` applied in order to ``fields`` (default: the image fields), with
    ``targets`` that move with the image, ``views`` and ``mix`` (parameters and draw order: docs/augment.md)."""

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
                raise TypeError(f"mix must be a fastdata.augment.mixing.Mix, not {self.mix!r}")
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
        """"sequence" when the ops are sequence ops (fastdata.augment.sequence), else "image"."""
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
                             "fastdata.augment.apply.augment_batch(augment, batch, g)")
        return self.run({"": x}, g, "", sizes, targets=False)[""]

    def run(self, batch: dict[str, Tensor], g: torch.Generator, image: str | None, sizes: Tensor | None = None,
            hw: Tensor | None = None, targets: bool = True, ops: Sequence[Any] | None = None,
            done: int = 0, owned: bool = False) -> dict[str, Tensor]:
        """Augment ``batch[image]`` (float (B, C, H, W); None: the targets alone) and the declared targets, one draw
        per op; ``done``: first ops the reader ran (drawn again), ``owned``: the image buffer may be written into."""
        x = batch[image] if image is not None else None
        if x is not None and not done:
            hw = image_hw(x, sizes, g.device)
        elif hw is None:
            raise ValueError("Augment.run without an image, or with ops done, needs hw, the images' sizes")
        else:
            hw = hw.to(g.device).float()
        out = dict(batch)
        chain = list(self.ops if ops is None else ops)
        owned = owned and all(_builtin(op) for op in chain)  # an op of your own may hand back memory it keeps
        work = _Targets(self.targets if targets else {}, out, x)
        for k, op in enumerate(chain):
            if not _builtin(op):
                x, sizes, hw = _own_op(op, x, g, bool(work.targets), sizes, hw)
                continue
            img = x if k >= done else None  # the image this op transforms (None: done already, or none)
            if img is not None:
                op.check(img, sizes)
            p = op.draw(g, hw)
            if img is not None:
                if owned and isinstance(op, _Flip) and img.device.type == "cpu":
                    x = _flip_samples(img, p["flip"], op._axis, sizes, img)  # in the caller's own memory
                elif owned and k == len(chain) - 1 and type(op) is Normalize:
                    x = op.into(img, img)  # in place (elementwise: an output may be its input)
                else:
                    x = op.image(img, p, sizes)
            if isinstance(op, _Geometric):
                if work.targets:
                    work.apply(op, p, hw, sizes)
                sizes = None if op.fixed_size or sizes is None else op.out_sizes(sizes)
                hw = op.out_sizes(hw)
        if x is not None:
            out[image] = x  # type: ignore[index]
            shapes = out.get(image + SHAPE_SUFFIX)  # type: ignore[operator]
            if shapes is not None and shapes.dim() == 2 and shapes.shape[1] >= 2:  # (H, W) after the ops, C kept
                shapes = shapes.clone()
                shapes[:, :2] = hw.round().to(shapes.device, shapes.dtype)
                out[image + SHAPE_SUFFIX] = shapes  # type: ignore[operator]
        work.finish(out)
        return out


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


def _own_op(op: Any, x: Tensor | None, g: torch.Generator, targets: bool, sizes: Tensor | None, hw: Tensor
            ) -> tuple[Tensor, Tensor | None, Tensor]:
    """An op of your own on the image; the sizes it leaves (unknown once it resized the canvas)."""
    if x is None:
        raise UsageError(f"{op!r} is not a built-in op: it cannot run without the image")
    canvas = x.shape[-2:]
    x = op.apply(x, g)
    if x.shape[-2:] != canvas:
        if targets:
            raise UsageError(f"{type(op).__name__} changed the image size; declared targets cannot "
                             "follow an op of your own that moves pixels")
        return x, None, image_hw(x, None, g.device)  # resized by your op: the true sizes are unknown from here on
    return x, sizes, hw


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
    """``<image>_shape`` rows ((B, 3): H, W, C) after the built-in ``ops``, for the DALI backend: crops and
    Resize give their size, Pad adds its borders, the other ops keep it."""
    hw = shapes[:, :2]
    for op in ops:
        if _builtin(op) and isinstance(op, _Geometric):
            hw = op.out_sizes(hw)
    out = shapes.clone()
    out[:, :2] = hw
    return out

