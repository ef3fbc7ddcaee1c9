"""LMDB map sizing: the map grows while writing (no MapFullError for the user) and the file holds
only the pages used, plus the fixed tail guard, whatever the map grew to."""

from __future__ import annotations

import lmdb
import numpy as np

import fastdata
from fastdata.format import lmdb as lmdb_format
from fastdata.format import make_field
from fastdata.measure.verify import verify


def _pages(path) -> int:
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    try:
        return (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    finally:
        env.close()


def test_map_grows_from_a_tiny_estimate_and_the_file_is_right_sized(tmp_path, monkeypatch):
    fields = [make_field("x", "<f4", (None, 16))]
    rows = np.arange(1, 401) % 37 + 1
    samples = [np.full((r, 16), i, "<f4") for i, r in enumerate(rows)]

    def write(path):
        w = lmdb_format.ShardWriter(path, fields, len(samples), {"x": int(rows.sum())})
        with w:
            for s in samples:
                w.write({"x": s})
        return w

    monkeypatch.setattr(lmdb_format, "_COMMIT_BYTES", 32 << 10)  # several commits, each may find the map full
    write(tmp_path / "normal.lmdb")
    monkeypatch.setattr(lmdb_format, "initial_map_size", lambda payload, count, nfields: 64 << 10)
    write(tmp_path / "tiny.lmdb")
    assert _pages(tmp_path / "tiny.lmdb") > 8 * (64 << 10)  # more pages than the first map holds: it grew
    for path in (tmp_path / "normal.lmdb", tmp_path / "tiny.lmdb"):
        used = _pages(path)
        assert path.stat().st_size == used + lmdb_format.tail_guard_bytes(4096, 8 + 8 + 37 * 64)
        assert used < 2 * 4 * 16 * rows.sum()  # payload 4 bytes x 16 x rows, with B-tree overhead
    assert (tmp_path / "normal.lmdb").stat().st_size == (tmp_path / "tiny.lmdb").stat().st_size  # growing costs nothing


def test_conversion_with_a_tiny_map_estimate_reads_back(tmp_path, monkeypatch):
    monkeypatch.setattr(lmdb_format, "initial_map_size", lambda payload, count, nfields: 32 << 10)
    x = np.random.default_rng(0).standard_normal((500, 300)).astype("<f4")
    np.save(tmp_path / "X.npy", x)
    opts = fastdata.WriteOptions(backend="lmdb", workers=2, shard_size=240_000)  # 200 samples a shard
    report = fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=opts), arrays={"x": tmp_path / "X.npy"})
    assert report.shards == 3
    assert np.array_equal(fastdata.open(tmp_path / "ds").get_batch(np.arange(500))["x"], x)
    assert verify(tmp_path / "ds", deep=True).ok
    assert not list((tmp_path / "ds").glob("*-lock"))  # no LMDB lock files in a dataset


def test_readers_open_read_only_without_a_lock_file(tmp_path):
    np.save(tmp_path / "X.npy", np.zeros((10, 3), "<f4"))
    fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb")), arrays={"x": tmp_path / "X.npy"})
    shard = tmp_path / "ds" / "shard-00000.lmdb"
    shard.chmod(0o444)
    ds = fastdata.open(tmp_path / "ds")
    assert ds.get_batch([1])["x"].shape == (1, 3)
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == ["manifest.json", "shard-00000.lmdb"]
    env = ds.readers[0].handle().env
    assert env.flags()["readonly"] and not env.flags()["lock"]
