"""Concurrency: many processes reading one dataset at once, and readers running while another
conversion writes a different DST (the same DST is refused: tests/test_reliability_errors.py)."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import fastdata

BACKENDS = ["hdf5", "lmdb"]


@pytest.fixture(params=BACKENDS)
def ds(request, tmp_path):
    x = np.random.default_rng(0).standard_normal((600, 8, 32)).astype("<f4")
    np.save(tmp_path / "X.npy", x)
    np.save(tmp_path / "y.npy", np.arange(600, dtype="<i8") % 7)
    fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=request.param, shard_size=100_000, workers=1)), arrays={"x": tmp_path / "X.npy", "label": tmp_path / "y.npy"})
    return tmp_path / "ds"


def digest(path, seed: int, rounds: int = 3) -> str:
    """Read every sample ``rounds`` times in a random batch order; a hash of what was read, in index order."""
    d = fastdata.open(path)
    rng = np.random.default_rng(seed)
    h = hashlib.sha256()
    for _ in range(rounds):
        order = rng.permutation(len(d))
        got = {k: np.empty_like(v) for k, v in d.get_batch([0]).items()}
        parts = {k: [] for k in got}
        for b in np.array_split(order, 12):
            batch = d.get_batch(b)
            for k, v in batch.items():
                parts[k].append((b, v))
        for k, chunks in parts.items():
            full = np.empty((len(d), *chunks[0][1].shape[1:]), chunks[0][1].dtype)
            for b, v in chunks:
                full[b] = v
            h.update(full.tobytes())
    return h.hexdigest()


def _reader(path, seed, barrier, results):
    barrier.wait(timeout=60)
    results.put(digest(path, seed))


def test_many_processes_read_one_dataset_at_once(ds):
    expected = digest(ds, 0)
    ctx = mp.get_context("fork")
    n = 6
    barrier, results = ctx.Barrier(n + 1), ctx.Queue()
    procs = [ctx.Process(target=_reader, args=(ds, i, barrier, results)) for i in range(n)]
    for p in procs:
        p.start()
    barrier.wait(timeout=60)  # the parent reads at the same moment too
    mine = digest(ds, 99)
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got == [expected] * n and mine == expected


def test_reader_process_while_another_conversion_writes(ds, tmp_path):
    stop, ready = tmp_path / "stop", tmp_path / "ready"
    reader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os
        import numpy as np, fastdata
        d = fastdata.open({str(ds)!r})
        want = d.get_batch(np.arange(len(d)))
        passes = 0
        while not os.path.exists({str(stop)!r}) or passes < 2:
            got = d.get_batch(np.random.default_rng(passes).permutation(len(d)))
            order = np.argsort(np.random.default_rng(passes).permutation(len(d)))
            assert all(np.array_equal(v[order], want[k]) for k, v in got.items())
            passes += 1
            open({str(ready)!r}, "w").close()
        print("passes", passes)
        """)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists() and reader.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # the reader is reading before the conversions start
    try:
        for backend in BACKENDS:
            fastdata.convert(None, tmp_path / f"other-{backend}", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=2,
                               shard_size=50_000)), arrays={"x": tmp_path / "X.npy"})
    finally:
        stop.touch()
    out, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err
    assert int(out.split()[-1]) >= 2
    x = np.load(tmp_path / "X.npy")
    for backend in BACKENDS:
        assert np.array_equal(fastdata.open(tmp_path / f"other-{backend}").get_batch(np.arange(600))["x"], x)


def test_reader_thread_while_a_conversion_runs_in_the_same_process(ds, tmp_path):
    """The same process holds read-only LMDB/HDF5 handles of one dataset and writes another."""
    d = fastdata.open(ds)
    want = d.get_batch(np.arange(len(d)))["x"]
    errors, stop = [], threading.Event()

    def read():
        try:
            while not stop.is_set():
                assert np.array_equal(d.get_batch(np.arange(len(d)))["x"], want)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=read)
    t.start()
    try:
        for backend in BACKENDS:
            fastdata.convert(None, tmp_path / f"inline-{backend}", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=1,
                               shard_size=50_000)), arrays={"x": tmp_path / "X.npy"})
    finally:
        stop.set()
        t.join(timeout=60)
    assert not errors, errors
    assert np.array_equal(fastdata.open(tmp_path / "inline-lmdb").get_batch(np.arange(600))["x"], np.load(tmp_path / "X.npy"))
