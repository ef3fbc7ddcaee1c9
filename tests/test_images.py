"""Image folders -> shards: the three --images modes, colour and orientation, labels, determinism."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastdata
import imagegen as g
from fastdata import ImageOptions, WriteOptions
from conftest import tree_state

BACKENDS = ["hdf5", "lmdb"]
ONE = WriteOptions(workers=1)


def convert(src: Path, dst: Path, backend: str = "hdf5", workers: int = 1, shard_size: int = 256 << 20, **opts) -> fastdata.Dataset:
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=WriteOptions(backend=backend, workers=workers, shard_size=shard_size), images=ImageOptions(**opts)))
    return fastdata.open(dst)


@pytest.fixture
def jpeg_folder(tmp_path: Path) -> Path:
    """src/<class>/<file>: JPEGs and PNGs of several sizes, names with spaces and non-ASCII characters."""
    src = tmp_path / "src"
    for c, cls in enumerate(("cat", "dog")):
        (src / cls).mkdir(parents=True)
        for i in range(3):
            g.jpeg(src / cls / f"photo {i} é.jpg", h=20 + 4 * i, w=30, seed=10 * c + i)
        g.png_rgb(src / cls / f"drawing ü{c}.png", seed=c)
    return src


@pytest.mark.parametrize("backend", BACKENDS)
def test_encoded_keeps_jpeg_bytes_and_decodes_like_pil(tmp_path, jpeg_folder, backend):
    before = tree_state(jpeg_folder)
    ds = convert(jpeg_folder, tmp_path / "ds", backend)
    files = sorted(p for p in jpeg_folder.rglob("*") if p.is_file())
    rels = [p.relative_to(jpeg_folder).as_posix() for p in files]
    assert rels == sorted(rels) and len(ds) == 8
    assert ds.classes == ["cat", "dog"]
    stored = fastdata.open(tmp_path / "ds", decode=False).get_batch(np.arange(8))
    for i, p in enumerate(files):
        n = stored["image_lengths"][i]
        if p.suffix == ".jpg":
            assert stored["image"][i, :n].tobytes() == p.read_bytes()  # the file, byte for byte
            assert stored["image_codec"][i] == 1
        else:
            assert stored["image_codec"][i] == 2  # other inputs: lossless PNG
        s = ds[i]
        assert np.array_equal(s["image"], g.pil_rgb(p))
        assert s["label"] == (0 if p.parent.name == "cat" else 1)
        assert list(s["image_shape"]) == [*g.pil_rgb(p).shape]
    assert tree_state(jpeg_folder) == before
    field = ds.manifest.field("image")
    assert (field.encoding, field.image.mode, field.image.layout) == ("image", "RGB", "HWC")


def test_multi_picture_jpeg_is_kept_and_decodes_as_its_first_image(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    first, second = g.pattern(16, 24, 1), g.pattern(16, 24, 2)
    Image.fromarray(first).save(src / "camera.jpg", "MPO", save_all=True, append_images=[Image.fromarray(second)])
    ds = convert(src, tmp_path / "ds")
    stored = fastdata.open(tmp_path / "ds", decode=False)[0]["image"]
    assert stored.tobytes() == (src / "camera.jpg").read_bytes()
    with Image.open(src / "camera.jpg") as im:
        assert im.format == "MPO" and im.n_frames == 2
        assert np.array_equal(ds[0]["image"], np.asarray(im.convert("RGB")))


def test_batch_of_mixed_sizes_is_padded_and_sizes_reported(tmp_path, jpeg_folder):
    ds = convert(jpeg_folder, tmp_path / "ds")
    b = ds.get_batch([2, 0, 3])
    shapes = b["image_shape"]
    assert b["image"].shape == (3, shapes[:, 0].max(), shapes[:, 1].max(), 3) and b["image"].dtype == np.uint8
    for k, i in enumerate([2, 0, 3]):
        h, w, _ = shapes[k]
        assert np.array_equal(b["image"][k, :h, :w], ds[i]["image"])
        assert not b["image"][k, h:].any() and not b["image"][k, :, w:].any()  # zero padding
    assert "image_lengths" not in b


def resize_then_crop(a: np.ndarray, h: int, w: int) -> np.ndarray:
    """The documented --size rule, written out: scale so the image covers h x w, centre-crop."""
    ih, iw = a.shape[:2]
    s = max(h / ih, w / iw)
    rw, rh = max(w, round(iw * s)), max(h, round(ih * s))
    r = np.asarray(Image.fromarray(a).resize((rw, rh), Image.Resampling.BILINEAR))
    top, left = (rh - h) // 2, (rw - w) // 2
    return r[top : top + h, left : left + w]


@pytest.mark.parametrize("backend", BACKENDS)
def test_raw_size_equals_pil_decode_after_the_same_resize(tmp_path, backend):
    src = tmp_path / "src"
    src.mkdir()
    sizes = [(40, 30), (30, 50), (16, 24), (12, 16)]  # (h, w): taller, wider, exact, upscaled
    for i, (h, w) in enumerate(sizes):
        g.png_rgb(src / f"{i}.png", h=h, w=w, seed=i)
    ds = convert(src, tmp_path / "ds", backend, images="raw", size=(12, 16))
    f = ds.manifest.field("image")
    assert (f.encoding, list(f.shape), f.dtype) == ("raw", [12, 16, 3], "|u1")
    batch = ds.get_batch(np.arange(4))
    assert batch["image"].shape == (4, 12, 16, 3)
    for i, (h, w) in enumerate(sizes):
        expect = resize_then_crop(g.pattern(h, w, i), 12, 16)
        assert np.array_equal(batch["image"][i], expect), i
    assert "label" not in batch and ds.classes is None  # a flat folder has no labels


def test_raw_max_side_is_ragged_with_shapes(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i, (h, w) in enumerate([(40, 20), (10, 12), (25, 50)]):
        g.png_rgb(src / f"{i}.png", h=h, w=w, seed=i)
    ds = convert(src, tmp_path / "ds", images="raw", max_side=20)
    assert ds.manifest.field("image").encoding == "pixels"
    expected_shapes = [(20, 10, 3), (10, 12, 3), (10, 20, 3)]  # longer side 20; small ones kept
    for i, shape in enumerate(expected_shapes):
        s = ds[i]
        assert s["image"].shape == shape and tuple(s["image_shape"]) == shape
        h, w = [(40, 20), (10, 12), (25, 50)][i]
        src_a = g.pattern(h, w, i)
        expect = src_a if max(h, w) <= 20 else np.asarray(Image.fromarray(src_a).resize(shape[1::-1], Image.Resampling.BILINEAR))
        assert np.array_equal(s["image"], expect)
    b = ds.get_batch([0, 2])
    assert b["image"].shape == (2, 20, 20, 3) and not b["image"][1, 10:].any()


def test_jpeg_mode_is_smaller_with_a_psnr_floor(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    originals = [g.png_rgb(src / f"{i}.png", h=64, w=64, seed=i) for i in range(3)]
    ds = convert(src, tmp_path / "ds", images="jpeg", quality=85)
    stored = fastdata.open(tmp_path / "ds", decode=False).get_batch(np.arange(3))
    assert (stored["image_codec"] == 1).all()
    for i, a in enumerate(originals):
        assert stored["image_lengths"][i] < a.nbytes / 2
        assert stored["image_lengths"][i] < (src / f"{i}.png").stat().st_size
        assert g.psnr(ds[i]["image"], a) > 30
    small = convert(src, tmp_path / "small", images="jpeg", max_side=32)
    assert small[0]["image"].shape == (32, 32, 3)
    assert g.psnr(small[0]["image"], np.asarray(Image.fromarray(originals[0]).resize((32, 32), Image.Resampling.BILINEAR))) > 30


KINDS = {
    "rgba.png": g.png_rgba,
    "la.png": g.png_la,
    "palette.png": g.png_palette,
    "palette transparent.png": lambda p: g.png_palette(p, transparent=True),
    "grey.png": g.png_grey,
    "grey16.png": g.png_grey16,
    "rgb16.png": g.png_rgb16,
    "bilevel.png": g.png_1bit,
    "image.bmp": lambda p: g.lossless(p, "BMP"),
    "image.webp": lambda p: g.lossless(p, "WEBP", lossless=True),
    "image.tiff": lambda p: g.lossless(p, "TIFF"),
    "animated.gif": g.gif_animated,
}


@pytest.fixture
def kinds_folder(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    src = tmp_path / "kinds"
    src.mkdir()
    expected = {name: make(src / name) for name, make in KINDS.items()}
    g.jpeg(src / "rotated.jpg", h=24, w=32, exif_orientation=6)
    expected["rotated.jpg"] = np.rot90(g.pil_rgb(src / "rotated.jpg"), k=-1)  # 6: turn 90 degrees clockwise
    g.jpeg(src / "mirrored.jpg", h=24, w=32, exif_orientation=2)
    expected["mirrored.jpg"] = g.pil_rgb(src / "mirrored.jpg")[:, ::-1]
    g.cmyk_jpeg(src / "cmyk.jpg")
    expected["cmyk.jpg"] = g.pil_rgb(src / "cmyk.jpg")
    g.jpeg(src / "grey.jpg", mode="L")
    expected["grey.jpg"] = g.pil_rgb(src / "grey.jpg")
    return src, expected


def test_every_colour_mode_becomes_rgb_upright(tmp_path, kinds_folder):
    src, expected = kinds_folder
    names = sorted(expected)
    raw = convert(src, tmp_path / "raw", images="raw")
    enc = convert(src, tmp_path / "enc")
    for i, name in enumerate(names):
        got = raw[i]["image"]
        assert got.dtype == np.uint8 and got.shape == expected[name].shape, name
        assert np.array_equal(got, expected[name]), name
        assert np.array_equal(enc[i]["image"], got), name  # encoded stores them losslessly
    cmyk = raw[names.index("cmyk.jpg")]["image"]
    assert np.abs(cmyk[8, 4].astype(int) - (0, 255, 255)).max() < 8  # cyan block
    assert np.abs(cmyk[8, 28].astype(int) - (0, 0, 0)).max() < 8  # black block
    # every file here needs a fix (orientation, CMYK, greyscale, alpha, ...): none is kept as it is
    codecs = fastdata.open(tmp_path / "enc", decode=False).get_batch(np.arange(len(names)))["image_codec"]
    assert (codecs == 2).all()
    assert enc.manifest.source["kept_files"] == 0


def test_mode_l_is_single_channel(tmp_path, kinds_folder):
    src, expected = kinds_folder
    names = sorted(expected)
    ds = convert(src, tmp_path / "ds", images="raw", mode="L")
    assert ds.manifest.field("image").image.mode == "L"
    for i, name in enumerate(names):
        rgb = expected[name].astype(np.int64)
        luma = (rgb[..., 0] * 299 + rgb[..., 1] * 587 + rgb[..., 2] * 114) / 1000  # ITU-R 601-2
        got = ds[i]["image"]
        assert got.shape == (*rgb.shape[:2], 1), name
        assert np.abs(got[..., 0] - luma).max() <= 1, name
    enc = convert(src, tmp_path / "enc", mode="L")
    grey = names.index("grey.jpg")
    stored = fastdata.open(tmp_path / "enc", decode=False).get_batch([grey])
    assert stored["image"][0, : stored["image_lengths"][0]].tobytes() == (src / "grey.jpg").read_bytes()
    assert np.array_equal(enc[grey]["image"], ds[grey]["image"])


def test_labels_file_with_string_labels(tmp_path):
    src = tmp_path / "flat"
    src.mkdir()
    for i in range(4):
        g.png_rgb(src / f"img {i}.png", h=8, w=8, seed=i)
    (src / "labels.csv").write_text("path,label\nimg 0.png,zebra\nimg 1.png,ant\nimg 2.png,zebra\nimg 3.png,bee\n")
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=ONE, images=ImageOptions(images="raw")), labels=src / "labels.csv")
    ds = fastdata.open(tmp_path / "ds")
    assert len(ds) == 4 and ds.classes == ["ant", "bee", "zebra"]
    assert ds.get_batch(np.arange(4))["label"].tolist() == [2, 0, 2, 1]


@pytest.mark.parametrize("mode,shard_size", [({"images": "jpeg"}, 2000), ({"images": "raw", "size": (8, 8)}, 500)])
def test_output_is_deterministic_whatever_the_workers(tmp_path, jpeg_folder, mode, shard_size):
    for name, workers in (("a", 1), ("b", 2), ("c", 2)):
        convert(jpeg_folder, tmp_path / name, workers=workers, shard_size=shard_size, **mode)
    shards = [fastdata.open(tmp_path / n).manifest.shards for n in "abc"]
    assert len(shards[0]) >= 3
    assert shards[0] == shards[1] == shards[2]
    for s in shards[0]:
        assert (tmp_path / "a" / s.file).read_bytes() == (tmp_path / "c" / s.file).read_bytes()
    assert (tmp_path / "a" / "manifest.json").read_text() == (tmp_path / "c" / "manifest.json").read_text().replace(
        str(tmp_path / "c"), str(tmp_path / "a"))


def test_symlinks_are_followed_once(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    g.png_rgb(src / "a" / "x.png", h=6, w=6)
    outside = tmp_path / "outside"
    outside.mkdir()
    g.png_rgb(outside / "y.png", h=7, w=7)
    os.symlink(outside / "y.png", src / "a" / "link.png")
    os.symlink(src, src / "a" / "loop")  # a cycle back to the root
    ds = convert(src, tmp_path / "ds", images="raw")
    assert len(ds) == 2 and sorted(tuple(ds[i]["image"].shape) for i in range(2)) == [(6, 6, 3), (7, 7, 3)]


def test_cli_converts_images_and_info_describes_them(tmp_path, jpeg_folder, run_cli):
    code, out, err = run_cli("convert", jpeg_folder, tmp_path / "ds", "--images", "raw", "--size", "8", "8",
                             "--format", "lmdb", "--quiet")
    assert code == 0, err
    assert out.count("\n") == 1 and "8 samples -> 1 lmdb shard(s)" in out
    code, out, _ = run_cli("info", tmp_path / "ds")
    assert code == 0 and "image        uint8     (8, 8, 3)" in out and "(RGB HWC)" in out
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["fields"][0]["image"] == {"mode": "RGB", "layout": "HWC"}
    assert manifest["source"]["images"] == "raw" and manifest["source"]["size"] == [8, 8]


@pytest.mark.parametrize("args,expect", [
    (["--images", "encoded", "--size", "8", "8"], "--size and --max-side resize images and need"),
    (["--images", "raw", "--quality", "80"], "--quality applies"),
    (["--images", "raw", "--size", "8", "8", "--max-side", "9"], "contradict"),
    (["--images", "jpeg", "--quality", "101"], "between 1 and 100"),
])
def test_cli_image_option_errors_are_usage_errors(tmp_path, jpeg_folder, run_cli, args, expect):
    code, _, err = run_cli("convert", jpeg_folder, tmp_path / "ds", *args)
    assert code == 2 and expect in err
    assert not (tmp_path / "ds").exists()


def test_image_options_on_a_npy_folder_are_refused(tmp_path, class_folder, run_cli):
    src, _ = class_folder
    code, _, err = run_cli("convert", src, tmp_path / "ds", "--images", "raw")
    assert code == 2 and "holds no images" in err
