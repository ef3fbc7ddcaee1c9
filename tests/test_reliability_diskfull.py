"""A real full disk: conversions into a small tmpfs that fills up part way. Each must end, in time,
with the documented one-line "No space left on device" error and a folder that ``--resume`` finishes
once there is room (the tmpfs made larger), byte for byte the dataset of an uninterrupted run.
Needs root (``mount``); skipped where a tmpfs cannot be mounted."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from crashkit import cli, same_dataset

SMALL, LARGE = "12m", "48m"  # the tmpfs while it fills up; after "freeing space"
SHARD_SIZE = "1MB"
EXT = {"hdf5": "h5", "lmdb": "lmdb"}
DEADLINE_S = 120  # a hang fails the test instead of hanging the suite
_FULL = re.compile(r"^fastdata: error: (\S+/shard-\d{5}\.(h5|lmdb)|\S+): cannot write: No space left on device \(disk full\?\); "
                   r"(\d+) finished shard\(s\) kept in (\S+): fix the problem, then run the same command with --resume to finish\n$")


def _mount(path, size, remount=False):
    opts = f"remount,size={size}" if remount else f"size={size}"
    return subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True, text=True)


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of SMALL bytes at tmp_path/disk (unmounted afterwards)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        made = _mount(disk, SMALL)
    except FileNotFoundError:
        pytest.skip("no mount command")
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.fixture(scope="module")
def big_source(tmp_path_factory):
    """An array source of 20 MB (more than SMALL holds): 2500 samples of 8 KiB."""
    root = tmp_path_factory.mktemp("big")
    x = np.random.default_rng(0).integers(0, 255, size=(2500, 8192), dtype=np.uint8)
    np.save(root / "x.npy", x)
    return root / "x.npy"


def _args(src, dst, backend, *more):
    return ["convert", src, dst, "--format", backend, "--shard-size", SHARD_SIZE, "--workers", 2, "--quiet", *more]


def _run(*args):
    try:
        return cli(*args, timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"fastdata {' '.join(map(str, args))} hung for {DEADLINE_S} s on a full disk")


def _fill_and_resume(src, disk, ref, backend, rounds):
    for _ in range(rounds):
        dst = disk / "ds"
        failed = _run(*_args(src, dst, backend))
        assert failed.returncode == 1, failed.stderr
        m = _FULL.match(failed.stderr)
        assert m, failed.stderr
        kept = int(m.group(3))
        assert kept >= 1 and m.group(4) == str(dst), failed.stderr
        assert not (dst / "manifest.json").exists()
        names = sorted(p.name for p in dst.iterdir())
        shards = [n for n in names if re.fullmatch(rf"shard-\d{{5}}\.{EXT[backend]}", n)]
        assert names == [".fastdata-journal", *shards] and len(shards) == kept, names  # (workers finish in any order)
        assert _mount(disk, LARGE, remount=True).returncode == 0  # "free some space"
        done = _run(*_args(src, dst, backend, "--resume"))
        assert done.returncode == 0, done.stderr
        assert f"resumed: kept {kept} finished shard(s)" in done.stdout
        same_dataset(ref, dst)
        shutil.rmtree(dst)
        assert _mount(disk, SMALL, remount=True).returncode == 0


@pytest.fixture
def reference(big_source, tmp_path):
    def make(backend):
        ref = tmp_path / f"ref-{backend}"
        assert _run(*_args(big_source, ref, backend)).returncode == 0
        return ref
    return make


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_disk_full_ends_in_one_line_and_resumes(big_source, small_disk, reference, backend):
    _fill_and_resume(big_source, small_disk, reference(backend), backend, rounds=2)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_disk_full_twenty_times(big_source, small_disk, reference, backend):
    _fill_and_resume(big_source, small_disk, reference(backend), backend, rounds=20)
