"""fastdata index --checksum: the reader checks each block of a source file the first time it reads it,
so a same-size edit between the blocks sampled at open, its modification time put back, is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

import fastdata
from fastdata import fileio
from fastdata.errors import CorruptShardError, FastdataError
from fastdata.format import external, inplace
from fastdata.format.external import SAMPLE_BLOCK, SAMPLE_BLOCKS
from fastdata.loaders import LoaderConfig
from fastdata.measure.verify import verify

N, ROW = 640, (1024,)  # 4 KiB a sample of float32: 2.5 MiB a field, more than 2 blocks and the 256 KiB sampled at open


def _x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((N, *ROW)).astype(np.float32)


def _sampled(size: int, blocks: int) -> list[tuple[int, int]]:
    """The byte ranges sample_checksum reads of a file of ``size`` bytes."""
    n = min(blocks, -(-size // SAMPLE_BLOCK))
    return [(int(o), int(o) + SAMPLE_BLOCK) for o in np.linspace(0, max(0, size - SAMPLE_BLOCK), n)]


def _edit(path: Path, lo: int, hi: int, blocks: int = SAMPLE_BLOCKS) -> None:
    """Flip one byte of ``path`` in ``lo..hi-1`` outside the blocks checked at open; the time is put back."""
    st = os.stat(path)
    seen = _sampled(st.st_size, blocks)
    off = next(o for o in range((lo + hi) // 2, hi) if not any(a <= o < b for a, b in seen))
    with open(path, "r+b") as f:
        f.seek(off)
        byte = f.read(1)[0]
        f.seek(off)
        f.write(bytes([byte ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _source(kind: str, tmp: Path) -> tuple[Path, dict[str, str] | None]:
    """A source of one field x, edited (once indexed) by ``_edit_source``."""
    if kind == "npy":
        np.save(tmp / "x.npy", _x())
        return tmp / "x.npy", None
    if kind.startswith("zarr"):
        zarr = pytest.importorskip("zarr")
        comp = None if kind == "zarr-raw" else zarr.codecs.ZstdCodec(level=1)
        z = zarr.create_array(str(tmp / "s.zarr"), shape=(N, *ROW), chunks=(16, *ROW), dtype="f4", compressors=comp)
        z[:] = _x()
        return tmp / "s.zarr", None
    kw = {"contiguous": {}, "h5-raw": {"chunks": (16, *ROW)}, "h5-gzip": {"chunks": (16, *ROW), "compression": "gzip"},
          "h5-lzf": {"chunks": (16, *ROW), "compression": "lzf"}}[kind]
    with h5py.File(tmp / "d.h5", "w") as f:
        f.create_dataset("x", data=_x(), **kw)
    return tmp / "d.h5", {"x": "/x"}


def _edit_source(kind: str, src: Path) -> None:
    if kind == "npy":
        _edit(src, 128, os.path.getsize(src))
    elif kind.startswith("zarr"):
        chunk = sorted(p for p in src.rglob("*") if p.is_file() and p.name != "zarr.json")[2]
        _edit(chunk, 0, chunk.stat().st_size, 4)
    else:
        with h5py.File(src, "r") as f:
            d = f["x"]
            info = d.id.get_chunk_info(30) if d.chunks else None  # far from sample 0's block
            lo, hi = (d.id.get_offset(), d.id.get_offset() + d.id.get_storage_size()) if info is None else \
                (info.byte_offset, info.byte_offset + info.size)
        _edit(src, lo, hi)


KINDS = ["contiguous", "npy", "h5-raw", "h5-gzip", "h5-lzf", "zarr-raw", "zarr-zstd"]
CHANGED = r"(d\.h5|x\.npy|s\.zarr/\S+): block \d+ \(bytes \d+\.\.\d+\) differs from its checksum taken at index time"


@pytest.fixture(autouse=True)
def by_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Columns read a chunk at a time, as large ones are (these would be read whole at open)."""
    monkeypatch.setattr(inplace, "_WHOLE_COLUMN_BYTES", 0)


@pytest.mark.parametrize("kind", KINDS)
def test_an_edit_between_the_sampled_blocks_is_refused_when_read(tmp_path, kind):
    src, fields = _source(kind, tmp_path)
    fastdata.index(src, tmp_path / "i", fields, checksum=True)
    fastdata.index(src, tmp_path / "plain", fields)
    ref = fastdata.open(tmp_path / "i").get_batch(np.arange(N))["x"]
    _edit_source(kind, src)
    ds = fastdata.open(tmp_path / "i")  # not seen at open: the edit is between the sampled blocks
    assert np.array_equal(ds[0]["x"], ref[0])  # blocks not read are not checked
    with pytest.raises(CorruptShardError, match=CHANGED):
        for i in range(N):
            ds[i]
    with pytest.raises(CorruptShardError, match=CHANGED):  # a block that failed is checked again
        ds.get_batch(np.arange(N))
    if kind in ("contiguous", "npy", "h5-raw", "zarr-raw"):  # without --checksum: read as it is now (documented)
        got = fastdata.open(tmp_path / "plain").get_batch(np.arange(N))["x"]
        assert not np.array_equal(got, ref)


@pytest.mark.parametrize("mode", ["threads", "processes"])
@pytest.mark.parametrize("kind", ["contiguous", "h5-gzip", "zarr-raw"])
def test_the_loader_refuses_an_edited_block(tmp_path, kind, mode):
    src, fields = _source(kind, tmp_path)
    fastdata.index(src, tmp_path / "i", fields, checksum=True)
    _edit_source(kind, src)
    ld = fastdata.loader(tmp_path / "i", 16, device="cpu", num_workers=2, config=LoaderConfig(mode=mode))
    try:
        with pytest.raises(FastdataError, match=CHANGED):
            for _ in ld:
                pass
    finally:
        ld.close()


def test_an_index_without_block_checksums_still_opens(tmp_path):
    src, fields = _source("contiguous", tmp_path)
    fastdata.index(src, tmp_path / "i", fields, checksum=True)
    man = tmp_path / "i" / "manifest.json"
    doc = json.loads(man.read_text())
    assert {"size", "xxh3_64"} <= set(doc["source"]["files"][0]["blocks"])
    del doc["source"]["files"][0]["blocks"]  # as an index written before block checksums
    man.write_text(json.dumps(doc))
    assert np.array_equal(fastdata.open(tmp_path / "i").get_batch(np.arange(N))["x"], _x())
    assert verify(tmp_path / "i", deep=True).ok


@pytest.mark.parametrize("kind", ["npy", "zarr-raw"])
def test_checksum_reads_each_file_once_and_samples_what_an_open_samples(tmp_path, monkeypatch, kind):
    src, fields = _source(kind, tmp_path)
    monkeypatch.setattr(fileio, "HASH_BLOCK", 1 << 20)  # 1 MiB reads: some sampled blocks span two of them
    sampled = external.sample_checksum(str(src))
    monkeypatch.setattr(external, "sample_checksum", None)  # --checksum takes the samples in its one pass
    fastdata.index(src, tmp_path / "i", fields, checksum=True)
    doc = json.loads((tmp_path / "i" / "manifest.json").read_text())
    assert doc["source"]["files"][0]["sample"] == sampled
