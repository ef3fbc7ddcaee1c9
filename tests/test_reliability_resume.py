"""Crash safety and --resume: a real `fastdata convert` killed with SIGKILL at several moments,
then resumed, ends byte-identical to an uninterrupted run; resume refuses a different conversion."""

from __future__ import annotations

import json
import os

import pytest

import fastdata
from conftest import make_class_folder
from crashkit import cli, kill, same_dataset, start_paused, wait_dead
from fastdata.errors import IncompleteDatasetError, UsageError

SHARD_SIZE = 4000  # 30 samples of 440 bytes -> 4 shards


@pytest.fixture
def src(tmp_path):
    make_class_folder(tmp_path / "src", per_class=10)
    return tmp_path / "src"


def reference(src, tmp_path, backend):
    ref = tmp_path / f"ref-{backend}"
    fastdata.convert(src, ref, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, shard_size=SHARD_SIZE, workers=1)))
    assert len(fastdata.open(ref).manifest.shards) == 4
    return ref


def _args(src, dst, backend, workers):
    return ["convert", src, dst, "--format", backend, "--shard-size", SHARD_SIZE, "--workers", workers, "--quiet"]


@pytest.mark.parametrize(
    "backend,workers,fault,kept",
    [
        ("hdf5", 1, "pause:before_first_shard", 0),
        ("hdf5", 1, "pause:mid_shard:1", 1),
        ("hdf5", 1, "pause:between_shards:1", 2),
        ("hdf5", 1, "pause:before_manifest", 4),
        ("lmdb", 1, "pause:mid_shard:2", 2),
        ("lmdb", 1, "pause:between_shards:0", 1),
        ("lmdb", 1, "pause:before_manifest", 4),
    ],
)
def test_sigkill_then_resume_equals_uninterrupted_run(src, tmp_path, backend, workers, fault, kept):
    ref = reference(src, tmp_path, backend)
    dst = tmp_path / "ds"
    proc = start_paused(_args(src, dst, backend, workers), fault, tmp_path / "ready")
    kill(proc)

    assert not (dst / "manifest.json").exists()
    with pytest.raises(IncompleteDatasetError, match="incomplete dataset.*--resume"):
        fastdata.open(dst)
    finished = sorted(p.name for p in dst.glob("shard-*"))
    assert len(finished) == kept
    assert (dst / ".fastdata.lock").exists()  # left by the killed process, and no obstacle below

    done = cli(*_args(src, dst, backend, workers), "--resume")
    assert done.returncode == 0, done.stderr
    assert (f"resumed: kept {kept} finished shard(s)" in done.stdout) == (kept > 0)
    same_dataset(ref, dst)


def test_sigkill_with_worker_processes_kills_the_workers_too(src, tmp_path):
    ref = reference(src, tmp_path, "hdf5")
    dst = tmp_path / "ds"
    ready = tmp_path / "ready"
    proc = start_paused(_args(src, dst, "hdf5", 2), "pause:mid_shard:2", ready)
    worker = int(ready.read_text())
    assert worker != proc.pid  # the pause happened in a shard-writing worker process
    kill(proc)
    assert wait_dead(worker), "a worker kept running after its conversion was killed"
    assert not (dst / "manifest.json").exists()
    done = cli(*_args(src, dst, "hdf5", 2), "--resume")
    assert done.returncode == 0, done.stderr
    same_dataset(ref, dst)


def test_resume_rewrites_a_finished_shard_that_no_longer_verifies(src, tmp_path):
    ref = reference(src, tmp_path, "lmdb")
    dst = _interrupted(src, tmp_path, "lmdb")
    shard = dst / "shard-00000.lmdb"
    blob = bytearray(shard.read_bytes())
    blob[5000] ^= 0xFF  # same size, other bytes: only the checksum can tell
    shard.write_bytes(bytes(blob))
    done = cli(*_args(src, dst, "lmdb", 1), "--resume")
    assert done.returncode == 0, done.stderr
    assert "resumed: kept 1 finished shard(s)" in done.stdout
    same_dataset(ref, dst)


def test_torn_journal_line_is_ignored(src, tmp_path):
    ref = reference(src, tmp_path, "hdf5")
    dst = _interrupted(src, tmp_path)
    journal = dst / ".fastdata-journal"
    lines = journal.read_bytes().split(b"\n")
    assert len(lines) == 4 and lines[-1] == b""  # header, two shards, end
    journal.write_bytes(b"\n".join(lines[:2]) + b"\n" + lines[2][:30])  # a crash in the middle of an append
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD_SIZE, workers=1), resume=True))
    same_dataset(ref, dst)


def _interrupted(src, tmp_path, backend="hdf5"):
    dst = tmp_path / "ds"
    kill(start_paused(_args(src, dst, backend, 1), "pause:between_shards:1", tmp_path / "ready"))
    return dst


def test_resume_refuses_other_options(src, tmp_path, run_cli):
    dst = _interrupted(src, tmp_path)
    before = {p.name: p.read_bytes() for p in dst.iterdir() if p.name != ".fastdata.lock"}
    code, _, err = run_cli(*_args(src, dst, "hdf5", 1)[:-5], "--shard-size", "8000", "--resume", "--quiet")
    assert code == 2 and "--resume refused" in err and "--shard-size 4000, this run --shard-size 8000" in err
    code, _, err = run_cli(*_args(src, dst, "lmdb", 1), "--resume")
    assert code == 2 and "--format hdf5, this run --format lmdb" in err
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before  # nothing touched (the stale lock went)


def test_resume_refuses_a_changed_source(src, tmp_path, run_cli):
    dst = _interrupted(src, tmp_path)
    victim = src / "dog" / "003.npy"
    os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns + 10**9))
    code, _, err = run_cli(*_args(src, dst, "hdf5", 1), "--resume")
    assert code == 2 and "source files changed" in err
    make_class_folder(src, per_class=11)  # one more sample per class
    with pytest.raises(UsageError, match="resume=True refused"):
        fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD_SIZE, workers=1), resume=True))
    code, _, err = run_cli(*_args(src, dst, "hdf5", 1), "--overwrite")
    assert code == 0, err
    assert len(fastdata.open(dst)) == 33


def test_resume_refuses_another_source_folder(src, tmp_path, run_cli):
    dst = _interrupted(src, tmp_path)
    other = tmp_path / "other"
    make_class_folder(other, per_class=10)
    code, _, err = run_cli(*_args(other, dst, "hdf5", 1), "--resume")
    assert code == 2 and "its source path was" in err


def test_resume_and_overwrite_rules(src, tmp_path, run_cli):
    dst = _interrupted(src, tmp_path)
    code, _, err = run_cli(*_args(src, dst, "hdf5", 1))
    assert code == 2 and "interrupted conversion; pass --resume" in err
    code, _, err = run_cli(*_args(src, dst, "hdf5", 1), "--resume", "--overwrite")
    assert code == 2 and "contradict" in err
    assert run_cli(*_args(src, dst, "hdf5", 1), "--resume")[0] == 0
    code, _, err = run_cli(*_args(src, dst, "hdf5", 1), "--resume")
    assert code == 2 and "already holds a finished dataset" in err
    new = tmp_path / "fresh"
    assert run_cli(*_args(src, new, "hdf5", 1), "--resume")[0] == 0  # nothing to resume: a new conversion
    assert sorted(p.name for p in new.iterdir()) == sorted(p.name for p in dst.iterdir())


def test_resume_of_a_folder_without_journal_is_refused(src, tmp_path, run_cli):
    dst = tmp_path / "ds"
    dst.mkdir()
    (dst / "shard-00000.h5").write_bytes(b"left over")
    code, _, err = run_cli(*_args(src, dst, "hdf5", 1), "--resume")
    assert code == 2 and "no interrupted conversion to resume" in err


def test_unreadable_journal_is_refused(src, tmp_path, run_cli):
    dst = _interrupted(src, tmp_path)
    (dst / ".fastdata-journal").write_bytes(b"\x80\x04\x95 not json\n")
    code, _, err = run_cli(*_args(src, dst, "hdf5", 1), "--resume")
    assert code == 2 and "not a journal" in err and "--overwrite" in err


def test_journal_records_the_plan_and_each_finished_shard(src, tmp_path):
    dst = _interrupted(src, tmp_path)
    lines = (dst / ".fastdata-journal").read_text().splitlines()
    head = json.loads(lines[0])
    assert head["options"] == {"backend": "hdf5", "shard_size": SHARD_SIZE, "compression": "none"}
    assert [s[0] for s in head["shards"]] == [f"shard-0000{i}.h5" for i in range(4)]
    assert head["source"]["path"] == str(src)
    done = [json.loads(line) for line in lines[1:]]
    assert [d["file"] for d in done] == ["shard-00000.h5", "shard-00001.h5"]
    for d in done:
        assert (dst / d["file"]).stat().st_size == d["bytes"] and d["checksum"].startswith("xxh3_128:")


def test_image_folder_resume_equals_uninterrupted_run(tmp_path, monkeypatch):
    import imagegen
    from fastdata.write import engine as writer

    src = tmp_path / "imgs"
    for c in ("a", "b"):
        (src / c).mkdir(parents=True)
        for i in range(6):
            imagegen.jpeg(src / c / f"{i}.jpg", h=16 + i, w=20, seed=i)
    opts = fastdata.WriteOptions(shard_size=3000, workers=1)
    fastdata.convert(src, tmp_path / "ref", fastdata.ConvertConfig(write=opts))
    real = writer.write_shard

    def fail_on_third(task, report=None):
        if task.index == 2:
            raise OSError(5, "Input/output error")
        return real(task, report)

    monkeypatch.setattr(writer, "write_shard", fail_on_third)
    with pytest.raises(fastdata.errors.WriteError, match="Input/output error.*2 finished shard.*resume=True"):
        fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=opts))
    monkeypatch.undo()
    report = fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=opts, resume=True))
    assert report.kept == 2
    same_dataset(tmp_path / "ref", tmp_path / "ds")


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_sigkill_while_the_journal_is_written_then_resume(src, tmp_path, backend):
    """Killed between writing the journal's temporary file and renaming it: DST holds only the lock and
    .fastdata-journal.tmp, and --resume (which scripts may always pass) starts the conversion afresh."""
    ref = reference(src, tmp_path, backend)
    dst = tmp_path / "ds"
    kill(start_paused(_args(src, dst, backend, 1), "pause:mid_journal", tmp_path / "ready"))
    assert sorted(p.name for p in dst.iterdir()) == [".fastdata-journal.tmp", ".fastdata.lock"]

    done = cli(*_args(src, dst, backend, 1), "--resume")
    assert done.returncode == 0, done.stderr
    same_dataset(ref, dst)


def test_resume_of_parts_never_started_or_killed_while_the_journal_is_written(src, tmp_path, run_cli):
    """--part I/N --resume (a failed array task re-run with --resume appended) finishes a part killed
    while writing its journal, and starts a part that never ran."""
    ref = reference(src, tmp_path, "hdf5")
    dst = tmp_path / "parts"
    args = _args(src, dst, "hdf5", 1)
    kill(start_paused([*args, "--part", "0/2"], "pause:mid_journal", tmp_path / "ready"))
    assert (dst / ".fastdata-journal-part-00000-of-00002.tmp").exists()
    for i in (0, 1):
        done = cli(*args, "--part", f"{i}/2", "--resume")
        assert done.returncode == 0, done.stderr
    code, _, err = run_cli("merge-parts", dst)
    assert code == 0, err
    same_dataset(ref, dst)


def test_fingerprint_covers_hdf5_files(tmp_path):
    h5py = pytest.importorskip("h5py")
    import numpy as np

    from fastdata.converters.arrays import H5Source
    from fastdata.write.journal import fingerprint

    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as f:
        f["x"] = np.zeros((4, 3), dtype=np.float32)
    before = fingerprint(H5Source.from_src(path, {"x": "/x"}))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # same bytes, a newer file
    assert fingerprint(H5Source.from_src(path, {"x": "/x"})) != before
