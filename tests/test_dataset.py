"""fastdata.open: get_batch semantics, process safety, and refusal of broken or hostile datasets."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil

import numpy as np
import pytest

import fastdata
from conftest import edit_manifest, four_shard_dataset, make_class_folder
from fastdata.errors import CorruptShardError, FormatError, IncompleteDatasetError, VersionError

BACKENDS = ["hdf5", "lmdb"]


@pytest.fixture(params=BACKENDS)
def dataset(request, tmp_path):
    path, arrays = four_shard_dataset(tmp_path, request.param)
    return path, np.stack([arrays[k] for k in sorted(arrays)])


def test_get_batch_any_order_with_repeats(dataset):
    path, ref = dataset
    ds = fastdata.open(path)
    assert len(ds.manifest.shards) > 2
    idx = [29, 0, 5, 5, 17, 28, 1, 2, 3]  # unsorted, repeated, crossing shards, with a run
    b = ds.get_batch(idx)
    assert np.array_equal(b["x"], ref[idx])
    assert b["label"].tolist() == [i // 10 for i in idx]
    assert np.array_equal(ds.get_batch(np.arange(30))["x"], ref)


def test_get_batch_into_preallocated_buffers(dataset):
    path, ref = dataset
    ds = fastdata.open(path)
    out = {"x": np.empty((4, *ref.shape[1:]), np.float32)}
    b = ds.get_batch([3, 2, 1, 0], out=out)
    assert b["x"] is out["x"] and np.array_equal(out["x"], ref[[3, 2, 1, 0]])
    with pytest.raises(ValueError, match="C-contiguous"):
        ds.get_batch([0, 1], out={"x": np.empty((3, *ref.shape[1:]), np.float32)})


def test_indexing_and_errors(dataset):
    path, ref = dataset
    ds = fastdata.open(path)
    assert np.array_equal(ds[-1]["x"], ref[-1])
    assert ds[-1]["label"].shape == ()
    with pytest.raises(IndexError):
        ds[30]
    with pytest.raises(IndexError):
        ds.get_batch([0, 30])
    with pytest.raises(TypeError):
        ds.get_batch([0.5])
    empty = ds.get_batch([])
    assert empty["x"].shape == (0, *ref.shape[1:])
    with pytest.raises(IndexError, match=f"index '3': not an integer in range for a dataset of {len(ds)}"):
        ds.key("3")  # a string is no index: the message does not call it out of range


def test_field_subset(dataset):
    path, ref = dataset
    ds = fastdata.open(path, fields=["label"])
    assert list(ds.get_batch([0, 11])) == ["label"]
    with pytest.raises(fastdata.errors.UsageError, match="no field 'y'"):
        fastdata.open(path, fields=["y"])


def _read_in_child(ds, idx):
    return ds.get_batch(idx)["x"]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_dataset_works_in_fork_and_spawn_workers(dataset, method):
    path, ref = dataset
    ds = fastdata.open(path)
    ds.get_batch([0, 15, 29])  # the parent opens its handles first
    state = pickle.dumps(ds)
    assert b"Environment" not in state  # no handle is pickled
    with mp.get_context(method).Pool(2) as pool:
        results = pool.starmap(_read_in_child, [(ds, [i, 29 - i]) for i in range(6)])
    for i, r in enumerate(results):
        assert np.array_equal(r, ref[[i, 29 - i]])
    assert np.array_equal(ds.get_batch([7])["x"], ref[[7]])  # parent handles still fine


def test_missing_manifest_is_incomplete(dataset):
    path, _ = dataset
    (path / "manifest.json").unlink()
    with pytest.raises(IncompleteDatasetError, match="incomplete dataset"):
        fastdata.open(path)


def test_truncated_or_missing_shard(dataset):
    path, _ = dataset
    shard = sorted(path.glob("shard-*"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptShardError, match=shard.name):
        fastdata.open(path)
    shard.unlink()
    with pytest.raises(CorruptShardError, match=f"{shard.name}.*missing"):
        fastdata.open(path)


def test_shard_truncated_after_open_raises_typed_error(dataset):
    path, _ = dataset
    ds = fastdata.open(path)
    shard = sorted(path.glob("shard-*"))[0]
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(CorruptShardError, match=shard.name):
        ds.get_batch([0])


def test_lmdb_flipped_header_byte(tmp_path):
    src = tmp_path / "src"
    make_class_folder(src, per_class=3)
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb")))
    shard = tmp_path / "ds" / "shard-00000.lmdb"
    blob = bytearray(shard.read_bytes())
    pos = blob.find(b"FDR1", blob.find(b"FDR1") + 1)  # the second record's magic
    blob[pos + 8] ^= 0xFF  # first payload size
    shard.write_bytes(bytes(blob))
    ds = fastdata.open(tmp_path / "ds")
    with pytest.raises(CorruptShardError, match="sample"):
        ds.get_batch(range(9))


@pytest.mark.parametrize(
    "edit,error,match",
    [
        (lambda m: m["shards"][0].update(file="../outside.h5"), FormatError, "bad shard file name"),
        (lambda m: m["shards"][0].update(file="/etc/passwd"), FormatError, "bad shard file name"),
        (lambda m: m["fields"][0].update(shape=[10**15, 10**15]), FormatError, "absurdly large"),
        (lambda m: m.update(num_samples=-1), FormatError, "num_samples"),
        (lambda m: m["shards"][-1].update(count=10**9), FormatError, "shards hold"),
        (lambda m: m.update(version=99), VersionError, "newer fastdata"),
        (lambda m: m["fields"][0].update(dtype="|O"), FormatError, "unsupported dtype"),
        (lambda m: m.update(backend="pickle"), FormatError, "unknown backend"),
    ],
)
def test_hostile_manifest_is_rejected(dataset, edit, error, match):
    path, _ = dataset
    edit_manifest(path, edit)
    with pytest.raises(error, match=match):
        fastdata.open(path)


def test_shard_symlink_outside_dataset_is_rejected(dataset, tmp_path):
    path, _ = dataset
    shard = sorted(path.glob("shard-*"))[0]
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.move(shard, outside / shard.name)
    os.symlink(outside / shard.name, shard)
    with pytest.raises(FormatError, match="outside the dataset"):
        fastdata.open(path)


def test_manifest_that_is_not_json(dataset):
    path, _ = dataset
    (path / "manifest.json").write_bytes(b"\x80\x04\x95 pickle?")
    with pytest.raises(FormatError, match="unreadable manifest"):
        fastdata.open(path)


def test_two_datasets_on_the_same_files_in_one_process(dataset):
    path, ref = dataset
    a, b = fastdata.open(path), fastdata.open(path)
    assert np.array_equal(a.get_batch([1, 2])["x"], b.get_batch([1, 2])["x"])
    a.close()  # closing one must not break the other
    assert np.array_equal(b.get_batch([3])["x"], ref[[3]])


def test_column_refuses_a_ragged_field_even_on_an_empty_subset(tmp_path):
    samples = [{"x": np.arange(i + 1, dtype=np.float32), "y": np.float32(i)} for i in range(6)]
    fastdata.convert(samples, tmp_path / "ds", ragged=["x"])
    ds = fastdata.open(tmp_path / "ds")
    empty = ds.split({"a": 0.0001, "b": 0.9999})["a"]
    assert len(empty) == 0 and empty.column("y").dtype == np.float32
    for d in (ds, empty):  # the empty one gave an empty float array instead of the refusal
        with pytest.raises(fastdata.errors.UsageError, match="field 'x' is ragged; column"):
            d.column("x")
