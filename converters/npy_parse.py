"""``.npy`` / ``.npz`` files: safe header handling (dtype, shape and data offset, never pickle; a file size that
disagrees with its header, truncated, is caught at scan time), and a folder of per-sample files as a source, every
header checked at scan (cheap), before a byte is written."""

from __future__ import annotations

import math
import os
import tokenize
import zipfile
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from fastdata.converters.images import is_image_file
from fastdata.converters.registry import DEFAULT_FIELD, Request, SourceKind, register
from fastdata.converters.scan import FolderSource, Labels, check_labelled, find_labels, refuse_bad
from fastdata.errors import DataError, FormatError, UsageError
from fastdata.format import LABEL_FIELD, FieldSpec, make_field
from fastdata.format.external import ZARR_META

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
