"""fastdata.convert from Python objects: a torch Dataset (dicts, tuples), an iterable, a Hugging Face dataset
and a pyarrow Table each read back equal sample by sample; schema errors name the sample; kill-and-resume
gives the shards of an uninterrupted run."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from crashkit import kill, same_dataset
from PIL import Image

import fastdata
from fastdata.errors import DataError, UsageError

ROOT = Path(__file__).resolve().parents[1]


def _image(i: int, size: tuple[int, int]) -> Image.Image:
    rng = np.random.default_rng(i)
    return Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8))


def _jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    _image(i, (20, 16)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


class FaceDataset(torch.utils.data.Dataset):
    """Dicts: a PIL image of varying size, keypoints, a ragged sequence, a string, a label, a tensor."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> dict:
        return {"image": _image(i, (8 + i % 3, 10)), "pose": np.full((5, 2), i, np.float32),
                "seq": np.arange(i % 6 + 1, dtype=np.int16).repeat(3).reshape(-1, 3), "name": f"face-{i}",
                "label": i % 4, "emb": torch.full((3,), float(i))}


class TupleDataset(torch.utils.data.Dataset):
    """Tuples: encoded JPEG bytes (kept as they are), a fixed-size image, keypoints."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple:
        return _jpeg(i), _image(100 + i, (6, 6)), np.full((3, 2), i, np.float64)


def _read(dst: Path) -> list[dict]:
    ds = fastdata.open(dst)
    return [ds[i] for i in range(len(ds))]


def _config(workers: int = 2, **kw) -> fastdata.ConvertConfig:
    return fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=workers, shard_size=kw.pop("shard_size", 4096)), **kw)


def test_dataset_of_dicts_reads_back_equal(tmp_path):
    src = FaceDataset()
    report = fastdata.convert(src, tmp_path / "ds", _config())
    assert report.samples == 40 and report.shards > 2  # several shards, written by two workers
    got = _read(tmp_path / "ds")
    for i, s in enumerate(got):
        want = src[i]
        assert np.array_equal(s["image"], np.asarray(want["image"])), i
        assert np.array_equal(s["pose"], want["pose"]) and np.array_equal(s["seq"], want["seq"])
        assert s["name"] == want["name"] and int(s["label"]) == want["label"]
        assert np.array_equal(s["emb"], want["emb"].numpy())


def test_dataset_of_tuples_named_by_fields(tmp_path):
    src = TupleDataset()
    fastdata.convert(src, tmp_path / "ds", _config(), fields=("jpeg", "thumb", "pose"))
    ds = fastdata.open(tmp_path / "ds")
    assert {f.name: f.encoding for f in ds.manifest.fields}["jpeg"] == "image"  # kept encoded
    for i in range(len(src)):
        jpeg, thumb, pose = src[i]
        s = ds[i]
        assert np.array_equal(s["jpeg"], np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")))
        assert np.array_equal(s["thumb"], np.asarray(thumb)) and np.array_equal(s["pose"], pose)
    with pytest.raises(UsageError, match="sample 0 is a tuple of 3 items: name them with fields="):
        fastdata.convert(src, tmp_path / "ds2", _config())


def test_pil_images_re_encoded_as_asked(tmp_path):
    config = _config(images=fastdata.ImageOptions("jpeg", quality=95))
    fastdata.convert(TupleDataset(), tmp_path / "ds", config, fields=("jpeg", "thumb", "pose"))
    ds = fastdata.open(tmp_path / "ds")
    assert {f.name: f.encoding for f in ds.manifest.fields}["thumb"] == "image"
    assert ds.column("thumb_codec").tolist() == [1] * len(ds)  # JPEG
    buf = io.BytesIO()
    TupleDataset()[3][1].save(buf, "JPEG", quality=95, optimize=True)  # what PIL makes of it at quality 95
    assert np.array_equal(ds[3]["thumb"], np.asarray(Image.open(buf)))


def test_iterable_reads_back_equal_and_keys_come_from_a_key_field(tmp_path):
    def gen():
        for i in range(30):
            yield {"key": f"row-{i}", "x": np.arange(i % 5 + 1, dtype=np.float32), "label": i}

    fastdata.convert(gen(), tmp_path / "ds", _config(shard_size=256))
    ds = fastdata.open(tmp_path / "ds")
    for i, s in enumerate(_read(tmp_path / "ds")):
        assert np.array_equal(s["x"], np.arange(i % 5 + 1, dtype=np.float32)) and int(s["label"]) == i
    assert ds.keys([0, 1]) == ["row-0", "row-1"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".fastdata-spool")]  # the spool is gone


def test_hugging_face_dataset_reads_back_equal(tmp_path):
    datasets = pytest.importorskip("datasets")
    feats = datasets.Features({"x": datasets.Array2D((4, 3), "float32"), "v": datasets.Sequence(datasets.Value("int32")),
                               "text": datasets.Value("string"), "label": datasets.ClassLabel(names=["a", "b"]),
                               "img": datasets.Image()})
    rng = np.random.default_rng(0)
    rows = {"x": [rng.random((4, 3), dtype=np.float32) for _ in range(50)],
            "v": [list(range(i % 4 + 1)) for i in range(50)], "text": [f"t{i}" for i in range(50)],
            "label": [i % 2 for i in range(50)], "img": [_image(i, (6, 5)) for i in range(50)]}
    hf = datasets.Dataset.from_dict(rows, features=feats).select(range(49, -1, -1))  # an index mapping too
    fastdata.convert(hf, tmp_path / "ds", _config(shard_size=1024))
    for i, s in enumerate(_read(tmp_path / "ds")):
        j = 49 - i
        assert np.array_equal(s["x"], rows["x"][j]) and s["x"].dtype == np.float32
        assert np.array_equal(s["v"], rows["v"][j]) and s["text"] == rows["text"][j] and int(s["label"]) == j % 2
        assert np.array_equal(s["img"], np.asarray(rows["img"][j]))  # stored by datasets as PNG bytes, kept encoded


def test_pyarrow_table_reads_back_equal(tmp_path):
    pa = pytest.importorskip("pyarrow")
    x = np.arange(60, dtype=np.float32).reshape(10, 2, 3)
    table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(x.ravel(), 3), 2),
                      "y": pa.array(np.arange(10, dtype=np.int64))})
    fastdata.convert(table, tmp_path / "ds", _config(workers=1))
    for i, s in enumerate(_read(tmp_path / "ds")):
        assert np.array_equal(s["x"], x[i]) and int(s["y"]) == i


def test_pyarrow_ragged_list_column_of_a_sliced_chunked_table_reads_back_equal(tmp_path):
    pa = pytest.importorskip("pyarrow")
    rows = [[float(i)] * (i % 4) for i in range(12)]  # lengths 0..3
    t = pa.concat_tables([pa.table({"b": pa.array(rows[:7], type=pa.list_(pa.float32()))}),
                          pa.table({"b": pa.array(rows[7:], type=pa.list_(pa.float32()))})]).slice(2)
    fastdata.convert(t, tmp_path / "ds", _config(workers=1), ragged=["b"])
    got = _read(tmp_path / "ds")
    assert len(got) == 10 and all(np.array_equal(s["b"], rows[i + 2]) for i, s in enumerate(got))


def _no_blocks(monkeypatch) -> None:
    """The write engine reads these sources sample by sample, as before blocks of rows."""
    from fastdata.converters.arrays import ArraysSource
    from fastdata.converters.objects import ObjectSource

    for cls in (ObjectSource, ArraysSource):
        monkeypatch.setattr(cls, "read_rows", lambda self, i, n: None)


def _shards(dst: Path) -> list:
    import json

    return json.loads((dst / "manifest.json").read_text())["shards"]


def test_fixed_shape_arrow_columns_written_in_blocks_give_the_bytes_of_sample_by_sample(tmp_path, monkeypatch):
    """Blocks of rows cut at Arrow chunks, batches and shard ends, through an index mapping: the shards are
    byte for byte those written a sample at a time, and read back equal."""
    datasets = pytest.importorskip("datasets")
    pa = pytest.importorskip("pyarrow")
    n = 2600
    x = np.random.default_rng(0).random((n, 4, 3), dtype=np.float32)
    cols = {"x": x, "b": np.arange(n) % 3 == 0, "f": np.arange(n) / 7, "label": np.arange(n, dtype=np.int16)}
    feats = datasets.Features({"x": datasets.Array2D((4, 3), "float32"), "b": datasets.Value("bool"),
                               "f": datasets.Value("float64"), "label": datasets.Value("int16")})
    parts = [datasets.Dataset.from_dict({k: v[a:a + 700] for k, v in cols.items()}, features=feats) for a in range(0, n, 700)]
    hf = datasets.concatenate_datasets(parts).select(list(range(5, n)) + list(range(5)))
    table = pa.Table.from_batches(pa.table({"x": pa.array(list(x.reshape(n, 12)), pa.list_(pa.float32(), 12)),
                                            "y": pa.array(np.arange(n))}).to_batches(max_chunksize=333))
    from fastdata.format.hdf5 import ShardWriter

    blocks = []
    write_rows = ShardWriter.write_rows
    monkeypatch.setattr(ShardWriter, "write_rows", lambda self, rows, k: blocks.append(k) or write_rows(self, rows, k))
    for name, obj, workers in (("hf", hf, 2), ("table", table, 1)):
        fastdata.convert(obj, tmp_path / name, _config(workers=workers, shard_size=40_000))
        with monkeypatch.context() as m:
            _no_blocks(m)
            fastdata.convert(obj, tmp_path / f"{name}-per-sample", _config(workers=workers, shard_size=40_000))
        assert len(_shards(tmp_path / name)) > 2
        assert _shards(tmp_path / name) == _shards(tmp_path / f"{name}-per-sample")
    assert sum(blocks) == n and len(blocks) < n // 20  # the table (one process): in blocks of rows
    order = list(range(5, n)) + list(range(5))
    for i, s in enumerate(_read(tmp_path / "hf")):
        j = order[i]
        assert np.array_equal(s["x"], x[j]) and bool(s["b"]) == cols["b"][j] and float(s["f"]) == cols["f"][j]
        assert int(s["label"]) == j
    ds = fastdata.open(tmp_path / "table")
    assert np.array_equal(ds[n - 1]["x"].reshape(4, 3), x[n - 1]) and int(ds[n - 1]["y"]) == n - 1


def test_npy_arrays_written_in_blocks_give_the_bytes_of_sample_by_sample(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    arrays = {"x": np.asfortranarray(rng.random((900, 5, 7), dtype=np.float32)), "label": np.arange(900, dtype=np.int32)}
    for k, a in arrays.items():
        np.save(tmp_path / f"{k}.npy", a)
    paths = {k: tmp_path / f"{k}.npy" for k in arrays}
    fastdata.convert(None, tmp_path / "blocks", _config(shard_size=50_000), arrays=paths)
    with monkeypatch.context() as m:
        _no_blocks(m)
        fastdata.convert(None, tmp_path / "per-sample", _config(shard_size=50_000), arrays=paths)
    assert len(_shards(tmp_path / "blocks")) > 2 and _shards(tmp_path / "blocks") == _shards(tmp_path / "per-sample")
    ds = fastdata.open(tmp_path / "blocks")
    assert np.array_equal(ds[899]["x"], arrays["x"][899]) and int(ds[899]["label"]) == 899


def test_a_block_of_rows_that_disagrees_is_named_by_its_first_sample():
    from fastdata.format import make_field
    from fastdata.write.shard_task import check_rows

    fields = [make_field("x", np.float32, (3,)), make_field("label", np.int64, ())]
    assert check_rows({"x": np.zeros((4, 3), np.float32), "label": np.zeros(4, np.int64)}, fields, 10) == 4
    with pytest.raises(DataError, match=r"^sample 10: 'x' has shape \(4,\), the dataset \[3\]"):
        check_rows({"x": np.zeros((4, 4), np.float32), "label": np.zeros(4, np.int64)}, fields, 10)
    with pytest.raises(DataError, match=r"^sample 10: 'label' has dtype int32"):
        check_rows({"x": np.zeros((4, 3), np.float32), "label": np.zeros(4, np.int32)}, fields, 10)


def test_writeback_and_prefault_are_hints_that_never_fail(tmp_path):
    """The writer's early writeback: on a file it leaves the bytes as written; where the kernel refuses it (a
    pipe) nothing happens. Prefaulting a memory map, plain memory or a tiny array changes no value."""
    from fastdata.fileio import prefault, start_writeback

    a = np.arange(300_000, dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    m = np.load(tmp_path / "a.npy", mmap_mode="r")
    for x in (m[1000:200_000], a[3:], a[:2], np.zeros(0)):
        prefault(x)
    assert np.array_equal(m, a)

    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, b"x" * 100_000)
        start_writeback(fd)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 100_000
    r, w = os.pipe()
    try:
        start_writeback(r)
    finally:
        os.close(r)
        os.close(w)


class Bad(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> dict:
        return {"x": np.zeros((3, 3) if i != 33 else (3, 4), np.float32), "label": i}


def test_a_sample_of_another_shape_is_named_by_index(tmp_path):
    with pytest.raises(DataError, match=r"^sample 33: 'x' has shape \[3, 4\], the first samples \[3, 3\]"):
        fastdata.convert(Bad(), tmp_path / "ds", _config())
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_skip_bad_leaves_the_sample_out_and_keeps_the_indices_as_keys(tmp_path):
    report = fastdata.convert(Bad(), tmp_path / "ds", _config(skip_bad=True))
    assert report.samples == 39 and [p for p, _ in report.skipped] == ["sample 33"]
    ds = fastdata.open(tmp_path / "ds")
    assert ds.keys([32, 33]) == ["32", "34"] and int(ds[33]["label"]) == 34


def test_skip_bad_among_the_first_samples_of_an_iterable(tmp_path):
    def gen():
        for i in range(20):
            yield {"x": None if i == 2 else np.full(2, i, np.float32)}

    with pytest.raises(DataError, match=r"^sample 2: 'x': a NoneType cannot be stored"):
        fastdata.convert(gen(), tmp_path / "a", _config())
    report = fastdata.convert(gen(), tmp_path / "b", _config(skip_bad=True))
    assert report.samples == 19 and [p for p, _ in report.skipped] == ["sample 2"]
    assert fastdata.open(tmp_path / "b").keys([1, 2]) == ["1", "3"]


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_skip_bad_when_every_first_sample_is_bad_keeps_the_good_later_ones(tmp_path, kind):
    # the first 16 samples (the schema's) all have a NaN label: a map-style source stopped instead of skipping them
    samples = [{"x": np.full(2, i, np.float32), "label": float("nan") if i < 16 else 1.0} for i in range(20)]
    report = fastdata.convert(samples if kind == "map" else iter(samples), tmp_path / "ds", _config(skip_bad=True))
    assert report.samples == 4 and [p for p, _ in report.skipped] == [f"sample {i}" for i in range(16)]
    ds = fastdata.open(tmp_path / "ds")
    assert ds.keys([0, 3]) == ["16", "19"] and float(ds[0]["x"][0]) == 16
    with pytest.raises(DataError, match=r"every sample is bad, e\.g\. sample 0: label nan is not a finite number"):
        fastdata.convert(samples[:16] if kind == "map" else iter(samples[:16]), tmp_path / "bad", _config(skip_bad=True))


def test_skip_bad_when_the_first_samples_raise_takes_the_schema_from_later_ones(tmp_path):
    class Broken:  # __getitem__ raises for the first 16 (all the schema used to be taken from)
        def __len__(self) -> int:
            return 20

        def __getitem__(self, i: int) -> dict:
            if i < 16:
                raise OSError(f"record {i} is unreadable")
            return {"x": np.full(2, i, np.float32)}

    report = fastdata.convert(Broken(), tmp_path / "ds", _config(skip_bad=True))
    assert report.samples == 4 and [p for p, _ in report.skipped] == [f"sample {i}" for i in range(16)]
    assert report.skipped[0][1].endswith("Broken[0] raised OSError: record 0 is unreadable")
    assert fastdata.open(tmp_path / "ds").keys([0]) == ["16"]


class Keyed(torch.utils.data.Dataset):
    def __init__(self, keys: list[str]) -> None:
        self.keys = keys

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> dict:
        return {"key": self.keys[i], "x": np.full(2, i, np.int32)}


def test_a_key_field_names_the_samples_and_duplicates_are_refused_before_writing(tmp_path):
    fastdata.convert(Keyed([f"img/{i}.png" for i in range(12)]), tmp_path / "ds", _config())
    assert fastdata.open(tmp_path / "ds").keys([0, 11]) == ["img/0.png", "img/11.png"]
    with pytest.raises(DataError, match=r"^samples 3 and 7 have the same key 'a'"):
        fastdata.convert(Keyed(["x", "y", "z", "a", "b", "c", "d", "a"]), tmp_path / "dup", _config())
    assert not (tmp_path / "dup").exists() or not any((tmp_path / "dup").iterdir())


class RandomCrop(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        return {"x": np.full(2, i + np.random.rand(), np.float32)}


def test_a_random_getitem_is_warned_about(tmp_path):
    with pytest.warns(UserWarning, match="__getitem__ is random"):
        fastdata.convert(RandomCrop(), tmp_path / "ds", _config(workers=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fastdata.convert(Bad(), tmp_path / "ds2", _config(workers=1, skip_bad=True))


def test_spawned_workers_unpickle_the_dataset(tmp_path, monkeypatch):
    import multiprocessing as mp

    from fastdata.write import engine

    monkeypatch.setattr(engine, "mp_context", lambda: mp.get_context("spawn"))
    from fastdata.converters import objects

    monkeypatch.setattr(objects, "mp_context", lambda: mp.get_context("spawn"))
    fastdata.convert(TupleDataset(), tmp_path / "ds", _config(), fields=("jpeg", "thumb", "pose"))
    fastdata.convert(TupleDataset(), tmp_path / "ds1", _config(workers=1), fields=("jpeg", "thumb", "pose"))
    same_dataset(tmp_path / "ds1", tmp_path / "ds")


def test_options_that_do_not_apply_are_refused(tmp_path):
    with pytest.raises(UsageError, match="engine=local"):
        fastdata.convert(Bad(), tmp_path / "a", fastdata.ConvertConfig(write=fastdata.WriteOptions(engine="ray")))
    with pytest.raises(UsageError, match="fields and ragged apply to Python sources"):
        fastdata.convert(tmp_path, tmp_path / "b", fields=("x",))
    with pytest.raises(UsageError, match=r"ragged must be a tuple of field names, not 'x'"):
        fastdata.convert(Bad(), tmp_path / "d", ragged="x")
    with pytest.raises(UsageError, match=r"image options \(images\) apply to images, and the samples have none"):
        fastdata.convert(Bad(), tmp_path / "e", fastdata.ConvertConfig(images=fastdata.ImageOptions("raw")))
    with pytest.raises(UsageError, match="not a dataset"):
        fastdata.convert({"x": 1}, tmp_path / "c")
    labels_file = fastdata.ConvertConfig(labels_columns=("path", "label"))
    with pytest.raises(UsageError, match="labels_columns applies to file sources"):
        fastdata.convert(Bad(), tmp_path / "f", labels_file)
    assert not (tmp_path / "f").exists()


def test_a_non_finite_float_label_is_refused_unless_allowed(tmp_path):
    class Targets:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {"x": np.full(3, i, np.float32), "label": float("nan") if i == 4 else i / 2}

    with pytest.raises(DataError, match=r"sample 4: label nan is not a finite number; pass allow_nan=True"):
        fastdata.convert(Targets(), tmp_path / "a")
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"x": [[0.0, 1.0]] * 4, "label": [1.0, 2.0, float("inf"), 3.0]})
    with pytest.raises(DataError, match=r"sample 2: label inf is not a finite number"):
        fastdata.convert(table, tmp_path / "b")
    fastdata.convert(Targets(), tmp_path / "c", fastdata.ConvertConfig(allow_nan=True))
    assert np.isnan(fastdata.Dataset(tmp_path / "c")[4]["label"])
    fastdata.convert(Targets(), tmp_path / "d", fastdata.ConvertConfig(skip_bad=True))
    assert len(fastdata.Dataset(tmp_path / "d")) == 5


_SCRIPT = """
import sys, numpy as np, fastdata
class Seqs:
    def __len__(self): return 60
    def __getitem__(self, i): return {{"seq": np.arange(i % 9 + 1, dtype=np.float32), "label": i}}
config = fastdata.ConvertConfig(write=fastdata.WriteOptions(workers={workers}, shard_size=400), resume={resume})
fastdata.convert(Seqs(), sys.argv[1], config)
"""


@pytest.mark.parametrize("workers, fault", [(1, "pause:between_shards:2"), (2, "pause:mid_shard:3")])
def test_kill_and_resume_gives_the_shards_of_an_uninterrupted_run(tmp_path, workers, fault):
    def script(resume: bool) -> Path:
        path = tmp_path / f"convert_{resume}.py"
        path.write_text(textwrap.dedent(_SCRIPT.format(workers=workers, resume=resume)))
        return path

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    fault_env = {**env, "FASTDATA_FAULT": fault, "FASTDATA_FAULT_READY": str(tmp_path / "ready")}
    proc = subprocess.Popen([sys.executable, script(False), tmp_path / "ds"], env=fault_env)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "ready").exists(), "the conversion never reached the fault point"
    kill(proc)
    assert not (tmp_path / "ds" / "manifest.json").exists()
    subprocess.run([sys.executable, script(True), tmp_path / "ds"], env=env, check=True, timeout=120)
    subprocess.run([sys.executable, script(False), tmp_path / "whole"], env=env, check=True, timeout=120)
    same_dataset(tmp_path / "whole", tmp_path / "ds")


def test_an_array_of_too_many_axes_is_refused_naming_its_field_once(tmp_path):
    # the message was "field 'x': field 'x': bad shape ..." (the spec's error already names the field)
    with pytest.raises(DataError) as e:
        fastdata.convert([{"x": np.zeros((1,) * 33)}] * 2, tmp_path / "ds")
    assert str(e.value).startswith("field 'x': bad shape") and str(e.value).count("'x'") == 1


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_samples_with_no_fields_are_refused_before_anything_is_written(tmp_path, kind):
    # empty dicts (or only a key) wrote a shard, then the manifest was refused ("no fields"), leaving a DST
    # with a journal whose --resume advice could only fail again
    samples = [{"key": f"k{i}"} for i in range(20)]
    src = samples if kind == "map" else iter(samples)
    with pytest.raises(DataError, match=r"^sample 0: has no fields to store \(its keys: key\)$"):
        fastdata.convert(src, tmp_path / "ds", _config())
    assert not (tmp_path / "ds").exists()


_ITER_SCRIPT = """
import sys, numpy as np, fastdata
rows = ({"seq": np.arange(i % 9 + 1, dtype=np.float32), "label": i} for i in range(60))
config = fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1, shard_size=400), resume=len(sys.argv) > 2)
fastdata.convert(rows, sys.argv[1], config)
"""


@pytest.mark.slow
def test_the_spool_of_a_killed_iterable_conversion_is_removed_by_the_next_conversion(tmp_path):
    # a SIGKILL skipped the spool's removal: a hidden copy of every sample stayed beside DST for good
    script = tmp_path / "convert.py"
    script.write_text(_ITER_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    fault_env = {**env, "FASTDATA_FAULT": "pause:between_shards:1", "FASTDATA_FAULT_READY": str(tmp_path / "ready")}
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen([sys.executable, script, out / "ds"], env=fault_env)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "ready").exists(), "the conversion never reached the fault point"
    kill(proc)
    assert [p for p in out.iterdir() if p.name.startswith(".fastdata-spool")]  # left by the kill
    subprocess.run([sys.executable, script, out / "ds", "resume"], env=env, check=True, timeout=120)
    assert sorted(p.name for p in out.iterdir()) == ["ds"]  # the dead spool is gone, and the new one
    subprocess.run([sys.executable, script, tmp_path / "whole"], env=env, check=True, timeout=120)
    same_dataset(tmp_path / "whole", out / "ds")
