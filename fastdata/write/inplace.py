"""``fastdata.index``: a dataset pointing into existing HDF5, ``.npy`` or Zarr files, no copy (a folder with only
``manifest.json``); each source file is stamped, so one changed later is refused by name."""

from __future__ import annotations

import glob
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import xxhash

from fastdata._version import __version__
from fastdata.errors import DataError, FastdataError, UsageError
from fastdata.format import MANIFEST_NAME, FieldSpec, Manifest, ShardInfo, make_field, read_manifest, write_manifest
from fastdata.format.external import ZARR_META, Column, Index, hdf5_info, native, npy_info, stamp, zarr_info
from fastdata.format.inplace import NAME
from fastdata.format.spec import KEYS_INDEX, KeysInfo, validate
from fastdata.write.options import Progress

DEFAULT_FIELD = "x"  # the field of a single .npy file or Zarr array indexed without --field
_UNIT_BYTES = 4 << 20  # contiguous data: the unit of shuffle=Shards() is about this many bytes


@dataclass
class IndexReport:
    dst: Path
    samples: int
    parts: int
    files: int
    bytes: int  # of the source files
    fields: list[str]

    def summary(self) -> str:
        return (f"{self.samples} samples in {self.files} source file(s), {self.parts} part(s), indexed in place "
                f"at {self.dst} (fields: {', '.join(self.fields)}; no data copied)")


def is_hdf5(path: str | os.PathLike[str]) -> bool:
    """A file that starts with HDF5's signature."""
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(8) == b"\x89HDF\r\n\x1a\n"


def is_zarr(path: str | os.PathLike[str]) -> bool:
    """A Zarr (v2 or v3) array or group store: a folder with Zarr metadata."""
    return os.path.isdir(path) and any(os.path.exists(os.path.join(path, m)) for m in ZARR_META)


def source_format(src: str) -> str:
    """``hdf5``, ``npy`` or ``zarr``: what ``src`` (a path, or the first match of a glob) holds."""
    if is_zarr(src):
        return "zarr"
    if os.path.isdir(src):
        raise UsageError(f"{src}: a folder that is not a Zarr store (no .zarray, .zgroup or zarr.json)")
    if src.lower().endswith(".npy"):
        return "npy"
    if is_hdf5(src):
        return "hdf5"
    raise UsageError(f"{src}: not an HDF5 file, a .npy file or a Zarr store")


def expand(src: str) -> list[str]:
    """The files ``src`` names (absolute): the sorted matches of a glob, or ``src`` itself, which must exist."""
    paths = sorted(glob.glob(src)) if any(c in src for c in "*?[") else [src]
    if not paths or not os.path.exists(paths[0]):
        raise UsageError(f"{src}: no such file" + ("" if paths else " (the pattern matches none)"))
    return [os.path.abspath(p) for p in paths]


def _npy_path(base: str, rel: str) -> str:
    """A field's ``.npy``: ``rel`` as given, else beside the indexed ``.npy``/in the indexed folder."""
    if not rel:
        return base
    if os.path.isabs(rel) or os.path.exists(rel):
        return os.path.abspath(rel)
    return os.path.join(base if os.path.isdir(base) else os.path.dirname(base), rel)


def plan_part(fmt: str, path: str, fields: Mapping[str, str], files: dict[str, int],
               specs: dict[str, FieldSpec]) -> tuple[dict[str, Column], int, int]:
    """Each field's column in one source file (several files for .npy), checked against the others:
    the columns, the samples, and the samples of one shuffle=Shards() unit."""
    cols: dict[str, Column] = {}
    count: int | None = None
    first = ""
    chunk_rows, row_bytes = 0, -1
    for name, array in fields.items():
        fpath = _npy_path(path, array) if fmt == "npy" else path
        where = f"{fpath}: {array}" if array and fmt != "npy" else fpath
        info = npy_info(fpath) if fmt == "npy" else (hdf5_info if fmt == "hdf5" else zarr_info)(fpath, array)
        dtype = native(info.dtype, where)
        spec = make_field(name, dtype, info.shape[1:])
        if name in specs and specs[name] != spec:
            old = specs[name]
            raise DataError(f"{where}: field {name!r} is {spec.np_dtype}{list(spec.shape)} here but "
                            f"{old.np_dtype}{list(old.shape)} in the first file")
        specs[name] = spec
        if count is None:
            count, first = info.shape[0], where
        elif info.shape[0] != count:
            raise DataError(f"{where}: has {info.shape[0]} samples but {first} has {count} (all fields must "
                            "agree on the first axis)")
        fid = files.setdefault(fpath, len(files))
        cols[name] = Column(fid, fmt, "" if fmt == "npy" else array, info.offset, info.chunk_rows)
        if info.chunk_rows is not None and spec.row_nbytes > row_bytes:
            chunk_rows, row_bytes = info.chunk_rows, spec.row_nbytes
    assert count is not None
    if not chunk_rows:
        chunk_rows = max(1, _UNIT_BYTES // max(1, sum(s.row_nbytes for s in specs.values())))
    return cols, count, chunk_rows


def build(src: str, fields: Mapping[str, str] | None = None, *, checksum: bool = False,
          progress: Progress | None = None) -> Manifest:
    """The manifest of an in-place index of ``src`` (see :func:`index`), without writing it; ``progress``
    counts the files read (their metadata, then with ``checksum`` their bytes)."""
    paths = expand(src)
    fmt = source_format(paths[0])
    if fmt != "hdf5" and len(paths) > 1:
        raise UsageError(f"{src}: a pattern may match HDF5 files only (it matched {len(paths)} {fmt} sources)")
    if fields is not None and not (isinstance(fields, Mapping)
                                   and all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items())):
        raise UsageError(f"fields is a dict of field name: path in SRC, e.g. {{'x': '/images', 'label': '/labels'}}, "
                         f"not {fields!r}")
    if not fields:
        if fmt == "hdf5":
            raise UsageError(f"{paths[0]}: name the datasets to read, e.g. --field x=/images --field label=/labels")
        fields = {DEFAULT_FIELD: ""}
    elif fmt == "hdf5" and not all(fields.values()):  # a bare --field NAME: SRC itself, which in HDF5 is no dataset
        name = next(k for k, v in fields.items() if not v)
        raise UsageError(f"{paths[0]}: field {name!r} names no dataset; give its path in the HDF5 file, "
                         f"e.g. --field {name}=/images")
    files: dict[str, int] = {}
    specs: dict[str, FieldSpec] = {}
    parts, shards, units, start = [], [], [], 0
    if progress is not None:
        progress.start(len(paths), 0, desc="indexing", unit="files")
    for i, path in enumerate(paths):
        cols, count, unit = plan_part(fmt, path, fields, files, specs)
        digest = xxhash.xxh3_128(json.dumps({k: c.to_json() for k, c in cols.items()}, sort_keys=True).encode())
        size = sum(os.path.getsize(p) if os.path.isfile(p) else 0 for p, j in files.items()
                   if j in {c.file for c in cols.values()})
        shards.append(ShardInfo(f"part-{i:05d}", start, count, size, f"xxh3_128:{digest.hexdigest()}"))
        parts.append(cols)
        units.append(unit)
        start += count
        if progress is not None:
            progress.update(1, 0)
    arrays = [[c.array for p in parts for c in p.values() if c.file == j] for j in range(len(files))]
    if progress is not None and checksum:
        progress.start(len(files), 0, desc="checksumming", unit="files")
    stamps = []
    for p, j in files.items():
        stamps.append(stamp(p, fmt, arrays[j], checksum))
        if progress is not None and checksum:
            progress.update(1, stamps[-1].size)
    source = {**Index(stamps, parts, units).to_json(), "format": fmt, "created_by": f"fastdata {__version__}"}
    return Manifest(backend=NAME, fields=list(specs.values()), num_samples=start, shards=shards, source=source,
                    keys=KeysInfo(kind=KEYS_INDEX))


def index(src: str | os.PathLike[str], dst: str | os.PathLike[str], fields: Mapping[str, str] | None = None, *,
          checksum: bool = False, overwrite: bool = False, progress: Progress | None = None) -> IndexReport:
    """Index ``src`` in place at the folder ``dst``: ``fastdata.open(dst)`` then reads the source files.

    ``src``: an HDF5 file or glob, a ``.npy`` file, or a Zarr array or group. ``fields``: field -> array
    inside it (``{"x": "/images", "label": "/labels"}``; ``.npy`` files beside ``src``; default: ``src`` as
    ``x``), all agreeing on the first axis. ``checksum``: also record whole-file and per-MiB-block checksums.
    """
    manifest = build(os.fspath(src), fields, checksum=checksum, progress=progress)
    validate(manifest, where=os.fspath(dst))  # a refused field name, before DST is made or an old index removed
    out = Path(dst)
    if out.exists():
        if not out.is_dir():
            raise UsageError(f"{out}: exists and is not a folder")
        if any(out.iterdir()):
            is_index = (out / MANIFEST_NAME).is_file() and _is_index(out)
            if not (overwrite and is_index):
                why = "pass overwrite=True (--overwrite) to replace the index" if is_index else \
                    "choose an empty or new folder (it is not an index fastdata would replace)"
                raise UsageError(f"{out}: not empty; {why}")
            shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    write_manifest(out, manifest)
    nfiles = len(manifest.source["files"])
    return IndexReport(out, manifest.num_samples, len(manifest.shards), nfiles,
                       sum(int(f["size"]) for f in manifest.source["files"]), [f.name for f in manifest.fields])


def _is_index(root: Path) -> bool:
    try:
        return read_manifest(root).backend == NAME and set(os.listdir(root)) == {MANIFEST_NAME}
    except FastdataError:
        return False
