"""Issue 48: a conversion that resizes images keeps every pixel coordinate of a metadata table true
(declared keypoint and box columns rescaled, the original size stored), and refuses a column that
looks like coordinates when nobody said what it is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from imagegen import png_rgb

import fastdata
from fastdata.converters import ConvertConfig, ImageOptions
from fastdata.errors import DataError, UsageError

SIZES = [(200, 300), (150, 120), (90, 90)]  # (H, W) of each source image: landscape, portrait, square


def _source(root: Path, keypoints: bool = True) -> list[dict]:
    """Images of several sizes and a JSON Lines table of keypoints (17, 3) with visibility and boxes (n, 4)."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = []
    for i, (h, w) in enumerate(SIZES):
        png_rgb(root / f"im{i}.png", h, w, seed=i)
        kp = np.stack([rng.uniform(0, w, 17), rng.uniform(0, h, 17), rng.integers(0, 3, 17)], axis=1)
        x0, y0 = rng.uniform(0, w / 2, 2), rng.uniform(0, h / 2, 2)
        boxes = np.stack([x0, y0, x0 + w / 3, y0 + h / 3], axis=1)
        row = {"path": f"im{i}.png", "boxes": boxes.tolist(), "label": i % 2}
        if keypoints:
            row["keypoints"] = kp.tolist()
        rows.append(row)
    (root / "ann.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def _theirs(a: np.ndarray, h: int, w: int, size: tuple[int, int] | None, max_side: int | None, box: bool) -> np.ndarray:
    """What a user's own rescaling gives (minus the centre crop): a box edge x * new_w / old_w, a keypoint (a pixel
    index) (x + 0.5) * new_w / old_w - 0.5; y the same with the heights."""
    if size is not None:
        th, tw = size
        s = max(th / h, tw / w)
        nw, nh = max(tw, round(w * s)), max(th, round(h * s))
        left, top = (nw - tw) // 2, (nh - th) // 2
    else:
        s = min(1.0, max_side / max(h, w))
        nw, nh, left, top = max(1, round(w * s)), max(1, round(h * s)), 0, 0
    out = np.array(a, dtype=np.float64)
    half = 0.0 if box else 0.5
    for c in ((0, 2) if box else (0,)):
        out[:, c] = (out[:, c] + half) * nw / w - half - left
        out[:, c + 1] = (out[:, c + 1] + half) * nh / h - half - top
    return out


@pytest.mark.parametrize("size,max_side", [((128, 128), None), ((64, 96), None), (None, 100)])
def test_resized_keypoints_and_boxes_match_a_users_own_rescaling(tmp_path, size, max_side):
    rows = _source(tmp_path / "src")
    opts = ImageOptions(images="raw", size=size, max_side=max_side)
    cfg = ConvertConfig(images=opts, keypoints=("keypoints",), boxes=("boxes",))
    fastdata.convert(tmp_path / "src", tmp_path / "ds", cfg, meta=tmp_path / "src" / "ann.jsonl")
    ds = fastdata.open(tmp_path / "ds")
    assert ds.manifest.field("image_original_size").dtype == "<i4"
    for i, ((h, w), row) in enumerate(zip(SIZES, rows)):
        s = ds[i]
        assert s["image_original_size"].tolist() == [h, w]
        if size is not None:
            assert s["image"].shape[:2] == size
        kp = np.asarray(row["keypoints"])
        got = np.asarray(s["keypoints"])
        assert np.abs(got[:, :2] - _theirs(kp, h, w, size, max_side, False)[:, :2]).max() < 1e-3
        assert got[:, 2].tolist() == kp[:, 2].tolist()  # visibility untouched
        boxes = np.asarray(s["boxes"])[: len(row["boxes"])]
        assert np.abs(boxes - _theirs(np.asarray(row["boxes"]), h, w, size, max_side, True)).max() < 1e-3


def test_a_resized_keypoint_stays_on_its_pixel_as_the_loaders_resize_moves_it(tmp_path):
    """A keypoint is a pixel index (docs/augment.md): one at the centre of a 4x4 white block stays at the block's
    centre when --size shrinks the image 4 times, and where the loader's Resize of the same image puts it. The
    conversion scaled x * s (a 0.375 px shift here), the loader (x + 0.5) * s - 0.5."""
    from PIL import Image

    from fastdata.augment import Augment, Resize
    from fastdata.augment.targets import Keypoints

    (tmp_path / "src").mkdir()
    a = np.zeros((64, 96, 3), np.uint8)
    a[20:24, 40:44] = 255  # pixel-index centre (41.5, 21.5)
    Image.fromarray(a).save(tmp_path / "src" / "im.png")
    (tmp_path / "src" / "ann.jsonl").write_text(json.dumps({"path": "im.png", "keypoints": [[41.5, 21.5, 2.0]]}) + "\n")
    meta = tmp_path / "src" / "ann.jsonl"
    cfg = ConvertConfig(images=ImageOptions(images="raw", size=(16, 24)), keypoints=("keypoints",))
    fastdata.convert(tmp_path / "src", tmp_path / "small", cfg, meta=meta)
    s = fastdata.open(tmp_path / "small")[0]
    ys, xs = np.nonzero(s["image"][..., 0] > 128)
    assert (xs.mean(), ys.mean()) == (10.0, 5.0)  # the block's centre in the stored image
    assert np.asarray(s["keypoints"])[0, :2].tolist() == [10.0, 5.0]
    fastdata.convert(tmp_path / "src", tmp_path / "full", ConvertConfig(images=ImageOptions(images="raw")), meta=meta)
    aug = Augment([Resize((16, 24))], targets={"keypoints": Keypoints()})
    batch = next(iter(fastdata.loader(tmp_path / "full", 1, device="cpu", augment=aug)))
    assert batch["keypoints"][0, 0, :2].tolist() == [10.0, 5.0]


def test_an_undeclared_coordinate_column_is_refused_only_when_resizing(tmp_path, run_cli):
    _source(tmp_path / "src")
    src, meta = tmp_path / "src", tmp_path / "src" / "ann.jsonl"
    code, _, err = run_cli("convert", src, tmp_path / "ds", "--meta", meta, "--images", "raw", "--size", "128",
                           "128", "--keypoints", "keypoints", "--quiet")
    assert code != 0 and not (tmp_path / "ds" / "manifest.json").exists()
    assert len(err.strip().splitlines()) == 1
    assert "column 'boxes' looks like pixel coordinates" in err
    assert "--keypoints boxes, --boxes boxes or --not-coordinates boxes" in err
    # as advised: both ways work
    code, _, err = run_cli("convert", src, tmp_path / "ds", "--meta", meta, "--images", "raw", "--size", "128",
                           "128", "--keypoints", "keypoints", "--not-coordinates", "boxes", "--quiet")
    assert code == 0, err
    code, _, err = run_cli("convert", src, tmp_path / "ds2", "--meta", meta, "--images", "raw", "--size", "128",
                           "128", "--keypoints", "keypoints,boxes", "--quiet")
    assert code == 0, err  # boxes (n, 4) may be declared as points: each corner rescales as a point
    # without a resize nothing moves: no refusal, values kept as they are
    code, _, err = run_cli("convert", src, tmp_path / "ds3", "--meta", meta, "--images", "raw", "--quiet")
    assert code == 0, err
    assert "image_original_size" not in fastdata.open(tmp_path / "ds3").fields


def test_a_coordinate_column_found_by_its_values(tmp_path):
    """A column named neither keypoints nor boxes, whose values lie inside each image, is refused too."""
    rows = _source(tmp_path / "src", keypoints=False)
    for r in rows:
        r["centre"] = [r["boxes"][0][0], r["boxes"][0][1]]
        del r["boxes"]
    (tmp_path / "src" / "ann.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = ConvertConfig(images=ImageOptions(images="raw", max_side=64))
    # from Python the advice is ConvertConfig's own form, a tuple (keypoints=centre was refused as a str)
    with pytest.raises(DataError, match=r"column 'centre' looks like pixel coordinates \(its 2 values per row lie "
                                        r"inside each image\).*keypoints=\('centre',\) or not_coordinates=\('centre',\)$"):
        fastdata.convert(tmp_path / "src", tmp_path / "ds", cfg, meta=tmp_path / "src" / "ann.jsonl")
    cfg = ConvertConfig(images=ImageOptions(images="raw", max_side=64), keypoints=("centre",))
    fastdata.convert(tmp_path / "src", tmp_path / "ds", cfg, meta=tmp_path / "src" / "ann.jsonl")


def test_declarations_are_checked(tmp_path):
    _source(tmp_path / "src")
    meta = tmp_path / "src" / "ann.jsonl"
    opts = ImageOptions(images="raw", size=(64, 64))
    with pytest.raises(UsageError, match="'kp', which is not a column"):
        fastdata.convert(tmp_path / "src", tmp_path / "ds", ConvertConfig(images=opts, keypoints=("kp",)), meta=meta)
    with pytest.raises(DataError, match="column 'label' is given as boxes"):
        fastdata.convert(tmp_path / "src", tmp_path / "ds", ConvertConfig(images=opts, boxes=("label",)), meta=meta)
    with pytest.raises(DataError, match="column 'label' is given as keypoints"):
        fastdata.convert(tmp_path / "src", tmp_path / "ds", ConvertConfig(images=opts, keypoints=("label",)), meta=meta)
    with pytest.raises(UsageError, match="both as keypoints and as not_coordinates"):
        ConvertConfig(keypoints=("a",), not_coordinates=("a",))
    with pytest.raises(UsageError, match="keypoints, boxes and not_coordinates name columns of a metadata table"):
        fastdata.convert(tmp_path / "src", tmp_path / "ds", ConvertConfig(keypoints=("a",)))


def test_a_file_column_cannot_be_declared(tmp_path):
    """A mask named by a file column is an image, not coordinates: declaring it is an error, not a crash."""
    _source(tmp_path / "src")
    (tmp_path / "src" / "masks").mkdir()
    lines = []
    for i, line in enumerate((tmp_path / "src" / "ann.jsonl").read_text().splitlines()):
        png_rgb(tmp_path / "src" / "masks" / f"m{i}.png", 8, 8, seed=i)
        lines.append(json.dumps({**json.loads(line), "mask": f"masks/m{i}.png"}))
    (tmp_path / "src" / "ann.jsonl").write_text("\n".join(lines) + "\n")
    cfg = ConvertConfig(images=ImageOptions(images="raw", size=(64, 64)), keypoints=("keypoints", "mask"),
                        boxes=("boxes",))
    with pytest.raises(DataError, match="column 'mask' is given as keypoints but is not numeric"):
        fastdata.convert(tmp_path / "src", tmp_path / "ds", cfg, meta=tmp_path / "src" / "ann.jsonl")


class _Poses:
    """A user's own Dataset: PIL images of several sizes with keypoints (17, 3) and boxes (n, 4) in pixels."""

    def __init__(self, keypoints_name: str = "keypoints") -> None:
        from PIL import Image

        rng = np.random.default_rng(1)
        self.items = []
        for i, (h, w) in enumerate(SIZES):
            im = Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
            kp = np.stack([rng.uniform(0, w, 17), rng.uniform(0, h, 17), rng.integers(0, 3, 17)], axis=1)
            boxes = np.array([[w / 4, h / 4, w / 2, h / 2]])
            self.items.append({"image": im, keypoints_name: kp, "boxes": boxes, "label": i})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def test_python_objects_resized_keep_their_coordinates(tmp_path):
    """fastdata.convert of a Dataset follows the same rule as a table: declared coordinates move with the pixels."""
    ds = _Poses()
    cfg = ConvertConfig(images=ImageOptions(images="raw", size=(64, 96)), keypoints=("keypoints",), boxes=("boxes",))
    fastdata.convert(ds, tmp_path / "d", cfg)
    d = fastdata.open(tmp_path / "d")
    for i, (h, w) in enumerate(SIZES):
        s = d[i]
        assert tuple(s["image_original_size"]) == (h, w)
        assert s["image"].shape == (64, 96, 3)
        want = _theirs(ds.items[i]["keypoints"], h, w, (64, 96), None, box=False)
        np.testing.assert_allclose(s["keypoints"], want, atol=0.5)
        np.testing.assert_array_equal(s["keypoints"][:, 2], ds.items[i]["keypoints"][:, 2])  # visibility untouched
        np.testing.assert_allclose(s["boxes"], _theirs(ds.items[i]["boxes"], h, w, (64, 96), None, box=True), atol=0.5)


def test_python_objects_resized_refuse_undeclared_coordinates(tmp_path):
    ds = _Poses("landmarks")
    resize = ImageOptions(images="raw", size=(64, 96))
    # the advice reads as ConvertConfig's arguments (it printed the raw template '%(keypoints=('landmarks',))')
    with pytest.raises(DataError, match=r"'landmarks' looks like pixel coordinates .*: keypoints=\('landmarks',\) or "
                                        r"not_coordinates=\('landmarks',\)$"):
        fastdata.convert(ds, tmp_path / "a", ConvertConfig(images=resize, boxes=("boxes",)))
    assert not (tmp_path / "a" / "manifest.json").exists()
    fastdata.convert(ds, tmp_path / "b", ConvertConfig(images=resize, boxes=("boxes",), not_coordinates=("landmarks",)))
    np.testing.assert_array_equal(fastdata.open(tmp_path / "b")[0]["landmarks"], ds.items[0]["landmarks"])
    with pytest.raises(UsageError, match="'kp'"):
        fastdata.convert(ds, tmp_path / "c", ConvertConfig(images=resize, keypoints=("kp",)))
    fastdata.convert(ds, tmp_path / "e", ConvertConfig(images=ImageOptions(images="raw")))  # no resize: nothing moves
    np.testing.assert_array_equal(fastdata.open(tmp_path / "e")[1]["landmarks"], ds.items[1]["landmarks"])
