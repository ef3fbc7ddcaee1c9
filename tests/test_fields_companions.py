"""Issue 48: ``fields=`` limits a batch to the fields asked for and the companions they need
(``_lengths``, ``_offsets``); an image field's ``_shape``/``_codec`` come only when asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from imagegen import png_rgb

import fastdata
from fastdata.loaders import LoaderConfig


@pytest.fixture(scope="module")
def pose(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pose")
    src = root / "src"
    src.mkdir()
    rows = []
    for i, (h, w) in enumerate([(20, 28), (30, 16), (20, 28), (25, 25)]):  # mixed sizes: padded batches
        png_rgb(src / f"i{i}.png", h, w, seed=i)
        rows.append({"path": f"i{i}.png", "keypoints": [[1, 2], [3, 4]], "label": i % 2, "boxes": [[0, 0, 1, 1]] * (i + 1)})
    (src / "ann.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fastdata.convert(src, root / "ds", meta=src / "ann.jsonl")
    return root / "ds"


def test_open_returns_only_the_fields_asked_for(pose):
    ds = fastdata.open(pose, fields=["image", "keypoints", "label", "boxes"])
    assert sorted(ds.get_batch([0, 1])) == ["boxes", "boxes_lengths", "image", "keypoints", "label"]
    assert sorted(ds.get_batch([0, 1], ragged="padded")) == sorted(ds.get_batch([2, 3]))
    assert ds.fields == ["image", "keypoints", "label", "boxes"] and sorted(ds[1]) == ["boxes", "image", "keypoints", "label"]
    both = fastdata.open(pose, fields=["image", "image_shape", "label"])
    assert sorted(both.get_batch([0, 1])) == ["image", "image_shape", "label"]
    assert both.get_batch([1])["image_shape"].tolist() == [[30, 16, 3]]
    raw = fastdata.open(pose, fields=["boxes"], decode=False)
    assert sorted(raw.get_batch([0, 3], ragged="packed")) == ["boxes", "boxes_lengths", "boxes_offsets"]


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_loader_returns_only_the_fields_asked_for(pose, mode):
    config = LoaderConfig(mode=mode)
    with fastdata.loader(pose, 2, fields=["image", "keypoints", "label"], num_workers=1, config=config) as loader:
        for b in loader:
            assert sorted(b) == ["image", "keypoints", "label"]
