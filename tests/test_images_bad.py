"""Bad images: a clear error naming the file (exit 1, nothing written), or skipped with --skip-bad."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

import fastdata
import imagegen as g
from fastdata import ImageOptions, WriteOptions
from fastdata.converters import ConvertConfig, Request, detect
from fastdata.errors import DataError, UsageError

BAD = {
    "empty.jpg": (lambda p: p.write_bytes(b""), "empty file (0 bytes)"),
    "truncated.jpg": (g.truncated_jpeg, "truncated"),
    "text.jpg": (lambda p: p.write_text("this is not a picture\n"), "not an image file PIL can read"),
    "bomb.png": (lambda p: g.huge_png(p, 10_000), "decompression-bomb limit"),
    "bigger bomb.png": (lambda p: g.huge_png(p, 20_000), "decompression-bomb limit"),
    "float.tiff": (g.float_tiff, "unsupported image mode 'F'"),
}


def good_folder(root: Path) -> Path:
    root.mkdir(parents=True)
    for i in range(3):
        g.jpeg(root / f"good {i}.jpg", h=16, w=16, seed=i)
    return root


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_file_fails_naming_it(tmp_path, run_cli, name):
    src = good_folder(tmp_path / "src")
    make, message = BAD[name]
    make(src / name)
    code, out, err = run_cli("convert", src, tmp_path / "ds", "--images", "raw", "--quiet")
    assert code == 1, err
    assert str(src / name) in err and message in err and "Traceback" not in err
    assert not (tmp_path / "ds").exists()


def test_files_that_are_not_images_are_skipped_or_refused_with_strict(tmp_path, run_cli):
    src = good_folder(tmp_path / "src")
    (src / "notes.txt").write_text("hello")
    (src / "Thumbs.db").write_bytes(b"\0" * 10)
    code, _, err = run_cli("convert", src, tmp_path / "ds", "--strict", "--quiet")
    assert code == 1 and str(src / "Thumbs.db") in err and "not a sample file" in err
    assert not (tmp_path / "ds").exists()
    code, out, err = run_cli("convert", src, tmp_path / "ds", "--quiet")
    assert code == 0 and "skipped 2 file(s) that are not samples: Thumbs.db, notes.txt" in err
    assert "3 samples" in out


@pytest.mark.parametrize("mode", ["encoded", "raw", "jpeg"])
def test_skip_bad_lists_every_bad_file_with_its_reason(tmp_path, mode):
    src = good_folder(tmp_path / "src")
    for name, (make, _) in BAD.items():
        make(src / name)
    report = fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=2), skip_bad=True, images=ImageOptions(images=mode)))
    assert report.samples == 3 and len(report.skipped) == len(BAD)
    listed = json.loads((tmp_path / "ds" / "skipped.json").read_text())
    assert [e["path"] for e in listed] == sorted(BAD)
    for e in listed:
        assert BAD[e["path"]][1] in e["reason"] and str(src / e["path"]) in e["reason"]
    ds = fastdata.open(tmp_path / "ds")
    for i in range(3):
        assert np.abs(ds[i]["image"].astype(int) - g.pil_rgb(src / f"good {i}.jpg")).max() <= (0 if mode != "jpeg" else 40)


def test_truncated_jpeg_is_never_stored_as_grey(tmp_path):
    """PIL would half-decode it with LOAD_TRUNCATED_IMAGES; the converter refuses the file instead."""
    src = tmp_path / "src"
    src.mkdir()
    g.truncated_jpeg(src / "cut.jpg")
    for mode in ("encoded", "raw", "jpeg"):
        with pytest.raises(DataError, match="cut.jpg: cannot decode: image file is truncated"):
            fastdata.convert(src, tmp_path / mode, fastdata.ConvertConfig(write=WriteOptions(workers=1), images=ImageOptions(images=mode)))
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_a_program_that_allows_truncated_images_is_refused(tmp_path, monkeypatch):
    src = good_folder(tmp_path / "src")
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(UsageError, match="LOAD_TRUNCATED_IMAGES"):
        fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1), images=ImageOptions()))


def test_images_mixed_with_npy_is_an_error_naming_a_file(tmp_path, run_cli):
    src = good_folder(tmp_path / "src")
    np.save(src / "stray.npy", np.zeros(3))
    code, _, err = run_cli("convert", src, tmp_path / "ds")
    assert code == 1 and str(src / "stray.npy") in err and "images" in err


def test_labels_file_must_cover_every_image(tmp_path):
    src = good_folder(tmp_path / "src")
    labels = tmp_path / "labels.csv"
    labels.write_text("good 0.jpg,1\ngood 1.jpg,2\n")
    with pytest.raises(DataError, match="good 2.jpg: no label for it"):
        fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1), images=ImageOptions()), labels=labels)
    labels.write_text("good 0.jpg,1\ngood 1.jpg,2\ngood 2.jpg,0\nmissing.jpg,3\n")
    with pytest.raises(DataError, match="lists 'missing.jpg', which is not a file"):
        fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1), images=ImageOptions()), labels=labels)


def test_a_file_that_changes_during_the_conversion_is_an_error(tmp_path):
    src = good_folder(tmp_path / "src")
    for k, mode in enumerate(("encoded", "raw")):
        config = ConvertConfig(WriteOptions(workers=1), ImageOptions(images=mode))
        source = detect(Request(src)).scan(Request(src), config, None)
        assert source.read(0)["image"].dtype == np.uint8
        g.jpeg(src / "good 0.jpg", h=16, w=16, seed=99 + k)
        with pytest.raises(DataError, match="good 0.jpg: changed during the conversion"):
            source.read(0)


def test_exif_that_cannot_be_parsed_does_not_lose_the_image(tmp_path, caplog):
    src = tmp_path / "src"
    src.mkdir()
    a = g.pattern(8, 8)
    Image.fromarray(a).save(src / "x.png", "PNG", exif=b"Exif\x00\x00II*\x00\xff\xff\xff\x7f")  # offset past the end
    with caplog.at_level("WARNING"):
        ds = fastdata.open(_convert(src, tmp_path / "ds"))
    assert np.array_equal(ds[0]["image"], a)
    assert any(str(src / "x.png") in r.getMessage() and "EXIF" in r.getMessage() for r in caplog.records)


def _convert(src: Path, dst: Path) -> Path:
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=WriteOptions(workers=1), images=ImageOptions(images="raw")))
    return dst
