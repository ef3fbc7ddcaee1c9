"""HDF5 and Zarr arrays as conversion sources (converters/h5source.py), written by the writer directly."""

from __future__ import annotations

import h5py
import hdf5plugin
import numpy as np
import pytest

import fastdata
from converters.dst import prepare_dst
from converters.h5source import H5Source, ZarrSource, detect, detect_zarr
from converters.writer import WriteOptions, write_dataset
from fastdata.errors import DataError, UsageError


def _write(source, dst, **opts):
    with prepare_dst(dst, [], overwrite=False) as target:
        return write_dataset(source, target, WriteOptions(workers=2, shard_size=1000, **opts))


def test_hdf5_glob_converts_bit_exact(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((70, 3, 4)).astype(np.float32)
    y = rng.integers(0, 9, 70)
    for i, (a, b) in enumerate([(0, 25), (25, 70)]):
        with h5py.File(tmp_path / f"p{i}.h5", "w") as f:
            f.create_dataset("data/x", data=x[a:b], chunks=(8, 3, 4), **hdf5plugin.LZ4())
            f["y"] = y[a:b]
    assert detect(tmp_path / "p*.h5") and detect(tmp_path / "p0.h5") and not detect(tmp_path / "nothing.h5")
    src = H5Source.from_src(str(tmp_path / "p*.h5"), {"x": "/data/x", "label": "/y"})
    report = _write(src, tmp_path / "out")
    assert report.samples == 70 and report.shards > 1
    b = fastdata.open(tmp_path / "out").get_batch(np.arange(70))
    assert np.array_equal(b["x"], x) and np.array_equal(b["label"], y)


def test_zarr_group_converts_bit_exact(tmp_path):
    zarr = pytest.importorskip("zarr")
    x = np.arange(50 * 6, dtype=np.int16).reshape(50, 2, 3)
    g = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    g.create_array("a", shape=x.shape, chunks=(7, 2, 3), dtype="i2")[:] = x
    assert detect_zarr(tmp_path / "s.zarr") and not detect_zarr(tmp_path)
    _write(ZarrSource.from_src(tmp_path / "s.zarr", {"x": "a"}), tmp_path / "out", compression="lz4")
    assert np.array_equal(fastdata.open(tmp_path / "out").get_batch(np.arange(50))["x"], x)


def test_bad_sources_name_file_and_array(tmp_path):
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["x"] = np.zeros((5, 2))
        f["y"] = np.zeros(4)
    with pytest.raises(DataError, match=r"d\.h5: no dataset '/z'"):
        H5Source.from_src(tmp_path / "d.h5", {"x": "/z"})
    with pytest.raises(DataError, match=r"d\.h5: /y: has 4 samples but .*d\.h5: /x has 5"):
        H5Source.from_src(tmp_path / "d.h5", {"x": "/x", "y": "/y"})
    with pytest.raises(UsageError, match="name the arrays"):
        H5Source.from_src(tmp_path / "d.h5", {})
    with pytest.raises(UsageError, match="not a Zarr store"):
        ZarrSource.from_src(tmp_path, {})
