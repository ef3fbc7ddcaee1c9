"""The fastdata on-disk format: manifest + shards. Writers and readers both import it from here.

Each storage backend is one module with the same small interface (``EXTENSION``,
``ShardWriter``, ``ShardReader``, ``parse_compression``), picked by the manifest's
``backend`` value. Normative description: docs/format.md.
"""

from __future__ import annotations

from types import ModuleType

from . import hdf5, inplace, lmdb, spec
from .manifest import read_manifest, shard_path, write_manifest
from .spec import (
    BACKENDS,
    FORMAT_VERSION,
    IMAGE_ENCODINGS,
    LABEL_FIELD,
    LENGTHS_SUFFIX,
    MANIFEST_NAME,
    ORIGIN_VERSION,
    READ_VERSION,
    FieldSpec,
    ImageSpec,
    Manifest,
    ShardInfo,
    make_field,
)

_REGISTRY: dict[str, ModuleType] = {"hdf5": hdf5, "lmdb": lmdb, "inplace": inplace}


def backend(name: str) -> ModuleType:
    """The module implementing a storage backend (``hdf5`` or ``lmdb``)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r} (expected one of {', '.join(BACKENDS)})") from None


def shard_file_name(index: int, backend_name: str) -> str:
    return f"shard-{index:05d}{backend(backend_name).EXTENSION}"


__all__ = [
    "BACKENDS",
    "FORMAT_VERSION",
    "ORIGIN_VERSION",
    "READ_VERSION",
    "IMAGE_ENCODINGS",
    "LABEL_FIELD",
    "LENGTHS_SUFFIX",
    "MANIFEST_NAME",
    "FieldSpec",
    "ImageSpec",
    "Manifest",
    "ShardInfo",
    "backend",
    "make_field",
    "read_manifest",
    "shard_file_name",
    "shard_path",
    "spec",
    "write_manifest",
]
