"""Writing HDF5 shards (the layout: fastdata/format/hdf5.py, docs/format.md)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from fastdata.errors import UsageError
from fastdata.format import codec as blosc_codec
from fastdata.format import interface
from fastdata.format.spec import FORMAT_VERSION, FieldSpec

COMPRESSIONS = ("none", "lzf", "gzip", "lz4", "zstd")
_CHUNK_BYTES = 1 << 20
_STAGE_BYTES = 32 << 20


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
        if n == 0:
            return
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
        if self._file is None:
            return
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


__all__ = ["COMPRESSIONS", "ShardWriter", "parse_compression"]
