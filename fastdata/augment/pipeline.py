"""The pipeline: :class:`Augment` runs its ops in order on a batch, one draw per op, targets following;
:func:`augment_batch` takes one batch through it: which fields of which kind, how many views (stacked on axis 1
when of one shape, else ``<field>_view<k>``), then mixing, in a fixed draw order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence, Union, get_args

import torch

from fastdata.augment.image_ops import (
    CenterCrop,
    ColorJitter,
    GaussianNoise,
    HorizontalFlip,
    Normalize,
    Pad,
    Params,
    RandomAffine,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    Tensor,
    VerticalFlip,
    _Flip,
    _flip_samples,
    _Geometric,
    image_hw,
)
from fastdata.augment.mixing import Mix, kept_fraction, mix_boxes, mix_images, mix_mask
from fastdata.augment.sequence import ops_kind, pack_to_padded, padded_to_pack, run_padded
from fastdata.augment.targets import VALID_SUFFIX, Boxes, Custom, Keypoints, Mask, Target
from fastdata.errors import UsageError
from fastdata.format.spec import LENGTHS_SUFFIX, OFFSETS_SUFFIX, SHAPE_SUFFIX

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
                             "fastdata.augment.pipeline.augment_batch(augment, batch, g)")
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
            elif isinstance(t, Keypoints) and name + LENGTHS_SUFFIX in batch:  # ragged: the padding rows stay as read
                batch[name] = torch.where(Boxes.rows(batch, name).unsqueeze(-1), v, batch[name].to(v.dtype))
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


# -- one batch through an Augment ----------------------------------------------------------------------
Kind = Literal["image", "sequence", "array"]
Batch = dict[str, torch.Tensor]


def _ragged(batch: Batch, name: str) -> bool:
    return name + LENGTHS_SUFFIX in batch or name + OFFSETS_SUFFIX in batch


def field_kinds(aug: Augment, batch: Batch, images: tuple[str, ...], mixed: frozenset[str]) -> dict[str, Kind]:
    """The fields to augment, in order, with their kinds (image, sequence, array: declared, or from the schema)."""
    op_kind = aug.op_kind
    declared: dict[str, Kind] = dict(aug.kinds)  # type: ignore[arg-type]
    if aug.fields is not None:
        missing = [f for f in aug.fields if f not in batch]
        if missing:
            raise UsageError(f"augment fields {missing} are not in the batch (fields: {sorted(batch)})")
        names = aug.fields
    elif op_kind == "image":
        names = images or _float_images(aug, batch)
    else:
        names = tuple(k for k in batch if _ragged(batch, k) and k not in aug.targets)
        if not names:
            raise UsageError("sequence ops need sequence fields: this batch has no ragged field; name the fields "
                             "with their kind, Augment(ops, fields={'x': 'sequence'}) (or 'array')")
    kinds: dict[str, Kind] = {}
    for name in names:
        kinds[name] = declared.get(name) or _kind_of(name, batch, images, mixed, aug)
        if (kinds[name] == "image") != (op_kind == "image") and aug.enabled_ops:
            what = "image ops" if op_kind == "image" else "sequence ops"
            raise UsageError(f"field {name!r} is {'an' if kinds[name] == 'array' else 'a'} {kinds[name]} field and "
                             f"this Augment has {what}; augment it with a separate Augment of its kind, or declare "
                             f"its kind: fields={{{name!r}: ...}}")
    return kinds


def _float_images(aug: Augment, batch: Batch) -> tuple[str, ...]:
    """Without image fields: float fields of (C, H, W) per sample; a (T, C) field is not guessed to be an image."""
    cands = [k for k, v in batch.items() if isinstance(v, torch.Tensor) and v.is_floating_point()
             and k not in aug.targets and not _ragged(batch, k)]
    chosen = tuple(k for k in cands if batch[k].dim() >= 4)
    flat = [k for k in cands if batch[k].dim() == 3]
    if not chosen and flat:
        raise UsageError(f"field {flat[0]!r} has float samples of shape {tuple(batch[flat[0]].shape[1:])}: an image "
                         "(H, W) or a sequence (T, C)? Declare it: Augment(ops, fields={"
                         f"{flat[0]!r}: 'image'}}) or 'sequence' (with sequence ops)")
    return chosen


def _kind_of(name: str, batch: Batch, images: tuple[str, ...], mixed: frozenset[str], aug: Augment) -> Kind:
    if name in images or name in mixed:
        return "image"
    if _ragged(batch, name):
        return "sequence"
    if aug.op_kind == "image":
        return "image"  # named by the user with image ops: a float (C, H, W) or (H, W) image
    ops = [op for view in aug.view_ops for op in view]
    if any(op.needs_time for op in ops):
        raise UsageError(f"field {name!r} has a fixed shape {tuple(batch[name].shape[1:])} per sample: is axis 1 time? "
                         f"Declare its kind: Augment(ops, fields={{{name!r}: 'sequence'}}) or 'array'")
    return "array"


def augment_batch(aug: Augment, batch: Batch, g: torch.Generator, images: tuple[str, ...] = (),
                  mixed: frozenset[str] = frozenset(), finish: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
                  skip: frozenset[str] = frozenset(), precropped: Mapping[str, int] | None = None,
                  owned: frozenset[str] = frozenset()) -> Batch:
    """Augment ``batch`` in place (and return it): every field of :func:`field_kinds`, then ``aug.mix``; ``skip``:
    fields DALI augmented, ``precropped``: first ops run by the reader, ``owned``: fields the ops may write into."""
    kinds = field_kinds(aug, batch, images, mixed)
    if aug.mix is not None and mixed and not any(getattr(op, "fixed_size", False) for op in aug.view_ops[0]):
        raise UsageError(f"Mix needs images of one size, and {sorted(mixed)[0]!r} mixes sizes: add a crop or Resize")
    image_fields = [n for n, k in kinds.items() if k == "image"]
    if aug.targets and len(image_fields) != 1:
        raise UsageError(f"augmentation with targets {sorted(aug.targets)} moves them with one image field, "
                         f"and this batch has {image_fields or 'none'}; name it with Augment(..., fields=(name,))")
    for name, kind in kinds.items():
        if name in skip:
            continue
        if kind == "image":
            sizes = batch[name + SHAPE_SUFFIX][:, :2] if name in mixed else None
            done = (precropped or {}).get(name, 0)  # its first ops ran in the reader (fastdata.loaders.host)
            before = batch[name + SHAPE_SUFFIX][:, :2] if done else None
            mine = name in owned and len(aug.view_ops) == 1  # several views all start from the image
            outs = [aug.run(batch, g, name, sizes, hw=before, ops=ops, done=done, owned=mine) for ops in aug.view_ops]
            written = [name, name + SHAPE_SUFFIX] + [k for t in aug.targets for k in (t, t + VALID_SUFFIX)]
        else:
            outs = [_sequence(batch, name, kind, ops, g) for ops in aug.view_ops]
            written = [name, name + LENGTHS_SUFFIX, name + OFFSETS_SUFFIX]
        join_views(batch, outs, written)
        if finish is not None and kind == "image":  # after stacking: stacked views are one new tensor already
            for key in [name] + [f"{name}_view{v}" for v in range(len(outs))]:
                if key in batch and batch[key].dim() == 4:
                    batch[key] = finish(name, batch[key])
    if aug.mix is not None:
        mix_batch(aug, batch, g, image_fields)
    return batch


def _sequence(batch: Batch, name: str, kind: Kind, ops: tuple[Any, ...], g: torch.Generator) -> Batch:
    """One view of a sequence or array field: the field and its lengths (or offsets)."""
    x = batch[name]
    offsets = batch.get(name + OFFSETS_SUFFIX)
    lengths = batch.get(name + LENGTHS_SUFFIX)
    if offsets is not None:
        padded, n = pack_to_padded(x, offsets)
        y, n2 = run_padded(ops, padded, n, g, name, kind)
        flat, new_offsets = padded_to_pack(y, n2 if n2 is not None else n)
        out = {name: flat, name + OFFSETS_SUFFIX: new_offsets.to(offsets.device, offsets.dtype)}
        if lengths is not None and n2 is not None:  # a packed batch also carries lengths: they follow the offsets
            out[name + LENGTHS_SUFFIX] = n2.to(lengths.device, lengths.dtype)
        return out
    y, n2 = run_padded(ops, x, lengths, g, name, kind)
    out = {name: y}
    if lengths is not None and n2 is not None:
        out[name + LENGTHS_SUFFIX] = n2.to(lengths.device, lengths.dtype)
    elif n2 is not None and not bool((n2 == y.shape[1]).all()):
        out[name + LENGTHS_SUFFIX] = n2.to(x.device)  # a fixed-length field got lengths (TimeCrop, TimeStretch)
    return out


def join_views(batch: Batch, outs: list[Batch], written: list[str], stack: bool | None = None) -> None:
    """Put each view's ``written`` fields into ``batch``: one view as is; views of one shape stacked on axis 1
    (``stack`` overrides; packed sequences never); otherwise ``<field>_view<k>``."""
    keys = [k for k in dict.fromkeys(written) if k in outs[0]]
    if len(outs) == 1:
        batch.update({k: outs[0][k] for k in keys})
        return
    if stack is None:
        stack = all(o[keys[0]].shape == outs[0][keys[0]].shape for o in outs) and \
            not any(k.endswith(OFFSETS_SUFFIX) for k in keys)
    if stack:
        batch.update({k: _stack([o[k] for o in outs]) for k in keys})
        return
    for k in keys:
        batch.pop(k, None)
        for v, o in enumerate(outs):
            batch[f"{k}_view{v}"] = o[k]


def _stack(ts: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(ts, 1)``; channels_last images stay channels_last in memory (a contiguous stack would be
    a transposing copy)."""
    t0 = ts[0]
    if t0.dim() != 4 or t0.is_contiguous() or not t0.is_contiguous(memory_format=torch.channels_last):
        return torch.stack(ts, 1)
    b, c, h, w = t0.shape
    out = torch.empty((b, len(ts), h, w, c), dtype=t0.dtype, device=t0.device).permute(0, 1, 4, 2, 3)
    for v, t in enumerate(ts):
        out[:, v].copy_(t)
    return out


def mix_batch(aug: Augment, batch: Batch, g: torch.Generator, image_fields: list[str]) -> None:
    """MixUp or CutMix (one draw for the batch) on the augmented image fields, the label and the targets."""
    mix = aug.mix
    assert mix is not None
    if not image_fields:
        raise UsageError("Mix mixes image fields, and this Augment augments none")
    if mix.label not in batch:
        raise UsageError(f"Mix: the label field {mix.label!r} is not in the batch (fields: {sorted(batch)}); "
                         "name it with Mix(label=...)")
    d = mix.draw(g)
    for name in image_fields:
        x = batch[name]
        if x.dim() != 4:
            raise UsageError(f"Mix needs image batches (B, C, H, W); {name!r} is {tuple(x.shape)}")
        batch[name] = mix_images(x, d)
    h, w = (int(v) for v in batch[image_fields[0]].shape[-2:])  # targets come with exactly one image field
    batch[mix.label] = mix.labels(batch[mix.label], kept_fraction(d, h, w))
    for t_name, t in aug.targets.items():
        if isinstance(t, Boxes):
            mix_boxes(batch, t_name, t, d, (h, w), mix.min_visible)
        elif isinstance(t, Mask) and d.cutmix:
            batch[t_name] = mix_mask(batch[t_name], d, (h, w))
