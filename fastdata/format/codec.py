"""Per-field compression (``--compression lz4|zstd``): each sample of an eligible field is one byte-shuffled
Blosc 1.x buffer (readable by HDF5's Blosc filter), decoded in reader threads straight into the batch."""

from __future__ import annotations

import functools
import struct
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from fastdata.errors import CorruptShardError, UsageError
from fastdata.format.spec import ENCODING_RAW, FieldSpec

BLOSC = "blosc"  # the manifest's name of the codec (spec.FIELD_CODECS)
CNAMES = ("lz4", "zstd")
DEFAULT_LEVEL = {"lz4": 5, "zstd": 3}
MIN_FIELD_BYTES = 4096
HEADER_BYTES = 16  # Blosc 1.x header: version, flags, typesize, then nbytes, blocksize, cbytes (u32 LE)
EXTRA = "fastdata[compress]"


@dataclass(frozen=True)
class Codec:
    """``cname`` (lz4 or zstd) at ``level``, byte shuffle: what ``--compression lz4[:N]|zstd[:N]`` asks for."""

    cname: str
    level: int


def parse(value: str | None) -> Codec | None:
    """``lz4``, ``lz4:N``, ``zstd`` or ``zstd:N`` (N 1-9) -> a Codec; anything else -> None (not a Blosc codec)."""
    if not value:
        return None
    name, sep, level = value.partition(":")
    if name not in CNAMES:
        return None
    if not sep:
        return Codec(name, DEFAULT_LEVEL[name])
    if level.isdigit() and 1 <= int(level) <= 9:
        return Codec(name, int(level))
    raise UsageError(f"--compression {value}: the level of {name} must be 1-9 (e.g. {name}:{DEFAULT_LEVEL[name]})")


def eligible(f: FieldSpec) -> bool:
    """Whether ``--compression lz4|zstd`` compresses field ``f`` (fixed, raw, at least MIN_FIELD_BYTES a sample)."""
    return not f.ragged and f.encoding == ENCODING_RAW and f.row_nbytes >= MIN_FIELD_BYTES


def compress_fields(fields: Sequence[FieldSpec], codec: Codec | None) -> list[FieldSpec]:
    """The schema as written with ``codec``: eligible fields marked compressed."""
    if codec is None:
        return list(fields)
    return [replace(f, compression=BLOSC) if eligible(f) else f for f in fields]


@functools.cache  # imported once, not on every decode
def _blosc() -> Any:
    try:
        from numcodecs import blosc
    except ImportError:
        raise UsageError(f"compressed fields need numcodecs and hdf5plugin: pip install '{EXTRA}'") from None
    return blosc


def require() -> None:
    """Raise a one-line UsageError now if the compression packages are missing."""
    _blosc()
    hdf5_filter(Codec("lz4", 5))


def encode(a: np.ndarray, codec: Codec) -> bytes:
    """One sample as a Blosc buffer (shuffled by the dtype's item size; bit shuffle for 1-byte types)."""
    b = _blosc()
    data = np.ascontiguousarray(a)
    # byte shuffle for multi-byte types, bit shuffle for bytes (images): Blosc's AUTOSHUFFLE
    out: bytes = b.compress(data, codec.cname.encode(), codec.level, b.AUTOSHUFFLE, typesize=data.dtype.itemsize)
    return out


def decode_into(buf: Any, out: np.ndarray, where: str) -> None:
    """Decode one Blosc buffer ``buf`` into ``out`` (a C-contiguous sample row); raises unless its header
    promises exactly ``out.nbytes`` bytes and ``buf`` is whole."""
    view = memoryview(buf).cast("B")
    if len(view) < HEADER_BYTES:
        raise CorruptShardError(f"{where}: compressed sample is {len(view)} bytes, too short for its header")
    nbytes, _, cbytes = struct.unpack_from("<III", view, 4)
    if nbytes != out.nbytes or cbytes != len(view):
        raise CorruptShardError(f"{where}: compressed sample header says {nbytes} bytes in {cbytes}, expected "
                                f"{out.nbytes} in {len(view)}")
    try:
        _blosc().decompress(view, out.reshape(-1).view(np.uint8))
    except (RuntimeError, ValueError) as e:
        raise CorruptShardError(f"{where}: cannot decompress sample ({e})") from None


def decode_rate(sample: np.ndarray, codec: Codec) -> tuple[float, float]:
    """(bytes decoded per second on one core, compression ratio) of ``codec`` on ``sample``, timed in memory."""
    buf = encode(sample, codec)
    out = np.empty_like(np.ascontiguousarray(sample))
    n, t0 = 0, time.perf_counter()
    while (dt := time.perf_counter() - t0) < 0.02:
        decode_into(buf, out, "decode_rate")
        n += 1
    return n * out.nbytes / dt, out.nbytes / len(buf)


def hdf5_filter(codec: Codec) -> Any:
    """The h5py ``compression=`` argument that declares ``codec``'s buffers to HDF5 (hdf5plugin.Blosc)."""
    try:
        import hdf5plugin
    except ImportError:
        raise UsageError(f"compressed fields need numcodecs and hdf5plugin: pip install '{EXTRA}'") from None
    return hdf5plugin.Blosc(cname=codec.cname, clevel=codec.level,  # type: ignore[arg-type]  # one of CNAMES
                            shuffle=hdf5plugin.Blosc.SHUFFLE)
