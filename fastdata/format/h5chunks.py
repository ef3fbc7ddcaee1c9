"""Chunks of an HDF5 dataset read without h5py: one ``pread`` per chunk and the filters undone here.

For a dataset chunked along the sample axis only (each chunk holds whole samples), the chunk
table (``chunk_iter``: where each chunk lies, how big, which filters it skipped) is read once per
process; afterwards a chunk is one positional read and a decode with the GIL released (zlib,
numcodecs' LZ4/Zstd/Blosc, a numpy byte unshuffle), so reader threads decode in parallel, which
h5py's global lock would forbid. Pipelines with any other filter (or chunks that split a sample)
are read through h5py instead (fastdata/format/inplace.py).
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CorruptShardError

DEFLATE, SHUFFLE, BLOSC, LZ4, ZSTD = 1, 2, 32001, 32004, 32015
KNOWN = (DEFLATE, SHUFFLE, BLOSC, LZ4, ZSTD)


@dataclass
class ChunkTable:
    """Where chunk ``c`` (samples ``c * rows`` onwards) lies in the file, and how to decode it."""

    rows: int
    offsets: np.ndarray  # -1: never written (reads fall back to h5py, which gives the fill value)
    sizes: np.ndarray
    masks: np.ndarray  # HDF5 filter mask: bit i set = filter i was skipped for this chunk
    filters: list[int]  # filter ids in the order they were applied when writing
    itemsize: int
    chunk_nbytes: int


def chunk_table(dset: Any) -> ChunkTable | None:
    """The table of ``dset`` (an h5py Dataset), or None when it must be read through h5py."""
    if dset.chunks is None or tuple(dset.chunks[1:]) != tuple(dset.shape[1:]):
        return None
    plist = dset.id.get_create_plist()
    filters = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    if any(f not in KNOWN for f in filters):
        return None
    rows = int(dset.chunks[0])
    n = -(-int(dset.shape[0]) // rows) if dset.shape[0] else 0
    offsets = np.full(n, -1, dtype=np.int64)
    sizes = np.zeros(n, dtype=np.int64)
    masks = np.zeros(n, dtype=np.int64)

    def note(info: Any) -> None:
        c = info.chunk_offset[0] // rows
        offsets[c], sizes[c], masks[c] = info.byte_offset, info.size, info.filter_mask

    if n:
        dset.id.chunk_iter(note)
    nbytes = rows * int(np.prod(dset.shape[1:], dtype=np.int64)) * dset.dtype.itemsize
    return ChunkTable(rows, offsets, sizes, masks, filters, dset.dtype.itemsize, nbytes)


def read_chunk(fd: int, t: ChunkTable, c: int, out: np.ndarray, where: str) -> None:
    """Chunk ``c`` decoded into ``out`` (C-contiguous, at most a chunk: the last one may be short)."""
    off, size, mask = int(t.offsets[c]), int(t.sizes[c]), int(t.masks[c])
    raw = os.pread(fd, size, off)
    if len(raw) != size:
        raise CorruptShardError(f"{where}: chunk {c}: short read (file truncated?)")
    data: Any = raw
    target = out.reshape(-1).view(np.uint8)
    steps = [f for i, f in enumerate(t.filters) if not mask & (1 << i)]
    try:
        for k, f in enumerate(reversed(steps)):
            last = k == len(steps) - 1
            if f == SHUFFLE and last:
                _unshuffle(data, t.itemsize, t.chunk_nbytes, target)
                return
            data = _undo(f, data, t)
    except CorruptShardError:
        raise
    except Exception as e:  # a codec's own error type: name the place instead
        raise CorruptShardError(f"{where}: chunk {c}: cannot decode ({type(e).__name__}: {e})") from None
    buf = np.frombuffer(data, dtype=np.uint8)
    if len(buf) < len(target):
        raise CorruptShardError(f"{where}: chunk {c}: decodes to {len(buf)} bytes, expected {t.chunk_nbytes}")
    target[:] = buf[: len(target)]


def _undo(f: int, data: Any, t: ChunkTable) -> Any:
    if f == DEFLATE:
        return zlib.decompress(data)
    if f == SHUFFLE:
        out = np.empty(t.chunk_nbytes, dtype=np.uint8)
        _unshuffle(data, t.itemsize, t.chunk_nbytes, out)
        return out
    if f == LZ4:
        return _lz4(data, t.chunk_nbytes)
    from numcodecs import Blosc, Zstd

    return (Zstd() if f == ZSTD else Blosc()).decode(data)


def _unshuffle(data: Any, itemsize: int, nbytes: int, target: np.ndarray) -> None:
    """HDF5's byte shuffle undone: byte j of every element is stored together, plane after plane
    (a tail shorter than ``itemsize`` elements is stored as it is)."""
    src = np.frombuffer(data, dtype=np.uint8)
    n = nbytes // itemsize
    whole = n * itemsize
    if itemsize == 1:
        target[:] = src[: len(target)]
        return
    planes = src[:whole].reshape(itemsize, n)
    rows = len(target) // itemsize
    target[: rows * itemsize].reshape(rows, itemsize)[:] = planes[:, :rows].T
    if len(target) > rows * itemsize:
        target[rows * itemsize :] = src[whole : whole + len(target) - rows * itemsize]


def _lz4(data: Any, nbytes: int) -> bytearray:
    """The HDF5 LZ4 filter's format: total size (u64, big-endian), block size (u32), then per block
    its compressed size (u32) and bytes; a block whose compressed size equals its size is stored plain."""
    from numcodecs import LZ4 as Codec

    mv = memoryview(data)
    total, block = struct.unpack(">QI", mv[:12])
    out = bytearray(total)
    pos, at = 12, 0
    codec = Codec()
    while at < total:
        n = min(block, total - at)
        (csize,) = struct.unpack(">I", mv[pos : pos + 4])
        pos += 4
        if csize == n:
            out[at : at + n] = mv[pos : pos + n]
        else:  # numcodecs' LZ4 frame: the decoded size (u32 little-endian), then the LZ4 block
            out[at : at + n] = codec.decode(struct.pack("<I", n) + mv[pos : pos + csize])
        pos += csize
        at += n
    return out
