"""Where each record of an LMDB shard lies in the file, from LMDB's B-tree pages alone.

py-lmdb touches every page of a value it returns, so learning a record's place through LMDB
reads the whole record, one 4 KiB page fault at a time on a cold cache (LMDB maps the file
with ``MADV_RANDOM`` when opened with ``readahead=False``): far below what the disk gives to
large reads. The tree's branch and leaf pages are a small fraction of the file: reading them with
``pread`` gives every record's offset, so the reader copies records from its own map and the
read-ahead (fastdata/reading/readahead.py) can hint their exact ranges before the first read.

The page layout is liblmdb 0.9's (``mdb.c``: ``MDB_page``, ``MDB_meta``, ``MDB_node``). Nothing
here is trusted blindly: the caller compares one record's place with what LMDB itself returns,
and every read compares the record's header in the map with the schema's, so a layout this code
misreads is never copied from; it only falls back to reading through LMDB.
"""

from __future__ import annotations

import os
import struct

import numpy as np

PAGE_HEADER = 16  # pgno (8), pad (2), flags (2), lower/upper (2 + 2)
P_BRANCH, P_LEAF = 0x01, 0x02
F_BIGDATA = 0x01  # the value lies on overflow pages; the node holds their first page number
META_MAGIC = 0xBEEFC0DE
_MAIN_ROOT = PAGE_HEADER + 4 + 4 + 8 + 8 + 48 + 40  # mm_dbs[MAIN_DBI].md_root in a meta page
_TXNID = PAGE_HEADER + 4 + 4 + 8 + 8 + 96 + 8  # mm_txnid, after mm_last_pg
_MAX_DEPTH = 16


class LayoutUnknown(Exception):
    """The file does not look like the LMDB layout this module knows."""


def _page(fd: int, pgno: int, psize: int, size: int) -> bytes:
    off = pgno * psize
    if off + psize > size:
        raise LayoutUnknown(f"page {pgno} lies past the end of the file")
    buf = os.pread(fd, psize, off)
    if len(buf) != psize:
        raise LayoutUnknown("short read")
    return buf


def _root(fd: int, psize: int, size: int) -> int:
    best: tuple[int, int] | None = None
    for m in (0, 1):
        page = _page(fd, m, psize, size)
        (magic,) = struct.unpack_from("<I", page, PAGE_HEADER)
        if magic != META_MAGIC:
            raise LayoutUnknown("no LMDB meta page")
        (root,) = struct.unpack_from("<Q", page, _MAIN_ROOT)
        (txnid,) = struct.unpack_from("<Q", page, _TXNID)
        if best is None or txnid > best[0]:
            best = (txnid, root)
    assert best is not None
    return best[1]


def record_offsets(fd: int, psize: int, first_key: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """File offsets and sizes of the values under the 8-byte big-endian keys ``first_key`` ..
    ``first_key + count - 1`` (-1 where a key is absent). Raises LayoutUnknown."""
    size = os.fstat(fd).st_size
    offsets = np.full(count, -1, dtype=np.int64)
    sizes = np.zeros(count, dtype=np.int64)
    root = _root(fd, psize, size)
    if root == (1 << 64) - 1:  # P_INVALID: an empty database
        return offsets, sizes
    level = [root]
    for _ in range(_MAX_DEPTH):
        children: list[int] = []
        for pgno in level:
            page = _page(fd, pgno, psize, size)
            flags, lower = struct.unpack_from("<HH", page, 10)
            nkeys = (lower - PAGE_HEADER) // 2
            ptrs = struct.unpack_from(f"<{nkeys}H", page, PAGE_HEADER)
            if flags & P_BRANCH:
                for p in ptrs:
                    lo, hi, fl = struct.unpack_from("<HHH", page, p)
                    children.append(lo | hi << 16 | fl << 32)
            elif flags & P_LEAF:
                _leaf(page, ptrs, pgno * psize, psize, first_key, offsets, sizes)
            else:
                raise LayoutUnknown(f"page {pgno} is neither a branch nor a leaf")
        if not children:
            return offsets, sizes
        level = children
    raise LayoutUnknown("tree deeper than expected")


def _leaf(page: bytes, ptrs: tuple[int, ...], page_off: int, psize: int, first_key: int,
          offsets: np.ndarray, sizes: np.ndarray) -> None:
    for p in ptrs:
        lo, hi, flags, ksize = struct.unpack_from("<HHHH", page, p)
        if ksize != 8:
            continue  # not a sample key
        (k,) = struct.unpack_from(">Q", page, p + 8)
        i = k - first_key
        if not 0 <= i < len(offsets):
            continue
        vsize = lo | hi << 16
        if flags & F_BIGDATA:
            (opg,) = struct.unpack_from("<Q", page, p + 16)
            offsets[i] = opg * psize + PAGE_HEADER
        else:
            offsets[i] = page_off + p + 16
        sizes[i] = vsize
