"""The files an in-place index points into: what an array inside one looks like (HDF5 dataset, ``.npy`` file,
Zarr array; errors name the file and the array), and the stamps that prove each unchanged since indexing
(size, time, metadata, sampled blocks; with ``--checksum`` every byte, and one ``xxh3_64`` per ``BLOCK``
bytes, each checked the first time a process reads bytes in it); a change is a CorruptShardError."""

from __future__ import annotations

import base64
import json
import os
import threading
from dataclasses import asdict, dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from fastdata.errors import CorruptShardError, DataError
from fastdata.fileio import read_blocks

KIND = "index"  # manifest source "kind" of an in-place index
FORMATS = ("hdf5", "npy", "zarr")
ZARR_META = (".zarray", ".zattrs", ".zgroup", ".zmetadata", "zarr.json")
SAMPLE_BLOCK = 4096
SAMPLE_BLOCKS = 64  # per file: 256 KiB read at each open (sample_checksum)
BLOCK = 1 << 20  # bytes a block: reads touching a block not checked yet read it whole, once per process
_HINT = "; run fastdata index again (or convert the data)"  # what every changed-file error ends with


@dataclass(frozen=True)
class Stamp:
    """What a source file (or Zarr store directory) was when it was indexed."""

    path: str
    size: int
    mtime_ns: int
    meta: str  # "xxh3_128:<hex>" of its metadata (see the module docstring)
    checksum: str | None = None  # "xxh3_128:<hex>" of its whole content, with --checksum
    sample: str | None = None  # "xxh3_128:<hex>" of blocks sampled across its content (sample_checksum)
    blocks: dict[str, Any] | None = None  # with --checksum: {"size": bytes, "xxh3_64": {file: digests}} (BlockCheck)

    def to_json(self) -> dict[str, Any]:
        return _set(self)


@dataclass(frozen=True)
class Column:
    """Where one field of one part lies: stamp ``file``, the array inside it ("" for .npy), and contiguous
    data at byte ``offset`` or chunks of ``chunk_rows`` samples."""

    file: int
    format: str
    array: str = ""
    offset: int | None = None
    chunk_rows: int | None = None

    def to_json(self) -> dict[str, Any]:
        return _set(self)


@dataclass(frozen=True)
class Index:
    """The manifest ``source`` of an in-place index: the files, and per part (shard) each field's column."""

    files: list[Stamp]
    parts: list[dict[str, Column]]
    unit_rows: list[int]  # per part: the samples of one unit of shuffle=Shards()

    def to_json(self) -> dict[str, Any]:
        return {"kind": KIND, "files": [s.to_json() for s in self.files],
                "parts": [{k: c.to_json() for k, c in p.items()} for p in self.parts], "unit_rows": self.unit_rows}


def parse_index(source: dict[str, Any], where: str) -> Index:
    """The index description of a manifest's ``source``; FormatError-like CorruptShardError if malformed."""
    try:
        files = [Stamp(str(f["path"]), int(f["size"]), int(f["mtime_ns"]), str(f["meta"]), f.get("checksum"),
                       f.get("sample"), f.get("blocks")) for f in source["files"]]
        parts = [{k: Column(int(c["file"]), str(c["format"]), str(c.get("array", "")), _opt_int(c.get("offset")),
                            _opt_int(c.get("chunk_rows"))) for k, c in p.items()} for p in source["parts"]]
        units = [int(u) for u in source["unit_rows"]]
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CorruptShardError(f"{where}: malformed in-place index description ({type(e).__name__}: {e})") from None
    for p in parts:
        for name, c in p.items():
            if not 0 <= c.file < len(files) or c.format not in FORMATS or (c.offset is None) == (c.chunk_rows is None):
                raise CorruptShardError(f"{where}: bad column of field {name!r} in the in-place index")
    if len(units) != len(parts) or any(u < 1 for u in units):
        raise CorruptShardError(f"{where}: bad unit_rows in the in-place index")
    return Index(files, parts, units)


def _set(entry: Any) -> dict[str, Any]:
    """A dataclass's fields that are set (not None), as the manifest keeps them."""
    return {k: v for k, v in asdict(entry).items() if v is not None}


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


# --- stamps -------------------------------------------------------------------------------


def _tree(path: str) -> list[tuple[str, os.stat_result]]:
    """Every file under a directory (a Zarr store), with its stat, in a stable order."""
    out = []
    for dirpath, dirs, names in os.walk(path):
        dirs.sort()
        for n in sorted(names):
            p = os.path.join(dirpath, n)
            out.append((os.path.relpath(p, path), os.stat(p)))
    return out


def size_mtime(path: str) -> tuple[int, int]:
    """Bytes and modification time (ns) of a file, or the total and latest of a directory's files."""
    if os.path.isdir(path):
        tree = _tree(path)
        return sum(s.st_size for _, s in tree), max((s.st_mtime_ns for _, s in tree), default=0)
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def meta_checksum(path: str, fmt: str, arrays: list[str]) -> str:
    """The checksum of the metadata of ``path`` that the index relies on."""
    h = xxhash.xxh3_128()
    if fmt == "hdf5":
        h.update(json.dumps(describe(path, sorted(set(arrays))), sort_keys=True).encode())
    elif fmt == "npy":
        h.update(json.dumps(npy_layout(path)[1:], sort_keys=True).encode())
    else:
        for rel, st in _tree(path):
            h.update(f"{rel}\0{st.st_size}\0".encode())
            if os.path.basename(rel) in ZARR_META:
                h.update(Path(path, rel).read_bytes())
    return f"xxh3_128:{h.hexdigest()}"


def _files(path: str) -> list[tuple[str, str, int]]:
    """The files of a file or a directory (a Zarr store): (name inside it, path, blocks sampled of it)."""
    if os.path.isdir(path):
        return [(rel, os.path.join(path, rel), 4) for rel, _ in _tree(path)]
    return [("", path, SAMPLE_BLOCKS)]


def _sampled(size: int, blocks: int) -> list[int]:
    """Where the ``blocks`` blocks sampled of ``size`` bytes start: spread evenly, first and last included."""
    return sorted({int(o) for o in np.linspace(0, max(0, size - SAMPLE_BLOCK), min(blocks, -(-size // SAMPLE_BLOCK)))})


def sample_checksum(path: str) -> str:
    """``xxh3_128`` of each file's name and its sampled blocks: cheap enough for every open, it sees files
    replaced and chunks swapped (small edits between blocks need ``--checksum``)."""
    h = xxhash.xxh3_128()
    for rel, p, blocks in _files(path):
        h.update(rel.encode() + b"\0")
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        try:
            for off in _sampled(os.fstat(fd).st_size, blocks):
                h.update(os.pread(fd, SAMPLE_BLOCK, off))
        finally:
            os.close(fd)
    return f"xxh3_128:{h.hexdigest()}"


def content_checksums(path: str) -> tuple[str, str, dict[str, str]]:
    """One pass over every byte of a file (or each file of a directory): its ``xxh3_128``, its
    :func:`sample_checksum` and its block digests."""
    full, sample = xxhash.xxh3_128(), xxhash.xxh3_128()
    blocks: dict[str, str] = {}
    for rel, p, n in _files(path):
        full.update(rel.encode() + b"\0")
        sample.update(rel.encode() + b"\0")
        starts = _sampled(os.path.getsize(p), n)
        pieces = {o: bytearray() for o in starts}
        sums: list[int] = []
        pos = 0
        for data in read_blocks(p):  # HASH_BLOCK is a multiple of BLOCK: blocks are whole
            full.update(data)
            sums += digests(data)
            for o in starts:
                if o < pos + len(data) and o + SAMPLE_BLOCK > pos:  # (a sampled block may span two reads)
                    pieces[o] += data[max(0, o - pos) : o + SAMPLE_BLOCK - pos]
            pos += len(data)
        for o in starts:
            sample.update(pieces[o])
        blocks[rel] = manifest_text(sums)
    return f"xxh3_128:{full.hexdigest()}", f"xxh3_128:{sample.hexdigest()}", blocks


def stamp(path: str, fmt: str, arrays: list[str], full: bool) -> Stamp:
    """What ``path`` is now; ``full``: with its full checksum and block digests (``--checksum``), read once."""
    size, mtime = size_mtime(path)
    if not full:
        return Stamp(path, size, mtime, meta_checksum(path, fmt, arrays), None, sample_checksum(path))
    whole, sample, blocks = content_checksums(path)
    return Stamp(path, size, mtime, meta_checksum(path, fmt, arrays), whole, sample,
                 {"size": BLOCK, "xxh3_64": blocks})


def check_file(s: Stamp, fmt: str, arrays: list[str], meta: bool = False, content: bool = False) -> str | None:
    """What changed in one source file since it was indexed (one line naming it), or None: size and time;
    with ``meta`` its metadata checksum; with ``content`` its full checksum (when recorded)."""
    if not os.path.exists(s.path):
        return f"{s.path}: source file of this index is missing{_HINT}"
    try:
        size, mtime = size_mtime(s.path)
    except OSError as e:
        return f"{s.path}: cannot read source file ({e.strerror}){_HINT}"
    if size != s.size:
        return f"{s.path}: changed since it was indexed ({size} bytes, the index says {s.size}){_HINT}"
    if mtime != s.mtime_ns:
        return f"{s.path}: changed since it was indexed (modified at another time than recorded){_HINT}"
    try:
        if meta and meta_checksum(s.path, fmt, arrays) != s.meta:
            return f"{s.path}: changed since it was indexed (its metadata differs){_HINT}"
        if content and s.checksum is not None and content_checksums(s.path)[0] != s.checksum:
            return f"{s.path}: changed since it was indexed (its content checksum differs){_HINT}"
        if meta and s.sample is not None and sample_checksum(s.path) != s.sample:
            return (f"{s.path}: changed since it was indexed (the blocks sampled across its content differ: "
                    f"edited, replaced or chunks swapped, its size and time kept){_HINT}")
    except (OSError, DataError) as e:
        return f"{s.path}: cannot read source file ({e}){_HINT}"
    return None


def file_problems(index: Index, content: bool = False) -> list[str]:
    """What changed in the index's source files (:func:`check_file` with ``meta``), one line each."""
    arrays: list[tuple[str, list[str]]] = [("", []) for _ in index.files]  # per file: its format, arrays read
    for p in index.parts:
        for c in p.values():
            arrays[c.file] = (c.format, arrays[c.file][1] + [c.array])
    found = [check_file(s, fmt, names, meta=True, content=content) for s, (fmt, names) in zip(index.files, arrays)]
    return [p for p in found if p is not None]


def digests(data: Any, block: int = BLOCK) -> list[int]:
    """``xxh3_64`` of each ``block`` bytes of ``data`` (the last one may be short)."""
    view = memoryview(data).cast("B")
    return [xxhash.xxh3_64_intdigest(view[i : i + block]) for i in range(0, len(view), block)]


def manifest_text(sums: list[int]) -> str:
    """Digests as the manifest keeps them: base64 of little-endian uint64s."""
    return base64.b64encode(np.asarray(sums, dtype="<u8").tobytes()).decode()


@dataclass
class BlockCheck:
    """The recorded block digests of one file, and which of its blocks this process has checked."""

    path: str
    sums: np.ndarray  # uint64, one per block
    block: int = BLOCK
    ok: np.ndarray = field(init=False)
    left: int = field(init=False)  # blocks not checked yet: once 0, reads cost one comparison
    lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.ok = np.zeros(len(self.sums), dtype=bool)
        self.left = len(self.sums)

    def done(self) -> bool:
        return self.left == 0

    def rows(self, fd: int, base: int, rows: np.ndarray, nbytes: int) -> None:
        """Check the blocks holding rows ``rows`` of ``nbytes`` bytes each from byte ``base`` of the file."""
        if nbytes <= 0 or len(rows) == 0 or self.done():
            return
        starts = base + rows.astype(np.int64) * nbytes
        if nbytes <= self.block:  # a row touches at most two blocks
            ids = np.unique(np.concatenate((starts // self.block, (starts + nbytes - 1) // self.block)))
        else:
            ids = np.unique(np.concatenate([np.arange(s // self.block, (s + nbytes - 1) // self.block + 1)
                                            for s in starts.tolist()]))
        self.blocks(fd, ids)

    def span(self, fd: int, start: int, end: int, data: Any = None) -> None:
        """Check the blocks holding bytes ``start..end-1``; ``data``, if given, is those bytes (blocks wholly
        inside it are hashed from it, the others read from ``fd``)."""
        if end <= start or self.done():
            return
        ids = np.arange(start // self.block, (end - 1) // self.block + 1)
        ids = ids[(ids < len(self.sums)) & ~self.ok[np.minimum(ids, len(self.sums) - 1)]]
        if data is None:
            self.blocks(fd, ids)
            return
        view = memoryview(data).cast("B")
        for b in ids.tolist():
            b0, b1 = b * self.block, (b + 1) * self.block
            if b0 >= start and b1 <= end:
                self._compare(b, view[b0 - start : b1 - start])
            else:
                self.blocks(fd, np.array([b]))

    def whole(self, data: Any) -> None:
        """Check every block against ``data``, the file's whole content."""
        if self.done():
            return
        got = digests(data, self.block)
        if len(got) != len(self.sums):
            raise CorruptShardError(f"{self.path}: holds {len(memoryview(data).cast('B'))} bytes, not the "
                                    f"{len(self.sums)} block(s) it had when indexed{_HINT}")
        for b, d in enumerate(got):
            if not self.ok[b]:
                self._compare(b, None, d)

    def all(self, fd: int) -> None:
        """Check every block not checked yet, reading it from ``fd``."""
        if not self.done():
            self.blocks(fd, np.flatnonzero(~self.ok))

    def blocks(self, fd: int, ids: np.ndarray) -> None:
        for b in ids.tolist():
            if b < len(self.sums) and not self.ok[b]:
                self._compare(b, os.pread(fd, self.block, b * self.block))

    def _compare(self, b: int, data: Any, digest: int | None = None) -> None:
        if digest is None:
            digest = xxhash.xxh3_64_intdigest(data)
        if digest != int(self.sums[b]):
            raise CorruptShardError(f"{self.path}: block {b} (bytes {b * self.block}..{(b + 1) * self.block - 1}) "
                                    f"differs from its checksum taken at index time (edited in place){_HINT}")
        with self.lock:  # reader threads may check the same block at once: count it once
            if not self.ok[b]:
                self.ok[b] = True
                self.left -= 1


def checks(blocks: dict[str, Any] | None, path: str, where: str) -> dict[str, BlockCheck] | None:
    """A fresh BlockCheck for each file of a stamp's ``blocks`` (keyed by path relative to the Zarr store,
    "" for a plain file), or None when the index recorded none."""
    if blocks is None:
        return None
    try:
        size = int(blocks["size"])
        out = {}
        for rel, text in dict(blocks["xxh3_64"]).items():
            sums = np.frombuffer(base64.b64decode(text, validate=True), dtype="<u8").astype(np.uint64)
            out[rel] = BlockCheck(os.path.join(path, rel) if rel else path, sums, size)
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptShardError(f"{where}: malformed block checksums in the in-place index ({e})") from None
    if size < 1:
        raise CorruptShardError(f"{where}: malformed block checksums in the in-place index (block size {size})")
    return out


def check_files(found: dict[str, BlockCheck], prefix: str = "") -> None:
    """Check every block of every file (whose relative path starts with ``prefix``), reading it whole."""
    for rel, check in found.items():
        if rel.startswith(prefix) and not check.done():
            try:
                fd = os.open(check.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                raise CorruptShardError(f"{check.path}: cannot read ({e.strerror}){_HINT}") from None
            try:
                check.all(fd)
            finally:
                os.close(fd)


def native(dtype: np.dtype, where: str) -> np.dtype:
    """``dtype`` if the index can hand it out as it is stored (plain numeric, native byte order)."""
    if dtype.kind not in "biufc" or dtype.fields is not None:
        raise DataError(f"{where}: holds {dtype}, not a plain numeric type; convert it instead (fastdata convert)")
    if not dtype.isnative and dtype.byteorder != "|":
        raise DataError(f"{where}: stored in non-native byte order ({dtype.str}); convert it instead (fastdata convert)")
    return dtype


# --- the arrays inside them -------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayInfo:
    """One array: its dtype and full shape (samples first), contiguous data at byte ``offset``,
    or chunks of ``chunk_rows`` samples (Zarr, chunked or compressed HDF5)."""

    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int | None = None
    chunk_rows: int | None = None


def _h5(path: str) -> Any:
    try:
        return h5_file(path)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable HDF5 file ({e})") from None


def h5_file(path: str, **kw: Any) -> Any:
    """``h5py.File(path, "r", **kw)``, with hdf5plugin's filters (LZ4, Zstd, Blosc, ...) where installed."""
    import h5py

    if find_spec("hdf5plugin") is not None:
        import hdf5plugin  # noqa: F401  (registers its filters)
    return h5py.File(path, "r", **kw)


def _dataset(f: Any, path: str, name: str) -> Any:
    import h5py

    obj = f.get(name)
    if obj is None:
        known = []
        f.visititems(lambda k, v: known.append("/" + k) if isinstance(v, h5py.Dataset) else None)
        raise DataError(f"{path}: no dataset {name!r} (datasets: {', '.join(known[:10]) or 'none'})")
    if not isinstance(obj, h5py.Dataset):
        raise DataError(f"{path}: {name!r} is a group, not a dataset")
    return obj


def hdf5_info(path: str, name: str) -> ArrayInfo:
    """How dataset ``name`` of HDF5 file ``path`` is stored."""
    import h5py

    with _h5(path) as f:
        d = _dataset(f, path, name)
        if d.ndim == 0:
            raise DataError(f"{path}: dataset {name!r} is a scalar: it has no sample axis")
        if d.chunks is None:  # contiguous, compact, virtual or external (HDF5 filters chunked data only)
            plist = d.id.get_create_plist()
            kind = {h5py.h5d.COMPACT: "compact (inside the file's metadata)", h5py.h5d.VIRTUAL: "virtual (mapped "
                    "from other datasets)"}.get(plist.get_layout(), "in external files" if plist.get_external_count() else "")
            if kind:
                raise DataError(f"{path}: dataset {name!r} is stored {kind}, at no offset of this file; convert it "
                                "instead (fastdata convert)")
            off = d.id.get_offset()
            if off is None and d.size:
                raise DataError(f"{path}: dataset {name!r} has no data written (never allocated)")
            return ArrayInfo(d.dtype, tuple(d.shape), offset=int(off or 0))
        return ArrayInfo(d.dtype, tuple(d.shape), chunk_rows=int(d.chunks[0]))


def describe(path: str, names: list[str]) -> dict[str, Any]:
    """The layout of datasets ``names`` of HDF5 file ``path``, as JSON-able values (for the metadata
    checksum): shape, type, chunks, filters, and where the data or every chunk lies."""
    out: dict[str, Any] = {}
    with _h5(path) as f:
        for name in names:
            d = _dataset(f, path, name)
            plist = d.id.get_create_plist()
            filters = [list(map(str, plist.get_filter(i)[:3])) for i in range(plist.get_nfilters())]
            entry: dict[str, Any] = {"shape": list(d.shape), "dtype": d.dtype.str, "chunks": d.chunks,
                                     "filters": filters}
            if d.chunks is None:
                entry["offset"] = d.id.get_offset()
            else:
                entry["chunk_table"] = _chunk_digest(d)
            out[name] = entry
    return out


def _chunk_digest(d: Any) -> str:
    """A digest of where every chunk of ``d`` lies, how big it is and which filters it skipped."""
    h = xxhash.xxh3_128()
    if d.size:
        d.id.chunk_iter(lambda c: h.update(f"{c.chunk_offset}:{c.byte_offset}:{c.size}:{c.filter_mask};".encode()))
    return h.hexdigest()


def npy_layout(path: str) -> tuple[int, str, list[int], bool]:
    """``(data offset, dtype str, shape, fortran_order)`` of a ``.npy`` file (header parsed, no pickle)."""
    try:
        with open(path, "rb") as fh:
            major, _ = np.lib.format.read_magic(fh)
            if major == 1:
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            return fh.tell(), dtype.str, list(shape), bool(fortran)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable .npy file ({e})") from None


def npy_info(path: str) -> ArrayInfo:
    off, dtype, shape, fortran = npy_layout(path)
    if not shape:
        raise DataError(f"{path}: a 0-d array has no sample axis")
    if fortran and len(shape) > 1:
        raise DataError(f"{path}: stored in Fortran order, so a sample is not contiguous; save it in C order "
                        "(np.ascontiguousarray) or convert it")
    dt = np.dtype(dtype)
    need = off + dt.itemsize * int(np.prod(shape))
    if os.path.getsize(path) < need:
        raise DataError(f"{path}: truncated ({os.path.getsize(path)} bytes, the header needs {need})")
    return ArrayInfo(dt, tuple(shape), offset=off)


def open_zarr(path: str, name: str) -> Any:
    """The Zarr array ``name`` ("" for the store itself) of the store at ``path``, read-only."""
    try:
        import zarr
    except ImportError:
        raise DataError(f"{path}: reading Zarr needs the zarr package: pip install 'fastdata[zarr]'") from None
    try:
        node = zarr.open(path, mode="r")
    except Exception as e:  # zarr raises several types for a missing or foreign store
        raise DataError(f"{path}: not a readable Zarr store ({type(e).__name__}: {e})") from None
    if name:
        if not isinstance(node, zarr.Group) or name.strip("/") not in node:
            raise DataError(f"{path}: no Zarr array {name!r}")
        node = node[name.strip("/")]
    if not isinstance(node, zarr.Array):
        keys = list(node.array_keys()) if isinstance(node, zarr.Group) else []
        raise DataError(f"{path}: {name or 'the store'!r} is a Zarr group, not an array (arrays: {', '.join(keys) or 'none'})")
    return node


def zarr_info(path: str, name: str) -> ArrayInfo:
    a = open_zarr(path, name)
    if not a.shape:
        raise DataError(f"{path}: Zarr array {name!r} is a scalar: it has no sample axis")
    return ArrayInfo(np.dtype(a.dtype), tuple(a.shape), chunk_rows=int(a.chunks[0]))
