"""Bad input: clear errors naming the file, exit codes 2 (usage) and 1 (data), nothing half-written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import fastdata
from conftest import tree_state
from fastdata.errors import DataError, UsageError, WriteError


def assert_nothing_written(dst: Path) -> None:
    assert not dst.exists() or not (dst / "manifest.json").exists()
    assert not dst.exists()  # a DST we created is removed again


def test_empty_folder(tmp_path, run_cli):
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli("convert", tmp_path / "empty", tmp_path / "ds")
    assert code == 1 and "no files found" in err and str(tmp_path / "empty") in err
    assert_nothing_written(tmp_path / "ds")


def test_missing_source_is_usage_error(tmp_path, run_cli):
    code, _, err = run_cli("convert", tmp_path / "nope", tmp_path / "ds")
    assert code == 2 and "no such file" in err


def test_non_npy_file_is_skipped_or_refused_with_strict(tmp_path, class_folder, run_cli):
    src, _ = class_folder
    (src / "dog" / "notes.txt").write_text("hello")
    code, _, err = run_cli("convert", src, tmp_path / "ds", "--strict")
    assert code == 1 and "notes.txt" in err and "not a sample file" in err
    assert_nothing_written(tmp_path / "ds")
    code, _, err = run_cli("convert", src, tmp_path / "ds")
    assert code == 0 and "skipped 1 file(s) that are not samples: dog/notes.txt" in err
    assert len(fastdata.open(tmp_path / "ds")) == 12


def test_dtype_mismatch_names_the_file(tmp_path, class_folder, run_cli):
    src, _ = class_folder
    np.save(src / "dog" / "odd.npy", np.zeros((2, 6, 3, 3), np.float64))
    code, _, err = run_cli("convert", src, tmp_path / "ds")
    assert code == 1 and "odd.npy" in err and "float64" in err and "float32" in err
    assert_nothing_written(tmp_path / "ds")


def test_trailing_shape_mismatch_names_the_file(tmp_path, class_folder, run_cli):
    src, _ = class_folder
    np.save(src / "cat" / "odd.npy", np.zeros((2, 6, 3, 4), np.float32))
    code, _, err = run_cli("convert", src, tmp_path / "ds")
    assert code == 1 and "odd.npy" in err and "(n, 6, 3, 4)" in err



@pytest.mark.parametrize("skip", [[], ["--skip-bad"]])
def test_sequences_saved_channels_first_are_refused_as_a_whole_not_file_by_file(tmp_path, run_cli, skip):
    """User 003 (/work/shared/context): (channels, time) .npy files whose time varies. Each file was named odd
    against the first one's shape ('... (8 more bad file(s); --skip-bad skips them ...)'), and --skip-bad kept
    one sample of six. Refused as a whole, saying the varying axis must come first."""
    src = tmp_path / "seqs"
    src.mkdir()
    for i in range(6):
        np.save(src / f"{i}.npy", np.zeros((16, 20 + i), np.float32))
    code, _, err = run_cli("convert", src, tmp_path / "ds", *skip)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "6 different shapes among 6 files" in err and "first axis" in err and "x.T" in err and "skip" not in err
    assert_nothing_written(tmp_path / "ds")
    for i in range(6):  # as advised: saved with time first, they convert as one ragged field
        np.save(src / f"{i}.npy", np.load(src / f"{i}.npy").T)
    code, _, err = run_cli("convert", src, tmp_path / "ds", *skip)
    assert code == 0, err
    ds = fastdata.open(tmp_path / "ds")
    assert sorted(ds[i]["x"].shape for i in range(len(ds))) == [(t, 16) for t in range(20, 26)]

def test_truncated_npy(tmp_path, class_folder, run_cli):
    src, _ = class_folder
    p = src / "eel" / "001.npy"
    p.write_bytes(p.read_bytes()[:-10])
    code, _, err = run_cli("convert", src, tmp_path / "ds")
    assert code == 1 and "001.npy" in err and "truncated" in err


@pytest.mark.parametrize("content,expect", [(b"", "empty file"), (b"not numpy at all", "not a valid .npy"),
                                            (b"\x93NUMPY\x01\x00\x10\x00{'descr': <?", "not a valid .npy")])
def test_garbage_npy(tmp_path, content, expect):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.zeros(3))
    (src / "b.npy").write_bytes(content)
    with pytest.raises(DataError, match=expect) as e:
        fastdata.convert(src, tmp_path / "ds")
    assert "b.npy" in str(e.value)


def test_object_array_is_refused_without_unpickling(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match="object arrays would need pickle"):
        fastdata.convert(src, tmp_path / "ds")


def test_unreadable_file(tmp_path, class_folder, monkeypatch):
    src, _ = class_folder
    from fastdata.converters import arrays as npyfile

    real_open = open

    def deny(path, *a, **k):
        if str(path).endswith("dog/002.npy"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", deny)
    with pytest.raises(DataError, match=r"dog/002\.npy: cannot read: Permission denied"):
        fastdata.convert(src, tmp_path / "ds")
    assert npyfile  # the module under test reads through builtins.open


def test_broken_symlink(tmp_path, class_folder):
    src, _ = class_folder
    os.symlink(tmp_path / "gone.npy", src / "cat" / "link.npy")
    with pytest.raises(DataError, match="link.npy: broken symlink"):
        fastdata.convert(src, tmp_path / "ds")


def test_symlink_loop_is_followed_once(tmp_path, class_folder):
    src, _ = class_folder
    os.symlink(src, src / "cat" / "loop")
    fastdata.convert(src, tmp_path / "ds")
    assert len(fastdata.open(tmp_path / "ds")) == 12


def test_existing_dst_is_usage_error(tmp_path, class_folder, run_cli):
    src, _ = class_folder
    dst = tmp_path / "ds"
    dst.mkdir()
    (dst / "mine.txt").write_text("keep me")
    code, _, err = run_cli("convert", src, dst)
    assert code == 2 and "already exists" in err
    code, _, err = run_cli("convert", src, dst, "--overwrite")
    assert code == 2 and "mine.txt" in err and "did not write" in err
    assert (dst / "mine.txt").read_text() == "keep me"


def test_overwrite_replaces_a_fastdata_dataset(tmp_path, class_folder, run_cli):
    src, _ = class_folder
    dst = tmp_path / "ds"
    assert run_cli("convert", src, dst, "--format", "lmdb")[0] == 0
    code, out, _ = run_cli("convert", src, dst, "--overwrite")
    assert code == 0 and "hdf5" in out
    assert sorted(p.name for p in dst.iterdir()) == ["keys.bin", "manifest.json", "shard-00000.h5"]


def test_empty_existing_dst_is_fine(tmp_path, class_folder, run_cli):
    src, _ = class_folder
    (tmp_path / "ds").mkdir()
    assert run_cli("convert", src, tmp_path / "ds")[0] == 0


def test_dst_inside_src(tmp_path, class_folder, run_cli):
    src, _ = class_folder
    before = tree_state(src)
    code, _, err = run_cli("convert", src, src / "cat" / "out")
    assert code == 2 and "inside the source" in err
    assert tree_state(src) == before


def test_skip_bad_writes_report(tmp_path, class_folder, run_cli):
    src, _ = class_folder
    (src / "cat" / "junk.txt").write_text("x")
    np.save(src / "dog" / "wide.npy", np.zeros((2, 6, 3, 9), np.float32))
    p = src / "eel" / "000.npy"
    p.write_bytes(p.read_bytes()[:100])
    before = tree_state(src)
    code, out, err = run_cli("convert", src, tmp_path / "ds", "--skip-bad")
    assert code == 0, err
    assert "skipped 2 bad file(s)" in out and "cat/junk.txt" in err  # not a sample: skipped, said once
    report = json.loads((tmp_path / "ds" / "skipped.json").read_text())
    assert [r["path"] for r in report] == ["dog/wide.npy", "eel/000.npy"]
    assert "truncated" in report[1]["reason"]
    ds = fastdata.open(tmp_path / "ds")
    assert len(ds) == 11 and ds.classes == ["cat", "dog", "eel"]
    assert tree_state(src) == before


def test_mixed_layout_is_reported(tmp_path, class_folder):
    src, _ = class_folder
    np.save(src / "stray.npy", np.zeros((2, 6, 3, 3), np.float32))
    with pytest.raises(DataError, match="stray.npy.*mixed layout|mixed layout.*stray.npy"):
        fastdata.convert(src, tmp_path / "ds")
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(no_labels=True))
    assert len(fastdata.open(tmp_path / "ds")) == 13


def test_labels_file_problems(tmp_path, class_folder):
    src, _ = class_folder
    lab = tmp_path / "l.csv"
    lab.write_text("cat/000.npy,1\n")
    with pytest.raises(DataError, match="cat/001.npy: no label"):
        fastdata.convert(src, tmp_path / "ds", labels=lab)
    lab.write_text("".join(f"{p.relative_to(src).as_posix()},0\n" for p in src.rglob("*.npy")) + "ghost.npy,1\n")
    with pytest.raises(DataError, match="ghost.npy"):
        fastdata.convert(src, tmp_path / "ds", labels=lab)
    with pytest.raises(UsageError, match="not found"):
        fastdata.convert(src, tmp_path / "ds", labels=tmp_path / "missing.csv")


def test_arrays_with_different_lengths(tmp_path, run_cli):
    np.save(tmp_path / "X.npy", np.zeros((10, 3)))
    np.save(tmp_path / "y.npy", np.zeros(9, np.int64))
    code, _, err = run_cli("convert", "--data", tmp_path / "X.npy", "--labels", tmp_path / "y.npy", tmp_path / "ds")
    assert code == 1 and "y.npy: has 9 samples" in err


def test_bad_options_are_usage_errors(tmp_path, class_folder, run_cli):
    src, _ = class_folder
    assert run_cli("convert", src, tmp_path / "a", "--shard-size", "lots")[0] == 2
    assert run_cli("convert", src, tmp_path / "a", "--workers", "0")[0] == 2
    code, _, err = run_cli("convert", src, tmp_path / "a", "--format", "lmdb", "--compression", "gzip")
    assert code == 2 and "HDF5 only" in err
    code, _, err = run_cli("convert", src, tmp_path / "a", "--compression", "brotli")
    assert code == 2 and "brotli" in err
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("failing", [0, 1])
def test_write_failure_leaves_nothing_that_looks_complete(tmp_path, class_folder, monkeypatch, failing):
    src, _ = class_folder
    from fastdata.write import engine as writer

    real = writer.write_shard

    def flaky(task, report=None):
        if task.index == failing:
            raise OSError(28, "No space left on device")
        return real(task, report)

    monkeypatch.setattr(writer, "write_shard", flaky)
    with pytest.raises(WriteError, match="No space left on device") as e:
        fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=1500, workers=1)))
    if failing == 0:  # nothing finished: DST is gone again
        assert not (tmp_path / "ds").exists()
    else:  # the finished shard and the journal stay for --resume (tests/test_reliability_resume.py)
        assert "resume=True" in str(e.value)
        assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == [".fastdata-journal", "shard-00000.h5"]
