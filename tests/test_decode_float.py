"""Encoded images decoded straight to float (``fastdata.open(..., decode="float")``), and the torch
loader's CPU reader threads using it: the same numbers as uint8 decoding followed by ``/ 255``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import fastdata
import imagegen as g
from fastdata.errors import UsageError
from fastdata.loaders import LoaderConfig


def _encoded(tmp_path: Path, sizes: list[tuple[int, int]]) -> Path:
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i, (h, w) in enumerate(sizes):
        if i % 2:
            g.png_rgb(src / "a" / f"{i:03d}.png", h=h, w=w, seed=i)
        else:
            g.jpeg(src / "a" / f"{i:03d}.jpg", h=h, w=w, seed=i)
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)))
    return tmp_path / "ds"


@pytest.mark.parametrize("sizes", [[(12, 10)] * 6, [(12, 10), (7, 15), (12, 10), (9, 9), (5, 4), (12, 15)]])
def test_float_decoding_equals_uint8_divided_by_255(tmp_path, sizes):
    root = _encoded(tmp_path, sizes)
    idx = [5, 0, 3, 3, 1]
    u8 = fastdata.open(root).get_batch(idx)
    f = fastdata.open(root, decode="float").get_batch(idx)
    assert f["image"].dtype == np.float32 and f["image"].shape == u8["image"].shape
    np.testing.assert_array_equal(f["image"], torch.from_numpy(u8["image"]).float().mul_(1 / 255).numpy())
    np.testing.assert_array_equal(f["image_shape"], u8["image_shape"])  # padding (mixed sizes) is 0.0


def test_float_decoding_reuses_a_float_buffer_and_refuses_bad_values(tmp_path):
    root = _encoded(tmp_path, [(12, 10)] * 4)
    ds = fastdata.open(root, decode="float", decode_threads=1)
    buf = np.full(4 * 12 * 10 * 3 + 7, np.nan, dtype=np.float32)
    b = ds.get_batch([0, 1, 2, 3], out={"image": buf})
    assert np.shares_memory(b["image"], buf) and not np.isnan(b["image"]).any()
    with pytest.raises(UsageError, match="True, False or 'float'"):
        fastdata.open(root, decode="f32")  # type: ignore[arg-type]


def test_loader_threads_decode_to_float_like_worker_processes(tmp_path):
    root = _encoded(tmp_path, [(12, 10), (7, 15), (12, 10), (9, 9), (5, 4), (12, 15), (3, 3), (8, 8)])
    with fastdata.loader(root, 4, device="cpu", num_workers=2, shuffle=False) as threads, \
            fastdata.loader(root, 4, device="cpu", num_workers=1, shuffle=False,
                            config=LoaderConfig(mode="processes")) as procs:
        assert threads._read_ds.options["decode"] == "float"  # type: ignore[attr-defined]
        assert threads._read_ds.options["decode_threads"] == 1  # type: ignore[attr-defined]
        assert procs._read_ds.options["decode"] is True  # type: ignore[attr-defined]  # workers ship uint8
        a, b = list(threads), list(procs)
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        assert x["image"].dtype == torch.float32 and x["image"].shape[1] == 3
        assert torch.equal(x["image"], y["image"])


def test_loader_keeps_uint8_decoding_where_float_would_be_wrong(tmp_path):
    root = _encoded(tmp_path, [(12, 10)] * 4)
    with fastdata.loader(root, 2, device="cpu", num_workers=2, config=LoaderConfig(image_dtype="uint8")) as ld:
        assert ld._read_ds.options["decode"] is True  # type: ignore[attr-defined]
        assert next(iter(ld))["image"].dtype == torch.uint8
    with fastdata.loader(root, 2, device="cpu", num_workers=2, config=LoaderConfig(images=())) as ld:
        assert ld._read_ds.options["decode"] is True  # type: ignore[attr-defined]  # not an image field here
        assert next(iter(ld))["image"].dtype == torch.uint8
    ds = fastdata.open(root, decode_threads=2)
    with fastdata.loader(ds, 2, device="cpu", num_workers=2) as ld:
        assert ld._read_ds.options["decode_threads"] == 2  # type: ignore[attr-defined]  # the user's choice
