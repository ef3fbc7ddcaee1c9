"""Writing LMDB shards: records (layout: docs/format.md) appended in key order,
committed in batches, the map grown on demand."""

from __future__ import annotations

import errno
import json
import os
import struct
from pathlib import Path

import lmdb
import numpy as np

from fastdata.errors import UsageError
from fastdata.fileio import disk_full
from fastdata.format import codec as blosc_codec
from fastdata.format import interface
from fastdata.format.spec import FieldSpec

MAGIC = b"FDR1"
SHARD_KEY = b"\xff" * 8  # the shard's own description; sorts after every sample key
KEY = struct.Struct(">Q")
key = KEY.pack  # a sample's key: its global index, big-endian (keys sort in sample order)
_COMMIT_BYTES = 64 << 20
_TAIL_GUARD_MIN = 192 << 10  # > the 64 KiB an in-page offset can reach, plus a 64 KiB key size
_FULL_MARGIN = 1 << 20  # a failed write with less than this (+ the batch) free on the disk: the disk is full


def parse_compression(value: str | None) -> blosc_codec.Codec | None:
    """``none``, or ``lz4[:N]`` | ``zstd[:N]`` (per field, fastdata/format/codec.py) -> the codec."""
    if value in (None, "", "none"):
        return None
    codec = blosc_codec.parse(value)
    if codec is None:
        raise UsageError(f"--compression {value} is not supported for LMDB shards (use none, lz4, lz4:1-9, zstd "
                         "or zstd:1-9; lzf and gzip are HDF5 only)")
    return codec


def shard_record(fields: list[FieldSpec], start: int, count: int) -> bytes:
    """The value stored under SHARD_KEY."""
    return json.dumps({"start": start, "count": count, "fields": [f.to_json() for f in fields]},
                      sort_keys=True).encode()


def encode_record(fields: list[FieldSpec], sample: dict[str, np.ndarray],
                  codec: blosc_codec.Codec | None = None) -> bytes:
    """One record: header, then each field's bytes (compressed fields as one Blosc buffer with ``codec``)."""
    parts = []
    for f in fields:
        a = np.asarray(sample[f.name])
        if f.compression is not None:
            if codec is None:
                raise ValueError(f"field {f.name!r} is compressed: encode_record needs the codec")
            parts.append(blosc_codec.encode(a, codec))
        else:
            parts.append(a.tobytes())  # C order
    header = MAGIC + struct.pack(f"<I{len(parts)}Q", len(parts), *(len(p) for p in parts))
    return b"".join([header, *parts])


def initial_map_size(payload: int, count: int, nfields: int) -> int:
    """A generous first map size for a shard. Only address space: the file holds just the pages
    used, and the writer doubles the map whenever a commit finds it full."""
    return int((payload + count * (4096 + 64 + 8 * nfields)) * 1.25) + (1 << 20)


def tail_guard_bytes(psize: int, largest_record: int) -> int:
    """Zero bytes appended after LMDB's last page: liblmdb checks only page numbers, so a corrupted offset or
    value size then stays inside the file instead of causing a SIGBUS (docs/format.md, "LMDB shards")."""
    return -(-max(_TAIL_GUARD_MIN, largest_record) // psize) * psize


class ShardWriter(interface.ShardWriter):
    """Writes one LMDB shard; the map grows on demand, so ``MapFullError`` never reaches the user."""

    @staticmethod
    def min_sample_bytes(fields: list[FieldSpec]) -> float:
        """The fewest bytes a sample takes: its key, LMDB's node header, the record's magic and field count,
        and one size per field."""
        return 8 + 8 + 4 + 4 + 8 * len(fields)

    def __init__(self, path: Path, fields: list[FieldSpec], count: int, ragged_rows: dict[str, int],
                 compression: str | None = None, start: int = 0) -> None:
        super().__init__(path, fields, count, ragged_rows, compression, start)
        self._codec = parse_compression(compression)
        self._check_codec(self._codec, compression)
        payload = sum(f.row_nbytes * (ragged_rows[f.name] if f.ragged else count) for f in fields)
        try:  # lock=False: a lock file is mapped memory (SIGBUS on a full tmpfs); the file is ours alone
            self._env = lmdb.open(
                str(self.path), subdir=False, map_size=initial_map_size(payload, count, len(fields)), metasync=False,
                sync=False, readahead=False, max_dbs=0, lock=False,
            )
        except lmdb.Error as e:
            raise self._disk_error(e, 0) from e
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._largest = 0

    def write(self, sample: dict[str, np.ndarray]) -> None:
        if self._n >= self.count:
            raise ValueError("shard is full")
        value = encode_record(self.fields, sample, self._codec)
        self._largest = max(self._largest, len(value))
        self._pending.append((key(self.start + self._n), value))
        self._pending_bytes += len(value)
        self._n += 1
        if self._pending_bytes >= _COMMIT_BYTES:
            self._commit()

    def _commit(self) -> None:
        if not self._pending:
            return
        while True:
            try:
                with self._env.begin(write=True) as txn, txn.cursor() as cur:
                    cur.putmulti(self._pending, append=True)
                break
            except lmdb.MapFullError:
                size = self._env.info()["map_size"]
                self._env.set_mapsize(max(size * 2, size + 4 * self._pending_bytes))
            except lmdb.Error as e:
                raise self._disk_error(e, self._pending_bytes) from e
        self._pending.clear()
        self._pending_bytes = 0

    def _disk_error(self, e: lmdb.Error, pending: int) -> Exception:
        """liblmdb turns a short write into EIO: name a full disk for what it is."""
        if disk_full(self.path.parent, pending + _FULL_MARGIN):
            return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({e})")
        return e

    def close(self) -> None:
        if self._env is None:
            return
        try:
            if self._n != self.count:
                raise ValueError(f"shard got {self._n} samples, planned {self.count}")
            self._pending.append((SHARD_KEY, shard_record(self.fields, self.start, self.count)))
            self._commit()
            try:
                self._env.sync(True)
            except lmdb.Error as e:
                raise self._disk_error(e, 0) from e
            psize = self._env.stat()["psize"]
        finally:
            self._release()
        with open(self.path, "r+b") as f:  # the tail guard, sparse
            end = f.seek(0, os.SEEK_END)
            f.truncate(end + tail_guard_bytes(psize, self._largest))
            os.fsync(f.fileno())

    def _release(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None  # type: ignore[assignment]  # closed: the writer is finished


__all__ = ["KEY", "MAGIC", "SHARD_KEY", "ShardWriter", "encode_record", "initial_map_size", "key", "parse_compression",
           "shard_record", "tail_guard_bytes"]
