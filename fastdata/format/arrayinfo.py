"""What an array inside an existing file (HDF5 dataset, ``.npy`` file, Zarr array) looks like, for
``fastdata index`` and its change checks; errors are one line naming the file and the array."""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any

import numpy as np
import xxhash

from fastdata.errors import DataError


@dataclass(frozen=True)
class ArrayInfo:
    """One array: its dtype and full shape (samples first), contiguous data at byte ``offset``,
    or chunks of ``chunk_rows`` samples (Zarr, chunked or compressed HDF5)."""

    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int | None = None
    chunk_rows: int | None = None


def _h5(path: str) -> Any:
    try:
        return h5_file(path)
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable HDF5 file ({e})") from None


def h5_file(path: str, **kw: Any) -> Any:
    """``h5py.File(path, "r", **kw)``, with hdf5plugin's filters (LZ4, Zstd, Blosc, ...) where installed."""
    import h5py

    if find_spec("hdf5plugin") is not None:
        import hdf5plugin  # noqa: F401  (registers its filters)
    return h5py.File(path, "r", **kw)


def _dataset(f: Any, path: str, name: str) -> Any:
    import h5py

    obj = f.get(name)
    if obj is None:
        known = []
        f.visititems(lambda k, v: known.append("/" + k) if isinstance(v, h5py.Dataset) else None)
        raise DataError(f"{path}: no dataset {name!r} (datasets: {', '.join(known[:10]) or 'none'})")
    if not isinstance(obj, h5py.Dataset):
        raise DataError(f"{path}: {name!r} is a group, not a dataset")
    return obj


def hdf5_info(path: str, name: str) -> ArrayInfo:
    """How dataset ``name`` of HDF5 file ``path`` is stored."""
    with _h5(path) as f:
        d = _dataset(f, path, name)
        if d.ndim == 0:
            raise DataError(f"{path}: dataset {name!r} is a scalar: it has no sample axis")
        if d.chunks is None and d.compression is None and not d.id.get_create_plist().get_nfilters():
            off = d.id.get_offset()
            if off is None and d.size:
                raise DataError(f"{path}: dataset {name!r} has no data written (never allocated)")
            return ArrayInfo(d.dtype, tuple(d.shape), offset=int(off or 0))
        if d.chunks is None:
            raise DataError(f"{path}: dataset {name!r} is filtered but not chunked")
        return ArrayInfo(d.dtype, tuple(d.shape), chunk_rows=int(d.chunks[0]))


def describe(path: str, names: list[str]) -> dict[str, Any]:
    """The layout of datasets ``names`` of HDF5 file ``path``, as JSON-able values (for the metadata
    checksum): shape, type, chunks, filters, and where the data or every chunk lies."""
    out: dict[str, Any] = {}
    with _h5(path) as f:
        for name in names:
            d = _dataset(f, path, name)
            plist = d.id.get_create_plist()
            filters = [list(map(str, plist.get_filter(i)[:3])) for i in range(plist.get_nfilters())]
            entry: dict[str, Any] = {"shape": list(d.shape), "dtype": d.dtype.str, "chunks": d.chunks,
                                     "filters": filters}
            if d.chunks is None:
                entry["offset"] = d.id.get_offset()
            else:
                entry["chunk_table"] = _chunk_digest(d)
            out[name] = entry
    return out


def _chunk_digest(d: Any) -> str:
    """A digest of where every chunk of ``d`` lies, how big it is and which filters it skipped."""
    h = xxhash.xxh3_128()
    if d.size:
        d.id.chunk_iter(lambda c: h.update(f"{c.chunk_offset}:{c.byte_offset}:{c.size}:{c.filter_mask};".encode()))
    return h.hexdigest()


def npy_layout(path: str) -> tuple[int, str, list[int], bool]:
    """``(data offset, dtype str, shape, fortran_order)`` of a ``.npy`` file (header parsed, no pickle)."""
    try:
        with open(path, "rb") as fh:
            major, _ = np.lib.format.read_magic(fh)
            if major == 1:
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
            return fh.tell(), dtype.str, list(shape), bool(fortran)
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: not a readable .npy file ({e})") from None


def npy_info(path: str) -> ArrayInfo:
    off, dtype, shape, fortran = npy_layout(path)
    if not shape:
        raise DataError(f"{path}: a 0-d array has no sample axis")
    if fortran and len(shape) > 1:
        raise DataError(f"{path}: stored in Fortran order, so a sample is not contiguous; save it in C order "
                        "(np.ascontiguousarray) or convert it")
    dt = np.dtype(dtype)
    need = off + dt.itemsize * int(np.prod(shape))
    if os.path.getsize(path) < need:
        raise DataError(f"{path}: truncated ({os.path.getsize(path)} bytes, the header needs {need})")
    return ArrayInfo(dt, tuple(shape), offset=off)


def open_zarr(path: str, name: str) -> Any:
    """The Zarr array ``name`` ("" for the store itself) of the store at ``path``, read-only."""
    try:
        import zarr
    except ImportError:
        raise DataError(f"{path}: reading Zarr needs the zarr package: pip install 'fastdata[zarr]'") from None
    try:
        node = zarr.open(path, mode="r")
    except Exception as e:  # zarr raises several types for a missing or foreign store
        raise DataError(f"{path}: not a readable Zarr store ({type(e).__name__}: {e})") from None
    if name:
        if not isinstance(node, zarr.Group) or name.strip("/") not in node:
            raise DataError(f"{path}: no Zarr array {name!r}")
        node = node[name.strip("/")]
    if not isinstance(node, zarr.Array):
        keys = list(node.array_keys()) if isinstance(node, zarr.Group) else []
        raise DataError(f"{path}: {name or 'the store'!r} is a Zarr group, not an array (arrays: {', '.join(keys) or 'none'})")
    return node


def zarr_info(path: str, name: str) -> ArrayInfo:
    a = open_zarr(path, name)
    if not a.shape:
        raise DataError(f"{path}: Zarr array {name!r} is a scalar: it has no sample axis")
    return ArrayInfo(np.dtype(a.dtype), tuple(a.shape), chunk_rows=int(a.chunks[0]))
