"""The interface every shard backend module implements (``EXTENSION``, ``parse_compression``, a
``ShardWriter`` and a ``ShardReader``), checked by mypy through the registry in backends.py."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from fastdata.format.shardio import Layout
    from fastdata.format.spec import FieldSpec, ShardInfo


class ShardWriter(Protocol):
    """Writes one shard of ``count`` samples, in order; a context manager that finishes the shard on
    a clean exit (and checks it got ``count`` samples) and releases it on an error."""

    def write(self, sample: dict[str, np.ndarray]) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> ShardWriter: ...

    def __exit__(self, *exc: object) -> None: ...


class ShardWriterFactory(Protocol):
    """A backend's ``ShardWriter`` class: how the write engine and merge create a shard."""

    def __call__(self, path: Path, fields: list[FieldSpec], count: int, ragged_rows: dict[str, int],
                 compression: str | None = None, start: int = 0) -> ShardWriter: ...
    def min_sample_bytes(self, fields: list[FieldSpec]) -> float: ...  # the fewest bytes a sample takes in a shard


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
    def ShardWriter(self) -> ShardWriterFactory: ...  # noqa: N802 - the module's class

    @property
    def ShardReader(self) -> ShardReaderFactory: ...  # noqa: N802 - the module's class

    def parse_compression(self, value: str | None) -> Any: ...


__all__ = ["Backend", "ShardReader", "ShardReaderFactory", "ShardWriter", "ShardWriterFactory"]
