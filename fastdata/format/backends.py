"""The one registry of shard backends: manifest ``backend`` value -> the module that reads and writes it
(mypy checks each against :class:`fastdata.format.interface.Backend`)."""

from __future__ import annotations

from fastdata.errors import FormatError, UsageError
from fastdata.format import hdf5, lmdb
from fastdata.format.interface import Backend
from fastdata.format.spec import Manifest

REGISTRY: dict[str, Backend] = {"hdf5": hdf5, "lmdb": lmdb}  # the shard files a conversion writes
INDEX = "inplace"  # a fastdata index: rows of existing files (format/inplace.py, read through InPlaceShards)
BACKENDS = (*REGISTRY, INDEX)  # the values a manifest's "backend" may hold


def backend(name: str) -> Backend:
    """The module implementing a storage backend (``hdf5`` or ``lmdb``)."""
    if name == INDEX:
        raise UsageError("backend 'inplace' is an index of existing files written by fastdata index "
                         "(docs/in-place.md): it is opened from its local folder, never converted into, merged "
                         "or read from a URL; convert with backend 'hdf5' or 'lmdb' for those")
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r} (expected one of {', '.join(REGISTRY)})") from None


def check_backend(name: str, where: str) -> None:
    """FormatError unless a manifest's ``backend`` names a registered backend."""
    if name not in BACKENDS:  # a tuple: an unhashable value from a bad manifest is just not there
        raise FormatError(f"{where}: unknown backend {name!r} (expected one of {', '.join(BACKENDS)})")


def check_counts(m: Manifest, where: str) -> None:
    """Each shard's count must fit in its bytes (the fewest its backend can store a sample in): a hostile
    count (2^40 samples in a few KiB) is refused before a loader allocates an index array from it."""
    floor = REGISTRY[m.backend].ShardWriter.min_sample_bytes(m.fields) if m.backend in REGISTRY else 0  # an index: no bound
    for s in m.shards:
        if floor > 0 and s.count * floor > s.bytes:
            raise FormatError(f"{where}: shard {s.file!r} claims {s.count} samples, more than its {s.bytes} bytes "
                              f"can hold (a {m.backend} sample takes at least {floor:.3g} bytes)")


def shard_file_name(index: int, backend_name: str) -> str:
    return f"shard-{index:05d}{backend(backend_name).EXTENSION}"


__all__ = ["BACKENDS", "INDEX", "REGISTRY", "backend", "check_backend", "check_counts", "shard_file_name"]
