"""The fastdata on-disk format (docs/format.md): manifest + shards, one module per storage backend
(interface.py: ``Backend``, ``ShardReader``, ``ShardWriter``), registered in backends.py."""

from __future__ import annotations

from fastdata.format import hdf5, lmdb, spec
from fastdata.format.backends import backend, shard_file_name
from fastdata.format.manifest import read_manifest, shard_path, write_manifest
from fastdata.format.spec import (
    FORMAT_VERSION,
    IMAGE_ENCODINGS,
    LABEL_FIELD,
    LENGTHS_SUFFIX,
    MANIFEST_NAME,
    ORIGIN_VERSION,
    FieldSpec,
    ImageSpec,
    Manifest,
    ShardInfo,
    make_field,
)

__all__ = [
    "FORMAT_VERSION",
    "FieldSpec",
    "IMAGE_ENCODINGS",
    "ImageSpec",
    "LABEL_FIELD",
    "LENGTHS_SUFFIX",
    "MANIFEST_NAME",
    "Manifest",
    "ORIGIN_VERSION",
    "ShardInfo",
    "backend",
    "hdf5",
    "lmdb",
    "make_field",
    "read_manifest",
    "shard_file_name",
    "shard_path",
    "spec",
    "write_manifest",
]
