"""Chunks of a local Zarr array chunked along the sample axis, read from their files and decoded with the
GIL released (C order, native, raw or one numcodecs codec); anything else goes through zarr."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastdata.errors import CorruptShardError
from fastdata.format.blocksums import BlockCheck


@dataclass
class ZarrChunks:
    """How to find and decode chunk ``c`` of one Zarr array."""

    root: str  # the array's folder
    keys: list[str]  # chunk c's file, relative to root
    codec: Any  # a numcodecs codec, or None (stored raw)
    chunk_nbytes: int


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


def zarr_chunks(array: Any, local_root: str) -> ZarrChunks | None:
    """The direct-read plan of ``array`` (opened from the local store at ``local_root``), or None."""
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
    return ZarrChunks(root, keys, codec, nbytes)


def read_zarr_chunk(z: ZarrChunks, c: int, out: np.ndarray, where: str, check: BlockCheck | None = None) -> None:
    """Chunk ``c`` into ``out`` (C-contiguous; the last chunk's buffer may be shorter than a chunk).
    ``check``: the chunk file's block digests, checked before its bytes are used."""
    path = os.path.join(z.root, z.keys[c])
    target = out.reshape(-1).view(np.uint8)
    try:
        with open(path, "rb", buffering=0) as f:
            if check is not None and z.codec is None:
                check.all(f.fileno())
            if z.codec is None:
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
        if len(target) == z.chunk_nbytes and z.codec.codec_id in ("zstd", "blosc", "lz4"):
            z.codec.decode(raw, out=target)  # straight into the chunk buffer
            return
        data = np.frombuffer(z.codec.decode(raw), dtype=np.uint8)
    except Exception as e:  # the codec's own error type: name the place instead
        raise CorruptShardError(f"{where}: chunk {c} ({path}): cannot decode ({type(e).__name__}: {e})") from None
    if len(data) < len(target):
        raise CorruptShardError(f"{where}: chunk {c} ({path}) decodes to {len(data)} bytes, expected {z.chunk_nbytes}")
    target[:] = data[: len(target)]
