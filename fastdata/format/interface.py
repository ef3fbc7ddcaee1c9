"""The interface every shard backend module implements (``EXTENSION``, ``parse_compression``, a
``ShardWriter`` and a ``ShardReader``), checked by mypy through the registry in backends.py, and what the
backends share: the writer and reader bases, index runs, ragged samples placed into padded batch rows."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from fastdata.errors import CorruptShardError
from fastdata.fileio import not_regular
from fastdata.format.spec import FieldSpec, ShardInfo
from fastdata.handles import PerProcessHandle

H = TypeVar("H")
GATHER_ROW_BYTES = 64 << 10  # rows up to this size are copied with one fancy-index gather


class ShardWriter:
    """Writes one shard of ``count`` samples, in order (each backend's writer derives from it); a context manager
    that finishes the shard on a clean exit (:meth:`close` checks it got ``count`` samples) and releases it on an
    error (:meth:`_release`)."""

    def __init__(self, path: Path, fields: list[FieldSpec], count: int, ragged_rows: dict[str, int],
                 compression: str | None = None, start: int = 0) -> None:
        self.path, self.fields, self.count, self.start = Path(path), fields, count, start
        self._n = 0  # samples written

    @staticmethod
    def min_sample_bytes(fields: list[FieldSpec]) -> float:  # pragma: no cover - abstract
        """The fewest bytes a sample takes in a shard (a manifest's counts are checked against it)."""
        raise NotImplementedError

    def _check_codec(self, codec: object, compression: str | None) -> None:
        if any(f.compression is not None for f in self.fields) and codec is None:
            raise ValueError(f"compressed fields need --compression lz4 or zstd, not {compression!r}")

    def write(self, sample: dict[str, np.ndarray]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - abstract
        """Finish the shard (ValueError unless it got ``count`` samples), then :meth:`_release` it."""
        raise NotImplementedError

    def _release(self) -> None:  # pragma: no cover - abstract
        """Release the shard's file, finished or not (again: nothing)."""
        raise NotImplementedError

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._release()


class ShardReader(Protocol):
    """Reads samples of one shard (``local`` are row numbers in the shard, ``dest`` their places in
    the batch); opens its file lazily, once per process, and can be closed and reopened."""

    path: Path

    def lengths(self, name: str, local: np.ndarray) -> np.ndarray: ...

    def read_into(self, local: np.ndarray, dest: np.ndarray, outs: dict[str, np.ndarray],
                  layouts: dict[str, Layout] | None = None) -> None: ...

    def ranges(self, local: np.ndarray, names: list[str]) -> tuple[np.ndarray, np.ndarray]: ...

    def copy_phase(self, name: str) -> int: ...

    def handle(self) -> Any: ...

    def is_open(self) -> bool: ...

    def close(self) -> None: ...


class ShardReaderFactory(Protocol):
    """A backend's ``ShardReader`` class."""

    def __call__(self, path: Path, info: ShardInfo, fields: list[FieldSpec]) -> ShardReader: ...


class Backend(Protocol):
    """A storage backend module (fastdata/format/hdf5.py, lmdb.py)."""

    EXTENSION: str

    @property
    def ShardWriter(self) -> type[ShardWriter]: ...  # noqa: N802 - the module's class

    @property
    def ShardReader(self) -> ShardReaderFactory: ...  # noqa: N802 - the module's class

    def parse_compression(self, value: str | None) -> Any: ...


def runs(local: np.ndarray, dest: np.ndarray) -> list[tuple[int, int, int]]:
    """Split parallel index arrays into runs ``(local0, dest0, length)`` consecutive in both."""
    n = len(local)
    if n == 0:
        return []
    breaks = np.flatnonzero((np.diff(local) != 1) | (np.diff(dest) != 1)) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [n]))
    return [(int(local[s]), int(dest[s]), int(e - s)) for s, e in zip(starts, ends)]


def copy_rows(data: np.ndarray, local: np.ndarray, dest: np.ndarray, out: np.ndarray) -> None:
    """Rows ``local`` (sorted) of ``data`` (e.g. a read-only memory map) to rows ``dest`` of ``out``: small
    rows in one numpy gather, larger ones one copy per run (no gathered temporary)."""
    if data.itemsize * math.prod(data.shape[1:]) <= GATHER_ROW_BYTES:
        out[dest] = data[local]
        return
    for l0, d0, n in runs(local, dest):
        out[d0 : d0 + n] = data[l0 : l0 + n]


_SMALL_COPY = 16 << 10  # smaller copies go through memoryviews (less overhead than numpy; GIL held)


class Packed(list[int]):
    """Layout of a packed ragged batch: sample ``d`` starts at byte ``self[d]`` of the flat output,
    samples back to back in batch order, no padding (``Dataset.get_batch(ragged="packed")``)."""


Layout = np.ndarray | Packed | None  # image shapes (padded pixels), packed starts, or plain padded rows


class RaggedOut:
    """The batch array of one ragged field, one copy a sample: ``(B, rows, *trailing)`` zero-padded; with image
    shapes as ``layout``, ``(B, H, W, C)`` padded right and below; with a :class:`Packed` layout, flat."""

    def __init__(self, out: np.ndarray, layout: Layout = None) -> None:
        self.out = out
        self.flat = out.reshape(-1).view(np.uint8)
        self.mv = memoryview(self.flat)  # type: ignore[arg-type]
        self.packed = layout if isinstance(layout, Packed) else None
        shapes = None if isinstance(layout, Packed) else layout
        if self.packed is not None:
            return
        self.stride = self.flat.size // len(out) if len(out) else 0
        self.zeros = memoryview(bytes(min(self.stride, _SMALL_COPY)))
        self.shapes = None if shapes is None else shapes.tolist()
        self.uniform = shapes is None or bool(len(shapes) == 0 or np.all(shapes[:, :2] == out.shape[1:3]))
        if not self.uniform:
            self.rows = out.reshape(out.shape[0], out.shape[1], -1)

    def put(self, d: int, src: memoryview, off: int, n: int) -> None:
        """Bytes ``src[off:off + n]`` (a 1-D byte memoryview) into batch row ``d``, padding zeroed."""
        if self.packed is not None or self.shapes is None or self.uniform:
            a = self.packed[d] if self.packed is not None else d * self.stride
            if n <= _SMALL_COPY:
                self.mv[a : a + n] = src[off : off + n]
            else:
                self.flat[a : a + n] = np.frombuffer(src, np.uint8, n, off)
            if self.packed is None:
                self.zero(a + n, a + self.stride)
            return
        h, w, c = self.shapes[d]
        o = self.rows[d]  # (H, W*C): rows of pixels as plain byte rows, far faster to copy than (h, w, c)
        # the whole block zeroed first (one memset), so the rows land on lines already in cache
        o.fill(0)
        o[:h, : w * c] = np.frombuffer(src, np.uint8, n, off).reshape(h, w * c)

    def zero(self, a: int, b: int) -> None:
        if b - a <= len(self.zeros):
            self.mv[a:b] = self.zeros[: b - a]
        else:
            self.flat[a:b] = 0

    def empty(self, d: int) -> None:
        """Batch row ``d`` holds nothing (an empty sample): all padding (packed: no bytes at all)."""
        if self.packed is not None:
            return
        self.zero(d * self.stride, (d + 1) * self.stride)


class ShardReaderBase(PerProcessHandle[H]):
    """What the HDF5 and LMDB shard readers share: naming a place in errors, opening the file
    checked against the manifest's size, and re-checking that size before each read."""

    def __init__(self, path: Path, info: ShardInfo) -> None:
        self.path = path
        self.info = info
        self.shown = str(path)  # the shard as errors name it (a URL store names the URL and its cached copy)

    def copy_phase(self, name: str) -> int:
        """Where (mod 64 bytes) samples of fixed field ``name`` lie in the memory they are copied from
        (0: not known or not fixed; a batch buffer at that phase fills fastest: loaders/host.py)."""
        return 0

    def _where(self, local: int | None = None) -> str:
        if local is None:
            return f"shard {self.shown}"
        return f"shard {self.shown}, sample {self.info.start + local}"

    def _open_handle(self) -> H:
        try:
            # O_NONBLOCK: a FIFO put in the shard's place must not block the open (no effect on a regular file)
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except FileNotFoundError:
            raise CorruptShardError(f"{self._where()}: shard file is missing") from None
        except OSError as e:
            raise CorruptShardError(f"{self._where()}: cannot open: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if why := not_regular(st.st_mode):
                raise CorruptShardError(f"{self._where()}: {why}")
            if st.st_size != self.info.bytes:
                raise CorruptShardError(
                    f"{self._where()}: file is {st.st_size} bytes, the manifest says {self.info.bytes} (truncated or replaced)"
                )
            return self._open_checked(fd, st)
        except BaseException:
            os.close(fd)
            raise

    def _open_checked(self, fd: int, st: os.stat_result) -> H:  # pragma: no cover - abstract
        """The backend's handle on the open file ``fd`` (of the manifest's size); it owns ``fd`` from here."""
        raise NotImplementedError

    def _check_unchanged(self, fd: int, local: np.ndarray) -> None:
        """A shard truncated or rewritten after it was opened must raise here, not SIGBUS in a
        memory-mapped read later (HDF5 small-row columns and LMDB both read through maps)."""
        size = os.fstat(fd).st_size
        if size != self.info.bytes:
            where = self._where(int(local[0]) if len(local) else None)
            raise CorruptShardError(f"{where}: file is now {size} bytes, the manifest says {self.info.bytes} "
                                    "(truncated or rewritten while open)")


__all__ = ["Backend", "ShardReader", "ShardReaderFactory", "ShardWriter"]
