"""The record index of an LMDB shard (schemas with ragged fields): every record's layout, read once
per process, so reading a batch needs no per-sample header parsing, only a length check per record."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import lmdb
import numpy as np

from fastdata.errors import CorruptShardError
from fastdata.format.lmdbwrite import KEY, key

if TYPE_CHECKING:
    from fastdata.format.lmdb import ShardReader, _Handle
    from fastdata.format.lmdbmap import Located

_SMALL_FIELD_BYTES = 64  # fixed fields up to this size per sample are kept in a shard's record index


@dataclass
class RecordIndex:
    """Every record's layout in one shard, read once per process (schemas with ragged fields):
    reading a batch then needs no per-sample header parsing, only a length check per record."""

    sizes: np.ndarray  # (count, fields) int64: payload bytes of each field
    offsets: np.ndarray  # (count, fields) int64: where each payload starts in its record
    total: np.ndarray  # (count,) int64: record length; -1 for a record that failed its checks
    bad: dict[int, str]  # local index -> what is wrong with that record
    small: dict[int, np.ndarray] = field(default_factory=dict)  # field index -> its values (small fixed fields)


def build_index(r: ShardReader, h: _Handle) -> RecordIndex:
    """The layout of every record of ``r``'s shard, reading each record's header once: from the file
    where the records' places are known, else through LMDB."""
    n, nf, hs = r.info.count, len(r.all_fields), r._header_size
    sizes = np.zeros((n, nf), dtype=np.int64)
    total = np.full(n, -1, dtype=np.int64)
    bad: dict[int, str] = {}
    # small fixed fields (labels, image shapes) are kept whole: a batch reads them without records
    small = {i: np.zeros((n, *f.trailing), dtype=f.np_dtype).view(np.uint8).reshape(n, f.row_nbytes)
             for i, f in enumerate(r.all_fields) if not f.ragged and 0 < f.row_nbytes <= _SMALL_FIELD_BYTES}
    first = key(r.info.start)
    loc = r._located()
    r._check_unchanged(h.fd, np.zeros(1, dtype=np.int64))
    if loc is not None and loc.sizes is not None:  # places known: read only the headers (and small fields)
        for local, (o, size) in enumerate(zip(loc.offsets.tolist(), loc.sizes.tolist())):
            # pread, not the map: a fault there would read the kernel's read-around window (MBs) per header
            head = os.pread(h.fd, min(size, hs), o)
            try:
                layout = r._layout(head, local, size)
            except CorruptShardError as e:
                bad[local] = str(e)
                continue
            sizes[local] = [s for _, s in layout]
            total[local] = size
            for i, col in small.items():
                off, nb = layout[i]
                col[local] = np.frombuffer(os.pread(h.fd, nb, o + off), np.uint8, col.shape[1])
    else:
        _index_through_lmdb(r, h, first, n, sizes, total, bad, small, loc)
    for local in np.flatnonzero(total < 0).tolist():
        bad.setdefault(local, f"{r._where(local)}: record is missing")
    offsets = hs + np.cumsum(sizes, axis=1) - sizes
    values = {i: col.view(r.all_fields[i].np_dtype).reshape((n, *r.all_fields[i].trailing))
              for i, col in small.items()}
    return RecordIndex(sizes=sizes, offsets=offsets, total=total, bad=bad, small=values)

def _index_through_lmdb(r: ShardReader, h: _Handle, first: bytes, n: int, sizes: np.ndarray, total: np.ndarray,
                    bad: dict[int, str], small: dict[int, np.ndarray], loc: Located | None) -> None:
    """Fill the record index with a cursor over the shard (reads every record: a slow cold pass)."""
    try:
        with h.env.begin(buffers=True) as txn, txn.cursor() as cur:
            ok = cur.set_range(first)
            while ok:
                k = bytes(cur.key())
                if len(k) != 8:
                    break
                local = KEY.unpack(k)[0] - r.info.start
                if not 0 <= local < n:
                    break
                buf = cur.value()
                try:
                    layout = r._layout(buf, local)
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
        raise CorruptShardError(f"{r._where()}: LMDB read failed ({e})") from None


__all__ = ["RecordIndex", "build_index"]
