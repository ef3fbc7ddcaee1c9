"""HDF5 and Zarr arrays as conversion sources (converters/arrays.py), written by the writer directly."""

from __future__ import annotations

import h5py
import hdf5plugin
import numpy as np
import pytest

import fastdata
from fastdata.converters import ConvertConfig
from fastdata.converters.arrays import H5Source, ZarrSource, detect
from fastdata.errors import DataError, UsageError
from fastdata.write import WriteOptions, write_dataset
from fastdata.write.destination import prepare_dst
from fastdata.write.inplace import is_zarr


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
    assert is_zarr(tmp_path / "s.zarr") and not is_zarr(tmp_path)
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


def test_fastdata_convert_and_the_cli_take_hdf5_and_zarr_sources(tmp_path):
    """Through the source table: an HDF5 file with --field NAME=/path, a Zarr store as field x."""
    from fastdata.cli import main

    x = np.random.default_rng(1).random((40, 3, 4)).astype(np.float32)
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["images"], f["labels"] = x, np.arange(40)
    assert main(["convert", str(tmp_path / "a.h5"), str(tmp_path / "ds"), "--field", "x=/images",
                 "--field", "label=/labels"]) == 0
    b = fastdata.open(tmp_path / "ds").get_batch(np.arange(40))
    assert np.array_equal(b["x"], x) and np.array_equal(b["label"], np.arange(40))
    with pytest.raises(UsageError, match="name the arrays"):
        fastdata.convert(tmp_path / "a.h5", tmp_path / "none")
    with pytest.raises(UsageError, match="labels"):
        fastdata.convert(tmp_path / "a.h5", tmp_path / "none", labels=tmp_path / "a.h5", arrays={"x": "/images"})
    zarr = pytest.importorskip("zarr")
    z = zarr.create_array(str(tmp_path / "z.zarr"), shape=x.shape, chunks=(16, 3, 4), dtype="float32")
    z[:] = x
    report = fastdata.convert(tmp_path / "z.zarr", tmp_path / "dz", ConvertConfig(write=WriteOptions(workers=1)))
    assert report.samples == 40 and np.array_equal(fastdata.open(tmp_path / "dz").get_batch(np.arange(40))["x"], x)


def test_hdf5_and_zarr_sources_open_their_src_the_same_way(tmp_path):
    """One from_src for both kinds: each checks what SRC names, then the fields (default: the kind's own)."""
    zarr = pytest.importorskip("zarr")
    with h5py.File(tmp_path / "d.h5", "w") as f:
        f["x"] = np.arange(6.0).reshape(3, 2)
    zarr.create_array(str(tmp_path / "z.zarr"), shape=(3, 2), chunks=(2, 2), dtype="f8")[:] = np.arange(6.0).reshape(3, 2)
    with pytest.raises(UsageError, match=r"^\S*p\*\.h5: no such file \(the pattern matches none\)$"):
        H5Source.from_src(tmp_path / "p*.h5", {"x": "/x"})
    with pytest.raises(UsageError, match=r"^\S*nothing\.h5: no such file$"):
        H5Source.from_src(tmp_path / "nothing.h5", {"x": "/x"})
    with pytest.raises(UsageError, match=r"^\S*nothing\.zarr: not a Zarr store"):
        ZarrSource.from_src(tmp_path / "nothing.zarr")
    with pytest.raises(UsageError, match="name the arrays"):  # HDF5 has no default field: naming is required
        H5Source.from_src(tmp_path / "d.h5")
    h5, z = H5Source.from_src(tmp_path / "d.h5", {"x": "/x"}), ZarrSource.from_src(tmp_path / "z.zarr")
    assert (h5.paths, h5.arrays, h5.counts) == ([str(tmp_path / "d.h5")], {"x": "/x"}, [3])
    assert (z.paths, z.arrays, z.counts) == ([str(tmp_path / "z.zarr")], {"x": ""}, [3])  # the store is field x
    assert [f.name for f in h5.fields] == [f.name for f in z.fields] == ["x"]


def test_the_source_table_says_what_src_is(tmp_path):
    """Every kind answers src_form() through the registry: conversion.py asks no source module directly."""
    zarr = pytest.importorskip("zarr")
    from fastdata.converters import src_form

    with h5py.File(tmp_path / "p0.h5", "w") as f:
        f["x"] = np.zeros((2, 1))
    zarr.create_array(str(tmp_path / "z.zarr"), shape=(2, 1), chunks=(2, 1), dtype="f4")
    (tmp_path / "meta.csv").write_text("path\n0.npy\n")
    np.save(tmp_path / "X.npy", np.zeros((2, 1)))
    (tmp_path / "folder").mkdir()
    assert src_form(tmp_path / "p0.h5") == src_form(tmp_path / "p*.h5") == src_form(tmp_path / "z.zarr") == "arrays"
    assert src_form(tmp_path / "meta.csv") == "table"
    for other in ("X.npy", "folder", "missing.h5", "missing.csv"):
        assert src_form(tmp_path / other) is None, other
