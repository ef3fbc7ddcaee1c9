"""The ``inplace`` backend: samples read where they are in existing HDF5, ``.npy`` or Zarr files
(``fastdata index``): contiguous data from a memory map, chunked data a whole cached chunk at a time."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Hashable, TypeVar

import numpy as np

from fastdata.errors import CorruptShardError, UsageError
from fastdata.format import chunks, external
from fastdata.format.backends import INDEX
from fastdata.format.external import BlockCheck, Column, Index, Stamp, check_file, file_problems, parse_index
from fastdata.format.interface import Layout, ShardReader, copy_rows, runs
from fastdata.format.spec import FieldSpec, Manifest, ShardInfo
from fastdata.format.store import LocalShards
from fastdata.handles import PerProcessHandle

NAME = INDEX
H = TypeVar("H")
_WHOLE_COLUMN_BYTES = 16 << 20  # a chunked column this small is read whole, once per process
_CACHE_BYTES = 64 << 20  # decoded chunks a column keeps per process, at least
_MIN_CHUNKS = 6  # kept at least: shuffle=Shards() mixes 2 chunks at a time, and readers run a batch or two ahead


class ChunkCache:
    """Decoded chunks shared by one process's reader threads, least recently used dropped beyond ``capacity``
    bytes (the newest always kept); a chunk is decoded once, threads asking meanwhile wait for it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._pending: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self._bytes = 0
        self.decoded_bytes = 0

    def get(self, key: Hashable, load: Callable[[], np.ndarray]) -> np.ndarray:
        """The chunk ``key``: cached, or loaded by ``load()`` (once, whoever asks at the same time)."""
        while True:
            with self._lock:
                hit = self._items.get(key)
                if hit is not None:
                    self._items.move_to_end(key)
                    return hit
                wait = self._pending.get(key)
                if wait is None:
                    self._pending[key] = threading.Event()
                    break
            wait.wait()  # another thread decodes it; then look again (it may have failed)
        try:
            chunk = load()
        except BaseException:
            with self._lock:
                self._pending.pop(key).set()
            raise
        with self._lock:
            self._items[key] = chunk
            self._bytes += chunk.nbytes
            self.decoded_bytes += chunk.nbytes
            while self._bytes > self.capacity and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.nbytes
            self._pending.pop(key).set()
        return chunk


def index_of(manifest: Manifest, where: str) -> Index:
    """The in-place description of an index's manifest (its backend is an index's: the callers check), checked
    whole here so that verify refuses what opening would."""
    index = parse_index(manifest.source, where)
    if len(index.parts) != len(manifest.shards):
        raise CorruptShardError(f"{where}: the in-place index describes {len(index.parts)} parts for "
                                f"{len(manifest.shards)} shards")
    for info, part in zip(manifest.shards, index.parts):
        if set(part) != {f.name for f in manifest.fields}:
            raise CorruptShardError(f"{where}: part {info.file} does not describe every field")
    for s in index.files:
        external.checks(s.blocks, s.path, s.path)  # malformed block checksums raise
    return index


class InPlaceShards(LocalShards):
    """The ShardStore of an index: one reader per part of the source files (no shard files)."""

    def open_readers(self, fields: list[FieldSpec]) -> list[ShardReader]:
        """One reader per part, after checking every source file is as indexed."""
        index = index_of(self.manifest, str(self.folder))
        problems = file_problems(index)
        if problems:
            raise CorruptShardError(problems[0])
        specs = {f.name: f for f in self.manifest.fields}
        readers: list[ShardReader] = []
        for info, part in zip(self.manifest.shards, index.parts):
            cols = {name: _column(index.files[c.file], c, specs[name], info.count) for name, c in part.items()}
            readers.append(PartReader(Path(index.files[next(iter(part.values())).file].path), info, cols))
        return readers


def unit_counts(manifest: Manifest, stored: np.ndarray) -> list[int]:
    """Samples per unit of ``shuffle=Shards()``: the shards, an in-place index's parts cut into their chunks (of
    the largest field). ``stored``: the dataset's stored indices (a subset's, sorted as ``split`` gives them)."""
    out = [s.count for s in manifest.shards]
    if manifest.backend == NAME:
        index = parse_index(manifest.source, "manifest")
        out = []
        for info, unit in zip(manifest.shards, index.unit_rows):
            out += [unit] * (info.count // unit) + ([info.count % unit] if info.count % unit else [])
    if len(stored) and bool((np.diff(stored) <= 0).any()):
        raise UsageError("shuffle=Shards() on a subset needs its samples in stored order (as split() gives them); "
                         "subset(np.sort(indices)) keeps the same samples")
    bounds = np.concatenate(([0], np.cumsum(out)))
    return np.diff(np.searchsorted(stored, bounds)).tolist()


def _column(stamp: Stamp, c: Column, f: FieldSpec, count: int) -> "_Mapped | _Chunked":
    if c.offset is not None:
        return _Mapped(stamp, c, f, count)
    return _Chunked(stamp, c, f, count)


class PartReader:
    """Reads samples of one part (shard) of an index into caller-provided batch arrays, with the
    interface of fastdata's shard readers (fixed-shape fields only)."""

    def __init__(self, path: Path, info: ShardInfo, columns: dict[str, "_Mapped | _Chunked"]) -> None:
        self.path = path
        self.info = info
        self.columns = columns

    def read_into(self, local: np.ndarray, dest: np.ndarray, outs: dict[str, np.ndarray],
                  layouts: dict[str, Layout] | None = None) -> None:
        """Sample ``local[k]`` of this part goes to row ``dest[k]`` of each array in ``outs`` (``local`` sorted)."""
        for name, out in outs.items():
            self.columns[name].read(local, dest, out)

    def lengths(self, name: str, local: np.ndarray) -> np.ndarray:
        raise UsageError(f"field {name!r}: an in-place index has no ragged fields")

    def ranges(self, local: np.ndarray, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """No read-ahead hints: a part's fields may lie in several files."""
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)

    def copy_phase(self, name: str) -> int:
        return 0

    def handle(self) -> None:
        """Open every column's file (each once per process)."""
        for col in self.columns.values():
            col.handle()

    def is_open(self) -> bool:
        return all(col.is_open() for col in self.columns.values())

    def close(self) -> None:
        for col in self.columns.values():
            col.close()


class _Col(PerProcessHandle[H]):
    """One field of one part: where it lies (``c``) in ``stamp``'s file, checked unchanged when a process opens it."""

    def __init__(self, stamp: Stamp, c: Column, f: FieldSpec, count: int) -> None:
        self.stamp, self.col, self.field, self.count = stamp, c, f, count
        self.offset = c.offset or 0  # contiguous data: its byte offset
        self.rows = c.chunk_rows or 0  # chunked data: the samples of a chunk
        self.where = f"{stamp.path}: {c.array}" if c.array else stamp.path

    def _check(self) -> None:
        problem = check_file(self.stamp, self.col.format, [self.col.array])
        if problem is not None:
            raise CorruptShardError(problem)


@dataclass
class _Map:
    fd: int
    data: np.ndarray
    check: BlockCheck | None = None  # with --checksum: the file's blocks, checked on this process's first read


class _Mapped(_Col[_Map]):
    """A contiguous array at byte ``offset`` of its file, read through a read-only memory map."""

    def _open_handle(self) -> _Map:
        self._check()
        fd = os.open(self.stamp.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            nbytes = self.count * self.field.row_nbytes
            if self.offset + nbytes > os.fstat(fd).st_size:
                raise CorruptShardError(f"{self.where}: data lies outside the file (truncated?)")
            shape = (self.count, *self.field.trailing)
            data = np.memmap(self.stamp.path, dtype=self.field.np_dtype, mode="r", offset=self.offset, shape=shape) \
                if nbytes else np.empty(shape, dtype=self.field.np_dtype)
            checks = external.checks(self.stamp.blocks, self.stamp.path, self.where)
            return _Map(fd, data.view(np.ndarray), None if checks is None else checks.get(""))
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _close_handle(handle: _Map) -> None:
        os.close(handle.fd)

    def read(self, local: np.ndarray, dest: np.ndarray, out: np.ndarray) -> None:
        h = self.handle()
        size = os.fstat(h.fd).st_size  # a file truncated while mapped must raise here, not SIGBUS below
        if size != self.stamp.size:
            raise CorruptShardError(f"{self.stamp.path}: changed while open ({size} bytes, the index says "
                                    f"{self.stamp.size}); run fastdata index again")
        if h.check is not None:
            h.check.rows(h.fd, self.offset, local, self.field.row_nbytes)
        copy_rows(h.data, local, dest, out)


@dataclass
class _Source:
    array: Any  # an h5py Dataset or a zarr Array
    file: Any  # the h5py File to close, or None
    cache: ChunkCache
    direct: chunks.ChunkTable | chunks.ZarrChunks | None = None  # chunks read without h5py or zarr (chunks.py)
    whole: np.ndarray | None = None  # a small column, read whole
    # with --checksum, HDF5 chunks read through h5py: the file open, chunks.chunk_spans, the file's blocks
    spans: tuple[int, np.ndarray, BlockCheck] | None = None


class _Chunked(_Col[_Source]):
    """A chunked (possibly compressed) HDF5 dataset or Zarr array, read a whole chunk at a time."""

    def _open_handle(self) -> _Source:
        self._check()
        checks = external.checks(self.stamp.blocks, self.stamp.path, self.where)
        if self.col.format == "hdf5":
            try:  # no HDF5 chunk cache: whole chunks are read, and kept decoded in our own cache
                fh = external.h5_file(self.stamp.path, rdcc_nbytes=0)
                src = _Source(fh[self.col.array], fh, self._cache())
                src.direct = chunks.chunk_table(src.array, self.stamp.path, checks)  # then no h5py from here on
            except (OSError, KeyError, ValueError) as e:
                raise CorruptShardError(f"{self.where}: cannot open ({e})") from None
        else:
            src = _Source(external.open_zarr(self.stamp.path, self.col.array), None, self._cache())
            src.direct = chunks.zarr_chunks(src.array, self.stamp.path, checks)
        if tuple(src.array.shape) != (self.count, *self.field.trailing):
            shape = tuple(src.array.shape)
            self._close_handle(src)
            raise CorruptShardError(f"{self.where}: is now of shape {shape}, the index says "
                                    f"{(self.count, *self.field.trailing)}; run fastdata index again")
        if checks is not None and src.direct is None:
            self._check_through(src, checks)
        if self.count * self.field.row_nbytes <= _WHOLE_COLUMN_BYTES:
            src.whole = self._load(src, 0, self.count)
        return src

    def _check_through(self, src: _Source, checks: dict[str, BlockCheck]) -> None:
        """Data read through h5py or zarr: an HDF5 chunk's blocks are checked when it is read (chunks.chunk_spans);
        otherwise every block of the file (of a Zarr array: of the files in its folder) now, closing on failure."""
        spans = chunks.chunk_spans(src.array) if src.file is not None else None
        if spans is not None and "" in checks:
            src.spans = (os.open(self.stamp.path, os.O_RDONLY | os.O_CLOEXEC), spans, checks[""])
            return
        array = self.col.array.strip("/")
        prefix = os.path.relpath(os.path.join(self.stamp.path, array), self.stamp.path) + os.sep \
            if self.col.format == "zarr" and array else ""
        try:
            external.check_files(checks, prefix)
        except BaseException:
            self._close_handle(src)
            raise

    def _cache(self) -> ChunkCache:
        """A cache of at least ``_CACHE_BYTES`` and ``_MIN_CHUNKS`` decoded chunks (per column and process)."""
        return ChunkCache(max(_CACHE_BYTES, _MIN_CHUNKS * self.rows * self.field.row_nbytes))

    @staticmethod
    def _close_handle(handle: _Source) -> None:
        if handle.direct is not None and handle.direct.fd is not None:
            os.close(handle.direct.fd)
        if handle.spans is not None:
            os.close(handle.spans[0])
        if handle.file is not None:
            handle.file.close()

    def _load(self, src: _Source, r0: int, r1: int) -> np.ndarray:
        if src.direct is not None:
            a = np.empty((r1 - r0, *self.field.trailing), dtype=self.field.np_dtype)
            for c0 in range(r0, r1, self.rows):  # r0 is the first row of a chunk
                src.direct.read(c0 // self.rows, a[c0 - r0 : min(c0 + self.rows, r1) - r0], self.where)
            return a
        if src.spans is not None:
            self._check_spans(src.spans, r0, r1)
        try:
            if src.file is not None:
                a = np.empty((r1 - r0, *self.field.trailing), dtype=self.field.np_dtype)
                if r1 > r0:
                    src.array.read_direct(a, source_sel=np.s_[r0:r1])
                return a
            return np.ascontiguousarray(src.array[r0:r1], dtype=self.field.np_dtype)
        except Exception as e:  # h5py/zarr raise many types; name the place instead
            raise CorruptShardError(f"{self.where}: samples {r0}..{r1 - 1}: read failed ({type(e).__name__}: {e})") from None

    def _check_spans(self, spans: tuple[int, np.ndarray, BlockCheck], r0: int, r1: int) -> None:
        """The blocks of every HDF5 chunk holding rows ``r0..r1-1`` (read through h5py)."""
        fd, s, check = spans
        rows = self.rows
        for off, size in s[(s[:, 0] < r1) & (s[:, 0] + rows > r0)][:, 1:].tolist():
            check.span(fd, off, off + size)

    def read(self, local: np.ndarray, dest: np.ndarray, out: np.ndarray) -> None:
        src = self.handle()
        if src.whole is not None:
            out[dest] = src.whole[local]
            return
        chunk = local // self.rows
        cuts = np.flatnonzero(np.diff(chunk)) + 1
        direct = src.direct
        for a, e in zip(np.concatenate(([0], cuts)).tolist(), np.concatenate((cuts, [len(local)])).tolist()):
            c = int(chunk[a])
            r0 = c * self.rows
            if direct is not None and direct.raw:  # stored plain: each run of rows read straight into the batch
                self._read_rows(direct, c, local[a:e] - r0, dest[a:e], out)
                continue
            data = src.cache.get(c, partial(self._load, src, r0, min(r0 + self.rows, self.count)))
            copy_rows(data, local[a:e] - r0, dest[a:e], out)

    def _read_rows(self, direct: chunks.ChunkTable | chunks.ZarrChunks, c: int, rows: np.ndarray, dest: np.ndarray,
                   out: np.ndarray) -> None:
        """Rows ``rows`` of the unfiltered chunk ``c`` into ``out[dest]`` with positional reads."""
        nb = self.field.row_nbytes
        path, base, check = direct.locate(c)
        fd = direct.fd if direct.fd is not None else os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if check is not None:
                check.rows(fd, base, rows, nb)
            for l0, d0, n in runs(rows, dest):
                view = memoryview(out[d0 : d0 + n].reshape(-1).view(np.uint8))  # type: ignore[arg-type]
                if os.preadv(fd, [view], base + l0 * nb) != n * nb:
                    raise CorruptShardError(f"{self.where}: chunk {c} ({path}) is short (truncated?)")
        finally:
            if direct.fd is None:
                os.close(fd)

    def decoded_bytes(self) -> int:
        """Bytes of chunks this process decoded so far (for read-amplification measurements)."""
        src = self._handle
        return 0 if src is None else src.cache.decoded_bytes + (0 if src.whole is None else src.whole.nbytes)

