"""Small test images of every kind the image converter must handle, made in tmp_path.

Each maker writes one file and returns the pixels a correct converter stores for it in
``RGB`` (computed here with numpy, independently of the converter), or None when the
expected pixels are PIL's own decode of the file (lossy JPEG inputs).
"""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image


def pattern(h: int, w: int, seed: int = 0) -> np.ndarray:
    """An asymmetric RGB test pattern: gradients plus a little noise, uint8 (h, w, 3)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([x * 255 // max(1, w - 1), y * 255 // max(1, h - 1), (x + 2 * y) % 256], axis=-1).astype(np.int16)
    a += rng.integers(-6, 7, a.shape, dtype=np.int16)
    return np.clip(a, 0, 255).astype(np.uint8)


def pil_rgb(path: Path) -> np.ndarray:
    """PIL's decode of a file, as RGB (no orientation applied)."""
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def jpeg(path: Path, h: int = 24, w: int = 32, seed: int = 0, quality: int = 92, exif_orientation: int | None = None,
         mode: str = "RGB") -> None:
    a = pattern(h, w, seed)
    im = Image.fromarray(a).convert(mode)
    kwargs = {}
    if exif_orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = exif_orientation
        kwargs["exif"] = exif
    im.save(path, "JPEG", quality=quality, **kwargs)


def png_rgb(path: Path, h: int = 20, w: int = 28, seed: int = 0) -> np.ndarray:
    a = pattern(h, w, seed)
    Image.fromarray(a).save(path, "PNG")
    return a


def png_rgba(path: Path) -> np.ndarray:
    rgb = pattern(12, 10, 1)
    alpha = np.tile(np.linspace(0, 255, 10).astype(np.uint8), (12, 1))[..., None]
    Image.fromarray(np.concatenate([rgb, alpha], axis=-1)).save(path, "PNG")
    return np.round(rgb * (alpha / 255.0)).astype(np.uint8)  # composited on black


def png_la(path: Path) -> np.ndarray:
    grey = pattern(9, 11, 2)[..., 0]
    alpha = np.full_like(grey, 128)
    Image.fromarray(np.stack([grey, alpha], axis=-1)).save(path, "PNG")
    return np.repeat(np.round(grey * (128 / 255.0)).astype(np.uint8)[..., None], 3, axis=-1)


def png_palette(path: Path, transparent: bool = False) -> np.ndarray:
    rng = np.random.default_rng(3)
    palette = rng.integers(0, 256, (16, 3), dtype=np.uint8)
    index = rng.integers(0, 16, (10, 14), dtype=np.uint8)
    im = Image.frombytes("P", (14, 10), index.tobytes())
    im.putpalette(palette.reshape(-1).tolist())
    expected = palette[index]
    if transparent:
        im.save(path, "PNG", transparency=5)
        expected = np.where((index == 5)[..., None], 0, expected).astype(np.uint8)
    else:
        im.save(path, "PNG")
    return expected


def png_grey(path: Path) -> np.ndarray:
    g = pattern(15, 13, 4)[..., 1]
    Image.fromarray(g).save(path, "PNG")
    return np.repeat(g[..., None], 3, axis=-1)


def png_grey16(path: Path) -> np.ndarray:
    g = (np.arange(8 * 9, dtype=np.uint32).reshape(8, 9) * 911 % 65536).astype(np.uint16)
    Image.fromarray(g).save(path, "PNG")
    return np.repeat((g >> 8).astype(np.uint8)[..., None], 3, axis=-1)


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_raw(width: int, height: int, bit_depth: int, colour_type: int, rows: bytes) -> bytes:
    """A PNG written by hand (for 16-bit RGB and for headers promising huge images)."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", zlib.compress(rows))
            + _png_chunk(b"IEND", b""))


def png_rgb16(path: Path) -> np.ndarray:
    a = (np.arange(5 * 6 * 3, dtype=np.uint32).reshape(5, 6, 3) * 2221 % 65536).astype(np.uint16)
    rows = b"".join(b"\x00" + a[r].astype(">u2").tobytes() for r in range(5))
    path.write_bytes(png_raw(6, 5, 16, 2, rows))
    return (a >> 8).astype(np.uint8)


def png_1bit(path: Path) -> np.ndarray:
    bits = (pattern(8, 16, 5)[..., 0] > 128)
    Image.fromarray(bits).save(path, "PNG")
    return np.repeat(np.where(bits, 255, 0).astype(np.uint8)[..., None], 3, axis=-1)


def lossless(path: Path, fmt: str, **kwargs: object) -> np.ndarray:
    a = pattern(11, 17, 6)
    Image.fromarray(a).save(path, fmt, **kwargs)
    return a


def gif_animated(path: Path) -> np.ndarray:
    frames = [Image.new("RGB", (7, 5), c) for c in ((200, 10, 10), (10, 200, 10))]
    frames[0].save(path, "GIF", save_all=True, append_images=frames[1:])
    with Image.open(path) as im:  # the first frame, through GIF's palette
        return np.asarray(im.convert("RGB"))


def cmyk_jpeg(path: Path) -> None:
    """Blocks of pure cyan, magenta, yellow and black, as an (Adobe) CMYK JPEG."""
    a = np.zeros((16, 32, 4), np.uint8)
    for k in range(4):
        a[:, k * 8 : (k + 1) * 8, k] = 255
    Image.frombytes("CMYK", (32, 16), a.tobytes()).save(path, "JPEG", quality=95)


def truncated_jpeg(path: Path) -> None:
    buf = io.BytesIO()
    Image.fromarray(pattern(64, 64, 7)).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    path.write_bytes(data[: len(data) // 2])


def huge_png(path: Path, side: int) -> None:
    """A tiny file whose header promises side x side pixels (a decompression bomb)."""
    path.write_bytes(png_raw(side, side, 8, 0, b"\x00" * 16))


def float_tiff(path: Path) -> None:
    Image.fromarray(np.ones((4, 4), np.float32)).save(path, "TIFF")


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)
