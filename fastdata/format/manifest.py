"""A dataset folder: its ``manifest.json`` (written last and atomically; parsed with every value checked against hard
limits before anything is allocated or a file outside it touched), the other names a conversion writes there, and the
source suffixes it reads, which tell what a folder without a manifest is, so that its error names the fix that works."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from fastdata.errors import FormatError, IncompleteDatasetError, VersionError
from fastdata.fileio import fsync_dir, write_atomic
from fastdata.format.backends import check_backend, check_counts
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

JOURNAL_NAME = ".fastdata-journal"  # an unfinished conversion: what --resume continues
LOCK_NAME = ".fastdata.lock"  # held by the conversion writing DST
SKIPPED_NAME = "skipped.json"  # the bad samples --skip-bad skipped
_PART = r"part-\d{5,}-of-\d{5,}"
# Every name a conversion may leave in DST; --overwrite deletes only these.
OURS = re.compile(
    r"^(manifest\.json|skipped\.json|keys\.bin|\.keys\.bin\..+\.tmp|\.manifest\..+\.tmp"
    r"|\.?shard-\d{5,}\.(h5|lmdb)(\.partial)?(-lock)?"
    rf"|\.fastdata-journal(-{_PART})?(\.tmp)?|\.fastdata\.lock|\.fastdata-{_PART}\.(json|lock)"
    rf"|\.\.fastdata-{_PART}\.json\..+\.tmp)$"
)
# Temporary names: never part of a finished or resumable conversion.
TEMPORARY = re.compile(
    r"^(\.manifest\..+\.tmp|\.keys\.bin\..+\.tmp|\.shard-\d{5,}\.(h5|lmdb)\.partial(-lock)?|shard-\d{5,}\.lmdb-lock"
    r"|\.fastdata-journal\.tmp)$"
)
# The files of one part of a conversion split with --part I/N: record (.json), journal, lock.
PART_FILE = re.compile(r"^\.fastdata-(?:journal-)?part-(\d{5,})-of-(\d{5,})(?:\.json|\.lock)?$")
PART_RECORD = re.compile(rf"^\.fastdata-{_PART}\.json$")
PART_JOURNAL = re.compile(rf"^\.fastdata-journal-{_PART}$")

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".bmp", ".webp", ".tif", ".tiff", ".gif"})
ARRAY_SUFFIXES = (".npy", ".npz")
TABLE_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
                  ".json": "json"}
LABEL_FILE_SUFFIXES = (".csv", ".json")
# What a source folder holds (samples, tables, label files): a folder of these is no dataset yet.
SOURCE_SUFFIXES = tuple(sorted(set(ARRAY_SUFFIXES) | set(TABLE_SUFFIXES) | set(LABEL_FILE_SUFFIXES) | IMAGE_SUFFIXES))

_LOOK = 2000  # names looked at in sub-folders, at most: enough to tell, cheap on a huge folder


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


def source_compression(source: Any) -> str | None:
    """The ``--compression`` a dataset's shards were written with (``lz4:5``...), from its manifest's ``source``: its
    conversion's, or for a merge the first of its inputs' that names one (a merge keeps each input's source)."""
    c = (source or {}).get("compression")
    if c not in (None, "none"):
        return str(c)
    return next(filter(None, (source_compression(i.get("source")) for i in (source or {}).get("inputs", []))), None)


def shard_path(root: str | os.PathLike[str], info: ShardInfo) -> Path:
    """The shard's path, refusing any that resolves (through symlinks) outside ``root``."""
    root_real = os.path.realpath(root)
    path = os.path.join(root_real, info.file)
    real = os.path.realpath(path)
    if os.path.dirname(real) != root_real:
        raise FormatError(f"{root}: shard {info.file!r} points outside the dataset directory ({real})")
    return Path(real)


def not_a_folder_error(root: Path) -> FormatError:
    """The error for a dataset path that is no folder: missing, a source file, or some other file."""
    if not os.path.lexists(root):
        return FormatError(f"{root}: no such folder (a fastdata dataset is the folder fastdata convert wrote)")
    if root.name.lower().endswith(SOURCE_SUFFIXES):
        return FormatError(f"{root}: a source file, not a fastdata dataset (a dataset is a folder); convert it with "
                           f"`fastdata convert {root} DST`, then open DST")
    return FormatError(f"{root}: not a directory (a fastdata dataset is a directory)")


def no_manifest_error(root: Path | str, names: set[str] | None = None) -> FormatError:
    """The error for the folder ``root`` (or a URL whose ``names`` are listed), which has no manifest: what
    the folder is, and what to do."""
    names = set(os.listdir(root)) if names is None else names
    if JOURNAL_NAME in names:
        return IncompleteDatasetError(
            f"{root}: incomplete dataset: no {MANIFEST_NAME} (the conversion did not finish: run the same "
            "fastdata convert command with --resume to finish it, or with --overwrite to start over)")
    if any(PART_RECORD.match(n) for n in names):
        return IncompleteDatasetError(
            f"{root}: parts of a conversion split with --part I/N, not merged yet (no {MANIFEST_NAME}): once every "
            f"part is done, run fastdata merge-parts {root}")
    if any(PART_JOURNAL.match(n) for n in names):
        return IncompleteDatasetError(
            f"{root}: an unfinished part of a conversion split with --part I/N (no {MANIFEST_NAME}): finish each "
            f"part with its fastdata convert command plus --resume, then run fastdata merge-parts {root}")
    if any(OURS.match(n) for n in names):
        return IncompleteDatasetError(
            f"{root}: incomplete dataset: a conversion started here but left no {MANIFEST_NAME} and no journal to "
            "resume from; convert again with --overwrite")
    if not names:
        return FormatError(f"{root}: an empty folder, not a fastdata dataset (no {MANIFEST_NAME})")
    if _holds_source_files(root, names):
        return FormatError(f"{root}: this is a source folder, not a fastdata dataset (no {MANIFEST_NAME}); convert "
                           f"it with `fastdata convert {root} DST`, then open DST")
    return FormatError(f"{root}: not a fastdata dataset (no {MANIFEST_NAME}); a dataset is the folder that "
                       "fastdata convert wrote")


def _holds_source_files(root: Path | str, names: set[str]) -> bool:
    """Whether ``root`` or one of its sub-folders (class folders; not of a URL) holds .npy, image or table files."""
    if any(n.lower().endswith(SOURCE_SUFFIXES) for n in names):
        return True
    if not isinstance(root, Path):  # a URL: its sub-folders are not looked into
        return False
    looked = 0
    for n in sorted(names):
        try:
            with os.scandir(root / n) as it:
                for e in it:
                    looked += 1
                    if e.name.lower().endswith(SOURCE_SUFFIXES):
                        return True
                    if looked >= _LOOK:
                        return False
        except OSError:  # a file, or a folder we may not read
            continue
    return False


__all__ = ["ARRAY_SUFFIXES", "IMAGE_SUFFIXES", "JOURNAL_NAME", "LABEL_FILE_SUFFIXES", "LOCK_NAME", "OURS", "PART_FILE",
           "PART_JOURNAL", "PART_RECORD", "SKIPPED_NAME", "SOURCE_SUFFIXES", "TABLE_SUFFIXES", "TEMPORARY", "manifest_of",
           "no_manifest_error", "not_a_folder_error", "parse_manifest", "read_manifest", "shard_path", "source_compression",
           "write_manifest"]
