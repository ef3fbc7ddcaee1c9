"""LMDB records copied from the reader's own map (records over 64 KiB, Linux) still have their header
compared on every read: a record rewritten in place after the process first read it raises
CorruptShardError, for fixed-layout and for ragged schemas (docs/reliability.md, "What is checked when")."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import numpy as np
import pytest

import fastdata
from fastdata.errors import CorruptShardError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the located path is Linux only")

N = 6


def _fixed(tmp_path: Path) -> tuple[Path, np.ndarray]:
    x = np.random.default_rng(2).integers(0, 256, (N, 200, 200, 3), dtype=np.uint8)  # 120 KB records
    np.save(tmp_path / "x.npy", x)
    dst = tmp_path / "fixed"
    fastdata.convert(None, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", workers=1)), arrays={"x": tmp_path / "x.npy"})
    return dst, x


def _ragged(tmp_path: Path) -> tuple[Path, list[np.ndarray]]:
    src = tmp_path / "seq"
    src.mkdir()
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((5000 + 100 * i, 4)).astype("<f4") for i in range(N)]  # 80+ KB records
    for i, a in enumerate(xs):
        np.save(src / f"{i:02d}.npy", a)
    dst = tmp_path / "ragged"
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", workers=1)))
    return dst, xs


def _rewrite(path: Path, offset: int, data: bytes) -> None:
    """Overwrite bytes in place: same file, same size (what a careless copy over an open dataset does)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize("kind", ["fixed", "ragged"])
def test_a_record_header_rewritten_in_place_after_the_first_read_raises(tmp_path, kind):
    dst, _ = _fixed(tmp_path) if kind == "fixed" else _ragged(tmp_path)
    ds = fastdata.open(dst)
    ds.get_batch(np.arange(N))  # every record's place is now known: later reads copy from the map
    r = ds._readers[0]
    loc = r.handle().located
    assert loc is not None and not loc.lost and (loc.offsets >= 0).all()
    _rewrite(r.path, int(loc.offsets[2]) + 8, b"\x07")  # sample 2's first payload size
    ds.get_batch([0, 1, 3])  # the others still read
    with pytest.raises(CorruptShardError, match=r"sample 2: record header changed"):
        ds.get_batch([1, 2])


def test_payload_bytes_rewritten_in_place_read_back_as_other_numbers(tmp_path):
    """What the per-read check does not cover (as documented): raw data has no per-sample checksum."""
    dst, x = _fixed(tmp_path)
    ds = fastdata.open(dst)
    ds.get_batch(np.arange(N))
    r = ds._readers[0]
    off = int(r.handle().located.offsets[4]) + r._header_size
    _rewrite(r.path, off, bytes([int(x[4].flat[0]) ^ 0xFF]))
    got = ds.get_batch([4])["x"][0]
    assert got.flat[0] == x[4].flat[0] ^ 0xFF
    np.testing.assert_array_equal(got.reshape(-1)[1:], x[4].reshape(-1)[1:])


def test_ragged_records_read_through_lmdb_compare_their_header_on_every_read(tmp_path, monkeypatch):
    """Where no record can be located (non-Linux, or the map not found), ragged records are read
    through LMDB on every read; their header is still compared with the index built at first read."""
    from fastdata.format import lmdb as lmdb_format

    monkeypatch.setattr(lmdb_format._Located, "_find_map", lambda self, address: None)
    dst, xs = _ragged(tmp_path)
    ds = fastdata.open(dst)
    ds.get_batch(np.arange(N))
    path = ds._readers[0].path
    blob = path.read_bytes()
    positions = [i for i in range(len(blob) - 4) if blob[i : i + 4] == b"FDR1"]
    assert len(positions) == N  # overflow pages are allocated in key order
    _rewrite(path, positions[2] + 4, b"\x02")  # sample 2's field count: same length, other header
    np.testing.assert_array_equal(ds.get_batch([3])["x"][0][: len(xs[3])], xs[3])
    with pytest.raises(CorruptShardError, match=r"sample 2: "):
        ds.get_batch([2])


def test_small_records_are_checked_on_every_read_not_only_the_first(tmp_path):
    """Records of at most 64 KiB are fetched through LMDB (getmulti) each time, headers compared."""
    x = np.arange(40 * 16, dtype="<f4").reshape(40, 16)
    np.save(tmp_path / "x.npy", x)
    dst = tmp_path / "small"
    fastdata.convert(None, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", workers=1)), arrays={"x": tmp_path / "x.npy"})
    ds = fastdata.open(dst)
    np.testing.assert_array_equal(ds.get_batch(np.arange(40))["x"], x)
    path = ds._readers[0].path
    blob = path.read_bytes()
    at = blob.find(b"FDR1" + struct.pack("<I", 1) + struct.pack("<Q", 64) + x[9].tobytes())
    assert at > 0
    _rewrite(path, at + 8, b"\x41")  # sample 9's payload size, in place
    np.testing.assert_array_equal(ds.get_batch([8, 10])["x"], x[[8, 10]])
    with pytest.raises(CorruptShardError, match=r"sample 9: "):
        ds.get_batch([9])
