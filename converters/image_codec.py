"""One source image -> what an image dataset stores: fully decoded (a truncated file raises), upright, 8-bit
``RGB`` or ``L``, resized if asked; the same file and options always give the same bytes. Pixel coordinates
(keypoints: x, y first; boxes: x0, y0, x1, y1) of tables or Python samples follow the resize (float32); an
undeclared look-alike field is then refused."""

from __future__ import annotations

import io
import logging
import os
import re
import warnings
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from fastdata.converters.table_read import FLOAT_DTYPE
from fastdata.errors import DataError, UsageError
from fastdata.format.files import IMAGE_SUFFIXES
from fastdata.format.spec import CHANNELS, CODEC_JPEG, CODEC_PNG

log = logging.getLogger(__name__)

OPEN_FORMATS = ("JPEG", "PNG", "BMP", "WEBP", "TIFF", "GIF")  # PIL plugins allowed to parse sources
DEFAULT_QUALITY = 90
RESAMPLE = Image.Resampling.BILINEAR
PNG_COMPRESS_LEVEL = 6
_ORIENTATION_TAG = 0x0112
_ALPHA_MODES = {"RGBA": "RGBA", "RGBa": "RGBA", "LA": "LA", "La": "LA", "PA": "RGBA"}
_PLAIN_MODES = {"1", "L", "P", "RGB", "RGBX", "CMYK", "YCbCr", "I;16", "I;16L", "I;16B", "I;16N"}


def is_image_file(rel: str) -> bool:
    """Whether a file name has an image suffix (case-insensitive)."""
    return os.path.splitext(rel)[1].lower() in IMAGE_SUFFIXES


@dataclass(frozen=True)
class ImageOptions:
    """How to store images (the CLI's ``--images``, ``--size``, ``--max-side``, ``--quality``, ``--mode``)."""

    images: Literal["encoded", "raw", "jpeg"] = "encoded"
    size: tuple[int, int] | None = None  # (H, W): resize the shorter side, then centre-crop
    max_side: int | None = None
    quality: int | None = None
    mode: Literal["RGB", "L"] = "RGB"

    def __post_init__(self) -> None:
        if self.images not in ("encoded", "raw", "jpeg"):
            raise UsageError(f"%(images) must be encoded, raw or jpeg, not {self.images!r}")
        if self.mode not in CHANNELS:
            raise UsageError(f"%(mode) must be RGB or L, not {self.mode!r}")
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
            raise UsageError(f"%(size) needs two positive integers H W, not {self.size!r}")
        if self.max_side is not None and self.max_side < 1:
            raise UsageError("%(max_side) must be a positive integer")
        if self.size is not None and self.max_side is not None:
            raise UsageError("%(size) and %(max_side) contradict each other; give one")
        if self.images == "encoded" and (self.size is not None or self.max_side is not None):
            raise UsageError("%(images=encoded) keeps the original files; %(size) and %(max_side) need %(images=raw) or "
                             "%(images=jpeg)")
        if self.quality is not None:
            if self.images == "raw":
                raise UsageError("%(quality) applies to %(images=jpeg) or %(images=encoded), not raw")
            if not 1 <= self.quality <= 100:
                raise UsageError(f"%(quality) must be between 1 and 100, not {self.quality}")

    @property
    def channels(self) -> int:
        return CHANNELS[self.mode]

    @property
    def resizes(self) -> bool:
        """Whether images may change size (``size`` or ``max_side``): pixel coordinates then move."""
        return self.size is not None or self.max_side is not None


@dataclass(frozen=True)
class Prepared:
    """One converted image: payload (HWC pixels, or an encoded file as 1-D uint8), decoded shape, codec (0: pixels),
    whether the source file was kept, its CRC-32, and its upright size (H, W) before any resize."""

    payload: np.ndarray
    shape: tuple[int, int, int]
    codec: int
    kept: bool
    crc: int
    original: tuple[int, int]


def read_source(path: str) -> bytes:
    """The bytes of a source file; a missing, unreadable or empty file raises DataError."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    if not data:
        raise DataError(f"{path}: empty file (0 bytes)")
    return data


def prepare_bytes(data: bytes, where: str, opts: ImageOptions) -> Prepared:
    """Convert an encoded image (a file's bytes); a JPEG already as asked is kept byte for byte.
    Any problem raises DataError naming ``where``."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise UsageError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES is set in this program; truncated images would be "
                         "stored as grey pixels. Unset it before converting.")
    crc = zlib.crc32(data)
    im = _open(where, data)
    try:
        try:  # decode every pixel: a truncated or corrupt file raises here instead of giving grey pixels
            im.load()
        except Exception as e:  # OSError "image file is truncated", SyntaxError "broken PNG file", ...
            raise DataError(f"{where}: cannot decode: {e}") from None
        orientation = _orientation(where, im)
        # MPO (several JPEGs in one file, from some cameras) decodes as its first image, like PIL's frame 0
        if opts.images == "encoded" and im.format in ("JPEG", "MPO") and im.mode == opts.mode and orientation == 1:
            shape = (im.height, im.width, opts.channels)
            return Prepared(np.frombuffer(data, dtype=np.uint8), shape, CODEC_JPEG, True, crc, shape[:2])
        out = prepare_image(ImageOps.exif_transpose(im) if orientation != 1 else im, where, opts)
    finally:
        im.close()
    return Prepared(out.payload, out.shape, out.codec, False, crc, out.original)


def prepare_image(im: Image.Image, where: str, opts: ImageOptions) -> Prepared:
    """Convert a decoded, upright PIL image (colour mode, resize) to raw pixels or encoded bytes (PNG, or
    JPEG when asked); ``crc`` is 0 (there is no source file), ``original`` its size before the resize."""
    original = (im.height, im.width)
    try:
        out = resize(to_mode(im, opts.mode), opts)
        shape = (out.height, out.width, opts.channels)
        if opts.images == "raw":
            return Prepared(np.asarray(out, dtype=np.uint8).reshape(shape), shape, 0, False, 0, original)
        codec = CODEC_JPEG if opts.images == "jpeg" or opts.quality is not None else CODEC_PNG
        payload = np.frombuffer(encode_image(out, codec, opts.quality), dtype=np.uint8)
    except (OSError, ValueError) as e:  # PIL cannot convert or encode this image
        raise DataError(f"{where}: cannot convert ({type(e).__name__}: {e})") from None
    return Prepared(payload, shape, codec, False, 0, original)


def prepare_image_value(v: Any, where: str, opts: ImageOptions) -> Prepared:
    """A PIL image or encoded image bytes, converted as ``opts`` asks."""
    if isinstance(v, Image.Image):
        return prepare_image(v, where, opts)
    return prepare_bytes(bytes(v), where, opts)


def _open(path: str, data: bytes) -> Image.Image:
    limit = Image.MAX_IMAGE_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # checked below, as an error
            im = Image.open(io.BytesIO(data), formats=OPEN_FORMATS)
    except Image.DecompressionBombError as e:
        raise DataError(f"{path}: image too large, over the decompression-bomb limit ({e})") from None
    except UnidentifiedImageError:
        raise DataError(f"{path}: not an image file PIL can read (JPEG, PNG, BMP, WebP, TIFF or GIF)") from None
    except Exception as e:  # a broken header raises SyntaxError, ValueError, struct.error, ...
        raise DataError(f"{path}: broken image header ({type(e).__name__}: {e})") from None
    w, h = im.size
    problem = None
    if limit and w * h > limit:
        problem = (f"image too large: {w}x{h} = {w * h} pixels, over the decompression-bomb limit of {limit} "
                   "pixels (PIL.Image.MAX_IMAGE_PIXELS)")
    elif w < 1 or h < 1:
        problem = f"image has no pixels ({w}x{h})"
    elif im.mode not in _PLAIN_MODES and im.mode not in _ALPHA_MODES:
        problem = f"unsupported image mode {im.mode!r} (8/16-bit greyscale, palette, RGB(A), CMYK and YCbCr work)"
    if problem is not None:
        im.close()
        raise DataError(f"{path}: {problem}")
    return im


def _orientation(path: str, im: Image.Image) -> int:
    """The EXIF orientation (1-8); 1 when absent, invalid or unreadable (logged with the file name)."""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = im.getexif().get(_ORIENTATION_TAG, 1)
    except Exception as e:  # a broken EXIF block does not make the pixels wrong
        log.warning("%s: unreadable EXIF data (%s); orientation ignored", path, e)
        return 1
    for w in caught:
        log.warning("%s: %s", path, str(w.message).strip())
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def to_mode(im: Image.Image, mode: str) -> Image.Image:
    """8-bit ``RGB`` or ``L``: alpha composited on black, 16-bit reduced to its high byte."""
    m = im.mode
    if m == "P" and "transparency" in im.info:
        m, im = "RGBA", im.convert("RGBA")
    if m in _ALPHA_MODES:
        a = np.asarray(im if m == _ALPHA_MODES[m] else im.convert(_ALPHA_MODES[m]))
        colour = a[..., :-1].astype(np.uint32)
        alpha = a[..., -1:].astype(np.uint32)
        composited = ((colour * alpha + 127) // 255).astype(np.uint8)  # round(colour * alpha / 255)
        im = Image.fromarray(composited if composited.shape[-1] == 3 else composited[..., 0])
    elif m.startswith("I;16"):
        im = Image.fromarray((np.asarray(im).astype(np.uint16) >> 8).astype(np.uint8))
    elif m not in ("L", "RGB"):
        im = im.convert("L" if m == "1" else "RGB")  # P, RGBX, CMYK (Adobe inverted too), YCbCr
    return im if im.mode == mode else im.convert(mode)


@dataclass(frozen=True)
class ResizePlan:
    """How one image of size ``w`` x ``h`` is resized: scaled to ``scaled`` (W, H), then cropped at
    ``(left, top)`` to ``out`` (W, H). A pixel coordinate x maps to ``x * scaled[0] / w - left``."""

    scaled: tuple[int, int]
    left: int
    top: int
    out: tuple[int, int]


def resize_plan(w: int, h: int, opts: ImageOptions) -> ResizePlan:
    """``--size H W``: scale the shorter side to cover H x W, then centre-crop; ``--max-side N``: scale down so the
    longer side is N; else nothing. Pixels and coordinates both take their geometry from here."""
    if opts.size is not None:
        th, tw = opts.size
        s = max(th / h, tw / w)
        rw, rh = max(tw, round(w * s)), max(th, round(h * s))
        return ResizePlan((rw, rh), (rw - tw) // 2, (rh - th) // 2, (tw, th))
    if opts.max_side is not None and max(w, h) > opts.max_side:
        s = opts.max_side / max(w, h)
        rw, rh = max(1, round(w * s)), max(1, round(h * s))
        return ResizePlan((rw, rh), 0, 0, (rw, rh))
    return ResizePlan((w, h), 0, 0, (w, h))


def resize(im: Image.Image, opts: ImageOptions) -> Image.Image:
    """Resize as :func:`resize_plan` says. Bilinear with antialiasing (PIL ``resize``)."""
    plan = resize_plan(im.width, im.height, opts)
    if plan.scaled != im.size:
        im = im.resize(plan.scaled, RESAMPLE)
    if plan.out != plan.scaled:
        im = im.crop((plan.left, plan.top, plan.left + plan.out[0], plan.top + plan.out[1]))
    return im


def encode_image(im: Image.Image, codec: int, quality: int | None) -> bytes:
    """PNG (lossless) or JPEG at ``quality`` (default 90), without metadata: deterministic bytes."""
    buf = io.BytesIO()
    if codec == CODEC_JPEG:
        im.save(buf, "JPEG", quality=quality or DEFAULT_QUALITY, optimize=True)
    else:
        im.save(buf, "PNG", compress_level=PNG_COMPRESS_LEVEL)
    return buf.getvalue()


# names that say "pixel coordinates": key points, landmarks, kp(s), boxes, bbox(es), coords, points, joints, ...
COORDINATE_NAME = re.compile(r"key_?points?|landmarks?|(^|[_.-])kps?([_.-]|$)|b_?box|boxes|(^|[_.-])box([_.-]|$)"
                             r"|coord|points?|joints?|corners?|polygons?|(^|[_.-])xy([_.-]|$)", re.IGNORECASE)


def rescale(a: np.ndarray, kind: str, original: Sequence[int], opts: ImageOptions) -> np.ndarray:
    """``a``'s pixel coordinates (``kind`` keypoints or boxes) in the image of upright size
    ``original`` (H, W) moved to the stored image: ``x * new_w / old_w - left``, ``y * new_h / old_h - top``."""
    h, w = int(original[0]), int(original[1])
    plan = resize_plan(w, h, opts)
    sx, sy = plan.scaled[0] / w, plan.scaled[1] / h
    out = np.array(a, dtype=np.float64)
    xs = [0, 2] if kind == "boxes" else [0]
    for c in xs:
        out[..., c] = out[..., c] * sx - plan.left
        out[..., c + 1] = out[..., c + 1] * sy - plan.top
    return out.astype(FLOAT_DTYPE)


def check_declared(lasts: Mapping[str, int | None], keypoints: Sequence[str], boxes: Sequence[str],
                   not_coordinates: Sequence[str], missing: Callable[[str, str], str],
                   bad: Callable[[str, str, str], str]) -> None:
    """Each declared name is in ``lasts`` (name -> its values' last axis length; None: not numeric) with the
    shape its kind needs; ``missing(flag, name)`` and ``bad(flag, name, need)`` word the UsageError."""
    for flag, names in (("keypoints", keypoints), ("boxes", boxes), ("not_coordinates", not_coordinates)):
        for name in names:
            if name not in lasts:
                raise UsageError(missing(flag, name))
    for flag, names, need in (("keypoints", keypoints, "(..., 2 or more): x, y first"),
                              ("boxes", boxes, "(..., 4): x0, y0, x1, y1")):
        for name in names:
            last = lasts[name]
            if last is None or (last < 2 if flag == "keypoints" else last != 4):
                raise DataError(bad(flag, name, need))


def looks_like(name: str, last: int | None, rows: Iterable[Any], originals: Iterable[Sequence[int]]) -> str | None:
    """Why a numeric field ``name`` whose values' last axis has ``last`` entries looks like pixel
    coordinates of images of upright sizes ``originals`` (H, W), or None (file and Python sources alike)."""
    if last is None or last < 2:
        return None
    if COORDINATE_NAME.search(name):
        return "its name says coordinates"
    if last > 4:
        return None
    top = 0.0
    xs, ys = ([0, 2], [1, 3]) if last == 4 else ([0], [1])  # boxes: both corners; points: x, y
    for a, (h, w) in zip(rows, originals):
        a = np.asarray(a, dtype=np.float64)
        if a.size == 0:
            continue
        x, y = a[..., xs], a[..., ys]
        if not (np.all((x >= 0) & (x <= w)) and np.all((y >= 0) & (y <= h))):
            return None
        top = max(top, float(a[..., :2].max()))
    return f"its {last} values per row lie inside each image" if top > 1 else None
