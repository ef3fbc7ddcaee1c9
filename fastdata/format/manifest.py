"""The manifest (``manifest.json``): written last and atomically; parsed as JSON, every value checked
against hard limits before anything is allocated or a file outside the dataset could be touched."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fastdata.errors import FormatError, VersionError
from fastdata.fileio import fsync_dir, write_atomic
from fastdata.format.backends import check_backend, check_counts
from fastdata.format.files import no_manifest_error, not_a_folder_error
from fastdata.format.spec import (
    _FILE_RE,
    CHECKSUMS,
    FORMAT_NAME,
    MANIFEST_NAME,
    MAX_CLASSES,
    MAX_DIMS,
    MAX_FIELDS,
    MAX_MANIFEST_BYTES,
    MAX_SHARDS,
    READ_VERSION,
    FieldSpec,
    ImageSpec,
    KeysInfo,
    Manifest,
    ShardInfo,
    _check_field,
    _is_int,
    parse_checksum,
    validate,
)


def _validate(m: Manifest, where: str) -> None:
    """The format's rules (spec.validate), with the backend checked against the registry first."""
    check_backend(m.backend, where)
    validate(m, where=where)
    check_counts(m, where)


def write_manifest(root: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically (temp file, fsync, rename, fsync the directory)."""
    _validate(manifest, where=str(root))
    root = Path(root)
    text = json.dumps(manifest.to_json(), indent=1, sort_keys=False) + "\n"
    write_atomic(root / MANIFEST_NAME, lambda f: f.write(text.encode("utf-8")))
    fsync_dir(root)
    return root / MANIFEST_NAME


def read_manifest(root: str | os.PathLike[str]) -> Manifest:
    """Read and validate the manifest of the dataset at ``root``."""
    root = Path(root)
    path = root / MANIFEST_NAME
    if not root.is_dir():
        raise not_a_folder_error(root)  # missing, or a file: a source file says how to convert it
    if not path.is_file():
        raise no_manifest_error(root)  # what the folder is instead, and the fix that works
    try:
        size = path.stat().st_size
        data = path.read_bytes() if size <= MAX_MANIFEST_BYTES else bytes(0)
    except OSError as e:
        raise FormatError(f"{path}: unreadable manifest: {e}") from None
    return manifest_of(data, str(path), size)


def manifest_of(data: bytes, where: str, size: int | None = None) -> Manifest:
    """The validated manifest in ``data``, the bytes of a ``manifest.json`` of ``size`` bytes (default: all of them)."""
    size = len(data) if size is None else size
    if size > MAX_MANIFEST_BYTES:
        raise FormatError(f"{where}: manifest is {size} bytes, over the {MAX_MANIFEST_BYTES} limit")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise FormatError(f"{where}: unreadable manifest: {e}") from None
    return parse_manifest(obj, where=where)


def parse_manifest(obj: Any, where: str = "manifest") -> Manifest:
    """Turn parsed JSON into a validated Manifest; any problem raises FormatError."""
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: manifest is not a JSON object")
    if obj.get("format") != FORMAT_NAME:
        raise FormatError(f"{where}: not a fastdata manifest (format={obj.get('format')!r})")
    version = obj.get("version")
    if not _is_int(version) or version < 1:
        raise FormatError(f"{where}: bad format version {version!r}")
    if version > READ_VERSION:
        raise VersionError(
            f"{where}: written by a newer fastdata (format version {version}; this fastdata reads "
            f"up to {READ_VERSION}); upgrade fastdata"
        )
    try:
        fields = [_parse_field(f) for f in _list(obj, "fields", MAX_FIELDS)]
        shards = [_parse_shard(s, version) for s in _list(obj, "shards", MAX_SHARDS)]
        classes = obj.get("classes")
        if classes is not None and (not isinstance(classes, list) or len(classes) > MAX_CLASSES
                                    or not all(isinstance(c, str) for c in classes)):
            raise FormatError("classes must be a list of strings")
        source = obj.get("source", {})
        if not isinstance(source, dict):
            raise FormatError("source must be an object")
        keys = _parse_keys(obj["keys"]) if "keys" in obj else None
        manifest = Manifest(
            backend=obj.get("backend"),  # type: ignore[arg-type]
            fields=fields,
            num_samples=obj.get("num_samples"),  # type: ignore[arg-type]
            shards=shards,
            classes=classes,
            source=source,
            version=version,
            keys=keys,
        )
    except FormatError as e:
        raise FormatError(f"{where}: {e}") from None
    _validate(manifest, where=where)
    return manifest


def _parse_field(obj: Any) -> FieldSpec:
    if not isinstance(obj, dict):
        raise FormatError("field entry is not an object")
    shape = obj.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise FormatError(f"field {obj.get('name')!r}: bad shape {shape!r}")
    image = obj.get("image")  # unknown extra keys in it are ignored (forward compatible)
    if image is not None and not isinstance(image, dict):
        raise FormatError(f"field {obj.get('name')!r}: 'image' must be an object")
    spec = FieldSpec(
        name=obj.get("name"),  # type: ignore[arg-type]
        dtype=obj.get("dtype"),  # type: ignore[arg-type]
        shape=tuple(shape),
        encoding=obj.get("encoding", "raw"),
        image=None if image is None else ImageSpec(image.get("mode"), image.get("layout")),  # type: ignore[arg-type]
        compression=obj.get("compression"),
    )
    _check_field(spec)
    return spec


def _parse_keys(obj: Any) -> KeysInfo:
    if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
        raise FormatError("keys must be an object with a kind")
    return KeysInfo(kind=obj["kind"], file=obj.get("file"), bytes=obj.get("bytes", 0), checksum=obj.get("checksum"))


def _parse_shard(obj: Any, version: int) -> ShardInfo:
    if not isinstance(obj, dict):
        raise FormatError("shard entry is not an object")
    name = obj.get("file")
    if not isinstance(name, str) or not _FILE_RE.match(name) or ".." in name:
        raise FormatError(f"bad shard file name {name!r} (must be a plain file name inside the dataset directory)")
    for key in ("start", "count", "bytes"):
        v = obj.get(key)
        if not _is_int(v) or not 0 <= v <= (1 << 50):
            raise FormatError(f"shard {name!r}: bad {key} {v!r}")
    raw = f"sha256:{obj.get('sha256')}" if version < 2 else obj.get("checksum")  # version 1: "sha256": "<hex>"
    checksum = parse_checksum(raw)
    if checksum is None:
        raise FormatError(f"shard {name!r}: bad checksum {raw!r} (expected '<algorithm>:<hex>', algorithm one of "
                          f"{', '.join(CHECKSUMS)})")
    origin = obj.get("origin")
    if origin is not None and (not _is_int(origin) or not 0 <= origin <= (1 << 50)):
        raise FormatError(f"shard {name!r}: bad origin {origin!r}")
    return ShardInfo(file=name, start=obj["start"], count=obj["count"], bytes=obj["bytes"], checksum=checksum,
                     origin=origin)


def _list(obj: dict[str, Any], key: str, limit: int) -> list[Any]:
    v = obj.get(key)
    if not isinstance(v, list):
        raise FormatError(f"{key} must be a list")
    if len(v) > limit:
        raise FormatError(f"{key} has {len(v)} entries, over the limit of {limit}")
    return v


def shard_path(root: str | os.PathLike[str], info: ShardInfo) -> Path:
    """The shard's path, refusing any that resolves (through symlinks) outside ``root``."""
    root_real = os.path.realpath(root)
    path = os.path.join(root_real, info.file)
    real = os.path.realpath(path)
    if os.path.dirname(real) != root_real:
        raise FormatError(f"{root}: shard {info.file!r} points outside the dataset directory ({real})")
    return Path(real)
