"""Batch assembly for :class:`fastdata.Dataset`: one array per field, filled by the shard readers.

The dataset hands over *segments* (a reader, rows in its shard, their places in the batch); here
the batch arrays are made (or taken from ``out=``), ragged fields padded or packed, pixels placed
as read, encoded images decoded, strings and keys turned into ``str``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from fastdata.errors import CorruptShardError, UsageError
from fastdata.format.shardio import Layout, Packed
from fastdata.format.spec import (
    ENCODING_PIXELS,
    KEY_FIELD,
    LENGTHS_SUFFIX,
    OFFSETS_SUFFIX,
    SHAPE_SUFFIX,
    FieldSpec,
    is_string,
)
from fastdata.reading.decode import BatchDecoder, check_shapes

Batch = dict[str, Any]  # field name -> numpy array, or list of str for string fields and keys


class Assembly:
    """Reading segments of a batch into its arrays; mixed into :class:`fastdata.Dataset`."""

    root: Path | str
    schema: list[FieldSpec]
    _strings: list[FieldSpec]
    _images: list[FieldSpec]  # image fields decoded on read (none with decode=False)
    _pixels: list[FieldSpec]  # raw pixels: placed straight into the padded image batch as they are read
    _decoder: BatchDecoder | None
    _with_key: bool
    _read_ahead_memo: dict[str, bool]  # kept by the read-ahead (fastdata/reading/readahead.py): "warm", its last probe

    if TYPE_CHECKING:
        def keys(self, indices: Iterable[int] | np.ndarray) -> list[str]: ...

    def _from_disk(self) -> bool:
        """Whether this process's read-ahead found the batches ahead of the readers not in the page
        cache (its probe, ReadAhead._resident): the readers then read with ``pread`` rather than from
        their maps (ShardReader.read_into). False without a read-ahead: nothing says so."""
        return self._read_ahead_memo.get("warm") is False

    def check_ragged(self, ragged: str) -> bool:
        """True for ``ragged="packed"`` (see :meth:`fastdata.Dataset.get_batch`); refuses what cannot be packed."""
        if ragged == "padded":
            return False
        if ragged != "packed":
            raise UsageError(f"ragged={ragged!r}: expected 'padded' or 'packed'")
        if self._decoder is not None:
            enc = next(f.name for f in self._images if f.encoding != ENCODING_PIXELS)
            raise UsageError(f"{self.root}: field {enc!r} holds encoded images, which are decoded into a padded batch; "
                             "open the dataset with decode=False to get their bytes packed, or use ragged='padded'")
        names = {f.name for f in self.schema}
        for f in self.schema:
            if f.ragged and f.name + OFFSETS_SUFFIX in names:
                raise UsageError(f"{self.root}: field {f.name + OFFSETS_SUFFIX!r} clashes with the packed offsets of "
                                 f"ragged field {f.name!r}; use ragged='padded'")
        return True

    def _read(self, segments: list[Any], idx: np.ndarray, asked: np.ndarray,
              out: dict[str, np.ndarray] | None, packed: bool = False) -> Batch:
        """Read ``segments`` (reader, rows in its shard, places in the batch) of the batch ``idx``; decode images."""
        b = len(idx)
        result: Batch = {}
        for f in self.schema:
            if f.ragged:
                lengths = np.zeros(b, dtype=np.int64)
                for reader, local, dest in segments:
                    lengths[dest] = reader.lengths(f.name, local)
                result[f.name + LENGTHS_SUFFIX] = lengths
            else:
                result[f.name] = self._out_array(f, b, out)
        where = lambda k: f"{self.root}: sample {int(idx[k])}"  # noqa: E731
        first = {f.name: result[f.name] for f in self.schema if not f.ragged}
        layouts: dict[str, Layout] = {}
        if self._pixels:  # the image shapes are needed first: read the fixed fields before the rest
            for reader, local, dest in segments:
                reader.read_into(local, dest, first)
            for f in self._pixels:
                s = result[f.name + SHAPE_SUFFIX]
                lengths = result.pop(f.name + LENGTHS_SUFFIX)
                padded = check_shapes(f, s, lengths, where)
                if packed:
                    result[f.name], layouts[f.name] = self._packed_array(f, lengths, out, result)
                else:
                    result[f.name] = self._ragged_array(f, padded, out)
                    layouts[f.name] = s
            first = {}
        decoded = {f.name for f in self._images if f.encoding != ENCODING_PIXELS}
        for f in self.schema:
            if f.ragged and f.name not in result:
                lengths = result[f.name + LENGTHS_SUFFIX]
                if packed and not is_string(f):
                    result[f.name], layouts[f.name] = self._packed_array(f, lengths, out, result)
                    continue
                # encoded images: ``out`` takes the decoded pixels, not the stored bytes
                result[f.name] = self._ragged_array(f, (b, int(lengths.max()) if b else 0, *f.trailing),
                                                    None if f.name in decoded else out)
        outs = {**first, **{f.name: result[f.name] for f in self.schema if f.ragged}}
        if outs:
            disk = self._from_disk()
            for reader, local, dest in segments:
                reader.read_into(local, dest, outs, layouts, from_disk=disk)
        if self._decoder is not None:
            for f in self._images:
                if f.encoding != ENCODING_PIXELS:
                    self._decoder.finish(f, result, where, None if out is None else out.get(f.name))
        for f in self._strings:
            result[f.name] = self._texts(f, result[f.name], result.pop(f.name + LENGTHS_SUFFIX), idx)
        if self._with_key:
            result[KEY_FIELD] = self.keys(asked)
        return result

    def _texts(self, f: FieldSpec, data: np.ndarray, lengths: np.ndarray, idx: np.ndarray) -> list[str]:
        out = []
        for k, n in enumerate(lengths.tolist()):
            try:
                out.append(data[k, :n].tobytes().decode("utf-8"))
            except UnicodeDecodeError:
                raise CorruptShardError(f"{self.root}: sample {int(idx[k])}: field {f.name!r} is not UTF-8 text") from None
        return out

    @classmethod
    def _packed_array(cls, f: FieldSpec, lengths: np.ndarray, out: dict[str, np.ndarray] | None,
                      result: Batch) -> tuple[np.ndarray, Packed]:
        """The packed batch array of a ragged field (samples back to back) and its layout; its row
        offsets go to ``result["<name>_offsets"]``."""
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        result[f.name + OFFSETS_SUFFIX] = offsets
        array = cls._ragged_array(f, (int(offsets[-1]), *f.trailing), out)
        return array, Packed(offsets[:-1] * f.row_nbytes)

    @staticmethod
    def _ragged_array(f: FieldSpec, shape: tuple[int, ...], out: dict[str, np.ndarray] | None) -> np.ndarray:
        """The padded batch array of a ragged field: in ``out[name]``'s memory when it is large enough
        (no zeroing needed: the readers write every byte of it)."""
        a = None if out is None else out.get(f.name)
        n = int(np.prod(shape))
        if a is not None and a.dtype == f.np_dtype and a.flags.c_contiguous and a.size >= n:
            return a.reshape(-1)[:n].reshape(shape)
        return np.empty(shape, dtype=f.np_dtype)

    @staticmethod
    def _out_array(f: FieldSpec, b: int, out: dict[str, np.ndarray] | None) -> np.ndarray:
        shape = (b, *f.trailing)
        if out is None or f.name not in out:
            return np.empty(shape, dtype=f.np_dtype)
        a = out[f.name]
        if a.shape != shape or a.dtype != f.np_dtype or not a.flags.c_contiguous:
            raise ValueError(f"out[{f.name!r}] must be a C-contiguous {f.np_dtype} array of shape {shape}")
        return a


__all__ = ["Assembly", "Batch"]
