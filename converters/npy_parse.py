"""Safe ``.npy`` / ``.npz`` header handling: dtype, shape and data offset, never pickle; a file size that
disagrees with its header (truncated) is caught at scan time."""

from __future__ import annotations

import math
import os
import tokenize
import zipfile
import zlib
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from fastdata.errors import DataError, FormatError
from fastdata.format import FieldSpec, make_field

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
