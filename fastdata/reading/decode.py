"""Image decoding for the read path: stored image fields -> one uint8 HWC batch array; JPEG by simplejpeg
(GIL released), PNG and JPEGs strict mode refuses by PIL; corrupt data raises DecodeError."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import simplejpeg

from fastdata.errors import CorruptShardError
from fastdata.format.spec import (
    CODEC_JPEG,
    CODEC_PNG,
    CODEC_SUFFIX,
    CODECS,
    ENCODING_IMAGE,
    LENGTHS_SUFFIX,
    MAX_SAMPLE_BYTES,
    SHAPE_SUFFIX,
    FieldSpec,
    ImageSpec,
)
from fastdata.handles import PerProcessHandle
from fastdata.world import usable_cpus

SJ_COLORSPACE = {"RGB": "RGB", "L": "GRAY"}  # a field's mode -> simplejpeg's colorspace
_PIL_FORMATS = {CODEC_JPEG: ["JPEG"], CODEC_PNG: ["PNG"]}
_JPEG_MODES = ("L", "RGB", "CMYK")  # what PIL decodes a baseline or progressive 8-bit JPEG to


class DecodeError(ValueError):
    """Stored bytes that do not decode to the recorded image."""


def decode_image(data: Any, codec: int, spec: ImageSpec, out: np.ndarray) -> None:
    """Decode one encoded image into ``out``, a ``(H, W, C)`` uint8 array of its recorded shape; raises
    DecodeError when the bytes are corrupt or decode to another size or mode."""
    if codec == CODEC_JPEG:
        colorspace = SJ_COLORSPACE[spec.mode]
        try:
            if out.flags.c_contiguous:
                got = simplejpeg.decode_jpeg(data, colorspace=colorspace, buffer=out, strict=True).shape
            else:
                a = simplejpeg.decode_jpeg(data, colorspace=colorspace, strict=True)
                got = a.shape
                if got == out.shape:
                    out[...] = a
            if got == out.shape:
                return
        except ValueError:
            pass  # corrupt, or only a recoverable warning: PIL decides below
    decode_pil(data, codec, spec, out)


def decode_pil(data: Any, codec: int, spec: ImageSpec, out: np.ndarray) -> None:
    from PIL import Image

    formats = _PIL_FORMATS.get(codec)
    if formats is None:
        raise DecodeError(f"unknown codec {codec} (known: {', '.join(f'{k}={v}' for k, v in CODECS.items())})")
    try:
        with Image.open(io.BytesIO(data), formats=formats) as im:
            if codec == CODEC_JPEG and im.mode != spec.mode:
                im.draft(spec.mode, im.size)  # libjpeg converts greyscale <-> YCbCr itself, as simplejpeg does
            im.load()
            a = np.asarray(_jpeg_to_mode(im, spec.mode) if codec == CODEC_JPEG else im)
            if codec != CODEC_JPEG and im.mode != spec.mode:
                raise DecodeError(f"{CODECS[codec]} decodes to mode {im.mode}, the field is {spec.mode}")
    except DecodeError:
        raise
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, ... on corrupt data
        raise DecodeError(f"cannot decode {CODECS[codec]}: {type(e).__name__}: {e}") from None
    a = a.reshape(a.shape[0], a.shape[1], -1)
    if a.shape != out.shape:
        raise DecodeError(f"{CODECS[codec]} decodes to {a.shape}, the recorded shape is {out.shape}")
    out[...] = a


def _jpeg_to_mode(im: Any, mode: str) -> Any:
    """A decoded JPEG in the field's mode, converted as simplejpeg (libjpeg-turbo) converts it:
    greyscale, RGB and CMYK JPEGs all read as RGB or L (CMYK through RGB)."""
    if im.mode == mode:
        return im
    if im.mode not in _JPEG_MODES:
        raise DecodeError(f"JPEG decodes to mode {im.mode}, which cannot be read as {mode}")
    return (im.convert("RGB") if im.mode == "CMYK" else im).convert(mode)


def check_shapes(field: FieldSpec, shapes: np.ndarray, lengths: np.ndarray,
                 where: Callable[[int], str]) -> tuple[int, int, int, int]:
    """Check the recorded image shapes of a batch against the field and the stored byte counts
    (``pixels``: exactly ``H*W*C``); return the padded batch shape ``(B, Hmax, Wmax, C)``."""
    spec = field.image
    assert spec is not None
    bad = (shapes < 0).any(axis=1) | (shapes[:, 2] != spec.channels)
    bad |= shapes[:, 0].astype(np.float64) * shapes[:, 1] * spec.channels > MAX_SAMPLE_BYTES
    if field.encoding != ENCODING_IMAGE:
        bad |= lengths != shapes.prod(axis=1)
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise CorruptShardError(
            f"{where(k)}: field {field.name!r} records image shape {shapes[k].tolist()} ({spec.mode}) "
            f"for {int(lengths[k])} stored bytes"
        )
    b = len(shapes)
    hmax = int(shapes[:, 0].max()) if b else 0
    wmax = int(shapes[:, 1].max()) if b else 0
    return (b, hmax, wmax, spec.channels)


class BatchDecoder(PerProcessHandle[ThreadPoolExecutor]):
    """Turns the stored bytes of an image field into one uint8 ``(B, H, W, C)`` array (``unit_float``: float32
    in [0, 1]), on ``threads`` threads (default: the usable CPUs; a pool made lazily in each process)."""

    def __init__(self, threads: int | None = None, unit_float: bool = False) -> None:
        if threads is not None and threads < 1:
            raise ValueError("decode threads must be at least 1")
        self.threads = threads or usable_cpus()
        self.unit_float = unit_float

    def _open_handle(self) -> ThreadPoolExecutor:
        return ThreadPoolExecutor(max(1, self.threads - 1), thread_name_prefix="fastdata-decode")

    @staticmethod
    def _close_handle(handle: ThreadPoolExecutor) -> None:
        handle.shutdown(wait=False, cancel_futures=True)  # idle threads exit; a running decode finishes

    def finish(self, field: FieldSpec, batch: dict[str, np.ndarray], where: Callable[[int], str],
               into: np.ndarray | None = None) -> None:
        """Replace ``batch[name]`` (bytes padded per row) by images and drop ``<name>_lengths``; ``where(k)`` names
        row ``k`` in errors, ``into`` (C-contiguous, of the output dtype) takes the images when large enough."""
        name, spec = field.name, field.image
        assert spec is not None, "only image fields are decoded"
        data = batch[name]
        lengths = batch.pop(name + LENGTHS_SUFFIX)
        shapes = batch[name + SHAPE_SUFFIX]
        b = len(shapes)
        out_shape = check_shapes(field, shapes, lengths, where)
        hmax, wmax = out_shape[1:3]
        uniform = bool(np.all(shapes[:, :2] == (hmax, wmax)))
        n = int(np.prod(out_shape))
        dtype = np.dtype(np.float32 if self.unit_float else np.uint8)
        if into is not None and into.dtype == dtype and into.flags.c_contiguous and into.size >= n:
            out = into.reshape(-1)[:n].reshape(out_shape)
            if not uniform:
                out[...] = 0
        else:
            out = (np.empty if uniform else np.zeros)(out_shape, dtype=dtype)
        codecs = batch[name + CODEC_SUFFIX]
        rows = [(k, int(lengths[k]), int(codecs[k]), int(h), int(w)) for k, (h, w, _) in enumerate(shapes.tolist())]
        scale = np.float32(1 / 255)

        def run(part: list[tuple[int, int, int, int, int]]) -> None:
            scratch = np.empty(max((h * w for _, _, _, h, w in part), default=0) * spec.channels, np.uint8)
            for k, n, codec, h, w in part:
                try:
                    if self.unit_float:  # decode into this thread's scratch, convert while it is in cache
                        pixels = scratch[: h * w * spec.channels].reshape(h, w, spec.channels)
                        decode_image(data[k, :n], codec, spec, pixels)
                        dst = out[k, :h, :w]
                        dst[...] = pixels  # a plain cast, then the multiply in place: faster
                        np.multiply(dst, scale, out=dst)  # than one mixed-type multiply
                    else:
                        decode_image(data[k, :n], codec, spec, out[k, :h, :w])
                except DecodeError as e:
                    raise CorruptShardError(f"{where(k)}: field {name!r}: {e}") from None

        parts = min(self.threads, b)
        cuts = [b * i // parts for i in range(parts + 1)] if parts else [0, 0]
        # the calling thread decodes the last part itself; the pool the others
        futures = [self.handle().submit(run, rows[cuts[i] : cuts[i + 1]]) for i in range(len(cuts) - 2)]
        try:
            run(rows[cuts[-2] :])
        finally:
            for f in futures:
                f.exception()  # wait for every part before leaving, even on an error
        for f in futures:
            f.result()
        batch[name] = out

