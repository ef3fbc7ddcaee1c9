"""Python samples -> what a dataset stores: the schema inferred from the first samples, every sample encoded
and checked against it."""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, Sequence

import numpy as np
from PIL import Image

from fastdata.converters.config import ConvertConfig, ImageOptions
from fastdata.converters.images import (
    ORIGINAL_SIZE_SUFFIX,
    check_declared,
    image_arrays,
    image_specs,
    looks_like,
    prepare_image_value,
    rescale,
)
from fastdata.converters.registry import DEFAULT_FIELD
from fastdata.converters.scan import check_finite
from fastdata.converters.table_read import FLOAT_DTYPE
from fastdata.errors import DataError, FormatError, UsageError
from fastdata.format import LABEL_FIELD, FieldSpec, make_field
from fastdata.format.spec import _NAME_RE, ENCODING_UTF8, KEY_FIELD, SHAPE_SUFFIX

Kind = Literal["array", "string", "image", "bytes"]
_GREY = ("1", "L", "I;16", "I;16L", "I;16B", "I;16N", "I", "F")


def as_dict(raw: Any, names: Sequence[str] | None, where: str) -> dict[str, Any]:
    """One sample as {field: value}: a dict (only ``names`` when given), a tuple or list named by ``names``,
    or one value (field ``names[0]``, else ``x``)."""
    if isinstance(raw, Mapping):
        if names is None:
            return dict(raw)
        missing = [n for n in names if n not in raw]
        if missing:
            raise DataError(f"{where}: has no {missing[0]!r} (its keys: {', '.join(map(str, raw))})")
        return {n: raw[n] for n in names}
    if isinstance(raw, (tuple, list)):
        if names is None:
            raise UsageError(f"{where} is a {type(raw).__name__} of {len(raw)} items: name them with "
                             "fields=('image', 'label', ...)")
        if len(raw) != len(names):
            raise DataError(f"{where}: has {len(raw)} items, %(fields) names {len(names)}")
        return dict(zip(names, raw))
    if names is not None and len(names) != 1:
        raise DataError(f"{where}: is one {type(raw).__name__}, %(fields) names {len(names)}")
    return {names[0] if names else DEFAULT_FIELD: raw}


def _array(v: Any, where: str) -> np.ndarray:
    """A numeric value as an array: numpy, torch (copied off its device), a number or a list of numbers."""
    if isinstance(v, np.ndarray) and v.dtype.kind in "biufc":
        return v
    if type(v).__module__.split(".")[0] == "torch" and hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    a = np.asarray(v)
    if a.dtype.kind not in "biufc":
        raise DataError(f"{where}: a {type(v).__name__} of dtype {a.dtype} cannot be stored (numbers, arrays, "
                        "strings, bytes and PIL images can)")
    return a


def _kind(v: Any, where: str) -> Kind:
    if isinstance(v, np.ndarray):
        return "array"
    if isinstance(v, str):
        return "string"
    if isinstance(v, Image.Image):
        return "image"
    if isinstance(v, (bytes, bytearray, memoryview)):
        try:
            with Image.open(io.BytesIO(bytes(v))):
                return "image"
        except Exception:  # not an image PIL knows: plain bytes
            return "bytes"
    if v is None or isinstance(v, Mapping):
        raise DataError(f"{where}: a {type(v).__name__} cannot be stored (numbers, arrays, strings, bytes and PIL "
                        "images can)")
    return "array"


@dataclass(frozen=True)
class FieldPlan:
    """How one entry of a sample is stored: its kind, dtype and per-sample shape (a leading None: ragged),
    and for images the options they are converted with."""

    name: str
    kind: Kind
    dtype: np.dtype
    shape: tuple[int | None, ...]
    image: ImageOptions | None = None
    coordinate: str | None = None  # "keypoints" | "boxes": any numbers, stored float32 after the resize's rescaling

    def specs(self) -> list[FieldSpec]:
        """The dataset fields this entry becomes (an image that is not fixed raw pixels has companions)."""
        try:
            if self.kind == "string":
                return [make_field(self.name, "|u1", (None,), encoding=ENCODING_UTF8)]
            if self.kind != "image":
                return [make_field(self.name, self.dtype, self.shape)]
            assert self.image is not None
            return image_specs(self.name, self.image, self.shape if self.shape[0] is not None else None)
        except FormatError as e:  # (its message names the field)
            raise DataError(str(e)) from None

    def encode(self, v: Any, where: str) -> dict[str, np.ndarray]:
        """The stored arrays of value ``v``; a value that disagrees with the plan raises DataError naming ``where``."""
        kind = _kind(v, f"{where}: {self.name!r}")
        if kind != self.kind:
            raise DataError(f"{where}: {self.name!r} is a {kind}, the first samples had a {self.kind}")
        if kind == "string":
            return {self.name: np.frombuffer(v.encode("utf-8"), dtype=np.uint8)}
        if kind == "image":
            assert self.image is not None
            p = prepare_image_value(v, f"{where}: {self.name!r}", self.image)
            if self.shape[0] is not None:
                self.check_shape(p.shape, where)
            return image_arrays(self.name, p, self.image, self.shape[0] is not None)
        a = np.frombuffer(bytes(v), dtype=np.uint8) if kind == "bytes" else _array(v, where)
        if self.coordinate is not None:  # SampleSchema.encode rescales it, to float32
            a = a.astype(np.float64)
        elif a.dtype != self.dtype:
            if not np.can_cast(a.dtype, self.dtype, "safe"):
                raise DataError(f"{where}: {self.name!r} has dtype {a.dtype}, the first samples {self.dtype}")
            a = a.astype(self.dtype)
        self.check_shape(a.shape, where)
        return {self.name: a}

    def check_shape(self, shape: tuple[int, ...], where: str) -> None:
        ragged = self.shape[:1] == (None,)
        if (ragged and (not shape or shape[1:] != self.shape[1:])) or (not ragged and shape != self.shape):
            hint = "" if ragged else f" (if its first axis varies, pass ragged=('{self.name}',))"
            raise DataError(f"{where}: {self.name!r} has shape {list(shape)}, the first samples "
                            f"{['n' if d is None else d for d in self.shape]}{hint}")


@dataclass(frozen=True)
class SampleSchema:
    """The plans of every entry of a sample, and whether samples carry a ``key``."""

    plans: tuple[FieldPlan, ...]
    names: tuple[str, ...] | None  # the fields= names of tuple samples (dict samples: those keys only)
    keyed: bool
    coords: tuple[tuple[str, str], ...] = ()  # (field, "keypoints" | "boxes") moved with the resized image
    resized: FieldPlan | None = None  # the one image field that is resized (coordinates follow it)
    finite_label: bool = False  # a float label that must be finite (no %(allow_nan))

    @property
    def fields(self) -> list[FieldSpec]:
        return [s for p in self.plans for s in p.specs()]

    def encode(self, raw: Any, i: int) -> tuple[dict[str, np.ndarray], str | None]:
        """Sample ``i`` as stored arrays, and its key (None: keyed by index)."""
        where = f"sample {i}"
        d = as_dict(raw, self.names, where)
        key = d.pop(KEY_FIELD, None)
        if (key is not None) != self.keyed:
            raise DataError(f"{where}: {'has no' if self.keyed else 'has a'} {KEY_FIELD!r}, unlike the first samples")
        extra = set(d) - {p.name for p in self.plans}
        if extra:
            raise DataError(f"{where}: has {sorted(extra)[0]!r}, which the first samples did not have")
        out: dict[str, np.ndarray] = {}
        for p in self.plans:
            if p.name not in d:
                raise DataError(f"{where}: has no {p.name!r}")
            out.update(p.encode(d[p.name], where))
        if self.resized is not None:
            original, opts = out[self.resized.name + ORIGINAL_SIZE_SUFFIX], self.resized.image
            assert opts is not None
            for name, kind in self.coords:
                out[name] = rescale(out[name], kind, original.tolist(), opts)
        if self.finite_label:
            check_finite(out[LABEL_FIELD][None], lambda _: where)
        return out, None if key is None else str(key)

    def encode_rows(self, cols: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray] | None:
        """``n`` samples given as one numpy array of rows per entry, stored as :meth:`encode` stores each; None when a
        row would not be stored as it is alone (images, strings, ragged, rescaled): :meth:`encode` then says why."""
        d = dict(cols) if self.names is None else {k: cols[k] for k in self.names if k in cols}
        if (d.pop(KEY_FIELD, None) is not None) != self.keyed or set(d) != {p.name for p in self.plans}:
            return None
        out = {}
        for p in self.plans:
            a = d[p.name]
            if (p.kind != "array" or p.coordinate is not None or a.dtype.kind not in "biufc" or len(a) != n
                    or a.shape[1:] != p.shape):
                return None
            if a.dtype != p.dtype:
                if not np.can_cast(a.dtype, p.dtype, "safe"):
                    return None
                a = a.astype(p.dtype)
            out[p.name] = a
        if self.finite_label and not np.isfinite(out[LABEL_FIELD]).all():
            return None  # encode names the sample
        return out


def infer_schema(samples: list[tuple[int, Any]], names: Sequence[str] | None, ragged: Sequence[str],
                 config: "ConvertConfig") -> SampleSchema:
    """The schema of the first ``samples`` ((index, sample) pairs agreeing on each entry's kind, dtype and trailing
    shape); with ``config.skip_bad`` a sample that cannot be stored is left out."""
    images = config.images
    if config.skip_bad:
        good = [(i, s) for i, s in samples if _usable(i, s, names, images)]
        samples = good or samples[:1]  # none usable: the first one's error is the one to show
    schema = _infer(samples, names, images, ragged)
    if images is not None and not any(p.kind == "image" for p in schema.plans):
        raise UsageError("image options (%(images)) apply to images, and the samples have none (PIL images or "
                         "image bytes)")
    label = next((p for p in schema.plans if p.name == LABEL_FIELD), None)
    if label is not None and label.kind == "array" and label.dtype.kind in "fc" and not config.allow_nan:
        schema = replace(schema, finite_label=True)
    return _with_coordinates(schema, samples, config)


def _with_coordinates(schema: SampleSchema, samples: list[tuple[int, Any]], coords: "ConvertConfig") -> SampleSchema:
    plans = {p.name: p for p in schema.plans}
    lasts = {n: p.shape[-1] if p.kind == "array" and p.dtype.kind in "iuf" and p.shape else None
             for n, p in plans.items()}  # name -> last axis of a numeric field
    check_declared(lasts, coords.keypoints, coords.boxes, coords.not_coordinates,
                   lambda flag, name: f"%({flag}) names {name!r}, which the samples do not have "
                                      f"(fields: {', '.join(plans)})",
                   lambda flag, name, need: f"field {name!r} is given as %({flag}) but is not numeric of shape {need}")
    resized = [p for p in schema.plans if p.kind == "image" and p.image is not None and p.image.resizes]
    if not resized:
        return schema
    moved = {**{n: "keypoints" for n in coords.keypoints}, **{n: "boxes" for n in coords.boxes}}
    if len(resized) > 1 and moved:
        raise UsageError(f"images {', '.join(repr(p.name) for p in resized)} are all resized: coordinates can follow "
                         "only one (convert one image field, or resize at load time)")
    img = resized[0]
    if img.name + ORIGINAL_SIZE_SUFFIX in plans:
        raise UsageError(f"field {img.name + ORIGINAL_SIZE_SUFFIX!r} is where a resize stores each image's original "
                         "size: rename the samples' field")
    undeclared = {n: last for n, last in lasts.items() if n not in moved and n not in coords.not_coordinates}
    _refuse_look_alikes(schema, samples, img, undeclared)
    new = tuple(replace(p, dtype=np.dtype(FLOAT_DTYPE), coordinate=moved[p.name]) if p.name in moved else p
                for p in schema.plans)
    return replace(schema, plans=new, coords=tuple(moved.items()), resized=img)


def _refuse_look_alikes(schema: SampleSchema, samples: list[tuple[int, Any]], img: FieldPlan,
                        lasts: dict[str, int | None]) -> None:
    """An undeclared numeric field (``lasts``: name -> last axis) that looks like pixel coordinates of the
    resized image is a DataError."""
    assert img.image is not None
    dicts = [(i, as_dict(s, schema.names, f"sample {i}")) for i, s in samples]
    originals: list[tuple[int, int]] | None = None
    for name, last in lasts.items():
        if last is None or last < 2:
            continue
        if originals is None:  # decoded only when a field might be coordinates
            originals = [prepare_image_value(d[img.name], f"sample {i}: {img.name!r}", img.image).original
                         for i, d in dicts]
        rows = [_array(d[name], f"sample {i}: {name!r}") for i, d in dicts]
        why = looks_like(name, last, rows, originals)
        if why is not None:
            boxes = f", %(boxes=('{name}',))" if last == 4 else ""
            raise DataError(f"field {name!r} looks like pixel coordinates ({why}) and images {img.name!r} are "
                            f"resized; say what it is: %(keypoints=('{name}',)){boxes} or "
                            f"%(not_coordinates=('{name}',))")


def _usable(i: int, s: Any, names: Sequence[str] | None, images: ImageOptions | None) -> bool:
    try:
        _infer([(i, s)], names, images, ()).encode(s, i)
        return True
    except DataError:
        return False


def _infer(samples: list[tuple[int, Any]], names: Sequence[str] | None, images: ImageOptions | None,
           ragged: Sequence[str]) -> SampleSchema:
    dicts = [(i, as_dict(s, names, f"sample {i}")) for i, s in samples]
    keyed = KEY_FIELD in dicts[0][1]
    first = [k for k in dicts[0][1] if k != KEY_FIELD]
    if not first:  # else the shards were written and the manifest refused, leaving a DST that --resume cannot finish
        raise DataError(f"sample {dicts[0][0]}: has no fields to store (its keys: {', '.join(map(str, dicts[0][1])) or 'none'})")
    unknown = set(ragged) - set(first)
    if unknown:
        raise UsageError(f"%(ragged) names {sorted(unknown)[0]!r}, which the samples do not have")
    plans = []
    for name in first:
        if not isinstance(name, str) or not _NAME_RE.match(name) or name.endswith(SHAPE_SUFFIX):
            raise UsageError(f"sample {dicts[0][0]}: {name!r} is not a field name (letters, digits, _ . -; not ending in "
                             f"{SHAPE_SUFFIX})")
        vals = [(i, d[name]) for i, d in dicts if name in d]
        plans.append(_plan(name, vals, images, name in ragged))
    return SampleSchema(tuple(plans), tuple(names) if names is not None else None, keyed)


def _plan(name: str, vals: list[tuple[int, Any]], images: ImageOptions | None, ragged: bool) -> FieldPlan:
    i0, v0 = vals[0]
    kind = _kind(v0, f"sample {i0}: {name!r}")
    for i, v in vals[1:]:
        if (k := _kind(v, f"sample {i}: {name!r}")) != kind:
            raise DataError(f"sample {i}: {name!r} is a {k}, sample {i0} a {kind}")
    if kind == "string":
        return FieldPlan(name, kind, np.dtype("|u1"), (None,))
    if kind == "image":
        opts = images or ImageOptions("encoded" if not isinstance(v0, Image.Image) else "raw",
                                      mode="L" if isinstance(v0, Image.Image) and v0.mode in _GREY else "RGB")
        plan = FieldPlan(name, kind, np.dtype("|u1"), (None,), opts)
        if opts.images != "raw":
            return plan
        shapes = [prepare_image_value(v, f"sample {i}: {name!r}", opts).shape for i, v in vals]
        return plan if ragged or len(set(shapes)) > 1 else replace(plan, shape=shapes[0])
    arrays = [(i, np.frombuffer(bytes(v), dtype=np.uint8) if kind == "bytes" else _array(v, f"sample {i}: {name!r}"))
              for i, v in vals]
    a0 = arrays[0][1]
    for i, a in arrays[1:]:
        if a.ndim != a0.ndim or a.shape[1:] != a0.shape[1:] or a.dtype != a0.dtype:
            raise DataError(f"sample {i}: {name!r} is {a.dtype} {list(a.shape)}, sample {i0} {a0.dtype} {list(a0.shape)}")
    varies = len({a.shape for _, a in arrays}) > 1 or kind == "bytes"
    if (ragged or varies) and a0.ndim == 0:
        raise UsageError(f"{name!r} is a scalar: it cannot be ragged")
    shape: tuple[int | None, ...] = (None, *a0.shape[1:]) if ragged or varies else a0.shape
    return FieldPlan(name, kind, a0.dtype, shape)
