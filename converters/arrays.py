"""Large ``.npy`` arrays whose first axis is the sample axis (``X.npy`` + ``y.npy``, or named fields):
the ``npy-arrays`` source kind; ``labels`` is then a ``.npy`` array too."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from fastdata.converters.npy_parse import data_field, read_npy_header
from fastdata.converters.registry import Request, SrcForm, register
from fastdata.converters.scan import check_finite
from fastdata.errors import DataError, UsageError
from fastdata.format import LABEL_FIELD, FieldSpec
from fastdata.handles import PerProcessHandle

if TYPE_CHECKING:
    from fastdata.converters.config import ConvertConfig
    from fastdata.write import Progress

_FINITE_ROWS = 1 << 20  # label rows checked at a time (the labels .npy is memory-mapped)


@dataclass(kw_only=True, eq=False)
class RowsSource:
    """What every source of rows of big arrays shares: fixed sizes, nothing ragged, rows keyed by their index,
    parts as row ranges."""

    offset: int = 0
    count: int = 0
    fields: list[FieldSpec]
    classes: list[str] | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return self.count

    def sample_nbytes(self) -> np.ndarray:
        return np.full(self.count, sum(f.row_nbytes for f in self.fields), dtype=np.int64)

    def ragged_rows(self, name: str) -> np.ndarray:  # arrays are never ragged
        raise KeyError(name)

    def sample_keys(self) -> None:
        """Rows are keyed by their index."""
        return None

    def part(self, start: int, stop: int) -> Self:
        return replace(self, offset=self.offset + start, count=stop - start)


@dataclass(kw_only=True, eq=False)  # hashable: PerProcessHandle tracks open handles in a WeakSet
class ArraysSource(RowsSource, PerProcessHandle[dict[str, np.ndarray]]):
    """Large arrays with the sample axis first (``X.npy`` + ``y.npy`` or several named fields), memory-mapped
    once per process (the maps are dropped when a part is pickled for a worker)."""

    paths: dict[str, str]
    file_sizes: dict[str, int]
    kind: str = "npy-arrays"

    @classmethod
    def scan(cls, paths: dict[str, Path]) -> "ArraysSource":
        fields, sizes, n0, first = [], {}, None, None
        for name, path in paths.items():
            if not path.is_file():
                raise UsageError(f"{path}: no such file")
            if path.suffix.lower() != ".npy":
                raise DataError(f"{path}: not a .npy file")
            h, size = read_npy_header(str(path))
            if not h.shape:
                raise DataError(f"{path}: a 0-d array has no sample axis")
            if n0 is None:
                n0, first = h.shape[0], path
            elif h.shape[0] != n0:
                raise DataError(f"{path}: has {h.shape[0]} samples but {first} has {n0}")
            fields.append(data_field(name, h.dtype, h.shape[1:], str(path)))
            sizes[name] = size
        return cls(paths={k: str(v) for k, v in paths.items()}, offset=0, count=int(n0 or 0), fields=fields, file_sizes=sizes)

    @property
    def bytes_in(self) -> int:
        return int(sum(self.file_sizes.values()))

    def _open_handle(self) -> dict[str, np.ndarray]:
        try:
            return {k: np.load(p, mmap_mode="r", allow_pickle=False) for k, p in self.paths.items()}
        except (OSError, ValueError) as e:
            raise DataError(f"cannot map source arrays: {e}") from None

    def read(self, i: int) -> dict[str, np.ndarray]:
        j = self.offset + i
        return {k: np.array(m[j], order="C") for k, m in self.handle().items()}

    def read_rows(self, i: int, n: int) -> dict[str, np.ndarray]:
        """Rows ``i`` to ``i + n - 1`` of every array: views of the maps, written from there without a copy."""
        j = self.offset + i
        return {k: m[j:j + n] for k, m in self.handle().items()}

    def inputs(self) -> tuple[list[str], list[np.ndarray]]:
        return sorted(self.paths.values()), []

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "arrays": {k: os.path.abspath(p) for k, p in self.paths.items()}}


class ArraysKind:
    """Named arrays (SRC as one ``.npy`` array is field ``x``), with ``labels`` as a ``.npy`` array."""

    name = "npy-arrays"

    def src_form(self, src: Path) -> SrcForm | None:
        return None  # a .npy SRC is the array of field x among the named arrays: detect() decides

    def detect(self, req: Request) -> bool:
        return bool(req.arrays) and req.meta is None

    def scan(self, req: Request, config: "ConvertConfig", progress: "Progress | None") -> ArraysSource:
        if config.images is not None:
            raise UsageError("image options (%(images)) apply to image folders, not to .npy arrays")
        named = dict(req.arrays)
        if req.labels is not None:
            if req.labels.suffix.lower() != ".npy":
                raise UsageError(f"{req.labels}: with array sources, %(labels) must be a .npy array")
            if LABEL_FIELD in named:
                raise UsageError("%(labels) and %(arrays) both name the labels (a field 'label')")
            named[LABEL_FIELD] = req.labels
        source = ArraysSource.scan(named)
        if not config.allow_nan and LABEL_FIELD in named:
            path = source.paths[LABEL_FIELD]
            values = np.load(path, mmap_mode="r", allow_pickle=False)  # checked by scan: a plain numeric .npy
            for a in range(0, len(values), _FINITE_ROWS):
                check_finite(values[a:a + _FINITE_ROWS], lambda i, a=a: f"{path}: row {a + i}")
        return source


register(ArraysKind())
