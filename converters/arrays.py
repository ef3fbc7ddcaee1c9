"""Arrays as conversion sources: ``.npy`` / ``.npz`` files read safely (header parsed, never pickle; a size that
disagrees with its header is caught at scan), a folder of per-sample files, and arrays whose first axis is the
sample axis: large ``.npy`` arrays (``X.npy`` + ``y.npy``, or named fields), HDF5 files and Zarr stores."""

from __future__ import annotations

import math
import os
import tokenize
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, ClassVar, Mapping, Self

import numpy as np

from fastdata.converters.images import is_image_file
from fastdata.converters.registry import DEFAULT_FIELD, Request, SourceKind, register
from fastdata.converters.scan import FolderSource, Labels, check_finite, check_labelled, find_labels, refuse_bad
from fastdata.errors import DataError, FormatError, UsageError
from fastdata.format import LABEL_FIELD, FieldSpec, make_field
from fastdata.format.external import ZARR_META, h5_file, open_zarr
from fastdata.handles import PerProcessHandle
from fastdata.write.inplace import expand, is_hdf5, is_zarr, plan_part

if TYPE_CHECKING:
    from fastdata.converters.config import ConvertConfig
    from fastdata.write import Progress


_KINDS = "biufc"
_MAX_DIMS = 32
_MAX_BYTES = 1 << 50  # 1 PiB: beyond any real file, so a header claiming more is broken or hostile
# What zipfile raises for damaged, encrypted or unsupported archives, besides OSError.
_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, RuntimeError, ValueError,
               zlib.error)


@dataclass(frozen=True)
class NpyHeader:
    dtype: np.dtype
    shape: tuple[int, ...]
    fortran: bool
    offset: int  # where the array bytes start in the .npy stream

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize  # Python ints: no overflow


def parse_header(fh: IO[bytes], where: str) -> NpyHeader:
    """Parse a .npy header from an open binary stream positioned at its start."""
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy version {version}")
        offset = fh.tell()
    except (ValueError, OSError, EOFError, SyntaxError, TypeError, OverflowError, RecursionError, MemoryError,
            tokenize.TokenError) as e:  # numpy parses the header dict with tokenize + ast.literal_eval
        raise DataError(f"{where}: not a valid .npy file, or truncated ({e})") from None
    if dtype.hasobject or dtype.kind not in _KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise DataError(
            f"{where}: dtype {dtype} is not supported (plain numeric arrays only; object arrays would need pickle)"
        )
    dims = tuple(int(d) for d in shape)
    if len(dims) > _MAX_DIMS or any(d < 0 for d in dims) or math.prod(dims) * dtype.itemsize > _MAX_BYTES:
        raise DataError(f"{where}: impossible array shape {dims} in the .npy header")
    return NpyHeader(dtype=dtype, shape=dims, fortran=bool(fortran), offset=offset)


def read_npy_header(path: str) -> tuple[NpyHeader, int]:
    """Header of a .npy file plus its size on disk; a size that disagrees is a truncated file."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise DataError(f"{path}: empty file (0 bytes)")
            h = parse_header(fh, path)
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    expect = h.offset + h.nbytes
    if size < expect:
        raise DataError(f"{path}: truncated .npy file ({size} bytes, the header promises {expect})")
    if size > expect:
        raise DataError(f"{path}: {size - expect} unexpected bytes after the array data")
    return h, size


def read_npy_data(path: str, h: NpyHeader, size: int) -> np.ndarray:
    """The array of a .npy file whose header was read at scan time, in C order."""
    n = int(np.prod(h.shape, dtype=np.int64))
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size != size:
                raise DataError(f"{path}: file changed size during conversion")
            fh.seek(h.offset)
            a = np.fromfile(fh, dtype=h.dtype, count=n)
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    if a.size != n:
        raise DataError(f"{path}: truncated .npy file")
    if h.fortran:
        return np.array(a.reshape(h.shape[::-1]).T, order="C")
    return a.reshape(h.shape)


def read_npz_headers(path: str) -> tuple[dict[str, NpyHeader], int]:
    """Headers of every array in a .npz file (member name without ``.npy``) and the file size."""
    try:
        size = os.path.getsize(path)
        if size == 0:
            raise DataError(f"{path}: empty file (0 bytes)")
        with zipfile.ZipFile(path) as zf:
            out = {}
            for info in zf.infolist():
                if not info.filename.endswith(".npy"):
                    raise DataError(f"{path}: member {info.filename!r} is not a .npy array")
                with zf.open(info) as fh:
                    h = parse_header(fh, f"{path}[{info.filename}]")
                if info.file_size != h.offset + h.nbytes:
                    raise DataError(f"{path}[{info.filename}]: truncated array")
                out[info.filename[:-4]] = h
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    except _ZIP_ERRORS as e:
        raise DataError(f"{path}: not a valid .npz file ({e})") from None
    if not out:
        raise DataError(f"{path}: .npz file holds no arrays")
    return out, size


def read_npz_data(path: str) -> dict[str, np.ndarray]:
    try:
        with zipfile.ZipFile(path) as zf:
            out = {}
            for info in zf.infolist():
                with zf.open(info) as fh:
                    out[info.filename[:-4]] = np.array(np.lib.format.read_array(fh, allow_pickle=False), order="C")
            return out
    except (OSError, *_ZIP_ERRORS) as e:
        raise DataError(f"{path}: cannot read .npz ({e})") from None


def data_field(name: str, dtype: Any, shape: tuple[int | None, ...], where: str) -> FieldSpec:
    """The field of an array of ``dtype`` and per-sample ``shape``; a type the format cannot store is
    a DataError naming ``where``."""
    try:
        return make_field(name, dtype, shape)
    except FormatError as e:
        raise DataError(f"{where}: {e}") from None


def _signature(headers: dict[str, NpyHeader]) -> tuple:
    """What must agree across samples: per array, dtype and shape after the first axis."""
    return tuple(sorted((k, h.dtype.str, len(h.shape), h.shape[1:]) for k, h in headers.items()))


def _describe(sig: tuple) -> str:
    parts = [f"{name}: {np.dtype(dt)} shape (n, {', '.join(map(str, tr))})" if nd else f"{name}: {np.dtype(dt)} scalar"
             for name, dt, nd, tr in sig]
    return "; ".join(parts)


def _refuse_a_varying_later_axis(root: Path, rels: list[str], sig_of: list[tuple]) -> None:
    """Three or more shapes after the first axis, none held by most files, arrays and dtypes alike: a length
    that varies along a later axis ((channels, time) sequences), not a few odd files to name or skip."""
    sigs = Counter(sig_of)
    if len(sigs) < 3 or 2 * max(sigs.values()) > len(sig_of) or \
            len({tuple((name, dt, nd) for name, dt, nd, _ in sig) for sig in sigs}) > 1:
        return
    a, b = sig_of[0], next(sig for sig in sig_of if sig != sig_of[0])
    raise DataError(f"{root}: the files' shapes differ after their first axis ({len(sigs)} different shapes among "
                    f"{len(sig_of)} files, e.g. {rels[0]}: {_describe(a)}; {rels[sig_of.index(b)]}: {_describe(b)}): "
                    "a length that varies must be each array's first axis (stored ragged); save them with that axis "
                    "first, e.g. np.save(path, x.T) for (channels, time)")


def _headers(root: Path, rels: list[str], main: str, bad: dict[str, str]) -> list[tuple[str, dict[str, NpyHeader], int]]:
    """Each good file's headers (one per array) and size; the others go to ``bad`` with the reason."""
    good: list[tuple[str, dict[str, NpyHeader], int]] = []
    for rel in rels:
        path = str(root / rel)
        ext = Path(rel).suffix.lower()
        if ext not in (".npy", ".npz"):
            bad[rel] = f"{path}: not a .npy or .npz file"
            continue
        if ext != main:
            bad[rel] = f"{path}: is {ext} but the folder holds {main} files"
            continue
        try:
            if main == ".npy":
                h, size = read_npy_header(path)
                good.append((rel, {DEFAULT_FIELD: h}, size))
            else:
                hs, size = read_npz_headers(path)
                good.append((rel, hs, size))
        except DataError as e:
            bad[rel] = str(e)
    return good


@dataclass(kw_only=True)
class NpyFolderSource(FolderSource):
    """Per-sample ``.npy`` (one field ``x``) or ``.npz`` (one field per array) files under a folder."""

    COLUMNS = ("sizes", "headers")

    sizes: list[int]
    headers: list[dict[str, NpyHeader]]
    npz: bool
    kind: str = "npy-folder"

    @classmethod
    def scan(cls, root: Path, rels: list[str], labels: Labels, skip_bad: bool = False) -> "NpyFolderSource":
        """Check the header of every file ``rels`` under ``root``; bad files raise (or are skipped)."""
        bad: dict[str, str] = {}
        suffix = Counter(Path(r).suffix.lower() for r in rels)
        main = ".npz" if suffix[".npz"] > suffix[".npy"] else ".npy"
        good = _headers(root, rels, main, bad)
        check_labelled(root, rels, labels, bad)
        good = [g for g in good if g[0] not in bad]
        # The signature most files share is the reference (ties: the first file's).
        sig_of = [_signature(h) for _, h, _ in good]
        sigs = Counter(sig_of)
        ref = max(sigs, key=sigs.__getitem__, default=())
        _refuse_a_varying_later_axis(root, [g[0] for g in good], sig_of)
        for (rel, _, _), sig in zip(good, sig_of):
            if sig != ref:
                bad[rel] = f"{root / rel}: has {_describe(sig)}, but {sigs[ref]} other file(s) have {_describe(ref)}"
        good = [g for g in good if g[0] not in bad]
        skipped = refuse_bad(bad, skip_bad)
        if not good:
            raise DataError(f"{root}: no usable samples (all {len(rels)} files are bad)")

        first_headers = good[0][1]
        fields = []
        for name in sorted(first_headers):
            h = first_headers[name]
            firsts = {g[1][name].shape[0] for g in good} if h.shape else {None}
            shape = (None, *h.shape[1:]) if len(firsts) > 1 else h.shape
            fields.append(data_field(name, h.dtype, shape, str(root / good[0][0])))
        if labels.by_path is not None and any(f.name == LABEL_FIELD for f in fields):
            raise DataError(f"{root / good[0][0]}: holds an array named 'label', which clashes with the labels; pass %(no_labels=True)")
        return cls.labelled_source(
            root, [g[0] for g in good], labels, fields, skipped,
            sizes=[g[2] for g in good],
            headers=[g[1] for g in good],
            npz=main == ".npz",
        )

    @property
    def bytes_in(self) -> int:
        return int(sum(self.sizes))

    def sample_nbytes(self) -> np.ndarray:
        return np.array([sum(h.nbytes for h in hs.values()) for hs in self.headers], dtype=np.int64)

    def ragged_rows(self, name: str) -> np.ndarray:
        """First-axis length of field ``name`` in every sample."""
        return np.array([hs[name].shape[0] for hs in self.headers], dtype=np.int64)

    def read(self, i: int) -> dict[str, np.ndarray]:
        path = os.path.join(self.root, self.rels[i])
        hs = self.headers[i]
        if self.npz:
            arrays = read_npz_data(path)
            for name, h in hs.items():
                a = arrays.get(name)
                if a is None or a.dtype != h.dtype or a.shape != h.shape:
                    raise DataError(f"{path}: changed during conversion (array {name!r})")
        else:
            arrays = {DEFAULT_FIELD: read_npy_data(path, hs[DEFAULT_FIELD], self.sizes[i])}
        return self.labelled(arrays, i)


def _detect_folder(req: Request) -> bool:
    """A folder of per-sample ``.npy``/``.npz`` files (what a folder without images is)."""
    return (req.meta is None and not req.arrays and req.src is not None and req.src.is_dir()
            and not req.in_file and not any(is_image_file(r) for r in req.files)
            and not any(os.path.basename(r) in ZARR_META for r in req.files))  # a Zarr store: kind "zarr"


def _scan_folder(req: Request, config: "ConvertConfig", progress: "Progress | None") -> NpyFolderSource:
    assert req.src is not None
    if config.images is not None:
        raise UsageError(f"{req.src}: image options (%(images)) given, but the folder holds no images")
    rels, labels = find_labels(req.src, req.files, lambda r: r.lower().endswith((".npy", ".npz")),
                               ".npy or .npz samples", req.labels, config)
    return NpyFolderSource.scan(req.src, rels, labels, config.skip_bad)


register(SourceKind("npy-folder", _detect_folder, _scan_folder))


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
