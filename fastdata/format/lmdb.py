"""LMDB shards: one environment file per shard, one record per sample.

Key: the sample's global index as an 8-byte big-endian unsigned integer, so keys sort
in sample order and are written with ``append=True``.

Record (all integers little-endian; see docs/format.md)::

    offset 0        magic   b"FDR1"
    offset 4        u32     number of fields n (equals the manifest's field count)
    offset 8        n x u64 payload size in bytes of each field, in manifest order
    offset 8 + 8n   payloads, concatenated: each field's array in C order, in its dtype

A ragged field's first-axis length is its payload size divided by the row size. A compressed
field's payload (``"compression": "blosc"`` in the manifest) is one Blosc buffer holding the sample
(fastdata/format/codec.py); its size in the header is the stored size.
Every record header is checked against the schema before any byte is copied. Large records
(over 64 KiB) are copied from the reader's own map of the file once their place is known
(:class:`_Located`: from LMDB's B-tree pages when the shard is opened, fastdata/format/lmdbtree.py); each such read first compares the record's header in the map with the one
its first read through LMDB found.

One more record, under the key ``SHARD_KEY`` (all bits set, after every sample), describes
the shard as JSON: its first sample, its count and the schema. A reader compares it with the
manifest when it opens the shard, so a shard of another dataset, or one renamed, is refused.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from ..errors import CorruptShardError, UsageError
from . import codec as blosc_codec
from . import lmdbtree
from .shardio import Layout, RaggedOut, ShardReaderBase
from .spec import FieldSpec, ShardInfo

EXTENSION = ".lmdb"
MAGIC = b"FDR1"
SHARD_KEY = b"\xff" * 8  # the shard's own description; sorts after every sample key
_MAX_SHARD_RECORD = 1 << 20
_COMMIT_BYTES = 64 << 20
_GATHER_RECORD_BYTES = 64 << 10
_SMALL_FIELD_BYTES = 64  # fixed fields up to this size per sample are kept in a shard's record index  # smaller fixed-layout records are fetched with one getmulti
_KEY = struct.Struct(">Q")
_TAIL_GUARD_MIN = 192 << 10  # > the 64 KiB an in-page offset can reach, plus a 64 KiB key size


# py-lmdb refuses to open a file that this process already has open, so every reader of one
# shard file shares one environment: reference-counted, keyed by the file's identity (a file
# replaced at the same path is a new file). A forked child closes the parent's copies.
_envs_lock = threading.RLock()  # reentrant: a finalizer (GC) may release an environment mid-acquire
_envs: dict[tuple[int, int], list[Any]] = {}  # (st_dev, st_ino) -> [environment, users]


def _acquire_env(path: Path, st: os.stat_result) -> lmdb.Environment:
    key = (st.st_dev, st.st_ino)
    with _envs_lock:
        entry = _envs.get(key)
        if entry is None:
            env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=False,
                            meminit=False, max_readers=1024, max_dbs=0)
            entry = _envs[key] = [env, 0]
        entry[1] += 1
        return entry[0]


def _release_env(env: lmdb.Environment) -> None:
    with _envs_lock:
        for key, entry in list(_envs.items()):
            if entry[0] is env:
                entry[1] -= 1
                if entry[1] <= 0:
                    del _envs[key]
                    env.close()
                return


def _reset_envs_in_child() -> None:
    global _envs_lock
    _envs_lock = threading.RLock()  # another thread may have held it at fork time
    for env, _ in _envs.values():
        try:
            env.close()
        except lmdb.Error:
            pass
    _envs.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_envs_in_child)


def parse_compression(value: str | None) -> blosc_codec.Codec | None:
    """``none``, or ``lz4[:N]`` | ``zstd[:N]`` (per field, fastdata/format/codec.py) -> the codec."""
    if value in (None, "", "none"):
        return None
    codec = blosc_codec.parse(value)
    if codec is None:
        raise UsageError(f"--compression {value} is not supported for LMDB shards (use none, lz4, lz4:1-9, zstd "
                         "or zstd:1-9; lzf and gzip are HDF5 only)")
    return codec


def key(index: int) -> bytes:
    return _KEY.pack(index)


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
    """Zero bytes appended after LMDB's last page (see docs/format.md, "LMDB shards")."""
    return -(-max(_TAIL_GUARD_MIN, largest_record) // psize) * psize


def _add_tail_guard(path: Path, psize: int, largest_record: int) -> None:
    """liblmdb reads wherever an in-page offset or a value size points, checking only page numbers.
    With this zeroed tail (sparse on disk), a corrupted offset or a value on one of the last pages
    stays inside the file instead of running past its end into a SIGBUS."""
    with open(path, "r+b") as f:
        end = f.seek(0, os.SEEK_END)
        f.truncate(end + tail_guard_bytes(psize, largest_record))
        f.flush()
        os.fsync(f.fileno())


class ShardWriter:
    """Writes one LMDB shard; the map grows on demand, so ``MapFullError`` never reaches the user."""

    def __init__(
        self,
        path: Path,
        fields: list[FieldSpec],
        count: int,
        ragged_rows: dict[str, int],
        compression: str | None = None,
        start: int = 0,
    ) -> None:
        self._codec = parse_compression(compression)
        if any(f.compression is not None for f in fields) and self._codec is None:
            raise ValueError(f"compressed fields need --compression lz4 or zstd, not {compression!r}")
        self.path = Path(path)
        self.fields = fields
        self.count = count
        self.start = start
        payload = sum(f.row_nbytes * (ragged_rows[f.name] if f.ragged else count) for f in fields)
        self.grows = 0  # times the map was enlarged (the estimate below was too small)
        self._env = lmdb.open(
            str(self.path), subdir=False, map_size=initial_map_size(payload, count, len(fields)), metasync=False,
            sync=False, readahead=False, max_dbs=0, lock=True,
        )
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._largest = 0
        self._n = 0

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
                with self._env.begin(write=True) as txn:
                    with txn.cursor() as cur:
                        cur.putmulti(self._pending, append=True)
                break
            except lmdb.MapFullError:
                size = self._env.info()["map_size"]
                self._env.set_mapsize(max(size * 2, size + 4 * self._pending_bytes))
                self.grows += 1
        self._pending.clear()
        self._pending_bytes = 0

    def close(self) -> None:
        if self._env is None:
            return
        try:
            if self._n != self.count:
                raise ValueError(f"shard got {self._n} samples, planned {self.count}")
            self._pending.append((SHARD_KEY, shard_record(self.fields, self.start, self.count)))
            self._commit()
            self._env.sync(True)
            psize = self._env.stat()["psize"]
        finally:
            self._release()
        _add_tail_guard(self.path, psize, self._largest)

    def _release(self) -> None:
        self._env.close()
        self._env = None  # type: ignore[assignment]  # closed: the writer is finished
        Path(str(self.path) + "-lock").unlink(missing_ok=True)

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        elif self._env is not None:
            self._release()


@dataclass
class _Index:
    """Every record's layout in one shard, read once per process (schemas with ragged fields):
    reading a batch then needs no per-sample header parsing, only a length check per record."""

    sizes: np.ndarray  # (count, fields) int64: payload bytes of each field
    offsets: np.ndarray  # (count, fields) int64: where each payload starts in its record
    total: np.ndarray  # (count,) int64: record length; -1 for a record that failed its checks
    bad: dict[int, str]  # local index -> what is wrong with that record
    small: dict[int, np.ndarray] = field(default_factory=dict)  # field index -> its values (small fixed fields)


class _Located:
    """Where each record of one shard lies in the file, learned the first time it is read through
    LMDB (or, for schemas with ragged fields, when the record index is built), and this process's
    own read-only map of the file to copy it from.

    py-lmdb touches every page of a value it returns (to take page faults without the GIL); a
    record whose place is known is copied straight from the map instead, like an HDF5 column:
    batches of 196 KB records faster on 2 threads (``benchmarks/bench_choices.py``, choice 5). Linux only: LMDB's own
    mapping of the file is found in ``/proc/self/maps`` to turn a value's address into its offset.
    """

    def __init__(self, fd: int, count: int) -> None:
        st = os.fstat(fd)
        self.inode = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
        self.mem = np.frombuffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ), dtype=np.uint8)
        self.mv = memoryview(self.mem)  # type: ignore[arg-type]
        self.offsets = np.full(count, -1, dtype=np.int64)  # -1: not read yet in this process
        self.sizes: np.ndarray | None = None  # every record's size, when its place came from the tree
        self._lmdb_map: tuple[int, int, int] | None = None  # start, end, file offset of start
        # LMDB's map not found in /proc/self/maps (a filesystem that names another device or inode
        # there than fstat does): looked up once, then records are read through LMDB as before
        self.lost = False

    def note(self, local: int, buf: memoryview | bytes) -> None:
        """Record ``local`` is ``buf`` (a value LMDB returned): remember where it lies in the file."""
        if self.lost:
            return
        off = self.offset_of(np.frombuffer(buf, dtype=np.uint8).ctypes.data)
        if off is not None and 0 <= off <= len(self.mem) - len(buf):
            self.offsets[local] = off

    def offset_of(self, address: int) -> int | None:
        """The file offset of ``address`` inside LMDB's map of this file (None if not found)."""
        m = self._lmdb_map
        if m is None or not m[0] <= address < m[1]:
            m = self._find_map(address)
            if m is None:
                self.lost = True
                return None
            self._lmdb_map = m
        return address - m[0] + m[2]

    def _find_map(self, address: int) -> tuple[int, int, int] | None:
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    parts = line.split()
                    if len(parts) < 5:
                        continue
                    lo, hi = (int(v, 16) for v in parts[0].split("-"))
                    major, minor = (int(v, 16) for v in parts[3].split(":"))
                    if lo <= address < hi and (major, minor, int(parts[4])) == self.inode:
                        return lo, hi, int(parts[2], 16)
        except (OSError, ValueError):
            pass
        return None


class _Decoder:
    """Places a compressed field's record bytes into the batch: a Blosc decode into row ``d``."""

    def __init__(self, reader: "ShardReader", f: FieldSpec, out: np.ndarray, local: np.ndarray, dest: np.ndarray) -> None:
        self.reader, self.field, self.out = reader, f, out
        self.local = dict(zip(dest.tolist(), local.tolist()))  # batch row -> sample, for error messages

    def put(self, d: int, src: memoryview | bytes, off: int, n: int) -> None:
        where = f"{self.reader._where(self.local[d])}: field {self.field.name!r}"
        blosc_codec.decode_into(memoryview(src)[off : off + n], self.out[d], where)


@dataclass
class _Handle:
    env: lmdb.Environment
    fd: int  # the same file, for a cheap size check before each read
    index: _Index | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    located: _Located | None = None  # where records lie in the file (Linux)


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
            self._check_meta(env, st.st_size)
            self._check_shard_record(env)
            located = None  # (small records are read through LMDB: their places serve read-ahead only)
            if sys.platform.startswith("linux"):
                try:
                    located = _Located(fd, self.info.count)
                except (OSError, ValueError):  # no second map (address space, limits): read through LMDB
                    located = None
                if located is not None:
                    self._locate_all(env, fd, located)
        except BaseException:
            _release_env(env)
            raise
        return _Handle(env, fd, located=located)

    def _locate_all(self, env: lmdb.Environment, fd: int, loc: _Located) -> None:
        """Every record's place from the B-tree pages (fastdata/format/lmdbtree.py), kept only if the
        first record's place agrees with what LMDB itself returns: a cold first epoch then reads
        records from the map (and read-ahead hints them) instead of page by page through LMDB."""
        n = self.info.count
        if n == 0:
            return
        try:
            offs, sizes = lmdbtree.record_offsets(fd, env.stat()["psize"], self.info.stored_start, n)
            with env.begin(buffers=True) as txn:
                buf = txn.get(key(self.info.stored_start))
                check = None if buf is None else loc.offset_of(np.frombuffer(buf, dtype=np.uint8).ctypes.data)
                first_size = 0 if buf is None else len(buf)
        except (lmdbtree.LayoutUnknown, lmdb.Error, OSError, struct.error):
            return
        if check is None or check != offs[0] or first_size != sizes[0] or (offs < 0).any() or \
                (offs + sizes > len(loc.mem)).any():
            return
        loc.offsets[:] = offs
        loc.sizes = sizes

    def _check_meta(self, env: lmdb.Environment, size: int) -> None:
        """liblmdb refuses page numbers past its last page but trusts that page to lie in the file:
        check it, so a bad page number is an error rather than a SIGBUS."""
        try:
            pages = env.info()["last_pgno"] + 1
            psize = env.stat()["psize"]
        except lmdb.Error as e:
            raise CorruptShardError(f"{self._where()}: not a readable LMDB file ({e})") from None
        if pages * psize > size:
            raise CorruptShardError(f"{self._where()}: LMDB says it has {pages} pages of {psize} bytes, "
                                    f"more than the file's {size} bytes")

    def _check_shard_record(self, env: lmdb.Environment) -> None:
        """The shard's own description must match the manifest's (absent in older shards)."""
        try:
            with env.begin() as txn:
                raw = txn.get(SHARD_KEY)
        except lmdb.Error as e:
            raise CorruptShardError(f"{self._where()}: LMDB read failed ({e})") from None
        if raw is None:
            return
        want = shard_record(self.all_fields, self.info.stored_start, self.info.count)
        if raw == want:
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
        handle.located = None  # its map goes with the last array still copying from it
        os.close(handle.fd)
        _release_env(handle.env)

    def _after_fork_in_child(self) -> None:
        # The environment registry closes the parent's environments in the child itself.
        handle = self._forget()
        if handle is not None:
            os.close(handle.fd)

    def _env(self, local: np.ndarray) -> lmdb.Environment:
        """This process's environment, after checking that the file was not truncated since it was
        opened: LMDB reads through a memory map, where a truncated file means SIGBUS, not an error."""
        h = self.handle()
        self._check_unchanged(h.fd, local)
        return h.env

    def _layout(self, buf: memoryview | bytes, local: int, total: int | None = None) -> list[tuple[int, int]]:
        """(offset, nbytes) of each field in one record, after checking the header (``buf`` may hold
        the header only when ``total`` gives the record's length)."""
        where = self._where(local)
        total = len(buf) if total is None else total
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
        if pos != total:
            raise CorruptShardError(f"{where}: record is {total} bytes, its header says {pos}")
        return out

    def _get(self, txn: lmdb.Transaction, local: int) -> memoryview | bytes:
        try:
            buf = txn.get(key(self.info.stored_start + local))
        except lmdb.Error as e:
            raise CorruptShardError(f"{self._where(local)}: LMDB read failed ({e})") from None
        if buf is None:
            raise CorruptShardError(f"{self._where(local)}: record is missing")
        return buf

    def copy_phase(self, name: str) -> int:
        """Where (mod 64 bytes) each sample of fixed field ``name`` starts in LMDB's memory map:
        large records lie at a fixed offset into their own pages (0 for gathered small records)."""
        if self._record_size is None or self._record_size <= _GATHER_RECORD_BYTES or self.info.count == 0:
            return 0
        with self._env(np.zeros(1, dtype=np.int64)).begin(buffers=True) as txn:
            start = np.frombuffer(self._get(txn, 0), dtype=np.uint8).ctypes.data
        return (start + self._field_offsets[self._index[name]]) % 64

    def records(self) -> _Index:
        """The layout of every record of this shard, built on first use in each process by reading
        each record's header once; a bad record is remembered and raises when it is read."""
        h = self.handle()
        if h.index is not None:
            return h.index
        with h.lock:
            if h.index is None:
                h.index = self._build_index(h)
        return h.index

    def _build_index(self, h: _Handle) -> _Index:
        n, nf, hs = self.info.count, len(self.all_fields), self._header_size
        sizes = np.zeros((n, nf), dtype=np.int64)
        total = np.full(n, -1, dtype=np.int64)
        bad: dict[int, str] = {}
        # small fixed fields (labels, image shapes) are kept whole: a batch reads them without records
        small = {i: np.zeros((n, *f.trailing), dtype=f.np_dtype).view(np.uint8).reshape(n, f.row_nbytes)
                 for i, f in enumerate(self.all_fields) if not f.ragged and 0 < f.row_nbytes <= _SMALL_FIELD_BYTES}
        first = key(self.info.start)
        loc = self._located()
        self._check_unchanged(h.fd, np.zeros(1, dtype=np.int64))
        if loc is not None and loc.sizes is not None:  # places known: read only the headers (and small fields)
            for local, (o, size) in enumerate(zip(loc.offsets.tolist(), loc.sizes.tolist())):
                # pread, not the map: a fault there would read the kernel's read-around window (MBs) per header
                head = os.pread(h.fd, min(size, hs), o)
                try:
                    layout = self._layout(head, local, size)
                except CorruptShardError as e:
                    bad[local] = str(e)
                    continue
                sizes[local] = [s for _, s in layout]
                total[local] = size
                for i, col in small.items():
                    off, nb = layout[i]
                    col[local] = np.frombuffer(os.pread(h.fd, nb, o + off), np.uint8, col.shape[1])
        else:
            self._index_through_lmdb(h, first, n, sizes, total, bad, small, loc)
        for local in np.flatnonzero(total < 0).tolist():
            bad.setdefault(local, f"{self._where(local)}: record is missing")
        offsets = hs + np.cumsum(sizes, axis=1) - sizes
        values = {i: col.view(self.all_fields[i].np_dtype).reshape((n, *self.all_fields[i].trailing))
                  for i, col in small.items()}
        return _Index(sizes=sizes, offsets=offsets, total=total, bad=bad, small=values)

    def _index_through_lmdb(self, h: _Handle, first: bytes, n: int, sizes: np.ndarray, total: np.ndarray,
                            bad: dict[int, str], small: dict[int, np.ndarray], loc: _Located | None) -> None:
        """Fill the record index with a cursor over the shard (reads every record: a slow cold pass)."""
        try:
            with h.env.begin(buffers=True) as txn, txn.cursor() as cur:
                ok = cur.set_range(first)
                while ok:
                    k = bytes(cur.key())
                    if len(k) != 8:
                        break
                    local = _KEY.unpack(k)[0] - self.info.start
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
                        if loc is not None:
                            loc.note(local, buf)
                        for i, col in small.items():
                            col[local] = np.frombuffer(buf, np.uint8, col.shape[1], layout[i][0])
                    ok = cur.next()
        except lmdb.Error as e:
            raise CorruptShardError(f"{self._where()}: LMDB read failed ({e})") from None

    def _check_good(self, ix: _Index, local: np.ndarray) -> None:
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
        :class:`RaggedOut` places them (``layouts``: per ragged field, image shapes of ``pixels`` fields or a packed layout)."""
        if self._record_size is not None and self._record_size <= _GATHER_RECORD_BYTES:
            self._read_small(local, dest, outs)
            return
        wanted = [(self._index[name], self.all_fields[self._index[name]], out) for name, out in outs.items()]
        if self._record_size is not None:
            self._read_fixed(local, dest, wanted)
            return
        ix = self.records()
        self._check_good(ix, local)
        totals = ix.total[local].tolist()
        plan: list[tuple[Any, ...]] = []
        for i, f, out in wanted:
            if i in ix.small:
                out[dest] = ix.small[i][local]  # no record needed
                continue
            offs, sizes = ix.offsets[local, i].tolist(), ix.sizes[local, i].tolist()
            if f.ragged:
                plan.append((offs, sizes, None, RaggedOut(out, (layouts or {}).get(f.name)), None, None))
            elif f.compression is not None:
                plan.append((offs, sizes, None, _Decoder(self, f, out, local, dest), None, None))
            else:
                plan.append((offs, sizes, out, None, f.np_dtype, f.trailing))
        if not plan:
            return
        loc = self._located()
        if loc is not None:  # every record was located when the index was built (checked there)
            self._check_unchanged(self.handle().fd, local)
            starts = loc.offsets[local]
            if (starts >= 0).all():
                self._check_mapped_headers(loc.mem, starts, local, self._headers_of(ix.sizes[local]))
                mv = loc.mv
                for k, (o, d) in enumerate(zip(starts.tolist(), dest.tolist())):
                    for offs, sizes, out, placer, dtype, shape in plan:
                        off, size = o + offs[k], sizes[k]
                        if placer is not None:
                            placer.put(d, mv, off, size)
                        else:
                            out[d] = np.frombuffer(mv, dtype=dtype, count=size // dtype.itemsize, offset=off).reshape(shape)
                return
        heads = self._headers_of(ix.sizes[local])
        with self._env(local).begin(buffers=True) as txn:
            for k, (l, d) in enumerate(zip(local.tolist(), dest.tolist())):
                buf = self._get(txn, l)
                if len(buf) != totals[k] or buf[: self._header_size] != heads[k].tobytes():
                    self._layout(buf, l)  # raises, naming what is wrong
                    raise CorruptShardError(f"{self._where(l)}: record changed while the shard was open")
                for offs, sizes, out, placer, dtype, shape in plan:
                    off, size = offs[k], sizes[k]
                    if placer is not None:  # copies out before the transaction ends
                        placer.put(d, buf, off, size)
                    else:
                        out[d] = np.frombuffer(buf, dtype=dtype, count=size // dtype.itemsize, offset=off).reshape(shape)

    def ranges(self, local: np.ndarray, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The byte ranges (starts, lengths) of this file holding records ``local``, where known
        (what fastdata.readahead hints to the kernel): records whose place this process has learned
        (every record once a schema with ragged or compressed fields has built its index)."""
        loc = self._located()
        if loc is None:  # checked first: records() can be a whole cursor pass
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        if self._record_size is None:
            total = self.records().total[local]
        else:
            total = np.full(len(local), self._record_size, dtype=np.int64)
        starts = loc.offsets[local]
        known = (starts >= 0) & (total > 0)
        return starts[known], total[known]

    def _read_fixed(self, local: np.ndarray, dest: np.ndarray, wanted: list[tuple[int, FieldSpec, np.ndarray]]) -> None:
        """Fixed-layout records: one header comparison per record, then straight copies."""
        hs, size, head = self._header_size, self._record_size, self._expected_header
        loc = self._located()
        if loc is not None:
            self._check_unchanged(self.handle().fd, local)
            offs = loc.offsets[local]
            if (offs < 0).any():
                self._locate(loc, local[offs < 0])
                offs = loc.offsets[local]
            if (offs >= 0).all():
                mem = loc.mem
                self._check_mapped_headers(mem, offs, local, np.frombuffer(head, dtype=np.uint8)[None, :])
                rows = [(self._field_offsets[i], f.row_nbytes, out.reshape(-1).view(np.uint8).reshape(len(out), f.row_nbytes))
                        for i, f, out in wanted if f.row_nbytes]  # out: C-contiguous (Dataset checks)
                for o, d in zip(offs.tolist(), dest.tolist()):
                    for off, rb, r in rows:
                        r[d] = mem[o + off : o + off + rb]
                return
        plan = [(self._field_offsets[i], f.np_dtype, math.prod(f.trailing), f.trailing, out) for i, f, out in wanted]
        with self._env(local).begin(buffers=True) as txn:
            for l, d in zip(local.tolist(), dest.tolist()):
                buf = self._get(txn, l)
                if len(buf) != size or buf[:hs] != head:
                    self._layout(buf, l)  # raises, naming what is wrong
                for off, dtype, count, shape, out in plan:
                    out[d] = np.frombuffer(buf, dtype=dtype, count=count, offset=off).reshape(shape)

    def _headers_of(self, sizes: np.ndarray) -> np.ndarray:
        """The header bytes (k, header size) that records with these payload sizes (k, fields) carry."""
        out = np.empty((len(sizes), self._header_size), dtype=np.uint8)
        out[:, :8] = np.frombuffer(MAGIC + struct.pack("<I", len(self.all_fields)), dtype=np.uint8)
        out[:, 8:] = np.ascontiguousarray(sizes, dtype="<u8").view(np.uint8).reshape(len(sizes), -1)
        return out

    def _check_mapped_headers(self, mem: np.ndarray, offs: np.ndarray, local: np.ndarray,
                              expected: np.ndarray) -> None:
        """Compare each record's header in the map with what its first read found (through LMDB, or
        from the map when the places came from the B-tree; for fixed records: the schema's header):
        a record rewritten in place since then raises instead of being copied."""
        found = mem[offs[:, None] + np.arange(self._header_size)]
        bad = np.flatnonzero((found != expected).any(axis=1))
        if len(bad):
            loc = self._located()
            l = int(local[bad[0]])
            if loc is not None and loc.sizes is not None:  # placed from the tree, perhaps never read: say what is wrong
                try:
                    with self._env(local).begin(buffers=True) as txn:
                        self._layout(self._get(txn, l), l)
                except CorruptShardError as e:
                    detail = str(e)[len(self._where(l)) + 2 :]
                    raise CorruptShardError(f"{self._where(l)}: record header changed since this process opened "
                                            f"the shard, or damaged: {detail}") from None
            raise CorruptShardError(f"{self._where(int(local[bad[0]]))}: record header changed since this "
                                    "process first read it (the shard was rewritten in place?)")

    def _located(self) -> _Located | None:
        """This process's :class:`_Located` (Linux, records not gathered by getmulti), else None."""
        loc = self.handle().located
        return None if loc is None or loc.lost else loc

    def _locate(self, loc: _Located, local: np.ndarray) -> None:
        """Read records ``local`` through LMDB once: check each header and note where it lies."""
        size, hs, head = self._record_size, self._header_size, self._expected_header
        with self._env(local).begin(buffers=True) as txn:
            for l in local.tolist():
                buf = self._get(txn, l)
                if len(buf) != size or buf[:hs] != head:
                    self._layout(buf, l)  # raises, naming what is wrong
                loc.note(l, buf)

    def _read_small(self, local: np.ndarray, dest: np.ndarray, outs: dict[str, np.ndarray]) -> None:
        """Fixed-layout small records: one ``getmulti`` and vectorised header checks."""
        raw = (local.astype(np.int64) + self.info.stored_start).astype(">u8").tobytes()
        keys = [raw[k : k + 8] for k in range(0, len(raw), 8)]
        size = self._record_size
        assert size is not None
        try:
            with self._env(local).begin(buffers=True) as txn:
                found = txn.cursor().getmulti(keys)  # buffers into the map: sizes are checked before a copy
                ok = len(found) == len(keys) and all(len(v) == size for _, v in found)
                joined = b"".join(v for _, v in found) if ok else b""
        except lmdb.Error as e:
            raise CorruptShardError(f"{self._where()}: LMDB read failed ({e})") from None
        if not ok:
            with self._env(local).begin(buffers=True) as txn:  # find and name the bad record
                for l in local.tolist():
                    self._layout(self._get(txn, l), l)
            raise CorruptShardError(f"{self._where()}: records missing or of the wrong size")
        rec = np.frombuffer(joined, dtype=np.uint8).reshape(len(found), size)
        head = np.frombuffer(self._expected_header, dtype=np.uint8)
        bad = np.flatnonzero((rec[:, : self._header_size] != head).any(axis=1))
        if len(bad):
            raise CorruptShardError(f"{self._where(int(local[bad[0]]))}: record header does not match the schema")
        for name, out in outs.items():
            i = self._index[name]
            f = self.all_fields[i]
            off = self._field_offsets[i]
            col = rec[:, off : off + f.row_nbytes].view(f.np_dtype).reshape((len(found), *f.trailing))
            out[dest] = col
