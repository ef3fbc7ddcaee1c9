"""Arrays whose first axis is the sample axis as conversion sources: large ``.npy`` arrays (``X.npy`` + ``y.npy``,
or named fields; ``labels`` is then a ``.npy`` array too), arrays in HDF5 files (one, or a glob of several, one after
another) and Zarr stores."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Self

import numpy as np

from fastdata.converters.npy_parse import data_field, read_npy_header
from fastdata.converters.registry import DEFAULT_FIELD, Request, SourceKind, register
from fastdata.converters.scan import check_finite
from fastdata.errors import DataError, UsageError
from fastdata.format import LABEL_FIELD, FieldSpec
from fastdata.format.external import h5_file, open_zarr
from fastdata.handles import PerProcessHandle
from fastdata.write.inplace import expand, is_hdf5, is_zarr, plan_part

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


def _scan_arrays(req: Request, config: "ConvertConfig", progress: "Progress | None") -> ArraysSource:
    """Named arrays (SRC as one ``.npy`` array is field ``x``), with ``labels`` as a ``.npy`` array."""
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


# a .npy SRC is the array of field x among the named arrays: detect decides
register(SourceKind("npy-arrays", lambda req: bool(req.arrays) and req.meta is None, _scan_arrays))


def detect(src: str | os.PathLike[str]) -> bool:
    """An HDF5 file, or a glob whose first match is one."""
    try:
        return is_hdf5(expand(os.fspath(src))[0])
    except UsageError:
        return False


@dataclass(kw_only=True, eq=False)  # hashable: PerProcessHandle tracks open handles in a WeakSet
class _ArrayFilesSource(RowsSource, PerProcessHandle[list[dict[str, Any]]]):
    """Fields as arrays in one or more files (samples of file k follow those of file k - 1)."""

    paths: list[str]
    arrays: dict[str, str]  # field -> array path inside each file
    counts: list[int]  # samples per file
    kind: str = ""  # also the format write/inplace.py reads the layout of: hdf5 or zarr
    default_arrays: ClassVar[Mapping[str, str]] = {}  # the fields when none are named (none: they must be)

    _paths = staticmethod(expand)  # the files SRC names, each checked to exist (a one-line UsageError if not)

    @classmethod
    def from_src(cls, src: str | os.PathLike[str], arrays: Mapping[str, str] | None = None) -> Self:
        """The source of the files SRC names, every field of every file checked (shapes, types, sample counts) before
        anything is read, as an in-place index of them would; ``arrays``: field -> array in each file (default: the
        kind's)."""
        paths, arrays = cls._paths(os.fspath(src)), arrays or cls.default_arrays
        if not arrays:
            raise UsageError(f"{paths[0]}: name the arrays to convert, e.g. --field x=/images --field label=/labels")
        specs: dict[str, FieldSpec] = {}
        counts = [plan_part(cls.kind, path, arrays, {}, specs)[1] for path in paths]
        return cls(paths=paths, arrays=dict(arrays), counts=counts, fields=list(specs.values()), count=sum(counts))

    @property
    def bytes_in(self) -> int:
        return self.count * sum(f.row_nbytes for f in self.fields)

    def read(self, i: int) -> dict[str, np.ndarray]:
        j = self.offset + i
        ends = np.cumsum(self.counts)
        k = int(np.searchsorted(ends, j, side="right"))
        row = j - (int(ends[k - 1]) if k else 0)
        handles = self.handle()[k]
        try:
            return {name: np.array(handles[name][row], order="C") for name in self.arrays}
        except Exception as e:  # h5py/zarr raise many types: name the file and the row instead
            raise DataError(f"{self.paths[k]}: row {row}: read failed ({type(e).__name__}: {e})") from None

    def inputs(self) -> tuple[list[str], list[np.ndarray]]:
        return list(self.paths), []

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "files": [os.path.abspath(p) for p in self.paths], "arrays": self.arrays}


@dataclass(kw_only=True, eq=False)
class H5Source(_ArrayFilesSource):
    """Datasets of one or more HDF5 files (any chunking and filter h5py and hdf5plugin read)."""

    kind: str = "hdf5"

    def _open_handle(self) -> list[dict[str, Any]]:
        out = []
        for p in self.paths:  # a chunk cache that holds whole chunks: rows are read one after another
            f = h5_file(p, rdcc_nbytes=64 << 20, rdcc_nslots=10007)
            out.append({"_file": f, **{name: f[a] for name, a in self.arrays.items()}})
        return out

    @staticmethod
    def _close_handle(handle: list[dict[str, Any]]) -> None:
        for h in handle:
            h["_file"].close()


@dataclass(kw_only=True, eq=False)
class ZarrSource(_ArrayFilesSource):
    """Arrays of a Zarr (v2 or v3) store: the store itself (field ``x``) or arrays of a group."""

    kind: str = "zarr"
    default_arrays: ClassVar[Mapping[str, str]] = {DEFAULT_FIELD: ""}  # the store itself is an array

    @staticmethod
    def _paths(src: str) -> list[str]:
        if not is_zarr(src):
            raise UsageError(f"{src}: not a Zarr store (no .zarray, .zgroup or zarr.json)")
        return [src]

    def _open_handle(self) -> list[dict[str, Any]]:
        return [{name: _RowCache(open_zarr(p, a)) for name, a in self.arrays.items()} for p in self.paths]


class _RowCache:
    """Rows of a Zarr array read a chunk at a time (reading row by row would decode each chunk per row)."""

    def __init__(self, array: Any) -> None:
        self.array = array
        self.rows = int(array.chunks[0])
        self.at = -1
        self.chunk: np.ndarray | None = None

    def __getitem__(self, row: int) -> np.ndarray:
        c = row // self.rows
        if c != self.at or self.chunk is None:
            self.chunk = np.asarray(self.array[c * self.rows : (c + 1) * self.rows])
            self.at = c
        return self.chunk[row - c * self.rows]


def _array_files_kind(name: str, probe: Callable[[Path], bool], source: type[_ArrayFilesSource]) -> SourceKind:
    """SRC a file (or glob of files) or store of named arrays: ``in_file`` names each field's array inside it."""

    def scan(req: Request, config: "ConvertConfig", progress: "Progress | None") -> _ArrayFilesSource:
        assert req.src is not None
        if config.images is not None:
            raise UsageError(f"{req.src}: image options (%(images)) apply to image folders, not to HDF5 or Zarr "
                             "arrays")
        return source.from_src(req.src, req.in_file)

    return SourceKind(name, lambda req: req.src is not None and req.meta is None and not req.arrays and probe(req.src),
                      scan, lambda src: "arrays" if probe(src) else None)


register(_array_files_kind("hdf5", detect, H5Source))  # an HDF5 file, or a glob of them (one after another)
register(_array_files_kind("zarr", is_zarr, ZarrSource))  # a Zarr array (field x) or a group
