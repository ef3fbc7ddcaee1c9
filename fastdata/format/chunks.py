"""Chunks of HDF5 datasets (one ``pread`` each) and of local Zarr arrays (their files), chunked along the sample
axis, decoded here with the GIL released so threads decode in parallel; other filters go through h5py or zarr."""

from __future__ import annotations

import os
import struct
import sys
import threading
import zlib
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any

import numpy as np

from fastdata.errors import CorruptShardError
from fastdata.format.external import BlockCheck

DEFLATE, SHUFFLE, BLOSC, LZ4, ZSTD = 1, 2, 32001, 32004, 32015
KNOWN = (DEFLATE, SHUFFLE, BLOSC, LZ4, ZSTD)


@dataclass
class ChunkTable:
    """Where each chunk of an HDF5 dataset lies in its file (open as ``fd``), and how to decode it."""

    path: str
    fd: int
    offsets: np.ndarray
    sizes: np.ndarray
    masks: np.ndarray  # HDF5 filter mask: bit i set = filter i was skipped for this chunk
    filters: list[int]  # filter ids in the order they were applied when writing
    itemsize: int
    chunk_nbytes: int
    raw: bool  # no filters: rows are read straight from the file
    check: BlockCheck | None = None  # with --checksum: the file's block digests

    def locate(self, c: int) -> tuple[str, int, BlockCheck | None]:
        """Chunk ``c``'s file, its byte offset there, and the file's block digests."""
        return self.path, int(self.offsets[c]), self.check

    def read(self, c: int, out: np.ndarray, where: str) -> None:
        """Chunk ``c`` decoded into ``out`` (C-contiguous; the last chunk may be short), without extra copies;
        the file's block digests checked before the chunk is decoded."""
        off, size, mask = int(self.offsets[c]), int(self.sizes[c]), int(self.masks[c])
        raw = bytearray(size)
        if os.preadv(self.fd, [raw], off) != size:
            raise CorruptShardError(f"{where}: chunk {c}: short read (file truncated?)")
        if self.check is not None:
            self.check.span(self.fd, off, off + size, raw)
        target = out.reshape(-1).view(np.uint8)
        steps = [f for i, f in enumerate(self.filters) if not mask & (1 << i)]
        data: Any = raw
        try:
            for k, f in enumerate(reversed(steps)):
                whole = k == len(steps) - 1 and len(target) == self.chunk_nbytes
                dst = target if whole else _scratch(self.chunk_nbytes, k % 2)
                _undo(f, data, self.itemsize, dst)
                data = dst
        except CorruptShardError:
            raise
        except Exception as e:  # a codec's own error type: name the place instead
            raise CorruptShardError(f"{where}: chunk {c}: cannot decode ({type(e).__name__}: {e})") from None
        if data is not target:
            buf = np.frombuffer(data, dtype=np.uint8)
            if len(buf) < len(target):
                raise CorruptShardError(f"{where}: chunk {c}: holds {len(buf)} bytes, expected {self.chunk_nbytes}")
            target[:] = buf[: len(target)]


def chunk_table(dset: Any, path: str, checks: dict[str, BlockCheck] | None = None) -> ChunkTable | None:
    """The table of ``dset`` (an h5py Dataset of the file ``path``, opened here), or None when it must be read
    through h5py (other filters, chunks not along the sample axis, or chunks never written: h5py gives the fill
    value); ``checks``: the file's block digests (external.checks)."""
    if dset.chunks is None or tuple(dset.chunks[1:]) != tuple(dset.shape[1:]):
        return None
    plist = dset.id.get_create_plist()
    filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    if any(f not in KNOWN for f in filters) or (set(filters) - {DEFLATE} and find_spec("numcodecs") is None):
        return None
    rows = int(dset.chunks[0])
    nbytes = rows * int(np.prod(dset.shape[1:], dtype=np.int64)) * dset.dtype.itemsize
    offsets, sizes, masks = chunk_arrays(dset, rows)
    if (offsets < 0).any():
        return None
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    return ChunkTable(path, fd, offsets, sizes, masks, filters, dset.dtype.itemsize, nbytes, not filters,
                      None if checks is None else checks.get(""))


def chunk_arrays(dset: Any, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per chunk of ``rows`` samples of ``dset`` (chunked along the sample axis only): its byte offset (-1:
    never written), stored size and HDF5 filter mask."""
    n = -(-int(dset.shape[0]) // rows) if dset.shape[0] else 0
    offsets = np.full(n, -1, dtype=np.int64)
    sizes = np.zeros(n, dtype=np.int64)
    masks = np.zeros(n, dtype=np.int64)

    def note(info: Any) -> None:
        c = info.chunk_offset[0] // rows
        offsets[c], sizes[c], masks[c] = info.byte_offset, info.size, info.filter_mask

    if n:
        dset.id.chunk_iter(note)
    return offsets, sizes, masks


def chunk_spans(dset: Any) -> np.ndarray | None:
    """Per stored chunk of a chunked ``dset`` (any chunk shape): its first row, byte offset and size
    (rows of an int64 array); None for a dataset that is not chunked."""
    if dset.chunks is None:
        return None
    out: list[tuple[int, int, int]] = []
    dset.id.chunk_iter(lambda info: out.append((info.chunk_offset[0], info.byte_offset, info.size)))
    return np.array(out, dtype=np.int64).reshape(-1, 3)


_local = threading.local()


def _scratch(n: int, which: int) -> np.ndarray:
    """One of this thread's two reused buffers between filters, of ``n`` bytes (no page faults per chunk)."""
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = [np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.uint8)]
    if len(bufs[which]) < n:
        bufs[which] = np.empty(n, dtype=np.uint8)
    return bufs[which][:n]


def _undo(f: int, data: Any, itemsize: int, dst: np.ndarray) -> None:
    """Undo filter ``f`` of ``data`` into ``dst`` (a chunk's bytes)."""
    if f == LZ4:
        _lz4(data, dst)
        return
    if f == DEFLATE:
        plain = zlib.decompress(data)
        if len(plain) != len(dst):
            raise CorruptShardError(f"deflate gave {len(plain)} bytes, expected {len(dst)}")
        dst[:] = np.frombuffer(plain, dtype=np.uint8)
        return
    import numcodecs

    codec = numcodecs.Shuffle(itemsize) if f == SHUFFLE else numcodecs.Zstd() if f == ZSTD else numcodecs.Blosc()
    codec.decode(data, out=dst)


def _lz4(data: bytearray, dst: np.ndarray) -> None:
    """The HDF5 LZ4 filter's format: total size (u64 BE), block size (u32), then per block its compressed size
    (u32) and bytes (stored plain when the sizes match); decoded in place in ``data``, our own copy."""
    from numcodecs import LZ4 as Codec

    mv = memoryview(data)
    total, block = struct.unpack(">QI", mv[:12])
    if total != len(dst):
        raise CorruptShardError(f"LZ4 chunk holds {total} bytes, expected {len(dst)}")
    pos, at = 12, 0
    codec = Codec()
    while at < total:
        n = min(block, total - at)
        (csize,) = struct.unpack(">I", mv[pos : pos + 4])
        if csize == n:
            dst[at : at + n] = np.frombuffer(mv[pos + 4 : pos + 4 + n], dtype=np.uint8)
        else:
            struct.pack_into("<I", data, pos, n)
            codec.decode(mv[pos : pos + 4 + csize], out=dst[at : at + n])
        pos += 4 + csize
        at += n


@dataclass
class ZarrChunks:
    """How to find and decode chunk ``c`` of one Zarr array (each chunk a file, opened when read)."""

    root: str  # the array's folder
    keys: list[str]  # chunk c's file, relative to root
    codec: Any  # a numcodecs codec, or None (stored raw)
    chunk_nbytes: int
    store: str  # the store's folder
    checks: dict[str, BlockCheck] | None = None  # with --checksum: each file's block digests, by path in the store
    fd: None = None  # no file kept open
    raw: bool = field(init=False)

    def __post_init__(self) -> None:
        self.raw = self.codec is None

    def locate(self, c: int) -> tuple[str, int, BlockCheck | None]:
        path = os.path.join(self.root, self.keys[c])
        return path, 0, None if self.checks is None else self.checks.get(os.path.relpath(path, self.store))

    def read(self, c: int, out: np.ndarray, where: str) -> None:
        """Chunk ``c`` into ``out`` (C-contiguous; the last chunk's buffer may be shorter than a chunk), the chunk
        file's block digests checked before its bytes are used."""
        path, _, check = self.locate(c)
        target = out.reshape(-1).view(np.uint8)
        try:
            with open(path, "rb", buffering=0) as f:
                if check is not None and self.codec is None:
                    check.all(f.fileno())
                if self.codec is None:
                    got = f.readinto(memoryview(target))  # type: ignore[arg-type]
                    if got != len(target):
                        raise CorruptShardError(f"{where}: chunk {c} ({path}) is short ({got} bytes, expected {len(target)})")
                    return
                raw = f.read()
                if check is not None:
                    check.whole(raw)
        except OSError as e:
            raise CorruptShardError(f"{where}: chunk {c}: cannot read {path} ({e.strerror})") from None
        try:
            if len(target) == self.chunk_nbytes and self.codec.codec_id in ("zstd", "blosc", "lz4"):
                self.codec.decode(raw, out=target)  # straight into the chunk buffer
                return
            data = np.frombuffer(self.codec.decode(raw), dtype=np.uint8)
        except Exception as e:  # the codec's own error type: name the place instead
            raise CorruptShardError(f"{where}: chunk {c} ({path}): cannot decode ({type(e).__name__}: {e})") from None
        if len(data) < len(target):
            raise CorruptShardError(f"{where}: chunk {c} ({path}) decodes to {len(data)} bytes, expected {self.chunk_nbytes}")
        target[:] = data[: len(target)]


def _codec(meta: Any) -> tuple[bool, Any]:
    """(supported, numcodecs codec or None) for the array's codecs."""
    import numcodecs

    if hasattr(meta, "codecs"):  # Zarr v3: bytes, then at most one compressor
        names = [type(c).__name__ for c in meta.codecs]
        if not names or names[0] != "BytesCodec":
            return False, None
        endian = getattr(meta.codecs[0], "endian", None)
        if endian is not None and endian.value != sys.byteorder:
            return False, None
        if len(names) == 1:
            return True, None
        if len(names) > 2:
            return False, None
        c = meta.codecs[1]
        conf = c.to_dict().get("configuration", {})
        table = {"ZstdCodec": lambda: numcodecs.Zstd(level=conf.get("level", 0)) if not conf.get("checksum") else None,
                 "GzipCodec": lambda: numcodecs.GZip(level=conf.get("level", 5)),
                 "BloscCodec": lambda: numcodecs.Blosc()}
        make = table.get(type(c).__name__)
        codec = make() if make else None
        return codec is not None, codec
    if meta.filters or getattr(meta, "order", "C") != "C":  # Zarr v2
        return False, None
    comp = meta.compressor
    if comp is None:
        return True, None
    return comp.codec_id in ("zstd", "blosc", "gzip", "zlib", "lz4"), comp


def zarr_chunks(array: Any, local_root: str, checks: dict[str, BlockCheck] | None = None) -> ZarrChunks | None:
    """The direct-read plan of ``array`` (opened from the local store at ``local_root``), or None; ``checks``:
    the store's block digests (external.checks)."""
    shape, chunks = tuple(array.shape), tuple(array.chunks)
    dtype = np.dtype(array.dtype)
    if chunks[1:] != shape[1:] or not (dtype.isnative or dtype.byteorder == "|"):
        return None
    if type(getattr(array.metadata, "codecs", [None])[-1]).__name__ == "ShardingCodec":
        return None
    ok, codec = _codec(array.metadata)
    if not ok:
        return None
    n = -(-shape[0] // chunks[0]) if shape[0] else 0
    rest = (0,) * (len(shape) - 1)
    keys = [array.metadata.encode_chunk_key((c, *rest)) for c in range(n)]
    root = os.path.join(local_root, array.path) if array.path else local_root
    if not all(os.path.isfile(os.path.join(root, k)) for k in keys):
        return None  # chunks never written hold the fill value: zarr knows it
    nbytes = chunks[0] * int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    return ZarrChunks(root, keys, codec, nbytes, local_root, checks)
