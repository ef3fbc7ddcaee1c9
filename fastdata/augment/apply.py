"""One batch through an :class:`fastdata.augment.Augment`: which fields of which kind, how many views
(stacked on axis 1 when of one shape, else ``<field>_view<k>``), then mixing, in a fixed draw order."""

from __future__ import annotations

from typing import Any, Callable, Literal, Mapping

import torch

from fastdata.augment import Augment
from fastdata.augment.mixing import kept_fraction, mix_boxes, mix_images, mix_mask
from fastdata.augment.sequence import pack_to_padded, padded_to_pack, run_padded
from fastdata.augment.targets import VALID_SUFFIX, Boxes, Mask
from fastdata.errors import UsageError
from fastdata.format.spec import LENGTHS_SUFFIX, OFFSETS_SUFFIX, SHAPE_SUFFIX

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
            raise KeyError(f"augment fields {missing} are not in the batch (fields: {sorted(batch)})")
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
        return {name: flat, name + OFFSETS_SUFFIX: new_offsets.to(offsets.device, offsets.dtype)}
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
