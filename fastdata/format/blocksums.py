"""Per-block checksums of an index's source files (``fastdata index --checksum``): one ``xxh3_64`` per
``BLOCK`` bytes, each checked the first time a process reads bytes in it (docs/in-place.md)."""

from __future__ import annotations

import base64
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from fastdata.errors import CorruptShardError

BLOCK = 1 << 20  # bytes a block: reads touching a block not checked yet read it whole, once per process


def digests(data: Any, block: int = BLOCK) -> list[int]:
    """``xxh3_64`` of each ``block`` bytes of ``data`` (the last one may be short)."""
    view = memoryview(data).cast("B")
    return [xxhash.xxh3_64_intdigest(view[i : i + block]) for i in range(0, len(view), block)]


def manifest_text(sums: list[int]) -> str:
    """Digests as the manifest keeps them: base64 of little-endian uint64s."""
    return base64.b64encode(np.asarray(sums, dtype="<u8").tobytes()).decode()


@dataclass
class BlockCheck:
    """The recorded block digests of one file, and which of its blocks this process has checked."""

    path: str
    sums: np.ndarray  # uint64, one per block
    block: int = BLOCK
    ok: np.ndarray = field(init=False)
    left: int = field(init=False)  # blocks not checked yet: once 0, reads cost one comparison
    lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.ok = np.zeros(len(self.sums), dtype=bool)
        self.left = len(self.sums)

    def done(self) -> bool:
        return self.left == 0

    def rows(self, fd: int, base: int, rows: np.ndarray, nbytes: int) -> None:
        """Check the blocks holding rows ``rows`` of ``nbytes`` bytes each from byte ``base`` of the file."""
        if nbytes <= 0 or len(rows) == 0 or self.done():
            return
        starts = base + rows.astype(np.int64) * nbytes
        if nbytes <= self.block:  # a row touches at most two blocks
            ids = np.unique(np.concatenate((starts // self.block, (starts + nbytes - 1) // self.block)))
        else:
            ids = np.unique(np.concatenate([np.arange(s // self.block, (s + nbytes - 1) // self.block + 1)
                                            for s in starts.tolist()]))
        self.blocks(fd, ids)

    def span(self, fd: int, start: int, end: int, data: Any = None) -> None:
        """Check the blocks holding bytes ``start..end-1``; ``data``, if given, is those bytes (blocks wholly
        inside it are hashed from it, the others read from ``fd``)."""
        if end <= start or self.done():
            return
        ids = np.arange(start // self.block, (end - 1) // self.block + 1)
        ids = ids[(ids < len(self.sums)) & ~self.ok[np.minimum(ids, len(self.sums) - 1)]]
        if data is None:
            self.blocks(fd, ids)
            return
        view = memoryview(data).cast("B")
        for b in ids.tolist():
            b0, b1 = b * self.block, (b + 1) * self.block
            if b0 >= start and b1 <= end:
                self._compare(b, view[b0 - start : b1 - start])
            else:
                self.blocks(fd, np.array([b]))

    def whole(self, data: Any) -> None:
        """Check every block against ``data``, the file's whole content."""
        if self.done():
            return
        got = digests(data, self.block)
        if len(got) != len(self.sums):
            raise CorruptShardError(f"{self.path}: holds {len(memoryview(data).cast('B'))} bytes, not the "
                                    f"{len(self.sums)} block(s) it had when indexed{_HINT}")
        for b, d in enumerate(got):
            if not self.ok[b]:
                self._compare(b, None, d)

    def all(self, fd: int) -> None:
        """Check every block not checked yet, reading it from ``fd``."""
        if not self.done():
            self.blocks(fd, np.flatnonzero(~self.ok))

    def blocks(self, fd: int, ids: np.ndarray) -> None:
        for b in ids.tolist():
            if b < len(self.sums) and not self.ok[b]:
                self._compare(b, os.pread(fd, self.block, b * self.block))

    def _compare(self, b: int, data: Any, digest: int | None = None) -> None:
        if digest is None:
            digest = xxhash.xxh3_64_intdigest(data)
        if digest != int(self.sums[b]):
            raise CorruptShardError(f"{self.path}: block {b} (bytes {b * self.block}..{(b + 1) * self.block - 1}) "
                                    f"differs from its checksum taken at index time (edited in place){_HINT}")
        with self.lock:  # reader threads may check the same block at once: count it once
            if not self.ok[b]:
                self.ok[b] = True
                self.left -= 1


_HINT = "; run fastdata index again (or convert the data)"


def checks(blocks: dict[str, Any] | None, path: str, where: str) -> dict[str, BlockCheck] | None:
    """A fresh BlockCheck for each file of a stamp's ``blocks`` (keyed by path relative to the Zarr store,
    "" for a plain file), or None when the index recorded none."""
    if blocks is None:
        return None
    try:
        size = int(blocks["size"])
        out = {}
        for rel, text in dict(blocks["xxh3_64"]).items():
            sums = np.frombuffer(base64.b64decode(text, validate=True), dtype="<u8").astype(np.uint64)
            out[rel] = BlockCheck(os.path.join(path, rel) if rel else path, sums, size)
    except (KeyError, TypeError, ValueError) as e:
        raise CorruptShardError(f"{where}: malformed block checksums in the in-place index ({e})") from None
    if size < 1:
        raise CorruptShardError(f"{where}: malformed block checksums in the in-place index (block size {size})")
    return out


def check_files(found: dict[str, BlockCheck], prefix: str = "") -> None:
    """Check every block of every file (whose relative path starts with ``prefix``), reading it whole."""
    for rel, check in found.items():
        if rel.startswith(prefix) and not check.done():
            try:
                fd = os.open(check.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                raise CorruptShardError(f"{check.path}: cannot read ({e.strerror}){_HINT}") from None
            try:
                check.all(fd)
            finally:
                os.close(fd)
