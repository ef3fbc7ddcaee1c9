"""Rows of an Arrow-backed dataset (a Hugging Face ``datasets.Dataset`` or a ``pyarrow.Table``) read in batches:
numeric and fixed-shape columns as one numpy array per batch, other columns as Python values per row."""

from __future__ import annotations

import bisect
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.errors import DataError

BATCH_ROWS = 1024


def is_arrow(obj: Any) -> bool:
    """A Hugging Face ``datasets.Dataset`` (read through its Arrow table) or a ``pyarrow.Table``."""
    top = type(obj).__module__.split(".")[0]
    return (top == "datasets" and hasattr(obj, "with_format")) or (top == "pyarrow" and hasattr(obj, "slice")
                                                                  and hasattr(obj, "column_names"))


class ArrowRows:
    """Row ``j`` of ``obj`` as {column: value}, from a cached batch of :data:`BATCH_ROWS` rows (each Arrow
    chunk of the batch converted on its own: nothing is copied to join chunks)."""

    def __init__(self, obj: Any) -> None:
        self._plain = type(obj).__module__.split(".")[0] == "pyarrow"
        self._table = obj if self._plain else obj.with_format("arrow")
        self._len = obj.num_rows if self._plain else len(obj)
        self._start = -1
        self._n = 0
        self._cols: dict[str, tuple[list[int], list[Any]]] = {}  # column -> (chunk starts, chunk values)

    def row(self, j: int) -> dict[str, Any]:
        return {name: values[k] for name, values, k in self._at(j)}

    def rows(self, j: int, n: int) -> dict[str, np.ndarray] | None:
        """Rows ``j`` to at most ``j + n - 1`` (at least one) as {column: numpy array of rows}, views of the batch;
        None when a column's values are not one numpy array (strings, images, ragged lists, missing values)."""
        out = {}
        for name, values, k in self._at(j):
            if not isinstance(values, np.ndarray):
                return None
            out[name] = values[k:]
            n = min(n, len(out[name]))
        return {name: v[:n] for name, v in out.items()}

    def _at(self, j: int) -> list[tuple[str, Any, int]]:
        """Per column: (name, the values of the chunk holding row ``j``, the row's place in them); loads its batch."""
        if not self._start <= j < self._start + self._n:
            self._load(j - j % BATCH_ROWS)
        k = j - self._start
        out = []
        for name, (starts, chunks) in self._cols.items():
            c = bisect.bisect_right(starts, k) - 1 if len(starts) > 1 else 0  # most batches: one chunk per column
            out.append((name, chunks[c], k - starts[c]))
        return out

    def _load(self, start: int) -> None:
        stop = min(start + BATCH_ROWS, self._len)
        batch = self._table.slice(start, stop - start) if self._plain else self._table[start:stop]
        self._cols = {}
        for name in batch.column_names:
            chunks = [c for c in batch.column(name).chunks if len(c)]
            starts = np.cumsum([0] + [len(c) for c in chunks[:-1]]).tolist()
            self._cols[name] = (starts, [column_values(c, name) for c in chunks])
        self._start, self._n = start, stop - start


def column_values(col: Any, name: str) -> Any:
    """One Arrow array (a chunk of a column) as a numpy array of rows (numbers, fixed-shape arrays) or a list of values."""
    import pyarrow as pa

    arr = col
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage  # e.g. datasets' Array2D..Array5D: nested lists underneath
    if arr.null_count:
        return arr.to_pylist()  # a missing value (None) is then refused, or skipped, for its own sample
    fixed = _fixed_numpy(arr)
    if fixed is not None:
        return fixed
    t = arr.type
    if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0:  # datasets' Image() feature: {bytes, path}
        return [_image_bytes(r, name) for r in arr.to_pylist()]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = _fixed_numpy(arr.flatten())
        if inner is not None:  # ragged rows of numbers: views into one array
            offs = np.asarray(arr.offsets)
            offs = offs - offs[0]
            return [inner[a:b] for a, b in zip(offs[:-1].tolist(), offs[1:].tolist())]
    return arr.to_pylist()


def _fixed_numpy(arr: Any) -> np.ndarray | None:
    """Numbers or nested lists of one length per level, as one array (rows first); None otherwise."""
    import pyarrow as pa

    dims: list[int] = []
    t = arr.type
    while pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        n = len(arr)
        if pa.types.is_fixed_size_list(t):
            size = t.list_size
            arr = arr.flatten()
        else:
            offs = np.asarray(arr.offsets)
            sizes = np.diff(offs)
            if n and (sizes != sizes[0]).any() or arr.null_count:
                return None
            size = int(sizes[0]) if n else 0
            arr = arr.flatten()
        dims.append(size)
        t = arr.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        return None
    base = arr.to_numpy(zero_copy_only=False)
    rows = len(base) // max(1, int(np.prod(dims))) if dims else len(base)
    return base.reshape(rows, *dims)


def _image_bytes(r: dict[str, Any], name: str) -> bytes:
    if r.get("bytes") is not None:
        return bytes(r["bytes"])
    path = r.get("path")
    if not path:
        raise DataError(f"column {name!r}: an image with neither bytes nor a path")
    return Path(path).read_bytes()

