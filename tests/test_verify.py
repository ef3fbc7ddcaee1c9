"""fastdata verify [--deep]: every bad shard and sample is reported; exit code 1 if any."""

from __future__ import annotations

import os

import lmdb
import numpy as np
import pytest

import fastdata
from conftest import edit_manifest, four_shard_dataset, make_class_folder
from fastdata.errors import CorruptShardError, FormatError, IncompleteDatasetError
from fastdata.measure.verify import MAX_SAMPLE_PROBLEMS, verify

BACKENDS = ["hdf5", "lmdb"]


@pytest.fixture(params=BACKENDS)
def ds(request, tmp_path):
    return four_shard_dataset(tmp_path, request.param)[0]


def _shard(ds, i):
    return next(ds.glob(f"shard-{i:05d}.*"))


class Recorder:
    def __init__(self):
        self.phases, self.samples = [], 0

    def start(self, total_samples, total_bytes, desc="converting"):
        self.phases.append((desc, total_samples))

    def update(self, samples, nbytes):
        self.samples += samples


def test_a_good_dataset_verifies(ds, run_cli):
    rec = Recorder()
    report = verify(ds, deep=True, progress=rec)
    assert report.ok and report.shards == 4 and report.samples_read == 30
    assert rec.phases == [("checksums", 30), ("reading samples", 30)] and rec.samples == 60
    code, out, _ = run_cli("verify", ds, "--deep", "--quiet")
    assert code == 0 and out.strip().endswith("OK: 4 shard(s) checked (size and checksum), 30 of 30 samples read and decoded")


def test_flipped_byte_is_a_checksum_problem(ds, run_cli):
    shard = _shard(ds, 1)
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 3] ^= 0x10
    shard.write_bytes(bytes(blob))
    code, out, _ = run_cli("verify", ds, "--quiet")
    assert code == 1
    assert f"BAD {shard.name}: checksum is " in out and "corrupted since it was written" in out
    assert out.count("BAD ") == 1 and "1 problem(s) in 1 shard(s)" in out


def test_missing_and_truncated_shards(ds, run_cli):
    _shard(ds, 0).unlink()
    t = _shard(ds, 2)
    t.write_bytes(t.read_bytes()[:100])
    report = verify(ds, deep=True)
    assert not report.ok
    assert report.bad_shards == sorted([f"shard-00000{t.suffix}", t.name])
    messages = [str(p) for p in report.problems]
    assert f"shard-00000{t.suffix}: file is missing" in messages
    assert any(m.startswith(f"{t.name}: file is 100 bytes, the manifest says") for m in messages)
    assert any(m.startswith("samples not read: the dataset cannot be opened") for m in messages)
    code, out, _ = run_cli("verify", ds, "--deep", "--quiet")
    assert code == 1 and out.count("BAD ") == 3


def test_deep_names_each_bad_lmdb_sample(tmp_path, run_cli):
    make_class_folder(tmp_path / "src", per_class=10)
    fastdata.convert(tmp_path / "src", tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", shard_size=4000)))
    shard = tmp_path / "ds" / "shard-00001.lmdb"
    blob = bytearray(shard.read_bytes())
    bad = []
    for k in (10, 13):  # two records of shard 1 (samples 9..17): break their field count
        pos = blob.find(k.to_bytes(8, "big") + b"FDR1")
        assert pos > 0
        blob[pos + 12] ^= 0x03
        bad.append(k)
    shard.write_bytes(bytes(blob))
    report = verify(tmp_path / "ds", deep=True)
    samples = sorted(p.sample for p in report.problems if p.sample is not None)
    assert samples == bad
    assert report.bad_shards == ["shard-00001.lmdb"]
    assert [p.sample for p in report.problems if p.sample is None] == [None]  # plus the checksum
    code, out, _ = run_cli("verify", tmp_path / "ds", "--deep", "--quiet")
    assert code == 1 and "shard-00001.lmdb, sample 10: record header does not match the schema" in out
    assert "sample 13" in out


def test_deep_caps_problems_per_shard(tmp_path):
    np.save(tmp_path / "X.npy", np.zeros((60, 4), "<f4"))
    fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb")), arrays={"x": tmp_path / "X.npy"})
    shard = tmp_path / "ds" / "shard-00000.lmdb"
    env = lmdb.open(str(shard), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        for k in range(60):
            txn.put(k.to_bytes(8, "big"), b"FDR1 not a record")
    env.close()
    edit_manifest(tmp_path / "ds", lambda m: m["shards"][0].update(bytes=shard.stat().st_size))
    report = verify(tmp_path / "ds", deep=True)
    sample_problems = [p for p in report.problems if p.sample is not None]
    assert len(sample_problems) == MAX_SAMPLE_PROBLEMS
    assert f"{60 - MAX_SAMPLE_PROBLEMS} more bad sample(s)" in str(report.problems[-1])


def test_deep_checks_labels_against_the_classes(ds):
    edit_manifest(ds, lambda m: m.update(classes=["cat", "dog"]))  # the 'eel' samples now carry a label with no class
    assert verify(ds).ok  # the shards are as written
    report = verify(ds, deep=True)
    assert sorted(p.sample for p in report.problems) == list(range(20, 30))
    assert "label 2 is not a class index (there are 2 classes)" in str(report.problems[0])


def test_deep_decodes_images(tmp_path):
    import imagegen

    src = tmp_path / "imgs"
    src.mkdir()
    for i in range(6):
        imagegen.jpeg(src / f"{i}.jpg", h=16, w=16, seed=i)
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb")))
    assert verify(tmp_path / "ds", deep=True).ok
    shard = tmp_path / "ds" / "shard-00000.lmdb"
    blob = bytearray(shard.read_bytes())
    pos = blob.find(b"\xff\xd8\xff")  # the start of some stored JPEG
    blob[pos : pos + 3] = b"\x00\x00\x00"
    shard.write_bytes(bytes(blob))
    report = verify(tmp_path / "ds", deep=True)
    bad = [p for p in report.problems if p.sample is not None]
    assert len(bad) == 1
    with pytest.raises(CorruptShardError, match=f"sample {bad[0].sample}"):
        fastdata.open(tmp_path / "ds")[bad[0].sample]


def test_verify_refuses_a_dataset_without_a_usable_manifest(tmp_path, ds, run_cli):
    (tmp_path / "half").mkdir()
    with pytest.raises(FormatError, match="not a fastdata dataset"):
        verify(tmp_path / "half")
    (tmp_path / "half" / "shard-00000.h5").write_bytes(b"")
    with pytest.raises(IncompleteDatasetError, match="no journal to resume from; convert again with --overwrite"):
        verify(tmp_path / "half")
    code, _, err = run_cli("verify", tmp_path / "half")
    assert code == 1 and "incomplete dataset" in err and "Traceback" not in err
    edit_manifest(ds, lambda m: m["shards"][0].update(file="../../etc/passwd"))
    code, _, err = run_cli("verify", ds)
    assert code == 1 and "bad shard file name" in err


def _claim(ds, count):
    """Edit the manifest so that the last shard claims ``count`` samples (num_samples to match)."""
    def edit(m):
        last = m["shards"][-1]
        m["num_samples"] += count - last["count"]
        last["count"] = count
    edit_manifest(ds, edit)


def test_a_count_the_shard_bytes_cannot_hold_is_refused_before_any_allocation(ds, run_cli):
    _claim(ds, (1 << 40) - 1 - 27)  # 2^40 - 1 samples in all: inside the format's limits
    with pytest.raises(FormatError, match="shard-00003.*claims 1099511627748 samples, more than its"):
        fastdata.open(ds)
    with pytest.raises(FormatError, match="claims"):  # not MemoryError from an 8 TiB index array
        fastdata.loader(ds, batch_size=4, device="cpu")
    code, _, err = run_cli("verify", ds, "--deep", "--quiet")
    assert code == 1 and "claims 1099511627748 samples" in err


def test_a_count_the_shard_does_not_hold_is_a_quick_problem_and_its_samples_are_not_read(ds):
    _claim(ds, 30)  # the last shard holds 3; 30 would fit its bytes compressed, so only opening it tells
    quick = verify(ds)
    assert quick.bad_shards == [_shard(ds, 3).name] and len(quick.problems) == 1
    deep = verify(ds, deep=True)
    assert deep.bad_shards == [_shard(ds, 3).name] and len(deep.problems) == 1
    assert deep.samples_read == 27  # the bad shard's claimed samples are not read one by one


def test_a_fifo_in_place_of_a_shard_is_not_a_regular_file(ds):
    shard = _shard(ds, 1)
    opened = fastdata.open(ds)  # before the FIFO: its first read of the shard opens the FIFO
    shard.unlink()
    os.mkfifo(shard)
    with pytest.raises(CorruptShardError, match=f"{shard.name}' is not a regular file \\(a FIFO\\)"):
        fastdata.open(ds)
    with pytest.raises(CorruptShardError, match=f"{shard.name}: is not a regular file \\(a FIFO\\)"):
        opened.get_batch([9])  # the first sample of shard 1
    report = verify(ds, deep=True)  # neither hangs on the FIFO nor calls it missing
    assert [str(p) for p in report.problems[:1]] == [f"{shard.name}: is not a regular file (a FIFO)"]
