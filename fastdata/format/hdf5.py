"""HDF5 shards, written and read: one dataset per fixed field, ragged fields as data + offsets; the hot read
path uses memory maps and ``pread`` with no h5py call (nor its global lock), ``lzf``/``gzip`` fields go through h5py."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from fastdata.errors import CorruptShardError, UsageError
from fastdata.fileio import pread_into
from fastdata.format import codec as blosc_codec
from fastdata.format import interface
from fastdata.format.chunks import chunk_arrays
from fastdata.format.interface import Layout, RaggedOut, ShardReaderBase, copy_rows, runs
from fastdata.format.spec import FORMAT_VERSION, FieldSpec, ShardInfo

EXTENSION = ".h5"
COMPRESSIONS = ("none", "lzf", "gzip", "lz4", "zstd")
_CHUNK_BYTES = 1 << 20
_STAGE_BYTES = 32 << 20
_CACHE_COLUMN_BYTES = 1 << 20  # small columns (labels) are read whole, once per process


def parse_compression(value: str | None) -> tuple[str | None, Any]:
    """``none`` | ``lzf`` | ``gzip`` | ``gzip:N`` -> (h5py filter, level); ``lz4[:N]`` | ``zstd[:N]``
    -> (``"blosc"``, the :class:`~.codec.Codec`)."""
    if value in (None, "", "none"):
        return None, None
    codec = blosc_codec.parse(value)
    if codec is not None:
        return blosc_codec.BLOSC, codec
    name, _, level = value.partition(":")
    if name == "lzf" and not level:
        return "lzf", None
    if name == "gzip":
        try:
            lvl = int(level) if level else 4
        except ValueError:
            lvl = -1
        if 0 <= lvl <= 9:
            return "gzip", lvl
    raise UsageError(f"unknown compression {value!r} (use none, lz4, lz4:1-9, zstd, zstd:1-9, lzf, gzip or gzip:0-9)")


class ShardWriter(interface.ShardWriter):
    """Writes one HDF5 shard of ``count`` samples (a context manager): uncompressed fields with one ``pwrite``
    per sample, ``lz4``/``zstd`` fields one chunk per sample, ``lzf``/``gzip`` fields staged through h5py."""

    @staticmethod
    def min_sample_bytes(fields: list[FieldSpec]) -> float:
        """The fewest bytes a sample takes: its raw bytes (8 per ragged field's offset) over the most any HDF5
        codec compresses (zstd: about 4 bytes per 128 KiB block)."""
        return sum(8 if f.ragged else f.row_nbytes for f in fields) / (1 << 16)

    def __init__(self, path: Path, fields: list[FieldSpec], count: int, ragged_rows: dict[str, int],
                 compression: str | None = None, start: int = 0) -> None:
        super().__init__(path, fields, count, ragged_rows, compression, start)
        filt, level = parse_compression(compression)
        self._codec = level if filt == blosc_codec.BLOSC else None
        if filt == blosc_codec.BLOSC:
            filt, level = None, None  # per field: the fields marked compressed get one Blosc chunk per sample
        self._check_codec(self._codec, compression)
        self._file = h5py.File(path, "w", libver="earliest", track_order=False)
        self._fd: int | None = None
        try:
            self._file.attrs["fastdata_format"] = FORMAT_VERSION
            self._file.attrs["fastdata_start"] = start  # lets a reader notice a shard swapped with another
            self._dsets: dict[str, Any] = {}
            self._stage: dict[str, list[np.ndarray]] = {}  # fields written through h5py: samples not flushed yet
            self._staged_bytes = 0
            self._written = 0  # samples flushed (staged fields)
            self._offsets: dict[str, np.ndarray] = {}  # ragged: row offsets, count + 1
            self._planned_rows = {f.name: int(ragged_rows[f.name]) for f in fields if f.ragged}
            self._direct: dict[str, int] = {}  # field -> byte offset of its data in the file (pwrite)
            self._chunked: dict[str, Any] = {}  # compressed field -> its dataset (one chunk per sample)
            for f in fields:
                if f.compression is not None and count > 0:
                    assert self._codec is not None
                    self._chunked[f.name] = self._file.create_dataset(
                        f.name, shape=(count, *f.trailing), dtype=f.np_dtype, chunks=(1, *f.trailing),
                        track_times=False, **blosc_codec.hdf5_filter(self._codec))
                    continue
                if f.ragged:
                    rows = self._planned_rows[f.name]
                    g = self._file.create_group(f.name)
                    self._dsets[f.name] = self._create(g, "data", (rows, *f.trailing), f, filt, level)
                    self._offsets[f.name] = np.zeros(count + 1, dtype=np.int64)
                else:
                    self._dsets[f.name] = self._create(self._file, f.name, (count, *f.trailing), f, filt, level)
                dset = self._dsets[f.name]
                if dset.chunks is None and dset.compression is None and dset.id.get_offset() is not None:
                    self._direct[f.name] = int(dset.id.get_offset())
                else:
                    self._stage[f.name] = []
            self._file.flush()  # the allocated extents are in the file before any pwrite lands there
            if self._direct:
                self._fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except BaseException:
            self._file.close()
            raise

    @staticmethod
    def _create(parent: Any, name: str, shape: tuple[int, ...], f: FieldSpec, filt: Any, level: Any) -> Any:
        if filt is None or shape[0] == 0 or math.prod(shape) == 0:
            # allocated now and never filled: the writer puts every byte in place itself
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
            return parent.create_dataset(name, shape=shape, dtype=f.np_dtype, track_times=False, dcpl=dcpl)
        chunks = (max(1, min(shape[0], _CHUNK_BYTES // max(1, f.row_nbytes))), *shape[1:])
        return parent.create_dataset(
            name, shape=shape, dtype=f.np_dtype, chunks=chunks, compression=filt,
            compression_opts=level, shuffle=filt == "gzip", track_times=False,
        )

    def write(self, sample: dict[str, np.ndarray]) -> None:
        """Append one sample (arrays already validated against the schema)."""
        if self._n >= self.count:
            raise ValueError("shard is full")
        n = self._n
        for f in self.fields:
            a = sample[f.name]
            if f.ragged:
                offs = self._offsets[f.name]
                offs[n + 1] = offs[n] + a.shape[0]
                if offs[n + 1] > self._planned_rows[f.name]:
                    raise ValueError(f"field {f.name!r}: more rows than planned ({self._planned_rows[f.name]})")
                pos = int(offs[n]) * f.row_nbytes
            else:
                pos = n * f.row_nbytes
            off = self._direct.get(f.name)
            chunked = self._chunked.get(f.name)
            if chunked is not None:
                assert self._codec is not None
                chunked.id.write_direct_chunk((n,) + (0,) * len(f.trailing), blosc_codec.encode(a, self._codec), 0)
            elif off is not None:
                if a.nbytes:
                    assert self._fd is not None
                    _pwrite_all(self._fd, np.ascontiguousarray(a), off + pos)
            else:
                self._stage[f.name].append(a)
                self._staged_bytes += a.nbytes
        self._n += 1
        if self._staged_bytes >= _STAGE_BYTES:
            self._flush()

    def write_rows(self, rows: dict[str, np.ndarray], n: int) -> None:
        """Append ``n`` samples given as one array of rows per field (validated): one ``pwrite`` per field
        where every field is uncompressed and fixed-shape, else sample by sample."""
        if self._n + n > self.count:
            raise ValueError("shard is full")
        if any(f.ragged or f.name not in self._direct for f in self.fields):
            for r in range(n):
                self.write({k: v[r] for k, v in rows.items()})
            return
        assert self._fd is not None
        for f in self.fields:
            a = rows[f.name]
            if a.nbytes:
                _pwrite_all(self._fd, np.ascontiguousarray(a), self._direct[f.name] + self._n * f.row_nbytes)
        self._n += n

    def _flush(self) -> None:
        n = self._n - self._written
        for f in self.fields:
            parts = self._stage.get(f.name)
            if not parts:
                continue
            dset = self._dsets[f.name]
            if f.ragged:
                block = np.concatenate(parts) if len(parts) > 1 else parts[0]
                r0 = int(self._offsets[f.name][self._written])  # rows flushed so far
                if len(block):
                    dset[r0 : r0 + len(block)] = block
            else:
                dset[self._written : self._written + n] = np.stack(parts)
            parts.clear()
        self._written += n
        self._staged_bytes = 0

    def close(self) -> None:
        try:
            self._flush()
            if self._n != self.count:
                raise ValueError(f"shard got {self._n} samples, planned {self.count}")
            for f in self.fields:
                if f.ragged:
                    rows = int(self._offsets[f.name][-1])
                    if rows != self._planned_rows[f.name]:
                        raise ValueError(f"field {f.name!r}: got {rows} rows, planned {self._planned_rows[f.name]}")
                    self._file[f.name].create_dataset("offsets", data=self._offsets[f.name], track_times=False)
        finally:
            self._release()

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._file is not None:
            self._file.close()
            self._file = None


def _pwrite_all(fd: int, a: np.ndarray, offset: int) -> None:
    view = memoryview(a.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


@dataclass
class _Column:
    """How to read one field in this process: a cached array, a memory map (at byte ``offset``), or h5py."""

    offset: int | None = None  # contiguous uncompressed data
    cached: np.ndarray | None = None  # whole small column in memory
    mapped: np.ndarray | None = None  # a read-only memory map of the column (any sample size)
    dset: Any = None  # chunked/compressed: read through h5py
    offsets: np.ndarray | None = None  # ragged: row offsets, count + 1
    byte_offsets: list[int] | None = None  # ragged and mapped: offsets in bytes, as Python ints
    # compressed per sample: each sample's chunk offset in the file and its stored bytes
    chunks: tuple[np.ndarray, np.ndarray] | None = None


@dataclass
class _Handle:
    fd: int
    h5: Any
    columns: dict[str, _Column] = field(default_factory=dict)


class ShardReader(ShardReaderBase[_Handle]):
    """Reads samples of one HDF5 shard into caller-provided batch arrays."""

    def __init__(self, path: Path, info: ShardInfo, fields: list[FieldSpec]) -> None:
        super().__init__(path, info)
        self.fields = {f.name: f for f in fields}

    def _open_checked(self, fd: int, st: os.stat_result) -> _Handle:
        try:
            h5 = h5py.File(self.path, "r", rdcc_nbytes=64 << 20, rdcc_nslots=10007)
        except Exception as e:  # h5py raises OSError with libhdf5's message
            raise CorruptShardError(f"{self._where()}: not a readable HDF5 file ({e})") from None
        handle = _Handle(fd=fd, h5=h5)
        keep_h5 = False
        try:
            self._check_start(h5)
            for f in self.fields.values():
                col = self._column(h5, f, st.st_size, fd)
                keep_h5 |= col.dset is not None
                handle.columns[f.name] = col
        except CorruptShardError:
            h5.close()
            raise
        except Exception as e:
            h5.close()
            raise CorruptShardError(f"{self._where()}: unexpected layout ({type(e).__name__}: {e})") from None
        if not keep_h5:
            h5.close()  # every column is cached or memory-mapped: no h5py (and no lock) from here on
            handle.h5 = None
        return handle

    def _check_start(self, h5: Any) -> None:
        start = h5.attrs.get("fastdata_start")  # absent in shards written before it was added
        if start is not None and int(start) != self.info.stored_start:
            raise CorruptShardError(
                f"{self._where()}: holds samples from {int(start)}, the manifest says {self.info.stored_start} "
                "(a shard of another dataset, or shards renamed?)"
            )

    def _column(self, h5: Any, f: FieldSpec, file_size: int, fd: int) -> _Column:
        n = self.info.count
        if f.name not in h5:
            raise CorruptShardError(f"{self._where()}: field {f.name!r} is missing")
        col = _Column()
        if f.ragged:
            grp = h5[f.name]
            if "data" not in grp or "offsets" not in grp:
                raise CorruptShardError(f"{self._where()}: ragged field {f.name!r} lacks data/offsets")
            dset, offs = grp["data"], grp["offsets"]
            if offs.shape != (n + 1,) or offs.dtype.kind not in "iu":
                raise CorruptShardError(f"{self._where()}: field {f.name!r} has bad offsets shape {offs.shape}")
            o = np.asarray(offs[...], dtype=np.int64)
            if o[0] != 0 or np.any(np.diff(o) < 0) or o[-1] != dset.shape[0]:
                raise CorruptShardError(f"{self._where()}: field {f.name!r} has inconsistent offsets")
            col.offsets = o
            expect = (int(o[-1]), *f.trailing)
        else:
            dset = h5[f.name]
            expect = (n, *f.trailing)
        if tuple(dset.shape) != expect or dset.dtype != f.np_dtype:
            raise CorruptShardError(
                f"{self._where()}: field {f.name!r} is {dset.dtype}{tuple(dset.shape)}, manifest says {f.np_dtype}{expect}"
            )
        nbytes = int(math.prod(expect)) * f.np_dtype.itemsize
        if f.compression is not None and n > 0:
            self._chunk_table(dset, f, col, file_size)
        elif dset.chunks is None and dset.compression is None:
            off = dset.id.get_offset()
            if nbytes and (off is None or off + nbytes > file_size):
                raise CorruptShardError(f"{self._where()}: field {f.name!r} data lies outside the file")
            col.offset = off
            if nbytes and f.ragged:
                # every sample one slice of this map: one copy each (offsets checked above, the size per read)
                col.mapped = np.memmap(self.path, dtype=np.uint8, mode="r", offset=off, shape=(nbytes,))
                assert col.offsets is not None
                col.byte_offsets = (col.offsets * f.row_nbytes).tolist()
            elif not f.ragged:
                if nbytes <= _CACHE_COLUMN_BYTES:  # (an empty column too: nothing to map or read)
                    col.cached = np.empty(expect, dtype=f.np_dtype)
                    if nbytes:
                        pread_into(fd, col.cached, off, self._where())
                else:
                    # in bounds: the size was checked above and read_into re-checks it (an error, never SIGBUS)
                    col.mapped = np.memmap(self.path, dtype=f.np_dtype, mode="r", offset=off, shape=expect)
        else:
            col.dset = dset
        return col

    def _chunk_table(self, dset: Any, f: FieldSpec, col: _Column, file_size: int) -> None:
        """Where each sample's compressed chunk lies (one chunk per sample, checked to lie in the file)."""
        if dset.chunks != (1, *f.trailing):
            raise CorruptShardError(f"{self._where()}: compressed field {f.name!r} has chunks {dset.chunks}, "
                                    f"expected one sample each")
        off, size, _ = chunk_arrays(dset, 1)  # each a Blosc buffer: the writer writes them itself (filter mask 0)
        if (off + size > file_size).any():
            raise CorruptShardError(f"{self._where()}: field {f.name!r} has chunks outside the file")
        col.chunks = off, size

    def ranges(self, local: np.ndarray, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The byte ranges (starts, lengths) of this file that reading fields ``names`` of samples ``local``
        touches, for read-ahead hints; columns in memory or read through h5py give none."""
        h = self.handle()
        starts, lengths = [], []
        for name in names:
            f, col = self.fields[name], h.columns[name]
            if col.chunks is not None:
                starts.append(col.chunks[0][local])
                lengths.append(col.chunks[1][local])
            elif col.cached is not None or col.offset is None or col.dset is not None:
                continue
            elif f.ragged and col.offsets is not None:
                starts.append(col.offset + col.offsets[local] * f.row_nbytes)
                lengths.append((col.offsets[local + 1] - col.offsets[local]) * f.row_nbytes)
            elif not f.ragged:
                starts.append(col.offset + local.astype(np.int64) * f.row_nbytes)
                lengths.append(np.full(len(local), f.row_nbytes, dtype=np.int64))
        if not starts:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(starts), np.concatenate(lengths)

    def lengths(self, name: str, local: np.ndarray) -> np.ndarray:
        h = self.handle()
        self._check_unchanged(h.fd, local)
        o = h.columns[name].offsets
        assert o is not None
        return o[local + 1] - o[local]

    def read_into(self, local: np.ndarray, dest: np.ndarray, outs: dict[str, np.ndarray],
                  layouts: dict[str, Layout] | None = None) -> None:
        """Sample ``local[k]`` (sorted) of this shard goes to row ``dest[k]`` of each array in ``outs``; ragged
        fields as :class:`RaggedOut` places them (``layouts``)."""
        h = self.handle()
        self._check_unchanged(h.fd, local)
        for name, out in outs.items():
            f = self.fields[name]
            col = h.columns[name]
            if f.ragged:
                self._read_ragged(h, f, col, local, dest, RaggedOut(out, (layouts or {}).get(name)))
            elif col.chunks is not None:
                self._read_compressed(h.fd, f, col, local, dest, out)
            elif col.cached is not None:
                out[dest] = col.cached[local]
            elif col.mapped is not None:
                copy_rows(col.mapped.view(np.ndarray), local, dest, out)
            else:
                for l0, d0, n in runs(local, dest):
                    self._h5_read(col.dset, np.s_[l0 : l0 + n], out[d0 : d0 + n], l0)

    def _read_compressed(self, fd: int, f: FieldSpec, col: _Column, local: np.ndarray, dest: np.ndarray,
                         out: np.ndarray) -> None:
        """One ``pread`` per sample (GIL released), decoded straight into its batch row."""
        assert col.chunks is not None
        offs, sizes = (a[local].tolist() for a in col.chunks)
        for l, d, o, n in zip(local.tolist(), dest.tolist(), offs, sizes):
            if o < 0:
                raise CorruptShardError(f"{self._where(l)}: field {f.name!r} has no stored chunk")
            buf = os.pread(fd, n, o)
            if len(buf) != n:
                raise CorruptShardError(f"{self._where(l)}: short read of field {f.name!r} (file truncated?)")
            blosc_codec.decode_into(buf, out[d], f"{self._where(l)}: field {f.name!r}")

    def _read_ragged(self, h: _Handle, f: FieldSpec, col: _Column, local: np.ndarray, dest: np.ndarray,
                     out: RaggedOut) -> None:
        o = col.offsets
        assert o is not None
        if col.byte_offsets is not None:
            m, bo = memoryview(col.mapped), col.byte_offsets  # type: ignore[arg-type]  # a map is a buffer
            for l, d in zip(local.tolist(), dest.tolist()):
                out.put(d, m, bo[l], bo[l + 1] - bo[l])
            return
        rows = np.empty(0, dtype=f.np_dtype)
        for l, d in zip(local.tolist(), dest.tolist()):
            r0, r1 = int(o[l]), int(o[l + 1])
            if r1 == r0:
                out.empty(d)
                continue
            if len(rows) < r1 - r0:
                rows = np.empty((r1 - r0, *f.trailing), dtype=f.np_dtype)
            target = rows[: r1 - r0]
            self._h5_read(col.dset, np.s_[r0:r1], target, l)
            out.put(d, memoryview(target.reshape(-1).view(np.uint8)), 0, target.nbytes)  # type: ignore[arg-type]

    def _h5_read(self, dset: Any, sel: Any, target: np.ndarray, local: int) -> None:
        try:
            dset.read_direct(target, source_sel=sel)
        except Exception as e:
            raise CorruptShardError(f"{self._where(local)}: read failed ({e})") from None

    @staticmethod
    def _close_handle(handle: _Handle) -> None:
        os.close(handle.fd)
        if handle.h5 is not None:
            handle.h5.close()


__all__ = ["COMPRESSIONS", "EXTENSION", "ShardReader", "ShardWriter", "parse_compression"]
