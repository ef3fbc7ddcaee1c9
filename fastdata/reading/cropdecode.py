"""Decode only what a crop keeps: one image's window, JPEGs at the smallest DCT scale that still has the
output's resolution, resampled bilinearly into its row of a fixed-size float batch."""

from __future__ import annotations

import math
import threading
from typing import Any

import numpy as np
import simplejpeg
import torch

from fastdata.format.spec import CODEC_JPEG, ImageSpec
from fastdata.reading.decode import SJ_COLORSPACE, decode_image

SCALES = (8, 4, 2, 1)  # the DCT reductions libjpeg decodes at (1/8 ... 1; its m/8 scales decode slower than 1)
# a window decodes at 1/s while it keeps this fraction of the output's size; below 1 loses visible quality
REACH = 1.0
FAST = {"fastdct": True, "fastupsample": True}  # simplejpeg's faster IDCT and chroma upsampling for windows
_INV255 = np.float32(1 / 255)


def dct_scale(w: float, h: float, ow: int, oh: int) -> int:
    """The largest reduction ``s`` (8, 4, 2 or 1) at which the window (``w`` x ``h`` source pixels) still
    has ``REACH`` of the output's size (``ow`` x ``oh``) on both axes."""
    for s in SCALES:
        if w / s >= REACH * ow and h / s >= REACH * oh:
            return s
    return 1


def _axis(x0: float, extent: float, n_out: int, n_src: int, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For one axis: each output pixel's two source indices and weight, on an
    image of ``n_src`` pixels that is ``scale`` times the full one; positions clamp to the image."""
    j = np.arange(n_out, dtype=np.float64)
    u = x0 + (j + 0.5) * (extent / n_out) - 0.5  # full-resolution position
    v = (u + 0.5) * scale - 0.5 if scale != 1 else u
    v = np.clip(v, 0, n_src - 1)
    i0 = np.floor(v).astype(np.int64)
    t = (v - i0).astype(np.float32)
    i1 = np.minimum(i0 + 1, n_src - 1)
    return i0, i1, t


def resample_into(src: np.ndarray, box: tuple[float, float, float, float], full_hw: tuple[int, int],
                  out: np.ndarray, flip: tuple[bool, bool] = (False, False), exact: bool = False) -> None:
    """Bilinear samples of the window ``box`` (x0, y0, w, h in pixels of the full image ``full_hw``) from ``src``
    (uint8 HWC, any scale) into ``out`` (float32 (oh, ow, C), /255), mirrored as ``flip`` says."""
    x0, y0, w, h = box
    oh, ow = out.shape[:2]
    n_y, n_x = src.shape[:2]
    sy, sx = n_y / full_hw[0], n_x / full_hw[1]  # the whole image, maybe decoded at a reduced scale
    rows, cols = _line(y0, h, oh, sy), _line(x0, w, ow, sx)
    if not exact and _fast_resize(src, rows, cols, out, flip):
        return
    r0, r1, ty = _axis(y0, h, oh, n_y, sy)
    c0, c1, tx = _axis(x0, w, ow, n_x, sx)
    first, last = int(c0[0]), int(c1[-1]) + 1
    if flip[0]:
        c0, c1, tx = c0[::-1], c1[::-1], tx[::-1]
    if flip[1]:
        r0, r1, ty = r0[::-1], r1[::-1], ty[::-1]
    _lerp2(src[:, first:last], (r0, r1, ty), (c0 - first, c1 - first, tx), out)


def _line(x0: float, extent: float, n_out: int, scale: float) -> tuple[float, float]:
    """One axis's sample positions in ``src`` as ``(c, s)``: output pixel ``j`` samples ``c + j * s``
    (before clamping; the full-resolution position mapped onto an image ``scale`` times the full one)."""
    s = extent / n_out * scale
    return (x0 + 0.5 * extent / n_out) * scale - 0.5, s


# torch's uint8 bilinear resize is fast only on AVX2 (channels-last); elsewhere the exact float path runs
_FAST_RESIZE = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
# source pixels: the largest sample-position error the uint8 resize may make, else the exact path
_TOLERANCE = 0.1
_LEAD = 64  # at most this many extra outputs computed before the window's, to line torch's sample grid up with it
_UPSAMPLE = torch.ops.aten.upsample_bilinear2d.out  # takes the output size and the scale both (F.interpolate: one)
_scratch = threading.local()  # each thread's reused memory for the resize's input and output (no page faults per image)


def _grid(c: float, s: float, n: int) -> tuple[int, int, float] | None:
    """Line torch's grid (output ``i`` of an input starting at pixel ``a`` samples ``a + (i + 0.5) * t - 0.5``) up
    with ours (``c + j * s``): ``(a, k, t)`` whose outputs ``k .. k + n - 1`` are within ``_TOLERANCE``, or None."""
    e = c + 0.5 - s / 2  # the window's first edge: ours is c + j * s = e + (j + 0.5) * s - 0.5
    m = (n - 1) / 2
    for k in range(_LEAD + 1):
        a = math.floor(e - k * s + 0.5)
        r = e - k * s - a
        t = s + r / (k + m + 0.5)
        if (k + 0.5) * t >= 0.5 and m * abs(r) / (k + m + 0.5) <= _TOLERANCE:  # torch's output k is at or past a
            return a, k, t
    return None


def _fast_resize(src: np.ndarray, rows: tuple[float, float], cols: tuple[float, float], out: np.ndarray,
                 flip: tuple[bool, bool]) -> bool:
    """The window resized by torch's uint8 kernel and converted to float once, into ``out``; False (nothing
    written) where it cannot match the sampling (see :func:`_grid`)."""
    (oh, ow), c = out.shape[:2], src.shape[2]
    if not _FAST_RESIZE or c > 4 or src.dtype != np.uint8:
        return False
    gy, gx = _grid(*rows, oh), _grid(*cols, ow)
    if gy is None or gx is None:
        return False
    spans = [(a, math.floor(a + (k + n - 0.5) * t - 0.5) + 2) for (a, k, t), n in ((gy, oh), (gx, ow))]
    if any(b <= 0 or a >= end for (a, b), end in zip(spans, src.shape[:2])):
        return False  # a window wholly outside the pixels given (not from a crop's draw): the exact path clamps
    # an output as large as its input is a copy to torch whatever the scale: one more (dropped) output then
    size = [k + n + (k + n == b - a) for (a, k, _), n, (a, b) in zip((gy, gx), (oh, ow), spans)]
    win = _padded(src, spans[0], spans[1])
    y = _buffer("out", size[0] * size[1] * c)[: size[0] * size[1] * c].reshape(size[0], size[1], c)
    x, yt = torch.from_numpy(win).permute(2, 0, 1)[None], torch.from_numpy(y).permute(2, 0, 1)[None]
    _UPSAMPLE(x, size, False, 1 / gy[2], 1 / gx[2], out=yt)  # channels-last in and out: no packing copies
    _to_float(y[gy[1] : gy[1] + oh, gx[1] : gx[1] + ow], out, flip)
    return True


def _buffer(name: str, n: int) -> np.ndarray:
    """This thread's uint8 scratch ``name``, at least ``n`` bytes."""
    buf = getattr(_scratch, name, None)
    if buf is None or buf.size < n:
        buf = np.empty(max(n, 1 << 20), np.uint8)
        setattr(_scratch, name, buf)
    return buf


def _padded(src: np.ndarray, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
    """``src[r0:r1, c0:c1]`` as a C-contiguous array (what torch's kernel takes without a copy of its own),
    indices outside ``src`` repeating its edge pixels."""
    (r0, r1), (c0, c1) = rows, cols
    h, w, c = src.shape
    y0, y1, x0, x1 = max(r0, 0), min(r1, h), max(c0, 0), min(c1, w)
    part = src[y0:y1, x0:x1]
    if (y0, y1, x0, x1) == (r0, r1, c0, c1) and part.flags.c_contiguous and part.flags.writeable:
        return part  # whole rows of a decoded image: no copy
    buf = _buffer("in", (r1 - r0) * (c1 - c0) * c)[: (r1 - r0) * (c1 - c0) * c].reshape(r1 - r0, c1 - c0, c)
    buf[y0 - r0 : y1 - r0, x0 - c0 : x1 - c0] = part
    buf[: y0 - r0] = buf[y0 - r0]
    buf[y1 - r0 :] = buf[y1 - r0 - 1]
    buf[:, : x0 - c0] = buf[:, x0 - c0 : x0 - c0 + 1]
    buf[:, x1 - c0 :] = buf[:, x1 - c0 - 1 : x1 - c0]
    return buf


def _to_float(y: np.ndarray, out: np.ndarray, flip: tuple[bool, bool]) -> None:
    """uint8 (oh, ow, C) into float32 ``out`` /255, mirrored as ``flip`` says (columns by torch: numpy's
    reversed copy of 3-byte pixels is slow)."""
    dst = out[::-1] if flip[1] else out
    if not flip[0]:
        np.multiply(y, _INV255, out=dst, dtype=np.float32)
        return
    step = max(1, _GRAIN // max(1, y.shape[1] * y.shape[2]))
    for a in range(0, y.shape[0], step):
        np.multiply(torch.from_numpy(y[a : a + step]).flip(1).numpy(), _INV255, out=dst[a : a + step], dtype=np.float32)


_GRAIN = 32767  # elements per torch op: below torch's parallel grain (32768), so each op runs in the calling thread


def _lerp2(src: np.ndarray, rows: tuple[np.ndarray, np.ndarray, np.ndarray],
           cols: tuple[np.ndarray, np.ndarray, np.ndarray], out: np.ndarray) -> None:
    """Separable bilinear interpolation, rows first, in blocks small enough that torch runs each op in the
    calling thread (the reader threads are the parallelism)."""
    c = src.shape[2]
    flat = torch.from_numpy(np.ascontiguousarray(src)).view(src.shape[0], -1)  # (h, w' * C) uint8
    r0, r1, ty = (torch.from_numpy(np.ascontiguousarray(a)) for a in rows)
    c0, c1, tx = cols
    chan = np.arange(c)
    i0 = torch.from_numpy((c0[:, None] * c + chan).ravel())
    i1 = torch.from_numpy((c1[:, None] * c + chan).ravel())
    wx = torch.from_numpy(np.repeat(tx, c)).view(1, -1)
    o = torch.from_numpy(out).view(out.shape[0], -1)
    step = max(1, _GRAIN // max(flat.shape[1], o.shape[1]))
    for a in range(0, o.shape[0], step):
        b = min(o.shape[0], a + step)
        top = flat.index_select(0, r0[a:b]).float()
        kept = torch.lerp(top, flat.index_select(0, r1[a:b]).float(), ty[a:b].view(-1, 1))
        torch.lerp(kept.index_select(1, i0), kept.index_select(1, i1), wx, out=o[a:b])
        o[a:b].mul_(float(_INV255))


def decode_crop(data: Any, codec: int, spec: ImageSpec, hw: tuple[int, int], box: tuple[float, float, float, float],
                out: np.ndarray, flip: tuple[bool, bool] = (False, False)) -> str:
    """Decode the window ``box`` of one encoded image (recorded size ``hw``) into ``out`` (float32 (oh, ow, C) in
    [0, 1]), mirrored as ``flip`` says; returns ``"scaled"`` or ``"full"``, raises DecodeError on corrupt data."""
    oh, ow = out.shape[:2]
    h, w = hw
    n = h * w * spec.channels
    pixels = _buffer("full", n)[:n].reshape(h, w, spec.channels)
    s = dct_scale(box[2], box[3], ow, oh) if codec == CODEC_JPEG else 1
    fast = FAST if (box[2], box[3]) != (ow, oh) else {}  # a window taken as it is (a crop) keeps exact pixels
    src = _decode_jpeg(data, spec, (math.ceil(h / s), math.ceil(w / s)), pixels, fast) if codec == CODEC_JPEG else None
    if src is None:  # another codec, or a stream that needs the full decoder's judgement (corrupt, or a warning)
        decode_image(data, codec, spec, pixels)
        src, s = pixels, 1
    resample_into(src, box, hw, out, flip=flip)
    return "scaled" if s > 1 else "full"


def _decode_jpeg(data: Any, spec: ImageSpec, min_hw: tuple[int, int], pixels: np.ndarray,
                 fast: dict[str, bool]) -> np.ndarray | None:
    """The whole JPEG decoded at the reduction that gives at least ``min_hw``, into ``pixels``' memory; None
    when the stream needs the full decoder's judgement (corrupt, a recoverable warning, or not the recorded size)."""
    try:
        if tuple(simplejpeg.decode_jpeg_header(data)[:2]) != pixels.shape[:2]:
            return None
        a = simplejpeg.decode_jpeg(data, colorspace=SJ_COLORSPACE[spec.mode], strict=True, buffer=pixels.reshape(-1),
                                   min_height=min_hw[0], min_width=min_hw[1], **fast)
    except ValueError:
        return None
    return a.reshape(a.shape[0], a.shape[1], -1)
