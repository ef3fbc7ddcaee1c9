"""LMDB shards read through py-lmdb: large records in any order, in threads and worker processes,
the same bytes; a record header rewritten in place, or a file truncated, after the first read raises
CorruptShardError on every later read (docs/reliability.md, "What is checked when")."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

import fastdata
from fastdata.errors import CorruptShardError
from fastdata.loaders import LoaderConfig

N = 30


def _dataset(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    x = rng.integers(0, 256, (N, 160, 160, 3), dtype=np.uint8)  # 77 KB records: past the getmulti size
    y = rng.permutation(N).astype(np.int64) * 7  # distinct: a batch row names its sample
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    dst = tmp_path / "ds"
    fastdata.convert(None, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", shard_size=1 << 20, workers=1)), arrays={"x": tmp_path / "x.npy", "y": tmp_path / "y.npy"})
    return dst, x, y


def _fixed(tmp_path: Path) -> tuple[Path, np.ndarray]:
    x = np.random.default_rng(2).integers(0, 256, (6, 200, 200, 3), dtype=np.uint8)  # 120 KB records
    np.save(tmp_path / "x.npy", x)
    dst = tmp_path / "fixed"
    fastdata.convert(None, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", workers=1)), arrays={"x": tmp_path / "x.npy"})
    return dst, x


def _ragged(tmp_path: Path) -> tuple[Path, list[np.ndarray]]:
    src = tmp_path / "seq"
    src.mkdir()
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((5000 + 100 * i, 4)).astype("<f4") for i in range(6)]  # 80+ KB records
    for i, a in enumerate(xs):
        np.save(src / f"{i:02d}.npy", a)
    dst = tmp_path / "ragged"
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", workers=1)))
    return dst, xs


def _record_at(path: Path, local: int) -> int:
    """Where record ``local`` starts in the file (large records lie on overflow pages, in key order)."""
    blob = path.read_bytes()
    positions = [i for i in range(len(blob) - 4) if blob[i : i + 4] == b"FDR1"]
    return positions[local]


def _rewrite(path: Path, offset: int, data: bytes) -> None:
    """Overwrite bytes in place: same file, same size (what a careless copy over an open dataset does)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_large_records_read_the_same_in_any_order_and_again(tmp_path):
    dst, x, y = _dataset(tmp_path)
    ds = fastdata.open(dst)
    assert len(ds.readers) >= 2
    idx = np.random.default_rng(0).integers(0, N, 50)  # random order, repeats, across shards
    first = ds.get_batch(idx)
    out = {"x": np.empty((50, 160, 160, 3), np.uint8), "y": np.empty(50, np.int64)}
    again = ds.get_batch(idx, out=out)
    for b in (first, again):
        np.testing.assert_array_equal(b["x"], x[idx])
        np.testing.assert_array_equal(b["y"], y[idx])
    everything = ds.get_batch(np.arange(N)[::-1])
    np.testing.assert_array_equal(everything["x"], x[::-1])


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_loader_threads_and_processes_read_large_records(tmp_path, mode):
    dst, x, y = _dataset(tmp_path)
    ld = fastdata.loader(dst, 8, device="cpu", num_workers=2, shuffle=True, seed=3,
                         config=LoaderConfig(mode=mode, image_dtype="uint8", images=()))
    try:
        for _ in range(2):
            seen = []
            for b in ld:
                ys = b["y"].numpy()
                where = [int(np.flatnonzero(y == v)[0]) for v in ys.tolist()]
                np.testing.assert_array_equal(b["x"].numpy(), x[where])
                seen.extend(ys.tolist())
            assert sorted(seen) == sorted(y.tolist())
    finally:
        ld.close()


def test_a_bad_record_header_is_named(tmp_path):
    dst, x, _ = _dataset(tmp_path)
    path = fastdata.open(dst).readers[0].path
    _rewrite(path, _record_at(path, 3) + 8, b"\x01")  # the first field's size in the record header
    fresh = fastdata.open(dst)
    np.testing.assert_array_equal(fresh.get_batch([2])["x"][0], x[2])
    with pytest.raises(CorruptShardError, match=r"sample 3\b.*(bytes|header)"):
        fresh.get_batch([3])
    with pytest.raises(CorruptShardError, match=r"sample 3\b.*(bytes|header)"):
        fresh.get_batch([3, 4])


def test_a_shard_truncated_after_its_first_read_is_an_error(tmp_path):
    dst, x, _ = _dataset(tmp_path)
    ds = fastdata.open(dst)
    ds.get_batch(np.arange(N))
    path = ds.readers[-1].path
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(CorruptShardError, match="truncated or rewritten"):
        ds.get_batch([N - 1])
    np.testing.assert_array_equal(ds.get_batch([0])["x"][0], x[0])  # the other shard still reads


@pytest.mark.parametrize("kind", ["fixed", "ragged"])
def test_a_record_header_rewritten_in_place_after_the_first_read_raises(tmp_path, kind):
    """Fixed records are compared with the schema on every read; ragged ones with the record index
    that the shard's first read built."""
    dst, _ = _fixed(tmp_path) if kind == "fixed" else _ragged(tmp_path)
    ds = fastdata.open(dst)
    ds.get_batch(np.arange(6))
    path = ds.readers[0].path
    _rewrite(path, _record_at(path, 2) + 8, b"\x07")  # sample 2's first payload size
    ds.get_batch([0, 1, 3])  # the others still read
    with pytest.raises(CorruptShardError, match=r"sample 2: "):
        ds.get_batch([1, 2])


def test_payload_bytes_rewritten_in_place_read_back_as_other_numbers(tmp_path):
    """What the per-read check does not cover (as documented): raw data has no per-sample checksum."""
    dst, x = _fixed(tmp_path)
    ds = fastdata.open(dst)
    ds.get_batch(np.arange(6))
    r = ds.readers[0]
    _rewrite(r.path, _record_at(r.path, 4) + r._header_size, bytes([int(x[4].flat[0]) ^ 0xFF]))
    got = ds.get_batch([4])["x"][0]
    assert got.flat[0] == x[4].flat[0] ^ 0xFF
    np.testing.assert_array_equal(got.reshape(-1)[1:], x[4].reshape(-1)[1:])


def test_small_records_are_checked_on_every_read_not_only_the_first(tmp_path):
    """Records of at most 64 KiB are fetched through LMDB (getmulti) each time, headers compared."""
    x = np.arange(40 * 16, dtype="<f4").reshape(40, 16)
    np.save(tmp_path / "x.npy", x)
    dst = tmp_path / "small"
    fastdata.convert(None, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", workers=1)), arrays={"x": tmp_path / "x.npy"})
    ds = fastdata.open(dst)
    np.testing.assert_array_equal(ds.get_batch(np.arange(40))["x"], x)
    path = ds.readers[0].path
    blob = path.read_bytes()
    at = blob.find(b"FDR1" + struct.pack("<I", 1) + struct.pack("<Q", 64) + x[9].tobytes())
    assert at > 0
    _rewrite(path, at + 8, b"\x41")  # sample 9's payload size, in place
    np.testing.assert_array_equal(ds.get_batch([8, 10])["x"], x[[8, 10]])
    with pytest.raises(CorruptShardError, match=r"sample 9: "):
        ds.get_batch([9])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_another_thread_reads_leaves_the_child_able_to_read(tmp_path: Path) -> None:
    """py-lmdb's close in a forked child waits for the parent's in-flight reads, which never end there:
    a fork must wait for them (a worker process started beside a reading loader hung)."""
    import threading
    import time

    dst, x, _ = _dataset(tmp_path)
    stop = threading.Event()
    with fastdata.open(dst) as ds:
        def read() -> None:
            while not stop.is_set():
                ds.get_batch(np.arange(N))

        t = threading.Thread(target=read)
        t.start()
        try:
            codes = []
            for _ in range(8):
                time.sleep(0.01)
                pid = os.fork()
                if pid == 0:
                    try:
                        ok = np.array_equal(ds.get_batch(np.arange(3))["x"], x[:3])
                    finally:
                        os._exit(0 if ok else 1)
                deadline = time.monotonic() + 30
                while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
                    time.sleep(0.05)
                if done[0] == 0:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    codes.append("hung")
                else:
                    codes.append(os.waitstatus_to_exitcode(done[1]))
        finally:
            stop.set()
            t.join()
    assert codes == [0] * 8
