"""Sample keys (relative source paths) in one side file, ``keys.bin`` (docs/format.md), mapped once per
process as numpy arrays, never lists of strings (a DataLoader worker would copy those page by page)."""

from __future__ import annotations

import bisect
import mmap
import os
import struct
from pathlib import Path
from typing import IO, Callable, Iterable, Sequence

import numpy as np

from fastdata.errors import CorruptShardError, DataError
from fastdata.handles import PerProcessHandle

MAGIC = b"FDKEYS1\0"
_HEAD = struct.Struct("<8sQQ")
Release = Callable[[], None]


class DuplicateKeyError(DataError):
    """Two samples would have the same key: samples ``a`` < ``b`` (positions in the keys written)."""

    def __init__(self, message: str, a: int = -1, b: int = -1, key: str = "") -> None:  # defaults: unpicklable otherwise
        super().__init__(message)
        self.a, self.b, self.key = a, b, key


def write_keys(f: IO[bytes], keys: Sequence[str], where: str = "keys") -> None:
    """Write ``keys`` (unique strings, in sample order) to the open binary file ``f``."""
    enc = [k.encode("utf-8") for k in keys]
    n = len(enc)
    lengths = np.fromiter((len(e) for e in enc), dtype=np.uint64, count=n)
    offsets = np.zeros(n + 1, dtype="<u8")
    np.cumsum(lengths, out=offsets[1:])
    order = np.array(sorted(range(n), key=enc.__getitem__), dtype="<u8")
    for a, b in zip(order[:-1].tolist(), order[1:].tolist()):
        if enc[a] == enc[b]:
            a, b = min(a, b), max(a, b)
            raise DuplicateKeyError(f"{where}: samples {a} and {b} have the same key {keys[a]!r}", a, b, keys[a])
    f.write(_HEAD.pack(MAGIC, n, int(offsets[-1])))
    f.write(offsets.tobytes())
    f.write(order.tobytes())
    for e in enc:
        f.write(e)


_Handle = tuple[np.ndarray, np.ndarray, mmap.mmap, Release | None]


class KeyTable(PerProcessHandle[_Handle]):
    """Reads a dataset's keys file: ``keys(indices)``, ``find(key)``, ``all()``. A URL dataset passes ``fetch``
    (download it, outside the opening lock) and ``prepare`` (keep it local while open; returns its release)."""

    def __init__(self, path: Path, count: int, nbytes: int, prepare: Callable[[], Release] | None = None,
                 fetch: Callable[[], None] | None = None) -> None:
        self.path, self.count, self.nbytes = path, count, nbytes
        self.prepare, self.fetch = prepare, fetch
        self._base = 0

    def _ready(self) -> _Handle:
        if self.fetch is not None and not self.is_open():
            self.fetch()
        return self.handle()

    def _bad(self, what: str) -> CorruptShardError:
        return CorruptShardError(f"keys file {self.path}: {what}")

    def _open_handle(self) -> _Handle:
        release = self.prepare() if self.prepare is not None else None
        try:
            offsets, order, mm = self._open_map()
        except BaseException:
            if release is not None:
                release()
            raise
        return offsets, order, mm, release

    def _open_map(self) -> tuple[np.ndarray, np.ndarray, mmap.mmap]:
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size != self.nbytes:
                    raise self._bad(f"is {size} bytes, the manifest says {self.nbytes} (truncated or replaced)")
                if size < _HEAD.size:
                    raise self._bad("truncated header")
                # plain arrays over one map: no np.memmap overhead per key
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            raise self._bad("missing") from None
        except OSError as e:
            raise self._bad(f"cannot read: {e.strerror}") from None
        magic, n, text = _HEAD.unpack_from(mm)
        if magic != MAGIC or n != self.count or _HEAD.size + 8 * (n + 1) + 8 * n + text != size:
            raise self._bad(f"header does not match the manifest ({n} keys, {self.count} samples)")
        n1 = n + 1
        offsets = np.frombuffer(mm, dtype="<u8", count=n1, offset=_HEAD.size)
        order = np.frombuffer(mm, dtype="<u8", count=n, offset=_HEAD.size + 8 * n1)
        self._base = _HEAD.size + 8 * (n1 + n)  # where the text starts in the file
        if offsets[0] != 0 or offsets[-1] != text or (n and bool((offsets[1:] < offsets[:-1]).any())):
            raise self._bad("inconsistent offsets")
        if n and int(order.max()) >= n:
            raise self._bad("bad sort order")
        return offsets, order, mm

    @staticmethod
    def _close_handle(handle: _Handle) -> None:
        try:
            handle[2].close()
        except BufferError:  # arrays over the map are still alive somewhere: the map goes with them
            pass
        finally:
            if handle[3] is not None:
                handle[3]()

    def keys(self, indices: Iterable[int] | np.ndarray) -> list[str]:
        offsets, _, mm, _ = self._ready()
        idx = np.asarray(indices, dtype=np.int64)
        base = self._base
        starts, ends = (offsets[idx] + base).tolist(), (offsets[idx + 1] + base).tolist()
        return [mm[a:b].decode("utf-8", errors="replace") for a, b in zip(starts, ends)]

    def find(self, key: str) -> int:
        """The index of the sample keyed ``key``, or -1 (binary search over the sorted order)."""
        offsets, order, mm, _ = self._ready()
        want = key.encode("utf-8")

        def text(k: int) -> bytes:  # the k-th key in sorted order
            j = int(order[k])
            return mm[self._base + int(offsets[j]) : self._base + int(offsets[j + 1])]

        k = bisect.bisect_left(range(self.count), want, key=text)
        return int(order[k]) if k < self.count and text(k) == want else -1

    def all(self) -> list[str]:
        """Every key, in sample order."""
        return self.keys(np.arange(self.count)) if self.count else []
