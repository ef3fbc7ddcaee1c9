"""Reading image shards: decoders (simplejpeg and PIL), threads, corrupt data, field selection, the format."""

from __future__ import annotations

import io
import json
import multiprocessing as mp
import pickle
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastdata
import imagegen as g
from conftest import edit_manifest
from fastdata import ImageOptions, WriteOptions
from fastdata.reading import decode
from fastdata.errors import CorruptShardError, FormatError
from fastdata.format import ImageSpec, read_manifest

RGB = ImageSpec(mode="RGB")


@pytest.fixture
def encoded(tmp_path: Path) -> tuple[Path, list[Path]]:
    """An encoded dataset of 6 JPEGs (two sizes) and 2 PNGs, with the source files."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        g.jpeg(src / f"{i}.jpg", h=24 if i % 2 else 32, w=40, seed=i)
    for i in range(2):
        g.png_rgb(src / f"p{i}.png", h=24, w=40, seed=i)
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1), images=ImageOptions()))
    return tmp_path / "ds", sorted(src.iterdir())


def jpeg_bytes(a: np.ndarray, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def test_simplejpeg_and_pil_decode_the_same_pixels(encoded):
    root, files = encoded
    fast = fastdata.open(root).get_batch(np.arange(8))["image"]
    for i, p in enumerate(files):
        h, w = g.pil_rgb(p).shape[:2]
        assert np.array_equal(fast[i, :h, :w], g.pil_rgb(p))


@pytest.mark.parametrize("jpeg", ["simplejpeg", "pil"])
def test_decoders_raise_on_truncated_jpeg(jpeg):
    decode_image = decode.decode_image if jpeg == "simplejpeg" else decode.decode_pil
    data = jpeg_bytes(g.pattern(32, 32))
    out = np.empty((32, 32, 3), np.uint8)
    decode_image(data, 1, RGB, out)
    assert np.array_equal(out, np.asarray(Image.open(io.BytesIO(data))))
    for cut in (len(data) // 2, len(data) - 2):
        with pytest.raises(decode.DecodeError, match="(?i)truncated"):
            decode_image(data[:cut], 1, RGB, out)
    with pytest.raises(decode.DecodeError, match="decodes to"):
        decode_image(data, 1, RGB, np.empty((16, 32, 3), np.uint8))


def test_png_and_unknown_codec():
    a = g.pattern(5, 7)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    out = np.empty((5, 7, 3), np.uint8)
    decode.decode_image(buf.getvalue(), 2, RGB, out)
    assert np.array_equal(out, a)
    with pytest.raises(decode.DecodeError, match="decodes to mode RGB, the field is L"):
        decode.decode_image(buf.getvalue(), 2, ImageSpec(mode="L"), np.empty((5, 7, 1), np.uint8))
    with pytest.raises(decode.DecodeError, match="unknown codec 7"):
        decode.decode_image(buf.getvalue(), 7, RGB, out)


def test_threads_give_the_same_batch(encoded):
    root, _ = encoded
    one = fastdata.open(root, decode_threads=1).get_batch([5, 1, 3, 3, 0, 7, 2])
    three = fastdata.open(root, decode_threads=3).get_batch([5, 1, 3, 3, 0, 7, 2])
    assert one.keys() == three.keys()
    for k in one:
        assert np.array_equal(one[k], three[k])
    uniform = fastdata.open(root, decode_threads=2).get_batch([1, 3, 5, 6])  # all 24 x 40
    assert uniform["image"].shape == (4, 24, 40, 3) and uniform["image"].flags.c_contiguous


def test_corrupt_stored_image_names_the_sample(encoded):
    root, files = encoded
    shard = root / read_manifest(root).shards[0].file
    blob = bytearray(shard.read_bytes())
    data = files[2].read_bytes()
    at = bytes(blob).find(data)
    assert at > 0
    blob[at : at + 4] = b"\x00\x00\x00\x00"  # no JPEG start marker any more; same file size
    shard.write_bytes(bytes(blob))
    ds = fastdata.open(root)
    assert ds[1]["image"].shape == (24, 40, 3)
    with pytest.raises(CorruptShardError, match=rf"sample 2: field 'image': cannot decode jpeg"):
        ds.get_batch([0, 2, 4])


def test_decode_false_and_field_selection(encoded):
    root, files = encoded
    raw = fastdata.open(root, decode=False)
    b = raw.get_batch([0, 1])
    assert set(b) == {"image", "image_lengths", "image_shape", "image_codec"}
    assert b["image"].ndim == 2 and b["image"][0, : b["image_lengths"][0]].tobytes() == files[0].read_bytes()
    assert raw[0]["image"].tobytes() == files[0].read_bytes()
    only = fastdata.open(root, fields=["image"])  # its shape and codec fields are read, not returned (issue 48)
    assert set(only.get_batch([0])) == {"image"}
    assert set(only.get_batch([0], companions=True)) == {"image", "image_shape", "image_codec"}


def test_dataset_with_decoder_pickles_and_forks(encoded):
    root, files = encoded
    ds = fastdata.open(root, decode_threads=2)
    expected = ds.get_batch(np.arange(8))["image"]  # starts the parent's thread pool
    clone = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(clone.get_batch(np.arange(8))["image"], expected)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_reads, args=(ds, q))
    p.start()
    got = q.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0 and np.array_equal(got, expected)


def _child_reads(ds: fastdata.Dataset, q: mp.Queue) -> None:
    q.put(ds.get_batch(np.arange(8))["image"])


def test_ragged_pixels_shape_that_disagrees_with_the_bytes_is_corrupt(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    g.png_rgb(src / "a.png", h=6, w=5)
    g.png_rgb(src / "b.png", h=7, w=4)  # mixed sizes: stored ragged, with each image's shape
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1, backend="lmdb"), images=ImageOptions(images="raw")))
    ds = fastdata.open(tmp_path / "ds")
    assert ds.manifest.fields[0].encoding == "pixels"
    assert ds[0]["image"].shape == (6, 5, 3)
    shard = tmp_path / "ds" / ds.manifest.shards[0].file
    blob = shard.read_bytes()
    shape = np.array([6, 5, 3], "<i8").tobytes()
    assert blob.count(shape) == 1
    shard.write_bytes(blob.replace(shape, np.array([5, 6, 4], "<i8").tobytes()))
    with pytest.raises(CorruptShardError, match=r"sample 0: field 'image' records image shape \[5, 6, 4\]"):
        fastdata.open(tmp_path / "ds")[0]


def _manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


@pytest.mark.parametrize("edit,message", [
    (lambda m: m["fields"].pop(1), "needs the field 'image_shape'"),
    (lambda m: m["fields"][0]["image"].update(mode="CMYK"), "unknown image mode 'CMYK'"),
    (lambda m: m["fields"][0]["image"].update(layout="CHW"), "unknown image layout 'CHW'"),
    (lambda m: m["fields"][0].pop("image"), "needs an 'image' object"),
    (lambda m: m["fields"][2].update(dtype="<u2"), "'image_codec' must be raw |u1"),
    (lambda m: m["fields"][0].update(encoding="webp"), "unknown encoding 'webp'"),
])
def test_manifest_image_rules_are_enforced(encoded, edit, message):
    root, _ = encoded
    edit_manifest(root, edit)
    with pytest.raises(FormatError, match=message):
        fastdata.open(root)


def test_raw_image_field_shape_must_match_its_mode(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    g.png_rgb(src / "a.png", h=6, w=5)
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1), images=ImageOptions(images="raw", size=(4, 4))))
    m = _manifest(tmp_path / "ds")
    assert m["fields"][0] == {"name": "image", "dtype": "|u1", "shape": [4, 4, 3], "encoding": "raw",
                              "image": {"mode": "RGB", "layout": "HWC"}}
    m["fields"][0]["image"]["mode"] = "L"
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FormatError, match=r"must be \|u1 of fixed shape \[H, W, 1\]"):
        fastdata.open(tmp_path / "ds")
