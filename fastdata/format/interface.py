"""The interface every shard backend module implements (``EXTENSION``, ``parse_compression``, a
``ShardWriter`` and a ``ShardReader``), checked by mypy through the registry in backends.py; the writers share
the :class:`ShardWriter` base."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from fastdata.format.shardio import Layout
    from fastdata.format.spec import FieldSpec, ShardInfo


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


__all__ = ["Backend", "ShardReader", "ShardReaderFactory", "ShardWriter"]
