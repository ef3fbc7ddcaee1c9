"""Disk full, I/O errors and permission denied while writing DST: one clear line, exit code 1, no
traceback (--debug shows it), nothing that looks complete, and --resume continues afterwards.
Also: a second conversion into a DST that is being written refuses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastdata
import fastdata.write
from conftest import make_class_folder
from fastdata.write import shard_task as shardwork
from crashkit import cli, kill, same_dataset, start_paused
from fastdata.errors import DestinationBusyError, WriteError

SHARD_SIZE = 4000


@pytest.fixture
def src(tmp_path):
    make_class_folder(tmp_path / "src", per_class=10)
    return tmp_path / "src"


def _args(src, dst, *more):
    return ["convert", src, dst, "--shard-size", SHARD_SIZE, "--workers", 1, "--quiet", *more]


@pytest.mark.parametrize(
    "fault,message,kept",
    [
        ("enospc:mid_shard:1", r"shard-00001\.h5: cannot write: No space left on device \(disk full\?\)", 1),
        ("eio:before_manifest", r"ds: cannot write: Input/output error \(a disk or network error\)", 4),
        ("eacces:before_first_shard", r"ds: cannot write: Permission denied \(no write permission\)", 0),
        ("enospc:between_shards:2", r"ds: cannot write: No space left on device", 3),
    ],
)
def test_write_errors_are_one_line_and_resumable(src, tmp_path, fault, message, kept):
    dst = tmp_path / "ds"
    failed = cli(*_args(src, dst), env={"FASTDATA_FAULT": fault})
    assert failed.returncode == 1
    err = failed.stderr
    assert err.count("\n") == 1 and err.startswith("fastdata: error: ") and "Traceback" not in err, err
    assert __import__("re").search(message, err), err
    assert not (dst / "manifest.json").exists()
    if kept:
        assert f"{kept} finished shard(s) kept in {dst}" in err and "--resume" in err
        assert sorted(p.name for p in dst.iterdir()) == [".fastdata-journal"] + [f"shard-0000{i}.h5" for i in range(kept)]
        with pytest.raises(fastdata.errors.IncompleteDatasetError):
            fastdata.open(dst)
    else:
        assert not dst.exists()  # nothing finished: the folder it created is gone again

    debug = cli("--debug", *_args(src, tmp_path / "dbg"), env={"FASTDATA_FAULT": fault})
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "WriteError" in debug.stderr

    fastdata.convert(src, tmp_path / "ref", fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD_SIZE, workers=1)))
    done = cli(*_args(src, dst, "--resume"))  # "after freeing space"
    assert done.returncode == 0, done.stderr
    same_dataset(tmp_path / "ref", dst)


def test_real_disk_full_from_libhdf5_is_one_line(tmp_path):
    """/dev/full fails every write with ENOSPC: the error libhdf5 reports becomes a one-line WriteError."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    field = fastdata.format.make_field("x", "<f4", (64,))
    dst = tmp_path / "ds"
    dst.mkdir()
    os.symlink("/dev/full", dst / ".shard-00000.h5.partial")
    part = fastdata.converters.arrays.ArraysSource(paths={}, offset=0, count=0, fields=[field], file_sizes={})
    task = shardwork.ShardTask(part=part, fields=[field], backend="hdf5", dst=str(dst), name="shard-00000.h5",
                               index=0, start=0, count=0, ragged_rows={}, compression=None)
    with pytest.raises(WriteError) as e:
        shardwork.write_shard(task)
    assert str(e.value) == f"{dst / 'shard-00000.h5'}: cannot write: No space left on device (disk full?)"
    assert not (dst / "shard-00000.h5").exists()


@pytest.mark.parametrize("exc,expect", [
    (OSError(28, "Unable to write (errno = 28, error message = 'No space left on device', ...)"),
     "No space left on device (disk full?)"),
    (RuntimeError("Can't write data (file write failed: errno = 5, error message = 'Input/output error')"),
     "Input/output error (a disk or network error)"),
    (PermissionError(13, "Permission denied"), "Permission denied (no write permission)"),
    (OSError(30, "Read-only file system"), "Read-only file system (mounted read-only)"),
    (ValueError("something\nelse"), "ValueError: something"),
])
def test_write_error_messages(exc, expect):
    assert str(shardwork.write_error(Path("/d/s.h5"), exc)) == f"/d/s.h5: cannot write: {expect}"


def test_permission_denied_on_the_lock_file(src, tmp_path, monkeypatch):
    real = os.open

    def deny(path, flags, *a, **k):
        if str(path).endswith(".fastdata.lock") and flags & os.O_CREAT:
            raise PermissionError(13, "Permission denied")
        return real(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", deny)
    with pytest.raises(WriteError, match=r"ds: cannot create \.fastdata\.lock: Permission denied"):
        fastdata.convert(src, tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_second_conversion_into_the_same_dst_refuses(src, tmp_path, run_cli):
    dst = tmp_path / "ds"
    first = start_paused(_args(src, dst), "pause:mid_shard:1", tmp_path / "ready")
    try:
        for more in ([], ["--overwrite"], ["--resume"]):
            code, _, err = run_cli(*_args(src, dst, *more))
            assert code == 2, (more, err)
            assert f"another conversion is writing it (fastdata pid {first.pid} on " in err
        with pytest.raises(DestinationBusyError):  # also when the check before scanning is passed
            fastdata.write.destination.prepare_dst(dst, [src], overwrite=True)
        assert (dst / "shard-00000.h5").exists()  # the refusals deleted nothing
    finally:
        kill(first)
    assert run_cli(*_args(src, dst, "--resume"))[0] == 0
    assert len(fastdata.open(dst)) == 30


def test_lock_is_gone_after_a_conversion_and_after_a_failure(src, tmp_path, monkeypatch):
    fastdata.convert(src, tmp_path / "ok", fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD_SIZE, workers=2)))
    assert not (tmp_path / "ok" / ".fastdata.lock").exists()
    monkeypatch.setenv("FASTDATA_FAULT", "enospc:between_shards:0")
    with pytest.raises(WriteError):
        fastdata.convert(src, tmp_path / "bad", fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD_SIZE, workers=1)))
    assert not (tmp_path / "bad" / ".fastdata.lock").exists()
    monkeypatch.delenv("FASTDATA_FAULT")
    report = fastdata.convert(src, tmp_path / "bad", fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD_SIZE, workers=2), resume=True))
    assert report.kept == 1
    assert np.array_equal(fastdata.open(tmp_path / "bad").get_batch(range(30))["x"],
                          fastdata.open(tmp_path / "ok").get_batch(range(30))["x"])


def test_bad_fault_spec_is_reported(src, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDATA_FAULT", "explode:everywhere")
    with pytest.raises(fastdata.errors.UsageError, match="FASTDATA_FAULT"):
        fastdata.convert(src, tmp_path / "ds")


def test_a_killed_worker_process_fails_the_conversion_cleanly(src, tmp_path):
    dst = tmp_path / "ds"
    ready = tmp_path / "ready"
    proc = start_paused(["convert", src, dst, "--shard-size", SHARD_SIZE, "--workers", 2, "--quiet"],
                        "pause:mid_shard:1", ready)
    worker = int(ready.read_text())
    assert worker != proc.pid
    os.kill(worker, 9)  # say, the out-of-memory killer
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in err
    assert "a conversion worker process died (killed, or out of memory?)" in err
    assert not (dst / "manifest.json").exists()
    assert cli(*_args(src, dst, "--resume")).returncode == 0
    fastdata.convert(src, tmp_path / "ref", fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD_SIZE, workers=1)))
    same_dataset(tmp_path / "ref", dst)


_POOL_SCRIPT = r'''
import os, sys, time
import numpy as np
import fastdata
from fastdata.errors import DataError
from fastdata.write.engine import _write_parallel
from fastdata.write.shard_task import ShardTask

class Part:
    """Shard 0 fails at once; shard 1's worker dies a little later (as a SIGBUS or the OOM killer would)."""
    def __init__(self, index):
        self.index = index
    def read(self, i):
        if self.index == 0:
            raise DataError("shard 0 fails")
        if self.index == 1:
            time.sleep(0.5)
            os.kill(os.getpid(), 9)
        time.sleep(0.5)  # the others are slow: futures still queued when shard 1's worker dies
        return {"x": np.zeros(4, "<f4")}

field = fastdata.format.make_field("x", "<f4", (4,))
tasks = [ShardTask(part=Part(i), fields=[field], backend="hdf5", dst=sys.argv[1], name=f"shard-{i:05d}.h5",
                   index=i, start=i, count=2, ragged_rows={}, compression=None) for i in range(12)]
try:
    _write_parallel(tasks, 2, None, lambda *a: None)
except Exception as e:
    print("raised:", type(e).__name__, e)
'''


def test_a_worker_dying_after_another_failed_does_not_hang_the_pool(tmp_path):
    """A worker dying after another task failed: the conversion fails with the first error, never hangs
    (the pool's thread crashed on futures cancelled after the first error, and nobody resolved the rest)."""
    script = tmp_path / "pool.py"
    script.write_text(_POOL_SCRIPT)
    (tmp_path / "ds").mkdir()
    env = {**os.environ, "PYTHONPATH": str(Path(fastdata.__file__).parents[1])}
    try:
        out = subprocess.run([sys.executable, script, tmp_path / "ds"], capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the conversion's process pool hung after a worker died")
    assert "raised: DataError shard 0 fails" in out.stdout, out.stdout + out.stderr
    assert "InvalidStateError" not in out.stderr, out.stderr


def test_ctrl_c_is_one_line_and_resumable(src, tmp_path):
    dst = tmp_path / "ds"
    proc = start_paused(_args(src, dst), "pause:between_shards:1", tmp_path / "ready")
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err == "fastdata: interrupted\n", err
    assert not (dst / "manifest.json").exists()
    assert cli(*_args(src, dst, "--resume")).returncode == 0
    fastdata.convert(src, tmp_path / "ref", fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD_SIZE, workers=1)))
    same_dataset(tmp_path / "ref", dst)


def test_a_dst_that_cannot_be_created_is_a_usage_error(src, tmp_path, run_cli):
    (tmp_path / "file").write_text("not a folder")
    code, _, err = run_cli(*_args(src, tmp_path / "file" / "ds"))
    assert code == 2 and err == f"fastdata: error: {tmp_path / 'file' / 'ds'}: cannot create the destination: Not a directory\n"
