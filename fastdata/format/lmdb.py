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
(:class:`~.lmdbmap.Located`: from LMDB's B-tree pages when the shard is opened, fastdata/format/lmdbtree.py); each such read first compares the record's header in the map with the one
its first read through LMDB found.

One more record, under the key ``SHARD_KEY`` (all bits set, after every sample), describes
the shard as JSON: its first sample, its count and the schema. A reader compares it with the
manifest when it opens the shard, so a shard of another dataset, or one renamed, is refused.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from fastdata.errors import CorruptShardError
from fastdata.format import codec as blosc_codec
from fastdata.format import lmdbtree
from fastdata.format.lmdbindex import RecordIndex, build_index
from fastdata.format.lmdbmap import Located, acquire_env, release_env
from fastdata.format.lmdbwrite import (
    MAGIC,
    SHARD_KEY,
    ShardWriter,
    encode_record,
    initial_map_size,
    key,
    parse_compression,
    shard_record,
    tail_guard_bytes,
)
from fastdata.format.shardio import Layout, RaggedOut, ShardReaderBase
from fastdata.format.spec import FieldSpec, ShardInfo

EXTENSION = ".lmdb"
_MAX_SHARD_RECORD = 1 << 20
_GATHER_RECORD_BYTES = 64 << 10  # smaller fixed-layout records are fetched with one getmulti
_Located = Located  # the name tests and benchmarks patch


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
    index: RecordIndex | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    located: Located | None = None  # where records lie in the file (Linux)


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
            env = acquire_env(self.path, st)
        except lmdb.Error as e:
            raise CorruptShardError(f"{self._where()}: not a readable LMDB file ({e})") from None
        try:
            self._check_meta(env, st.st_size)
            self._check_shard_record(env)
            located = None  # (small records are read through LMDB: their places serve read-ahead only)
            if sys.platform.startswith("linux"):
                try:
                    located = Located(fd, self.info.count)
                except (OSError, ValueError):  # no second map (address space, limits): read through LMDB
                    located = None
                if located is not None:
                    self._locate_all(env, fd, located)
        except BaseException:
            release_env(env)
            raise
        return _Handle(env, fd, located=located)

    def _locate_all(self, env: lmdb.Environment, fd: int, loc: Located) -> None:
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
        release_env(handle.env)

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

    def records(self) -> RecordIndex:
        """The layout of every record of this shard, built on first use in each process by reading
        each record's header once; a bad record is remembered and raises when it is read."""
        h = self.handle()
        if h.index is not None:
            return h.index
        with h.lock:
            if h.index is None:
                h.index = build_index(self, h)
        return h.index

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
                  layouts: dict[str, Layout] | None = None, *, from_disk: bool = False) -> None:
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
        (what fastdata.reading.readahead hints to the kernel): records whose place this process has learned
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

    def _located(self) -> Located | None:
        """This process's :class:`Located` (Linux, records not gathered by getmulti), else None."""
        loc = self.handle().located
        return None if loc is None or loc.lost else loc

    def _locate(self, loc: Located, local: np.ndarray) -> None:
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


__all__ = ["EXTENSION", "MAGIC", "SHARD_KEY", "ShardReader", "ShardWriter", "encode_record", "initial_map_size", "key",
           "parse_compression", "shard_record", "tail_guard_bytes"]
