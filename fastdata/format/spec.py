"""The fastdata format's spec: version, names, limits, field and shard types, image rules: what every
writer and reader agrees on (docs/format.md); imports only fastdata's errors."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence, TypeGuard

import numpy as np

from fastdata.errors import FormatError

ENCODING_RAW = "raw"
ENCODING_PIXELS = "pixels"
ENCODING_IMAGE = "image"
ENCODING_UTF8 = "utf8"  # a string field: ragged |u1 bytes, each sample one UTF-8 string (no pickle)
IMAGE_ENCODINGS = (ENCODING_PIXELS, ENCODING_IMAGE)  # ragged bytes that become HWC images on read

LAYOUT = "HWC"
CHANNELS = {"RGB": 3, "L": 1}  # image mode -> channels, in stored order
SHAPE_SUFFIX = "_shape"
CODEC_SUFFIX = "_codec"
SHAPE_DTYPE = "<i8"
CODEC_DTYPE = "|u1"

CODEC_JPEG = 1
CODEC_PNG = 2
CODECS = {CODEC_JPEG: "jpeg", CODEC_PNG: "png"}  # value of <name>_codec -> codec; 0 is never valid


@dataclass(frozen=True)
class ImageSpec:
    """How the pixels of an image field are laid out: ``mode`` ``RGB`` or ``L``, layout ``HWC``."""

    mode: str
    layout: str = LAYOUT

    @property
    def channels(self) -> int:
        return CHANNELS[self.mode]


def companions(f: FieldSpec) -> list[str]:
    """Names of the fields an image field needs to be read (its shape and codec fields)."""
    if f.encoding == ENCODING_IMAGE:
        return [f.name + SHAPE_SUFFIX, f.name + CODEC_SUFFIX]
    if f.encoding == ENCODING_PIXELS:
        return [f.name + SHAPE_SUFFIX]
    return []


def is_image_field(f: FieldSpec) -> bool:
    """Whether a field reads back as uint8 HWC images: an image encoding, an image spec, or a fixed
    uint8 field of shape (H, W, C) with C in 1, 3, 4. The one rule both loader backends use."""
    if f.encoding in IMAGE_ENCODINGS or f.image is not None:
        return True
    return (len(f.shape) == 3 and f.shape[0] is not None and f.dtype == "|u1" and f.shape[-1] in (1, 3, 4))


def image_fields(fields: Sequence[FieldSpec]) -> tuple[str, ...]:
    """Names of the image fields among ``fields`` (see :func:`is_image_field`), in order."""
    return tuple(f.name for f in fields if is_image_field(f))


def check_image_fields(fields: Sequence[FieldSpec]) -> None:
    """Check every image field against the rules above; raise FormatError naming the problem."""
    by_name = {f.name: f for f in fields}
    for f in fields:
        if f.encoding in IMAGE_ENCODINGS:
            if f.image is None:
                raise FormatError(f"field {f.name!r}: encoding {f.encoding!r} needs an 'image' object")
            if f.dtype != "|u1" or list(f.shape) != [None]:
                raise FormatError(f"field {f.name!r}: encoding {f.encoding!r} needs dtype |u1 and shape [null]")
            _need(by_name, f.name + SHAPE_SUFFIX, SHAPE_DTYPE, (3,), f.name)
            if f.encoding == ENCODING_IMAGE:
                _need(by_name, f.name + CODEC_SUFFIX, CODEC_DTYPE, (), f.name)
        elif f.image is not None:
            c = f.image.channels
            if f.encoding != ENCODING_RAW or f.dtype != "|u1" or len(f.shape) != 3 or f.shape[0] is None or f.shape[2] != c:
                raise FormatError(
                    f"field {f.name!r}: a raw image field must be |u1 of fixed shape [H, W, {c}] ({f.image.mode}), "
                    f"not {f.dtype} {list(f.shape)}"
                )


def _need(by_name: dict[str, FieldSpec], name: str, dtype: str, shape: tuple[int, ...], owner: str) -> None:
    g = by_name.get(name)
    if g is None:
        raise FormatError(f"image field {owner!r} needs the field {name!r}")
    if g.dtype != dtype or tuple(g.shape) != shape or g.encoding != ENCODING_RAW or g.image is not None:
        raise FormatError(f"field {name!r} must be raw {dtype} of shape {list(shape)} (it belongs to image field {owner!r})")


FORMAT_NAME = "fastdata"
FORMAT_VERSION = 3  # what a conversion writes (version history: docs/format.md)
ORIGIN_VERSION = 2  # a manifest with a shard ``origin`` (``fastdata merge``) needs a reader of at least this
COMPRESSED_VERSION = 4  # with a compressed field: readers of version 3 refuse it instead of misreading it
READ_VERSION = 4  # the newest manifest version this fastdata reads
FIELD_CODECS = ("blosc",)  # per-field compression codecs (docs/format.md, "Compressed fields")
# Shard checksum algorithms: name -> hex digits. Writers use CHECKSUM_DEFAULT; readers verify any of these.
CHECKSUMS = {"xxh3_128": 32, "sha256": 64}
CHECKSUM_DEFAULT = "xxh3_128"
MANIFEST_NAME = "manifest.json"
ENCODINGS = (ENCODING_RAW, ENCODING_PIXELS, ENCODING_IMAGE, ENCODING_UTF8)  # images: see above
LABEL_FIELD = "label"
KEY_FIELD = "key"  # the name under which get_batch and the loader return sample keys
KEYS_FILE = "keys.bin"  # the side file holding every sample's key (docs/format.md, "Sample keys")
KEYS_INDEX = "index"  # manifest "keys" kind: a sample's key is its index (array sources)
KEYS_KIND_FILE = "file"  # manifest "keys" kind: keys stored in KEYS_FILE
LENGTHS_SUFFIX = "_lengths"
OFFSETS_SUFFIX = "_offsets"  # row offsets of a packed ragged batch (Dataset.get_batch(ragged="packed"))

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
_HEX_RE = re.compile(r"^[0-9a-f]+$")
# Plain numeric dtypes only: no objects, strings, structured or datetime types.
_DTYPE_KINDS = "biufc"


@dataclass(frozen=True)
class FieldSpec:
    """One field of every sample: a numeric array of per-sample ``shape``; a leading ``None`` marks a field
    ragged on its first axis. ``image`` is set on image fields only."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]
    encoding: str = "raw"
    image: ImageSpec | None = None
    compression: str | None = None  # a codec of FIELD_CODECS: each stored sample is compressed

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
        """The manifest's entry: every attribute, ``image`` and ``compression`` only when set."""
        return {k: list(v) if k == "shape" else v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class ShardInfo:
    """One shard file: which samples it holds, its size and its ``"<algorithm>:<hex>"`` checksum. ``origin``:
    the index the file numbers its samples from when not ``start`` (a shard ``fastdata merge`` linked)."""

    file: str
    start: int
    count: int
    bytes: int
    checksum: str
    origin: int | None = None

    @property
    def stored_start(self) -> int:
        """The index of the shard's first sample inside its file (HDF5 attribute, LMDB keys)."""
        return self.start if self.origin is None else self.origin

    @property
    def checksum_algorithm(self) -> str:
        return self.checksum.partition(":")[0]

    def to_json(self, version: int = FORMAT_VERSION) -> dict[str, Any]:
        out: dict[str, Any] = {"file": self.file, "start": self.start, "count": self.count, "bytes": self.bytes}
        if version < 2:  # a version-1 manifest read back (fastdata info --json): its checksums are all SHA-256
            out["sha256"] = self.checksum.partition(":")[2]
        else:
            out["checksum"] = self.checksum
        if self.origin is not None:
            out["origin"] = self.origin
        return out


def parse_checksum(value: Any) -> str | None:
    """``value`` if it is a well-formed ``"<algorithm>:<hex>"`` checksum of a known algorithm, else None."""
    if not isinstance(value, str):
        return None
    algo, _, digest = value.partition(":")
    digits = CHECKSUMS.get(algo)
    if digits is None or len(digest) != digits or not _HEX_RE.match(digest):
        return None
    return value


@dataclass(frozen=True)
class KeysInfo:
    """Where the samples' keys live: ``kind`` ``index`` (the key is the sample index, as a string) or ``file``
    (the side file ``file`` of ``bytes`` bytes and ``checksum``, like shards)."""

    kind: str
    file: str | None = None
    bytes: int = 0
    checksum: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.kind == KEYS_INDEX:
            return {"kind": self.kind}
        return {"kind": self.kind, "file": self.file, "bytes": self.bytes, "checksum": self.checksum}


def is_string(f: FieldSpec) -> bool:
    """A string field: returned by readers as a list of ``str``."""
    return f.encoding == ENCODING_UTF8


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
    keys: KeysInfo | None = None  # None: written before keys existed (format version 1)

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
            "shards": [s.to_json(self.version) for s in self.shards],
            "source": self.source,
            **({"keys": self.keys.to_json()} if self.keys is not None else {}),
        }


def version_for(fields: Sequence[FieldSpec]) -> int:
    """The manifest version a dataset with these fields is written as (see COMPRESSED_VERSION)."""
    return COMPRESSED_VERSION if any(f.compression is not None for f in fields) else FORMAT_VERSION


def make_field(
    name: str, dtype: np.dtype | str, shape: tuple[int | None, ...], encoding: str = "raw", image: ImageSpec | None = None
) -> FieldSpec:
    """Build a validated FieldSpec (what converters call)."""
    spec = FieldSpec(name=name, dtype=np.dtype(dtype).str, shape=tuple(shape), encoding=encoding, image=image)
    _check_field(spec)
    return spec


def validate(m: Manifest, where: str = "manifest") -> None:
    """Check a manifest's internal consistency and limits; raise FormatError naming the problem."""

    def bad(msg: str) -> FormatError:
        return FormatError(f"{where}: {msg}")

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
        if f.compression is not None and m.version < COMPRESSED_VERSION:
            raise bad(f"field {f.name!r} is compressed, which needs format version {COMPRESSED_VERSION} "
                      f"(the manifest says {m.version})")
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
        if s.origin is not None and m.version < ORIGIN_VERSION:
            raise bad(f"shard {s.file!r} has an origin, which needs format version {ORIGIN_VERSION} (the manifest says {m.version})")
    if expected != m.num_samples:
        raise bad(f"shards hold {expected} samples but num_samples is {m.num_samples}")
    if m.classes is not None and len(set(m.classes)) != len(m.classes):
        raise bad("class names are not unique")
    if m.keys is not None:
        k = m.keys
        if k.kind == KEYS_KIND_FILE:
            if k.file != KEYS_FILE or not _is_int(k.bytes) or k.bytes < 0 or parse_checksum(k.checksum) is None:
                raise bad(f"bad keys entry {k.to_json()!r}")
        elif k.kind != KEYS_INDEX:
            raise bad(f"unknown keys kind {k.kind!r} (expected {KEYS_INDEX!r} or {KEYS_KIND_FILE!r})")
        if KEY_FIELD in names:
            raise bad(f"a field is named {KEY_FIELD!r}, the name sample keys are returned under")


def _check_field(f: FieldSpec) -> None:
    if not isinstance(f.name, str) or not _NAME_RE.match(f.name):
        raise FormatError(f"bad field name {f.name!r} (letters, digits, _ . -; not starting with a digit)")
    try:
        dt = np.dtype(f.dtype) if isinstance(f.dtype, str) and len(f.dtype) <= 8 else None
    except (TypeError, ValueError, SyntaxError):  # numpy's parser raises all three (e.g. "0{": SyntaxError)
        dt = None
    if dt is None or dt.kind not in _DTYPE_KINDS or dt.str != f.dtype:
        raise FormatError(f"field {f.name!r}: unsupported dtype {f.dtype!r} (plain numeric dtypes only)")
    if f.encoding not in ENCODINGS:
        raise FormatError(f"field {f.name!r}: unknown encoding {f.encoding!r}")
    if f.encoding == ENCODING_UTF8 and (f.dtype != "|u1" or list(f.shape) != [None] or f.image is not None):
        raise FormatError(f"field {f.name!r}: a utf8 string field needs dtype |u1 and shape [null], no image")
    if f.image is not None and (not isinstance(f.image.mode, str) or f.image.mode not in CHANNELS):
        raise FormatError(f"field {f.name!r}: unknown image mode {f.image.mode!r} (expected RGB or L)")
    if f.image is not None and f.image.layout != LAYOUT:
        raise FormatError(f"field {f.name!r}: unknown image layout {f.image.layout!r} (expected {LAYOUT})")
    if f.compression is not None:
        if f.compression not in FIELD_CODECS:
            raise FormatError(f"field {f.name!r}: unknown compression {f.compression!r} (this fastdata reads "
                              f"{', '.join(FIELD_CODECS)}; upgrade fastdata)")
        if f.encoding != ENCODING_RAW or (len(f.shape) > 0 and f.shape[0] is None):
            raise FormatError(f"field {f.name!r}: only fixed-shape raw fields can be compressed")
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


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)
