"""Image fields in the format: encodings, per-field image metadata, companion fields, codecs.

An image field stores uint8 pixels in HWC layout (channels ``RGB`` or ``L``) in one of
three encodings (docs/format.md, "Image fields"):

* ``raw`` with a fixed shape ``[H, W, C]``: plain pixels, read with a memory copy;
* ``pixels``: ragged ``|u1`` bytes, each sample's ``H*W*C`` pixels in C order, with the
  per-sample ``(H, W, C)`` in the companion field ``<name>_shape``;
* ``image``: ragged ``|u1`` bytes, each sample one complete encoded file (JPEG or PNG),
  with ``<name>_shape`` and the per-sample codec in ``<name>_codec``.

This module only describes and checks; decoding lives in ``fastdata.decode``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import FormatError

if TYPE_CHECKING:
    from .manifest import FieldSpec

ENCODING_RAW = "raw"
ENCODING_PIXELS = "pixels"
ENCODING_IMAGE = "image"
IMAGE_ENCODINGS = (ENCODING_PIXELS, ENCODING_IMAGE)  # ragged bytes that become HWC images on read

LAYOUT = "HWC"
CHANNELS = {"RGB": 3, "L": 1}  # image mode -> channels, in stored order
SHAPE_SUFFIX = "_shape"
CODEC_SUFFIX = "_codec"
SHAPE_DTYPE = "<i8"
CODEC_DTYPE = "|u1"

CODEC_JPEG = 1
CODEC_PNG = 2
CODECS = {CODEC_JPEG: "jpeg", CODEC_PNG: "png"}  # value of <name>_codec -> codec; 0 is never valid


@dataclass(frozen=True)
class ImageSpec:
    """How the pixels of an image field are laid out: ``mode`` ``RGB`` or ``L``, layout ``HWC``."""

    mode: str
    layout: str = LAYOUT

    @property
    def channels(self) -> int:
        return CHANNELS[self.mode]

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "layout": self.layout}


def parse_image_spec(obj: Any, field_name: Any) -> ImageSpec:
    """The ``image`` object of a field entry; unknown extra keys are ignored (forward compatible)."""
    if not isinstance(obj, dict):
        raise FormatError(f"field {field_name!r}: 'image' must be an object")
    spec = ImageSpec(mode=obj.get("mode"), layout=obj.get("layout"))  # type: ignore[arg-type]
    check_image_spec(spec, field_name)
    return spec


def check_image_spec(spec: ImageSpec, field_name: Any) -> None:
    if not isinstance(spec.mode, str) or spec.mode not in CHANNELS:
        raise FormatError(f"field {field_name!r}: unknown image mode {spec.mode!r} (expected RGB or L)")
    if spec.layout != LAYOUT:
        raise FormatError(f"field {field_name!r}: unknown image layout {spec.layout!r} (expected {LAYOUT})")


def companions(f: "FieldSpec") -> list[str]:
    """Names of the fields an image field needs to be read (its shape and codec fields)."""
    if f.encoding == ENCODING_IMAGE:
        return [f.name + SHAPE_SUFFIX, f.name + CODEC_SUFFIX]
    if f.encoding == ENCODING_PIXELS:
        return [f.name + SHAPE_SUFFIX]
    return []


def check_image_fields(fields: Sequence["FieldSpec"]) -> None:
    """Check every image field against the rules above; raise FormatError naming the problem."""
    by_name = {f.name: f for f in fields}
    for f in fields:
        if f.encoding in IMAGE_ENCODINGS:
            if f.image is None:
                raise FormatError(f"field {f.name!r}: encoding {f.encoding!r} needs an 'image' object")
            if f.dtype != "|u1" or list(f.shape) != [None]:
                raise FormatError(f"field {f.name!r}: encoding {f.encoding!r} needs dtype |u1 and shape [null]")
            _need(by_name, f.name + SHAPE_SUFFIX, SHAPE_DTYPE, (3,), f.name)
            if f.encoding == ENCODING_IMAGE:
                _need(by_name, f.name + CODEC_SUFFIX, CODEC_DTYPE, (), f.name)
        elif f.image is not None:
            c = f.image.channels
            if f.encoding != ENCODING_RAW or f.dtype != "|u1" or len(f.shape) != 3 or f.shape[0] is None or f.shape[2] != c:
                raise FormatError(
                    f"field {f.name!r}: a raw image field must be |u1 of fixed shape [H, W, {c}] ({f.image.mode}), "
                    f"not {f.dtype} {list(f.shape)}"
                )


def _need(by_name: dict[str, "FieldSpec"], name: str, dtype: str, shape: tuple[int, ...], owner: str) -> None:
    g = by_name.get(name)
    if g is None:
        raise FormatError(f"image field {owner!r} needs the field {name!r}")
    if g.dtype != dtype or tuple(g.shape) != shape or g.encoding != ENCODING_RAW or g.image is not None:
        raise FormatError(f"field {name!r} must be raw {dtype} of shape {list(shape)} (it belongs to image field {owner!r})")
