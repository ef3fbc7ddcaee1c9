"""A JPEG whose colour space differs from its field's mode (greyscale or CMYK in an RGB field, colour
in an L field) reads the same through simplejpeg and through the PIL fallback: converted to the
field's mode (docs/format.md, "Image fields"). A PNG must be in the field's mode on every path."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fastdata.reading import decode
from fastdata.format import ImageSpec
from fastdata.format.spec import CODEC_JPEG, CODEC_PNG

H, W = 24, 40
CHANNELS = {"RGB": 3, "L": 1}


def _encoded(stored_mode: str, fmt: str = "JPEG") -> bytes:
    rgb = np.random.default_rng(4).integers(0, 256, (H, W, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).convert(stored_mode).save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def _decode(data: bytes, field_mode: str, decoder: str) -> np.ndarray:
    out = np.full((H, W, CHANNELS[field_mode]), 7, np.uint8)
    run = decode.decode_pil if decoder == "pil" else decode.decode_image
    run(data, CODEC_JPEG, ImageSpec(mode=field_mode), out)
    return out


def _reference(data: bytes, field_mode: str) -> np.ndarray:
    """What a user expects: the JPEG decoded in the field's mode by libjpeg (greyscale is the luma
    channel, as stored), else PIL's own conversion of the decoded image."""
    im = Image.open(io.BytesIO(data))
    im.draft(field_mode, im.size)
    im = im.convert("RGB") if im.mode == "CMYK" else im
    return np.asarray(im.convert(field_mode)).reshape(H, W, CHANNELS[field_mode])


@pytest.mark.parametrize("decoder", ["simplejpeg", "pil"])
@pytest.mark.parametrize("stored,field", [("L", "RGB"), ("CMYK", "RGB"), ("RGB", "L"), ("CMYK", "L"), ("L", "L"), ("RGB", "RGB")])
def test_each_decoder_converts_a_jpeg_to_the_field_mode(stored, field, decoder):
    data = _encoded(stored)
    got = _decode(data, field, decoder)
    want = _reference(data, field)
    # CMYK: libjpeg-turbo and PIL round their CMYK -> RGB conversions differently (by 1-2 levels)
    tolerance = 2 if stored == "CMYK" else 0
    assert int(np.abs(got.astype(int) - want).max()) <= tolerance
    if stored == "L" and field == "RGB":
        assert (got[..., 0] == got[..., 1]).all() and (got[..., 1] == got[..., 2]).all()


@pytest.mark.parametrize("stored,field", [("L", "RGB"), ("CMYK", "RGB"), ("RGB", "L"), ("CMYK", "L")])
def test_both_decoders_give_the_same_pixels(stored, field):
    data = _encoded(stored)
    fast = _decode(data, field, "simplejpeg")
    slow = _decode(data, field, "pil")
    assert int(np.abs(fast.astype(int) - slow).max()) <= (2 if stored == "CMYK" else 0)


@pytest.mark.parametrize("stored,field", [("L", "RGB"), ("RGB", "L")])
def test_a_png_in_another_mode_is_refused(stored, field):
    out = np.empty((H, W, CHANNELS[field]), np.uint8)
    with pytest.raises(decode.DecodeError, match=f"png decodes to mode {stored}, the field is {field}"):
        decode.decode_image(_encoded(stored, "PNG"), CODEC_PNG, ImageSpec(mode=field), out)
