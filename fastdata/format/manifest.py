"""The manifest: what a dataset holds and where. Written last, atomically; parsed defensively.

A dataset is a directory with shard files and ``manifest.json``. A directory without a
manifest is an unfinished conversion and is never opened. The manifest is JSON (never
pickle), and every value in it is checked against hard limits before anything is
allocated or any file outside the dataset directory could be touched.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError, IncompleteDatasetError, VersionError
from ..fileio import fsync_dir, write_atomic
from .images import ENCODING_IMAGE, ENCODING_PIXELS, ENCODING_RAW, ImageSpec, check_image_fields, check_image_spec, parse_image_spec

FORMAT_NAME = "fastdata"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
BACKENDS = ("hdf5", "lmdb")
ENCODINGS = (ENCODING_RAW, ENCODING_PIXELS, ENCODING_IMAGE)  # images: see format/images.py
LABEL_FIELD = "label"
LENGTHS_SUFFIX = "_lengths"

# Hard limits: a manifest beyond them is rejected before any allocation.
MAX_MANIFEST_BYTES = 256 << 20
MAX_SAMPLES = 1 << 40
MAX_SAMPLE_BYTES = 1 << 36  # 64 GiB in one sample is surely a hostile or broken manifest
MAX_FIELDS = 256
MAX_DIMS = 32
MAX_SHARDS = 10_000_000
MAX_CLASSES = 10_000_000

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
_FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
# Plain numeric dtypes only: no objects, strings, structured or datetime types.
_DTYPE_KINDS = "biufc"


@dataclass(frozen=True)
class FieldSpec:
    """One field of every sample: a numeric array of fixed shape, or ragged on its first axis.

    ``shape`` is the per-sample shape; a leading ``None`` marks a ragged field whose first
    axis varies from sample to sample (the trailing axes do not). ``image`` is set on image
    fields only (see format/images.py).
    """

    name: str
    dtype: str
    shape: tuple[int | None, ...]
    encoding: str = "raw"
    image: ImageSpec | None = None

    @property
    def ragged(self) -> bool:
        return len(self.shape) > 0 and self.shape[0] is None

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def trailing(self) -> tuple[int, ...]:
        """Shape after the first axis for ragged fields; the whole shape otherwise."""
        return tuple(self.shape[1:]) if self.ragged else tuple(self.shape)  # type: ignore[arg-type]

    @property
    def row_nbytes(self) -> int:
        """Bytes of one row of a ragged field, or of one whole sample of a fixed field."""
        return self.np_dtype.itemsize * math.prod(self.trailing)

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "encoding": self.encoding}
        if self.image is not None:
            out["image"] = self.image.to_json()
        return out


@dataclass(frozen=True)
class ShardInfo:
    """One shard file: which samples it holds, its size and its SHA-256."""

    file: str
    start: int
    count: int
    bytes: int
    sha256: str


@dataclass
class Manifest:
    """Everything a reader needs to know about a dataset; see docs/format.md."""

    backend: str
    fields: list[FieldSpec]
    num_samples: int
    shards: list[ShardInfo]
    classes: list[str] | None = None
    source: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION

    def field(self, name: str) -> FieldSpec:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT_NAME,
            "version": self.version,
            "backend": self.backend,
            "num_samples": self.num_samples,
            "fields": [f.to_json() for f in self.fields],
            "classes": self.classes,
            "shards": [asdict(s) for s in self.shards],
            "source": self.source,
        }


def make_field(
    name: str, dtype: np.dtype | str, shape: tuple[int | None, ...], encoding: str = "raw", image: ImageSpec | None = None
) -> FieldSpec:
    """Build a validated FieldSpec (what converters call)."""
    spec = FieldSpec(name=name, dtype=np.dtype(dtype).str, shape=tuple(shape), encoding=encoding, image=image)
    _check_field(spec)
    return spec


def write_manifest(root: str | os.PathLike[str], manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically (temp file, fsync, rename, fsync the directory)."""
    validate(manifest, where=str(root))
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
        raise FormatError(f"{root}: not a directory (a fastdata dataset is a directory)")
    if not path.is_file():
        raise IncompleteDatasetError(
            f"{root}: incomplete dataset: no {MANIFEST_NAME} (the conversion did not finish: run the "
            "same fastdata convert command with --resume to finish it, or with --overwrite to start over)"
        )
    try:
        size = path.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise FormatError(f"{path}: manifest is {size} bytes, over the {MAX_MANIFEST_BYTES} limit")
        with open(path, "rb") as f:
            obj = json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise FormatError(f"{path}: unreadable manifest: {e}") from None
    return parse_manifest(obj, where=str(path))


def parse_manifest(obj: Any, where: str = "manifest") -> Manifest:
    """Turn parsed JSON into a validated Manifest; any problem raises FormatError."""
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: manifest is not a JSON object")
    if obj.get("format") != FORMAT_NAME:
        raise FormatError(f"{where}: not a fastdata manifest (format={obj.get('format')!r})")
    version = obj.get("version")
    if not _is_int(version) or version < 1:
        raise FormatError(f"{where}: bad format version {version!r}")
    if version > FORMAT_VERSION:
        raise VersionError(
            f"{where}: written by a newer fastdata (format version {version}; this fastdata reads "
            f"up to {FORMAT_VERSION}); upgrade fastdata"
        )
    try:
        fields = [_parse_field(f) for f in _list(obj, "fields", MAX_FIELDS)]
        shards = [_parse_shard(s) for s in _list(obj, "shards", MAX_SHARDS)]
        classes = obj.get("classes")
        if classes is not None:
            if not isinstance(classes, list) or len(classes) > MAX_CLASSES:
                raise FormatError("classes must be a list of strings")
            if not all(isinstance(c, str) for c in classes):
                raise FormatError("classes must be a list of strings")
        source = obj.get("source", {})
        if not isinstance(source, dict):
            raise FormatError("source must be an object")
        manifest = Manifest(
            backend=obj.get("backend"),  # type: ignore[arg-type]
            fields=fields,
            num_samples=obj.get("num_samples"),  # type: ignore[arg-type]
            shards=shards,
            classes=classes,
            source=source,
            version=version,
        )
    except FormatError as e:
        raise FormatError(f"{where}: {e}") from None
    validate(manifest, where=where)
    return manifest


def validate(m: Manifest, where: str = "manifest") -> None:
    """Check a manifest's internal consistency and limits; raise FormatError naming the problem."""

    def bad(msg: str) -> FormatError:
        return FormatError(f"{where}: {msg}")

    if m.backend not in BACKENDS:
        raise bad(f"unknown backend {m.backend!r} (expected one of {', '.join(BACKENDS)})")
    if not _is_int(m.num_samples) or not 0 <= m.num_samples <= MAX_SAMPLES:
        raise bad(f"bad num_samples {m.num_samples!r}")
    if not m.fields:
        raise bad("no fields")
    names = [f.name for f in m.fields]
    if len(set(names)) != len(names):
        raise bad(f"duplicate field names in {names}")
    for f in m.fields:
        try:
            _check_field(f)
        except FormatError as e:
            raise bad(str(e)) from None
        if f.ragged and f.name + LENGTHS_SUFFIX in names:
            raise bad(f"field {f.name + LENGTHS_SUFFIX!r} clashes with the lengths of ragged field {f.name!r}")
    try:
        check_image_fields(m.fields)
    except FormatError as e:
        raise bad(str(e)) from None
    expected = 0
    files = set()
    for s in m.shards:
        if s.start != expected:
            raise bad(f"shard {s.file!r} starts at sample {s.start}, expected {expected}")
        if s.file in files:
            raise bad(f"shard file {s.file!r} listed twice")
        files.add(s.file)
        expected += s.count
    if expected != m.num_samples:
        raise bad(f"shards hold {expected} samples but num_samples is {m.num_samples}")
    if m.classes is not None and len(set(m.classes)) != len(m.classes):
        raise bad("class names are not unique")


def _check_field(f: FieldSpec) -> None:
    if not isinstance(f.name, str) or not _NAME_RE.match(f.name):
        raise FormatError(f"bad field name {f.name!r} (letters, digits, _ . -; not starting with a digit)")
    try:
        dt = np.dtype(f.dtype) if isinstance(f.dtype, str) and len(f.dtype) <= 8 else None
    except TypeError:
        dt = None
    if dt is None or dt.kind not in _DTYPE_KINDS or dt.str != f.dtype:
        raise FormatError(f"field {f.name!r}: unsupported dtype {f.dtype!r} (plain numeric dtypes only)")
    if f.encoding not in ENCODINGS:
        raise FormatError(f"field {f.name!r}: unknown encoding {f.encoding!r}")
    if f.image is not None:
        check_image_spec(f.image, f.name)
    if not isinstance(f.shape, tuple) or len(f.shape) > MAX_DIMS:
        raise FormatError(f"field {f.name!r}: bad shape {f.shape!r}")
    for i, d in enumerate(f.shape):
        if d is None and i == 0:
            continue
        if not _is_int(d) or d < 0:
            raise FormatError(f"field {f.name!r}: bad shape {list(f.shape)!r}")
    nbytes = dt.itemsize * math.prod(d for d in f.shape if d is not None)
    if nbytes > MAX_SAMPLE_BYTES:
        raise FormatError(f"field {f.name!r}: shape {list(f.shape)!r} is absurdly large ({nbytes} bytes per sample)")


def _parse_field(obj: Any) -> FieldSpec:
    if not isinstance(obj, dict):
        raise FormatError("field entry is not an object")
    shape = obj.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise FormatError(f"field {obj.get('name')!r}: bad shape {shape!r}")
    image = obj.get("image")
    spec = FieldSpec(
        name=obj.get("name"),  # type: ignore[arg-type]
        dtype=obj.get("dtype"),  # type: ignore[arg-type]
        shape=tuple(shape),
        encoding=obj.get("encoding", "raw"),
        image=None if image is None else parse_image_spec(image, obj.get("name")),
    )
    _check_field(spec)
    return spec


def _parse_shard(obj: Any) -> ShardInfo:
    if not isinstance(obj, dict):
        raise FormatError("shard entry is not an object")
    name = obj.get("file")
    if not isinstance(name, str) or not _FILE_RE.match(name) or ".." in name:
        raise FormatError(f"bad shard file name {name!r} (must be a plain file name inside the dataset directory)")
    for key in ("start", "count", "bytes"):
        v = obj.get(key)
        if not _is_int(v) or not 0 <= v <= (1 << 50):
            raise FormatError(f"shard {name!r}: bad {key} {v!r}")
    sha = obj.get("sha256")
    if not isinstance(sha, str) or not _SHA_RE.match(sha):
        raise FormatError(f"shard {name!r}: bad sha256 {sha!r}")
    return ShardInfo(file=name, start=obj["start"], count=obj["count"], bytes=obj["bytes"], sha256=sha)


def _list(obj: dict[str, Any], key: str, limit: int) -> list[Any]:
    v = obj.get(key)
    if not isinstance(v, list):
        raise FormatError(f"{key} must be a list")
    if len(v) > limit:
        raise FormatError(f"{key} has {len(v)} entries, over the limit of {limit}")
    return v


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def shard_path(root: str | os.PathLike[str], info: ShardInfo) -> Path:
    """The shard's path, refusing any that resolves (through symlinks) outside ``root``."""
    root_real = os.path.realpath(root)
    path = os.path.join(root_real, info.file)
    real = os.path.realpath(path)
    if os.path.dirname(real) != root_real:
        raise FormatError(f"{root}: shard {info.file!r} points outside the dataset directory ({real})")
    return Path(real)
