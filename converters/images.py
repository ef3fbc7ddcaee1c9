"""Images as sources: one source image -> what an image dataset stores (fully decoded, a truncated file raises;
upright, 8-bit ``RGB`` or ``L``, resized if asked; the same file and options always give the same bytes), and image
folders (``root/<class>/<file>`` or a flat folder + labels file) -> samples."""

from __future__ import annotations

import io
import logging
import os
import re
import warnings
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from fastdata.converters.config import ConvertConfig, ImageOptions
from fastdata.converters.registry import Request, SourceKind, register
from fastdata.converters.scan import FolderSource, Labels, check_labelled, find_labels, map_tasks, refuse_bad
from fastdata.converters.table_read import FLOAT_DTYPE
from fastdata.errors import DataError, FastdataError, UsageError
from fastdata.format import FieldSpec, ImageSpec, make_field
from fastdata.format.manifest import IMAGE_SUFFIXES
from fastdata.format.spec import (
    CODEC_DTYPE,
    CODEC_JPEG,
    CODEC_PNG,
    CODEC_SUFFIX,
    CODECS,
    ENCODING_IMAGE,
    ENCODING_PIXELS,
    SHAPE_DTYPE,
    SHAPE_SUFFIX,
)
from fastdata.write import Progress

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


# Pixel coordinates (keypoints: x, y first; boxes: x0, y0, x1, y1) of tables or Python samples follow the resize
# (float32); an undeclared look-alike field is then refused.
# names that say "pixel coordinates": key points, landmarks, kp(s), boxes, bbox(es), coords, points, joints, ...
COORDINATE_NAME = re.compile(r"key_?points?|landmarks?|(^|[_.-])kps?([_.-]|$)|b_?box|boxes|(^|[_.-])box([_.-]|$)"
                             r"|coord|points?|joints?|corners?|polygons?|(^|[_.-])xy([_.-]|$)", re.IGNORECASE)


def rescale(a: np.ndarray, kind: str, original: Sequence[int], opts: ImageOptions) -> np.ndarray:
    """``a``'s pixel coordinates (``kind`` keypoints or boxes) in the image of upright size ``original`` (H, W)
    moved to the stored image as the loader's Keypoints and Boxes move them (docs/augment.md): a keypoint is a pixel
    index, ``(x + 0.5) * new_w / old_w - 0.5 - left``; a box's edges are ``x * new_w / old_w - left``."""
    h, w = int(original[0]), int(original[1])
    plan = resize_plan(w, h, opts)
    sx, sy = plan.scaled[0] / w, plan.scaled[1] / h
    half = 0.0 if kind == "boxes" else 0.5  # a keypoint is a pixel's centre, a box edge lies between pixels
    out = np.array(a, dtype=np.float64)
    for c in [0, 2] if kind == "boxes" else [0]:
        out[..., c] = (out[..., c] + half) * sx - half - plan.left
        out[..., c + 1] = (out[..., c + 1] + half) * sy - half - plan.top
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


# Image folders: every image is converted at scan to learn its stored shape, and again by the shard workers (same
# bytes).
IMAGE_FIELD = "image"
# A resizing conversion stores each image's upright size before the resize (int32 H, W) as "<image>_original_size".
ORIGINAL_SIZE_SUFFIX = "_original_size"
ORIGINAL_SIZE_DTYPE = np.dtype("<i4")
_SCAN_CHUNK = 32  # files per scan task


def image_specs(name: str, opts: ImageOptions, fixed: tuple[int | None, ...] | None = None) -> list[FieldSpec]:
    """The fields image field ``name`` is stored as: one fixed-shape field when every image is raw pixels of shape
    ``fixed``, else payload and shape (plus codec when encoded, plus original size when resized)."""
    spec = ImageSpec(mode=opts.mode)
    if fixed is not None:
        fields = [make_field(name, "|u1", fixed, image=spec)]
    else:
        encoding = ENCODING_PIXELS if opts.images == "raw" else ENCODING_IMAGE
        fields = [make_field(name, "|u1", (None,), encoding=encoding, image=spec),
                  make_field(name + SHAPE_SUFFIX, SHAPE_DTYPE, (3,))]
        if encoding == ENCODING_IMAGE:
            fields.append(make_field(name + CODEC_SUFFIX, CODEC_DTYPE, ()))
    if opts.resizes:
        fields.append(make_field(name + ORIGINAL_SIZE_SUFFIX, ORIGINAL_SIZE_DTYPE, (2,)))
    return fields


def image_arrays(name: str, p: Prepared, opts: ImageOptions, fixed: bool) -> dict[str, np.ndarray]:
    """What one converted image is stored as: the fields :func:`image_specs` names."""
    out: dict[str, np.ndarray]
    if fixed:
        out = {name: p.payload.reshape(p.shape)}
    else:
        out = {name: p.payload.reshape(-1), name + SHAPE_SUFFIX: np.asarray(p.shape, dtype=SHAPE_DTYPE)}
        if opts.images != "raw":
            out[name + CODEC_SUFFIX] = np.asarray(p.codec, dtype=np.uint8)
    if opts.resizes:
        out[name + ORIGINAL_SIZE_SUFFIX] = np.asarray(p.original, dtype=ORIGINAL_SIZE_DTYPE)
    return out


# The per-file columns of the scan, in _scan_chunk's order, and their types.
_COLUMNS: dict[str, Any] = {"shapes": np.int64, "nbytes": np.int64, "codecs": np.uint8, "kept": bool,
                            "crcs": np.uint32, "originals": ORIGINAL_SIZE_DTYPE, "file_sizes": np.int64}


def _scan_chunk(root: str, rels: list[str], opts: ImageOptions) -> list[tuple[Any, ...]]:
    """Convert each file once: (shape, payload bytes, codec, kept, crc, original size, file size) or (error message,)."""
    out: list[tuple[Any, ...]] = []
    for rel in rels:
        path = os.path.join(root, rel)
        try:
            p = prepare_bytes(read_source(path), path, opts)
        except DataError as e:
            out.append((str(e),))
            continue
        out.append((p.shape, p.payload.nbytes, p.codec, p.kept, p.crc, p.original, os.path.getsize(path)))
    return out


@dataclass(kw_only=True)
class ImageFolderSource(FolderSource):
    """Image files under a folder; one sample per file, in sorted order of relative path."""

    COLUMNS = tuple(_COLUMNS)

    opts: ImageOptions
    shapes: np.ndarray  # (n, 3) int64: stored H, W, C
    nbytes: np.ndarray  # (n,) payload bytes
    codecs: np.ndarray  # (n,) uint8, 0 for pixels
    kept: np.ndarray  # (n,) bool: the source file's bytes, untouched
    crcs: np.ndarray  # (n,) uint32 CRC-32 of the source files
    originals: np.ndarray  # (n, 2) int32: upright H, W before any resize
    file_sizes: np.ndarray  # (n,)
    kind: str = "image-folder"
    fixed: tuple[int, ...] | None = None  # every image has this shape: a fixed-shape field

    @classmethod
    def scan(cls, root: Path, opts: ImageOptions, rels: list[str], labels: Labels, skip_bad: bool = False,
             workers: int | None = None, progress: Progress | None = None) -> "ImageFolderSource":
        """Convert-check every image file ``rels`` under ``root``; bad files raise (or are skipped)."""
        bad: dict[str, str] = {}
        check_labelled(root, rels, labels, bad)
        todo = [r for r in rels if r not in bad]
        if progress is not None:
            progress.start(len(todo), 0, desc="checking images")
        tasks = [(str(root), todo[i : i + _SCAN_CHUNK], opts) for i in range(0, len(todo), _SCAN_CHUNK)]
        results = map_tasks(_scan_chunk, tasks, workers, progress, lambda r: sum(x[-1] for x in r if len(x) > 1))
        bad.update((rel, r[0]) for rel, r in zip(todo, results) if len(r) == 1)  # (error message,)
        good = [(rel, r) for rel, r in zip(todo, results) if len(r) > 1]
        skipped = refuse_bad(bad, skip_bad)
        if not good:
            raise DataError(f"{root}: no usable images (all {len(rels)} files are bad)")
        columns = {k: np.array([g[1][c] for g in good], dtype=t) for c, (k, t) in enumerate(_COLUMNS.items())}
        shapes = columns["shapes"]
        # raw images of one shape (always so with --size) are a fixed-shape field, read with plain copies
        fixed = tuple(shapes[0].tolist()) if opts.images == "raw" and bool((shapes == shapes[0]).all()) else None
        return cls.labelled_source(root, [g[0] for g in good], labels, image_specs(IMAGE_FIELD, opts, fixed), skipped,
                                   opts=opts, fixed=fixed, **columns)

    @property
    def bytes_in(self) -> int:
        return int(self.file_sizes.sum())

    def sample_nbytes(self) -> np.ndarray:
        return self.nbytes + sum(f.row_nbytes for f in self.fields if f.name != IMAGE_FIELD)

    def ragged_rows(self, name: str) -> np.ndarray:  # asked only for the ragged field: the image, when not fixed
        return self.nbytes

    def read(self, i: int) -> dict[str, np.ndarray]:
        path = os.path.join(self.root, self.rels[i])
        if self.kept[i]:
            data = read_source(path)
            p = Prepared(np.frombuffer(data, dtype=np.uint8), tuple(self.shapes[i].tolist()), int(self.codecs[i]), True,
                         zlib.crc32(data), tuple(self.originals[i].tolist()))
        else:
            p = prepare_bytes(read_source(path), path, self.opts)
        if p.crc != self.crcs[i]:
            raise DataError(f"{path}: changed during the conversion; convert again")
        if p.payload.nbytes != self.nbytes[i]:  # same file, other bytes: conversion is not deterministic here
            raise FastdataError(f"{path}: converted to {p.payload.nbytes} bytes, {self.nbytes[i]} at scan time")
        return self.labelled(image_arrays(IMAGE_FIELD, p, self.opts, self.fixed is not None), i)

    def inputs(self) -> tuple[list[str], list[np.ndarray]]:
        files, values = super().inputs()
        return files, [*values, self.crcs]  # a changed image with the same size and time changes its CRC

    def describe(self) -> dict[str, Any]:
        codecs = Counter(CODECS.get(int(c), "pixels") for c in self.codecs)
        return {
            **super().describe(), "images": self.opts.images,
            "mode": self.opts.mode, "size": list(self.opts.size) if self.opts.size else None,
            "max_side": self.opts.max_side, "quality": self.opts.quality,
            "kept_files": int(self.kept.sum()), "codecs": dict(sorted(codecs.items())),
        }


def _detect(req: Request) -> bool:
    """A folder of images (labels from class sub-folders, a labels file, or none)."""
    if req.meta is not None or req.arrays or req.src is None or not req.src.is_dir():
        return False
    if not any(is_image_file(r) for r in req.files):
        return False
    arrays = [r for r in req.files if r.lower().endswith((".npy", ".npz"))]
    if arrays:
        raise DataError(f"{req.src / arrays[0]}: an array file in a folder of images; a folder holds either "
                        "images or .npy/.npz samples, not both")
    return True


def _scan(req: Request, config: "ConvertConfig", progress: Progress | None) -> ImageFolderSource:
    assert req.src is not None
    rels, labels = find_labels(req.src, req.files, is_image_file, "images", req.labels, config)
    return ImageFolderSource.scan(req.src, config.images or ImageOptions(), rels, labels, config.skip_bad,
                                  config.write.workers, progress)


register(SourceKind("image-folder", _detect, _scan))
