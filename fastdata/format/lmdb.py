"""LMDB shards through py-lmdb, written and read: one environment file per shard, one record per sample under
its global index, the shard's own description under SHARD_KEY (layout and checks: docs/format.md); records are
appended in key order, committed in batches, the map grown on demand."""

from __future__ import annotations

import errno
import json
import os
import struct
import threading
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import lmdb
import numpy as np

from fastdata.errors import CorruptShardError, UsageError
from fastdata.fileio import disk_full
from fastdata.format import codec as blosc_codec
from fastdata.format import interface
from fastdata.format.interface import Layout, RaggedOut, ShardReaderBase
from fastdata.format.spec import FieldSpec, ShardInfo
from fastdata.handles import no_fork_during

EXTENSION = ".lmdb"
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


_MAX_SHARD_RECORD = 1 << 20
_GATHER_RECORD_BYTES = 64 << 10  # fixed-layout records up to this size are joined and checked at once
_SMALL_FIELD_BYTES = 64  # fixed fields up to this size per sample are kept in a shard's record index

# py-lmdb refuses a second open of one file in a process: readers share a refcounted environment per file.
_envs_lock = threading.RLock()  # reentrant: a finalizer (GC) may release an environment mid-acquire
_envs: dict[tuple[int, int], list[Any]] = {}  # (st_dev, st_ino) -> [environment, users]


def _acquire_env(path: Path, st: os.stat_result) -> lmdb.Environment:
    ident = (st.st_dev, st.st_ino)
    with _envs_lock, no_fork_during():
        entry = _envs.get(ident)
        if entry is None:
            # readahead: cold records come in by the kernel's read-around, not one 4 KiB fault at a time
            env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=True,
                            meminit=False, max_readers=1024, max_dbs=0)
            entry = _envs[ident] = [env, 0]
        entry[1] += 1
        return entry[0]


def _release_env(env: lmdb.Environment) -> None:
    with _envs_lock, no_fork_during():
        for ident, entry in list(_envs.items()):
            if entry[0] is env:
                entry[1] -= 1
                if entry[1] <= 0:
                    del _envs[ident]
                    env.close()
                return


def _reset_envs_in_child() -> None:
    global _envs_lock
    _envs_lock = threading.RLock()  # another thread may have held it at fork time
    for env, _ in _envs.values():
        with suppress(lmdb.Error):
            env.close()
    _envs.clear()


os.register_at_fork(after_in_child=_reset_envs_in_child)


class _Decoder:
    """Places a compressed field's record bytes into the batch: a Blosc decode into row ``d``."""

    def __init__(self, reader: "ShardReader", f: FieldSpec, out: np.ndarray, local: np.ndarray, dest: np.ndarray) -> None:
        self.reader, self.field, self.out = reader, f, out
        self.local = dict(zip(dest.tolist(), local.tolist()))  # batch row -> sample, for error messages

    def put(self, d: int, src: memoryview | bytes, off: int, n: int) -> None:
        where = f"{self.reader._where(self.local[d])}: field {self.field.name!r}"
        blosc_codec.decode_into(memoryview(src)[off : off + n], self.out[d], where)


@dataclass
class RecordIndex:
    """Every record's layout in one shard (schemas with ragged or compressed fields: read once per
    process), so a batch needs no per-sample header parsing, only a comparison per record."""

    sizes: np.ndarray  # (count, fields) int64: payload bytes of each field
    total: np.ndarray  # (count,) int64: record length; -1 for a record that failed its checks
    bad: dict[int, str]  # local index -> what is wrong with that record
    small: dict[int, np.ndarray] = field(default_factory=dict)  # field index -> its values (small fixed fields)


@dataclass
class _Handle:
    env: lmdb.Environment
    fd: int  # the same file, for a cheap size check before each read
    index: RecordIndex | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class ShardReader(ShardReaderBase[_Handle]):
    """Reads samples of one LMDB shard into caller-provided batch arrays."""

    def __init__(self, path: Path, info: ShardInfo, fields: list[FieldSpec]) -> None:
        super().__init__(path, info)
        self.all_fields = fields  # records hold every field, in manifest order
        n = len(fields)
        self._header_size = 8 + 8 * n
        self._sizes_fmt = f"<{n}Q"
        fixed = all(not f.ragged and f.compression is None for f in fields)  # every record of one size
        self._expected_header = MAGIC + struct.pack(f"<I{n}Q", n, *(f.row_nbytes if not f.ragged else 0 for f in fields))
        self._index = {f.name: i for i, f in enumerate(fields)}
        # every record of a schema without ragged fields has this size; None otherwise
        self._record_size = self._header_size + sum(f.row_nbytes for f in fields) if fixed else None
        self._field_offsets = np.cumsum([self._header_size] + [f.row_nbytes for f in fields])[:-1].tolist()

    def _open_checked(self, fd: int, st: os.stat_result) -> _Handle:
        try:
            env = _acquire_env(self.path, st)
        except lmdb.Error as e:
            raise CorruptShardError(f"{self._where()}: not a readable LMDB file ({e})") from None
        try:
            with no_fork_during():
                self._check_meta(env, st.st_size)
                with env.begin() as txn:
                    raw = txn.get(SHARD_KEY)
            self._check_shard_record(raw)
        except lmdb.Error as e:
            _release_env(env)
            raise CorruptShardError(f"{self._where()}: not a readable LMDB file ({e})") from None
        except BaseException:
            _release_env(env)
            raise
        return _Handle(env, fd)

    def _check_meta(self, env: lmdb.Environment, size: int) -> None:
        """liblmdb refuses page numbers past its last page but trusts that page to lie in the file:
        check it, so a bad page number is an error rather than a SIGBUS."""
        pages = env.info()["last_pgno"] + 1
        psize = env.stat()["psize"]
        if pages * psize > size:
            raise CorruptShardError(f"{self._where()}: LMDB says it has {pages} pages of {psize} bytes, "
                                    f"more than the file's {size} bytes")

    def _check_shard_record(self, raw: bytes | None) -> None:
        """The shard's own description (``raw``) must match the manifest's (absent in older shards)."""
        if raw is None or raw == shard_record(self.all_fields, self.info.stored_start, self.info.count):
            return
        try:
            got: Any = json.loads(raw) if len(raw) <= _MAX_SHARD_RECORD else None
            start, count = got["start"], got["count"]
        except (ValueError, TypeError, KeyError, RecursionError):
            raise CorruptShardError(f"{self._where()}: unreadable shard description") from None
        if (start, count) != (self.info.stored_start, self.info.count):
            raise CorruptShardError(
                f"{self._where()}: holds samples {start}..{start + count - 1}, the manifest says "
                f"{self.info.stored_start}..{self.info.stored_start + self.info.count - 1} (a shard of another dataset, or renamed?)"
            )
        raise CorruptShardError(f"{self._where()}: was written with another schema than the manifest's")

    @staticmethod
    def _close_handle(handle: _Handle) -> None:
        os.close(handle.fd)
        _release_env(handle.env)

    def _after_fork_in_child(self) -> None:
        # The environment registry closes the parent's environments in the child itself.
        handle = self._forget()
        if handle is not None:
            os.close(handle.fd)

    def _layout(self, buf: memoryview | bytes, local: int) -> list[tuple[int, int]]:
        """(offset, nbytes) of each field in one record, after checking its header."""
        where = self._where(local)
        if len(buf) < self._header_size or buf[:4] != MAGIC:
            raise CorruptShardError(f"{where}: bad record header")
        if self._record_size is not None:
            if buf[: self._header_size] != self._expected_header:
                raise CorruptShardError(f"{where}: record header does not match the schema")
            sizes = [f.row_nbytes for f in self.all_fields]
        else:
            (n,) = struct.unpack_from("<I", buf, 4)
            if n != len(self.all_fields):
                raise CorruptShardError(f"{where}: record has {n} fields, the schema {len(self.all_fields)}")
            sizes = list(struct.unpack_from(self._sizes_fmt, buf, 8))
            for f, s in zip(self.all_fields, sizes):
                if f.compression is not None:
                    whole = s >= blosc_codec.HEADER_BYTES  # the Blosc header is checked when decoded
                elif f.ragged:
                    whole = s % f.row_nbytes == 0 if f.row_nbytes else s == 0
                else:
                    whole = s == f.row_nbytes
                if not whole:
                    raise CorruptShardError(f"{where}: field {f.name!r} has {s} bytes, not a whole sample")
        out, pos = [], self._header_size
        for s in sizes:
            out.append((pos, s))
            pos += s
        if pos != len(buf):
            raise CorruptShardError(f"{where}: record is {len(buf)} bytes, its header says {pos}")
        return out

    def _get(self, txn: lmdb.Transaction, local: int) -> memoryview | bytes:
        buf = txn.get(key(self.info.stored_start + local))
        if buf is None:
            raise CorruptShardError(f"{self._where(local)}: record is missing")
        return buf

    @contextmanager
    def _txn(self, local: np.ndarray) -> Iterator[lmdb.Transaction]:
        """A read transaction (values are buffers into the map), the file checked unchanged first (LMDB reads
        through a memory map: a truncated file would be SIGBUS), with no fork while it is open (no_fork_during);
        an LMDB error in it is a CorruptShardError naming the shard."""
        h = self.handle()
        self._check_unchanged(h.fd, local)
        try:
            with no_fork_during(), h.env.begin(buffers=True) as txn:
                yield txn
        except lmdb.Error as e:
            raise CorruptShardError(f"{self._where()}: LMDB read failed ({e})") from None

    def _get_many(self, txn: lmdb.Transaction, local: np.ndarray) -> list[memoryview | bytes]:
        """Records ``local`` in order (buffers into the map); a missing one raises, named. (A loop of ``get`` is
        faster than one ``getmulti``, which builds a tuple per record.)"""
        raw = (local.astype(np.int64) + self.info.stored_start).astype(">u8").tobytes()  # the records' keys
        get = txn.get
        found = [get(raw[k : k + 8]) for k in range(0, len(raw), 8)]
        if None in found:
            for l in local.tolist():
                self._get(txn, l)  # raises for the first one missing
        return found  # type: ignore[return-value]

    def copy_phase(self, name: str) -> int:
        """Large fixed-size records each start at the same offset into their own pages of LMDB's map:
        the phase of the first record's field there (0 for small records, which are gathered)."""
        if self._record_size is None or self._record_size <= _GATHER_RECORD_BYTES or self.info.count == 0:
            return 0
        with self._txn(np.zeros(1, dtype=np.int64)) as txn:
            start = np.frombuffer(self._get(txn, 0), dtype=np.uint8).ctypes.data
        return (start + self._field_offsets[self._index[name]]) % 64

    def records(self) -> RecordIndex:
        """The layout of every record of this shard: the schema's for fixed-size records, else built once per
        process from each record's header (a bad record raises when it is read)."""
        h = self.handle()
        if h.index is not None:
            return h.index
        with h.lock:
            if h.index is None:
                h.index = self._build_index(h)
        return h.index

    def _build_index(self, h: _Handle) -> RecordIndex:
        """Every record's layout, from one cursor pass over the shard (from the schema if fixed)."""
        n = self.info.count
        if self._record_size is not None:
            row = np.array([f.row_nbytes for f in self.all_fields], dtype=np.int64)
            total = np.full(n, self._record_size, dtype=np.int64)
            return RecordIndex(sizes=np.broadcast_to(row, (n, len(row))), total=total, bad={})
        sizes = np.zeros((n, len(self.all_fields)), dtype=np.int64)
        total = np.full(n, -1, dtype=np.int64)
        bad: dict[int, str] = {}
        # small fixed fields (labels, image shapes) are kept whole: a batch reads them without records
        small = {i: np.zeros((n, f.row_nbytes), dtype=np.uint8) for i, f in enumerate(self.all_fields)
                 if not f.ragged and f.compression is None and 0 < f.row_nbytes <= _SMALL_FIELD_BYTES}
        with self._txn(np.zeros(1, dtype=np.int64)) as txn, txn.cursor() as cur:
            ok = cur.set_range(key(self.info.stored_start))
            while ok:
                k = bytes(cur.key())
                local = KEY.unpack(k)[0] - self.info.stored_start if len(k) == 8 else -1
                if not 0 <= local < n:
                    break
                buf = cur.value()
                try:
                    layout = self._layout(buf, local)
                except CorruptShardError as e:
                    bad[local] = str(e)
                else:
                    sizes[local] = [s for _, s in layout]
                    total[local] = len(buf)
                    for i, col in small.items():
                        col[local] = np.frombuffer(buf, np.uint8, col.shape[1], layout[i][0])
                ok = cur.next()
        for local in np.flatnonzero(total < 0).tolist():
            bad.setdefault(local, f"{self._where(local)}: record is missing")
        values = {i: col.view(self.all_fields[i].np_dtype).reshape((n, *self.all_fields[i].trailing))
                  for i, col in small.items()}
        return RecordIndex(sizes=sizes, total=total, bad=bad, small=values)

    def _check_good(self, ix: RecordIndex, local: np.ndarray) -> None:
        if ix.bad:
            broken = ix.total[local] < 0
            if broken.any():
                raise CorruptShardError(ix.bad[int(local[np.argmax(broken)])])

    def lengths(self, name: str, local: np.ndarray) -> np.ndarray:
        i = self._index[name]
        f = self.all_fields[i]
        ix = self.records()
        self._check_good(ix, local)
        return ix.sizes[local, i] // f.row_nbytes if f.row_nbytes else np.zeros(len(local), dtype=np.int64)

    def read_into(self, local: np.ndarray, dest: np.ndarray, outs: dict[str, np.ndarray],
                  layouts: dict[str, Layout] | None = None) -> None:
        """Sample ``local[k]`` goes to row ``dest[k]`` of each array in ``outs``; ragged fields as
        :class:`RaggedOut` places them (``layouts``: per ragged field, image shapes or a packed layout)."""
        if self._record_size is not None and self._record_size <= _GATHER_RECORD_BYTES:
            self._read_small(local, dest, outs)
            return
        ix = self.records()
        self._check_good(ix, local)
        lens = ix.sizes[local]
        starts = self._header_size + np.cumsum(lens, axis=1) - lens
        plan: list[tuple[Any, ...]] = []
        for name, out in outs.items():
            i = self._index[name]
            f = self.all_fields[i]
            if i in ix.small:
                out[dest] = ix.small[i][local]  # no record needed
                continue
            offs, sizes = starts[:, i].tolist(), lens[:, i].tolist()
            if f.ragged:
                plan.append((offs, sizes, None, RaggedOut(out, (layouts or {}).get(f.name)), None, None))
            elif f.compression is not None:
                plan.append((offs, sizes, None, _Decoder(self, f, out, local, dest), None, None))
            else:
                plan.append((offs, sizes, out, None, f.np_dtype, f.trailing))
        if not plan:
            return
        totals = ix.total[local].tolist()
        hs = self._header_size
        heads = self._headers_of(lens).tobytes()
        with self._txn(local) as txn:
            bufs = self._get_many(txn, local)
            if [len(b) for b in bufs] != totals or b"".join(b[:hs] for b in bufs) != heads:
                for k, (l, buf) in enumerate(zip(local.tolist(), bufs)):  # find it, and name what is wrong
                    if len(buf) != totals[k] or buf[:hs] != heads[k * hs : (k + 1) * hs]:
                        self._layout(buf, l)
                        raise CorruptShardError(f"{self._where(l)}: record changed while the shard was open")
            for k, (d, buf) in enumerate(zip(dest.tolist(), bufs)):
                for offs, sizes, out, placer, dtype, shape in plan:
                    off, size = offs[k], sizes[k]
                    if placer is not None:  # copies out before the transaction ends
                        placer.put(d, buf, off, size)
                    else:
                        out[d] = np.frombuffer(buf, dtype=dtype, count=size // dtype.itemsize, offset=off).reshape(shape)

    def ranges(self, local: np.ndarray, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The byte ranges of this file holding records ``local``: none, as LMDB alone knows where its
        records lie (so read-ahead hints nothing for LMDB shards)."""
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)

    def _headers_of(self, sizes: np.ndarray) -> np.ndarray:
        """The header bytes (k, header size) that records with these payload sizes (k, fields) carry."""
        out = np.empty((len(sizes), self._header_size), dtype=np.uint8)
        out[:, :8] = np.frombuffer(MAGIC + struct.pack("<I", len(self.all_fields)), dtype=np.uint8)
        out[:, 8:] = np.ascontiguousarray(sizes, dtype="<u8").view(np.uint8).reshape(len(sizes), -1)
        return out

    def _read_small(self, local: np.ndarray, dest: np.ndarray, outs: dict[str, np.ndarray]) -> None:
        """Fixed-layout small records: fetched together (``_get_many``), headers checked vectorised."""
        size = self._record_size
        assert size is not None
        with self._txn(local) as txn:
            bufs = self._get_many(txn, local)  # buffers into the map: sizes are checked before a copy
            if any(len(v) != size for v in bufs):
                for l, v in zip(local.tolist(), bufs):  # find and name the bad record
                    self._layout(v, l)
                raise CorruptShardError(f"{self._where()}: records of the wrong size")
            joined = b"".join(bufs)
        rec = np.frombuffer(joined, dtype=np.uint8).reshape(len(local), size)
        head = np.frombuffer(self._expected_header, dtype=np.uint8)
        bad = np.flatnonzero((rec[:, : self._header_size] != head).any(axis=1))
        if len(bad):
            raise CorruptShardError(f"{self._where(int(local[bad[0]]))}: record header does not match the schema")
        for name, out in outs.items():
            i = self._index[name]
            f = self.all_fields[i]
            off = self._field_offsets[i]
            col = rec[:, off : off + f.row_nbytes].view(f.np_dtype).reshape((len(local), *f.trailing))
            out[dest] = col


__all__ = ["EXTENSION", "ShardReader", "ShardWriter", "parse_compression"]
