"""Round trips from every .npy source kind into both formats, bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fastdata
from fastdata import WriteOptions
from fastdata.errors import DataError
from conftest import make_class_folder, tree_state

BACKENDS = ["hdf5", "lmdb"]


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
def test_class_folder_round_trip(tmp_path, class_folder, backend):
    src, arrays = class_folder
    before = tree_state(src)
    report = fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(backend=backend, shard_size=2000, workers=1)))
    assert report.samples == 12 and report.shards > 1  # small shard size forces several shards
    ds = fastdata.open(tmp_path / "ds")
    assert len(ds) == 12
    assert ds.classes == ["cat", "dog", "eel"]
    for i, rel in enumerate(sorted(arrays)):
        s = ds[i]
        assert same(s["x"], arrays[rel])
        assert s["label"] == ["cat", "dog", "eel"].index(rel.split("/")[0])
        assert s["label"].dtype == np.int64
    assert tree_state(src) == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_parallel_workers_give_same_dataset_as_serial(tmp_path, class_folder, backend):
    src, _ = class_folder
    fastdata.convert(src, tmp_path / "a", fastdata.ConvertConfig(write=WriteOptions(backend=backend, shard_size=1500, workers=1)))
    fastdata.convert(src, tmp_path / "b", fastdata.ConvertConfig(write=WriteOptions(backend=backend, shard_size=1500, workers=2)))
    ma = fastdata.open(tmp_path / "a").manifest
    mb = fastdata.open(tmp_path / "b").manifest
    assert len(ma.shards) >= 3
    assert [(s.file, s.start, s.count, s.checksum) for s in ma.shards] == [(s.file, s.start, s.count, s.checksum) for s in mb.shards]


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_conversions_are_identical(tmp_path, class_folder, backend):
    src, _ = class_folder
    for name in ("a", "b"):
        fastdata.convert(src, tmp_path / name, fastdata.ConvertConfig(write=WriteOptions(backend=backend, shard_size=3000)))
    for sa, sb in zip(fastdata.open(tmp_path / "a").manifest.shards, fastdata.open(tmp_path / "b").manifest.shards):
        assert sa == sb
        assert (tmp_path / "a" / sa.file).read_bytes() == (tmp_path / "b" / sb.file).read_bytes()


@pytest.mark.parametrize("backend", BACKENDS)
def test_flat_folder_has_no_labels(tmp_path, backend):
    src = tmp_path / "flat"
    src.mkdir()
    data = [np.arange(i, i + 5, dtype=np.int16) for i in range(7)]
    for i, a in enumerate(data):
        np.save(src / f"s{i}.npy", a)
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(backend=backend)))
    ds = fastdata.open(tmp_path / "ds")
    assert [f.name for f in ds.schema] == ["x"] and ds.classes is None
    assert all(same(ds[i]["x"], a) for i, a in enumerate(data))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["csv", "json"])
def test_labels_file_with_string_labels(tmp_path, backend, kind):
    src = tmp_path / "flat"
    src.mkdir()
    labels = {"a.npy": "zebra", "b.npy": "ant", "sub/c.npy": "zebra"}
    for rel in labels:
        (src / rel).parent.mkdir(exist_ok=True)
        np.save(src / rel, np.ones(3, np.float32))
    lab = tmp_path / f"labels.{kind}"
    if kind == "csv":
        lab.write_text("path,label\n" + "".join(f"{k},{v}\n" for k, v in labels.items()))
    else:
        lab.write_text(json.dumps(labels))
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(backend=backend)), labels=lab)
    ds = fastdata.open(tmp_path / "ds")
    assert ds.classes == ["ant", "zebra"]
    assert [int(ds[i]["label"]) for i in range(3)] == [1, 0, 1]  # sorted paths: a, b, sub/c


@pytest.mark.parametrize("kind", ["csv", "json"])
def test_an_empty_label_is_refused_naming_its_row_not_made_a_class(tmp_path, kind):
    """A labels file row with no label (an empty cell) is a missing label: before, it became a class named ''."""
    src = tmp_path / "flat"
    src.mkdir()
    labels = {"a.npy": "cat", "b.npy": "", "c.npy": "dog"}
    for rel in labels:
        np.save(src / rel, np.ones(3, np.float32))
    lab = tmp_path / f"labels.{kind}"
    lab.write_text("path,label\n" + "".join(f"{k},{v}\n" for k, v in labels.items()) if kind == "csv" else json.dumps(labels))
    with pytest.raises(DataError, match=r"labels\.(csv|json): the row for 'b\.npy' has an empty label"):
        fastdata.convert(src, tmp_path / "ds", labels=lab)
    assert not (tmp_path / "ds").exists()


def test_labels_file_with_integer_labels_inside_source(tmp_path):
    src = tmp_path / "flat"
    src.mkdir()
    for n in ("a", "b"):
        np.save(src / f"{n}.npy", np.zeros(2, np.uint8))
    (src / "labels.csv").write_text("a.npy,7\nb.npy,3\n")  # the labels file itself is not a sample
    fastdata.convert(src, tmp_path / "ds", labels=src / "labels.csv")
    ds = fastdata.open(tmp_path / "ds")
    assert ds.classes is None
    assert [int(ds[i]["label"]) for i in range(2)] == [7, 3]


@pytest.mark.parametrize("backend,compression", [("hdf5", None), ("hdf5", "lzf"), ("hdf5", "gzip:6"), ("lmdb", None)])
def test_ragged_sequences(tmp_path, backend, compression):
    src = tmp_path / "seq"
    rng = np.random.default_rng(3)
    data = {}
    for c in ("a", "b"):
        (src / c).mkdir(parents=True)
        for i in range(5):
            a = rng.standard_normal((int(rng.integers(0, 9)), 4)).astype(np.float32)
            data[f"{c}/{i}.npy"] = a
            np.save(src / c / f"{i}.npy", a)
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(backend=backend, compression=compression, shard_size=200)))
    ds = fastdata.open(tmp_path / "ds")
    assert ds.schema[0].shape == (None, 4) and ds.schema[0].ragged
    for i, rel in enumerate(sorted(data)):
        assert same(ds[i]["x"], data[rel])
    batch = ds.get_batch([9, 0, 4])
    lengths = [len(data[sorted(data)[i]]) for i in (9, 0, 4)]
    assert batch["x_lengths"].tolist() == lengths
    assert batch["x"].shape == (3, max(lengths), 4)
    for row, i in enumerate((9, 0, 4)):
        ref = data[sorted(data)[i]]
        assert same(batch["x"][row, : len(ref)], ref)
        assert not batch["x"][row, len(ref):].any()  # padding is zeros


@pytest.mark.parametrize("backend", BACKENDS)
def test_npz_samples_with_several_arrays(tmp_path, backend):
    src = tmp_path / "npz"
    (src / "k0").mkdir(parents=True)
    (src / "k1").mkdir()
    ref = []
    for i in range(6):
        img = np.full((3, 4, 4), i, np.uint8)
        mask = np.arange(i, i + 16, dtype=np.float64).reshape(4, 4)
        np.savez(src / f"k{i % 2}" / f"{i}.npz", image=img, mask=mask)
        ref.append((f"k{i % 2}/{i}.npz", img, mask))
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(backend=backend)))
    ds = fastdata.open(tmp_path / "ds")
    assert [f.name for f in ds.schema] == ["image", "mask", "label"]
    for i, (rel, img, mask) in enumerate(sorted(ref)):
        s = ds[i]
        assert same(s["image"], img) and same(s["mask"], mask) and int(s["label"]) == int(rel[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_arrays_with_labels(tmp_path, backend):
    x = np.random.default_rng(1).standard_normal((50, 3, 5)).astype(np.float32)
    y = np.arange(50, dtype=np.int64) % 7
    np.save(tmp_path / "X.npy", x)
    np.save(tmp_path / "y.npy", y)
    before = tree_state(tmp_path)
    fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(backend=backend, shard_size=1000)), labels=tmp_path / "y.npy", arrays={"x": tmp_path / "X.npy"})
    ds = fastdata.open(tmp_path / "ds")
    b = ds.get_batch(np.arange(50))
    assert same(b["x"], x) and same(b["label"], y)
    assert len(ds.manifest.shards) > 1
    assert {k: v for k, v in tree_state(tmp_path).items() if not k.startswith("ds")} == before


def test_named_array_fields_fortran_and_big_endian(tmp_path):
    a = np.asfortranarray(np.arange(60, dtype=">i4").reshape(10, 2, 3))
    b = np.linspace(0, 1, 10).astype("<f2")
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    fastdata.convert(None, tmp_path / "ds", arrays={"feat": tmp_path / "a.npy", "w": tmp_path / "b.npy"})
    ds = fastdata.open(tmp_path / "ds")
    assert ds.schema[0].dtype == ">i4"
    batch = ds.get_batch(range(10))
    assert same(batch["feat"], np.ascontiguousarray(a)) and same(batch["w"], b)


def test_large_array_is_memory_mapped_not_loaded(tmp_path, monkeypatch):
    x = np.zeros((20, 4), np.float32)
    np.save(tmp_path / "X.npy", x)
    real_load = np.load
    modes = []

    def spy(*args, **kw):
        modes.append(kw.get("mmap_mode"))
        return real_load(*args, **kw)

    monkeypatch.setattr(np, "load", spy)
    fastdata.convert(tmp_path / "X.npy", tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1)))
    assert modes and all(m == "r" for m in modes)


def test_progress_is_reported(tmp_path, class_folder):
    src, _ = class_folder

    class P:
        def __init__(self):
            self.total, self.samples, self.bytes = None, 0, 0

        def start(self, n, b):
            self.total = (n, b)

        def update(self, n, b):
            self.samples += n
            self.bytes += b

    for workers in (1, 2):
        p = P()
        fastdata.convert(src, tmp_path / f"ds{workers}", fastdata.ConvertConfig(write=WriteOptions(workers=workers, shard_size=1500)), progress=p)
        assert p.total[0] == 12 and p.samples == 12 and p.bytes == p.total[1] + 12 * 8  # + labels


def test_hdf5_compression_round_trip_and_smaller(tmp_path):
    src = tmp_path / "z"
    src.mkdir()
    for i in range(8):
        np.save(src / f"{i}.npy", np.zeros((64, 64), np.float32) + i)
    fastdata.convert(src, tmp_path / "plain")
    fastdata.convert(src, tmp_path / "gz", fastdata.ConvertConfig(write=WriteOptions(compression="gzip")))
    plain, gz = fastdata.open(tmp_path / "plain"), fastdata.open(tmp_path / "gz")
    assert gz.manifest.shards[0].bytes < plain.manifest.shards[0].bytes / 4
    assert same(gz.get_batch([7, 1, 1])["x"], plain.get_batch([7, 1, 1])["x"])


def test_subfolders_nest_under_their_class(tmp_path):
    src = tmp_path / "src"
    make_class_folder(src / "a" / "deep", per_class=1, classes=("x",))
    make_class_folder(src, per_class=1, classes=("b",))
    fastdata.convert(src, tmp_path / "ds")
    ds = fastdata.open(tmp_path / "ds")
    assert ds.classes == ["a", "b"]
