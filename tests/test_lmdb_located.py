"""LMDB shards of large fixed-layout records: once a record has been read through LMDB, later reads
copy it from the reader's own map of the file (fastdata.format.lmdb._Located). Same bytes, the same
errors for bad records, and a file truncated after the first read is still an error, not a SIGBUS."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

import fastdata
from fastdata.errors import CorruptShardError
from fastdata.loaders import LoaderConfig

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the located path is Linux only")

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


def test_records_read_the_same_before_and_after_their_place_is_known(tmp_path):
    dst, x, y = _dataset(tmp_path)
    ds = fastdata.open(dst)
    assert len(ds._readers) >= 2
    idx = np.random.default_rng(0).integers(0, N, 50)  # random order, repeats, across shards
    first = ds.get_batch(idx)
    located = [r.handle().located for r in ds._readers]
    assert all(loc is not None for loc in located)
    learned = sum(int((loc.offsets >= 0).sum()) for loc in located)
    assert learned == N  # every record located when the shard was opened, from LMDB's B-tree pages
    out = {"x": np.empty((50, 160, 160, 3), np.uint8), "y": np.empty(50, np.int64)}
    again = ds.get_batch(idx, out=out)  # now from the map
    for b in (first, again):
        np.testing.assert_array_equal(b["x"], x[idx])
        np.testing.assert_array_equal(b["y"], y[idx])
    everything = ds.get_batch(np.arange(N)[::-1])
    np.testing.assert_array_equal(everything["x"], x[::-1])


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_loader_threads_and_processes_read_located_records(tmp_path, mode):
    dst, x, y = _dataset(tmp_path)
    ld = fastdata.loader(dst, 8, device="cpu", num_workers=2, shuffle=True, seed=3,
                         config=LoaderConfig(mode=mode, image_dtype="uint8", images=()))
    try:
        for _ in range(2):  # the second epoch reads from the map
            seen = []
            for b in ld:
                ys = b["y"].numpy()
                where = [int(np.flatnonzero(y == v)[0]) for v in ys.tolist()]
                np.testing.assert_array_equal(b["x"].numpy(), x[where])
                seen.extend(ys.tolist())
            assert sorted(seen) == sorted(y.tolist())
    finally:
        ld.close()


def test_a_bad_record_header_is_named_when_first_read(tmp_path):
    dst, x, _ = _dataset(tmp_path)
    ds = fastdata.open(dst)
    ds.get_batch(np.arange(N))
    r = ds._readers[0]
    off = int(r.handle().located.offsets[3])
    path = r.path
    ds.close()
    with open(path, "r+b") as f:
        f.seek(off + 8)  # the first field's size in the record header
        f.write(b"\x01")
    fresh = fastdata.open(dst)
    np.testing.assert_array_equal(fresh.get_batch([2])["x"][0], x[2])
    with pytest.raises(CorruptShardError, match=r"sample 3\b.*(bytes|header)"):
        fresh.get_batch([3])
    with pytest.raises(CorruptShardError, match=r"sample 3\b.*(bytes|header)"):
        fresh.get_batch([3, 4])  # placed from the tree: the record is named, and so is what is wrong


def test_a_shard_truncated_after_its_records_were_located_is_an_error(tmp_path):
    dst, x, _ = _dataset(tmp_path)
    ds = fastdata.open(dst)
    ds.get_batch(np.arange(N))  # every place known: later reads go to the map
    path = ds._readers[-1].path
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(CorruptShardError, match="truncated or rewritten"):
        ds.get_batch([N - 1])
    np.testing.assert_array_equal(ds.get_batch([0])["x"][0], x[0])  # the other shard still reads


def test_a_map_not_found_in_proc_maps_is_looked_up_once_then_records_read_through_lmdb(tmp_path, monkeypatch):
    """Where /proc/self/maps names another device or inode than fstat (some stacked filesystems),
    no record can be located: reads stay correct and the maps file is not read again per record."""
    from fastdata.format import lmdb as lmdb_format

    calls = []
    monkeypatch.setattr(lmdb_format._Located, "_find_map", lambda self, address: calls.append(address))
    dst, x, y = _dataset(tmp_path)
    ds = fastdata.open(dst)
    idx = np.random.default_rng(1).integers(0, N, 40)
    for _ in range(3):
        b = ds.get_batch(idx)
        np.testing.assert_array_equal(b["x"], x[idx])
        np.testing.assert_array_equal(b["y"], y[idx])
    readers = [r for r in ds._readers if r.handle().located is not None]
    assert readers
    assert len(calls) == len(readers)  # once per shard handle, not once per record or batch
    assert all(r.handle().located.lost for r in readers)
