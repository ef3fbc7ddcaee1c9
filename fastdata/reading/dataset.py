"""``fastdata.open``: a map-style dataset over a directory of shards (or a URL's shard cache), read
in batches straight into one array per field, with subsets and splits."""

from __future__ import annotations

import copy
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping, Sequence

import numpy as np

from fastdata.errors import CorruptShardError, UsageError
from fastdata.format import IMAGE_ENCODINGS, FieldSpec, Manifest
from fastdata.format.backends import INDEX
from fastdata.format.interface import Layout, Packed, ShardReader
from fastdata.format.manifest import read_manifest
from fastdata.format.spec import (
    ENCODING_PIXELS,
    KEY_FIELD,
    LENGTHS_SUFFIX,
    OFFSETS_SUFFIX,
    SHAPE_SUFFIX,
    companions,
    is_string,
)
from fastdata.format.store import LocalShards, ShardStore
from fastdata.handles import open_all
from fastdata.reading.decode import BatchDecoder, check_shapes
from fastdata.remote import RemoteOptions, is_url
from fastdata.seeds import Stream, numpy_rng

if TYPE_CHECKING:
    from fastdata.remote.store import RemoteStore

Batch = dict[str, Any]  # field name -> numpy array, or list of str for string fields and keys
_COLUMN_CHUNK = 1 << 16  # samples read at a time by column()


def open_store(src: str, remote: RemoteOptions | None) -> ShardStore:
    """Where the shards of the dataset at ``src`` (a folder or a URL) live."""
    if is_url(src):
        from fastdata.remote.store import RemoteStore

        return RemoteStore(src, remote)
    if remote is not None:
        raise UsageError(f"{src}: remote= options apply to URLs (s3://...) only, and this is a local path")
    manifest = read_manifest(Path(src))
    if manifest.backend == INDEX:  # fastdata index: rows of existing files
        from fastdata.format.inplace import InPlaceShards

        return InPlaceShards(Path(src), manifest)
    return LocalShards(Path(src), manifest)


class Dataset:
    """Samples of a fastdata dataset; ``ds[i]`` and ``ds.get_batch(indices)`` give dicts of numpy arrays.
    ``decode``: image fields as pixels on read (``"float"``: float32 in [0, 1]) on ``decode_threads`` threads
    (default: the usable CPUs); ``root`` may be a URL, cached as ``remote`` says (docs/remote.md)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        fields: Sequence[str] | None = None,
        *,
        decode: bool | Literal["float"] = True,
        decode_threads: int | None = None,
        remote: RemoteOptions | None = None,
    ) -> None:
        src = root if isinstance(root, str) else os.fspath(root)
        self.options: dict[str, Any] = {"fields": fields, "decode": decode, "decode_threads": decode_threads,
                                        "remote": remote}
        self._store = open_store(src, remote)
        self.root: Path | str = self._store.root
        self.manifest: Manifest = self._store.manifest
        self.classes: list[str] | None = self.manifest.classes
        names = [f.name for f in self.manifest.fields]
        self._subset: np.ndarray | None = None
        self._subset_pos: tuple[np.ndarray, np.ndarray] | None = None
        self._with_key = fields is not None and KEY_FIELD in fields and KEY_FIELD not in names
        self._keys = self._store.key_table()
        if self._with_key:
            self._check_keys()  # asked for keys that cannot be read: say why now, not at the first batch
        self.schema: list[FieldSpec] = list(self.manifest.fields)
        if fields is not None:  # those asked for, each image field with its shape (and codec) fields
            unknown = [f for f in fields if f not in names and not (f == KEY_FIELD and self._with_key)]
            if unknown:
                raise UsageError(f"{self.root}: no field {unknown[0]!r} (fields: {', '.join(names)}, and 'key')")
            wanted = set(fields).union(*(companions(f) for f in self.manifest.fields if f.name in fields))
            self.schema = [f for f in self.manifest.fields if f.name in wanted]
        # image fields' shape and codec fields read (to decode) but not asked for: left out of batches
        self._hidden = frozenset(f.name for f in self.schema if fields is not None and f.name not in fields)
        # the fields get_batch returns (``<name>_lengths`` of ragged fields aside)
        self.fields = [f.name for f in self.schema if f.name not in self._hidden]
        self.fields += [KEY_FIELD] if self._with_key else []
        self._strings = [f for f in self.schema if is_string(f)]
        images = [f for f in self.schema if f.encoding in IMAGE_ENCODINGS] if decode else []
        self._pixels = [f for f in images if f.encoding == ENCODING_PIXELS]  # placed as read
        self._encoded = [f for f in images if f.encoding != ENCODING_PIXELS]  # decoded after reading
        if decode not in (True, False, "float"):
            raise UsageError(f"decode={decode!r}: expected True, False or 'float'")
        self._decoder = BatchDecoder(decode_threads, unit_float=decode == "float") if self._encoded else None
        # one reader per shard of the manifest (the loader aligns its batch buffers to the first)
        self.readers: list[ShardReader] = self._store.open_readers(self.manifest.fields)
        self._starts = np.array([s.start for s in self.manifest.shards], dtype=np.int64)

    def with_options(self, **changes: Any) -> "Dataset":
        """The same dataset opened again with some options changed (``fields``, ``decode``, ``decode_threads``)."""
        unknown = set(changes) - set(self.options)
        if unknown:
            raise TypeError(f"unknown dataset options: {sorted(unknown)}")
        ds = Dataset(self.root, **{**self.options, **changes})
        ds._subset, ds._subset_pos = self._subset, self._subset_pos  # a subset stays the same subset
        return ds

    @property
    def remote(self) -> "RemoteStore | None":
        """The remote store and shard cache when the dataset was opened from a URL, else None."""
        return self._store.remote

    def byte_ranges(self, indices: Iterable[int] | np.ndarray) -> list[tuple[Path, np.ndarray, np.ndarray]]:
        """Where reading samples ``indices`` reads in the shard files: ``(file, starts, lengths)`` per shard, in
        bytes; none for a URL dataset, columns held in memory and records whose place is not known yet."""
        if self.remote is not None:
            return []
        segments, shards = self._segments(self._stored(np.asarray(indices, dtype=np.int64)))
        open_all([self.readers[s] for s in shards])
        names = [f.name for f in self.schema]
        out = []
        for reader, local, _ in segments:
            starts, lengths = reader.ranges(local, names)
            if len(starts):
                out.append((reader.path, starts, lengths))
        return out

    def __len__(self) -> int:
        return self.manifest.num_samples if self._subset is None else len(self._subset)

    def trim(self, batch: Any) -> Any:
        """``batch`` without the companion fields read but not asked for (an image field's ``_shape``/``_codec``)."""
        for name in self._hidden:
            batch.pop(name, None)
        return batch

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}:{'str' if is_string(f) else f.np_dtype}{'' if is_string(f) else list(f.shape)}"
                           for f in self.schema)
        part = f" (a subset of {self.manifest.num_samples})" if self._subset is not None else ""
        return (f"<fastdata.Dataset {str(self.root)!r} {len(self)} samples{part}, {len(self.readers)} "
                f"{self.manifest.backend} shards; {fields}>")

    # --- keys, subsets, splits ------------------------------------------------------------------

    def _stored(self, indices: np.ndarray) -> np.ndarray:
        return indices if self._subset is None else self._subset[indices]

    def _check_keys(self) -> None:
        if self.manifest.keys is None:
            if (self.manifest.source or {}).get("kind") == "merge":
                raise UsageError(f"{self.root}: has no sample keys (merged with --drop-keys, or from datasets "
                                 "without keys); merge datasets that have keys (convert old ones again) to get keys")
            raise UsageError(f"{self.root}: has no sample keys (format version {self.manifest.version}: written "
                             "before keys existed); convert it again to get keys")

    def key(self, i: int) -> str:
        """The key of sample ``i``: its path relative to the conversion's source (or its index, for
        array sources). Keys are unique within a dataset."""
        n = len(self)
        if not isinstance(i, (int, np.integer)) or not -n <= i < n:
            raise IndexError(f"index {i!r}: not an integer in range for a dataset of {n} samples")
        return self.keys([int(i) % n])[0]

    def keys(self, indices: Iterable[int] | np.ndarray) -> list[str]:
        """The keys of samples ``indices`` (see :meth:`key`)."""
        self._check_keys()
        stored = self._stored(np.asarray(indices, dtype=np.int64))
        if self._keys is None:
            return [str(j) for j in stored.tolist()]
        return self._keys.keys(stored.tolist())

    def index_of(self, key: str) -> int:
        """The index (in this dataset or subset) of the sample keyed ``key``; KeyError if there is none."""
        self._check_keys()
        if self._keys is None:
            j = int(key) if isinstance(key, str) and key.isdigit() and str(int(key)) == key else -1
            j = j if j < self.manifest.num_samples else -1
        else:
            j = self._keys.find(key)
        if j >= 0 and self._subset is not None:
            if self._subset_pos is None:
                order = np.argsort(self._subset, kind="stable")
                self._subset_pos = (self._subset[order], order)
            sv, order = self._subset_pos
            p = int(np.searchsorted(sv, j))
            j = int(order[p]) if p < len(sv) and sv[p] == j else -1
        if j < 0:
            raise KeyError(f"{self.root}: no sample keyed {key!r}" + (" in this subset" if self._subset is not None else ""))
        return j

    def subset(self, selection: Sequence[int] | Sequence[str] | np.ndarray) -> Dataset:
        """A subset of the samples: ``selection`` is indices (into this dataset), keys, or a boolean
        mask of ``len(self)``. The subset's sample ``i`` is the ``i``-th selected; no sample twice."""
        sel = np.asarray(selection) if not isinstance(selection, np.ndarray) else selection
        n = len(self)
        if sel.ndim != 1:
            raise UsageError(f"subset takes a 1-D selection (indices, keys or a mask), not shape {sel.shape}")
        if sel.dtype == bool:
            if len(sel) != n:
                raise UsageError(f"a subset mask needs {n} entries (one per sample), not {len(sel)}")
            idx = np.flatnonzero(sel).astype(np.int64)
        elif sel.dtype.kind in "US":
            try:
                idx = np.array([self.index_of(str(k)) for k in sel.tolist()], dtype=np.int64)
            except KeyError as e:
                raise UsageError(str(e.args[0])) from None
        elif sel.dtype.kind in "iu" or len(sel) == 0:
            idx = sel.astype(np.int64)
            if len(idx) and (idx.min() < 0 or idx.max() >= n):
                bad = idx[(idx < 0) | (idx >= n)][0]
                raise UsageError(f"subset index {bad} out of range for a dataset of {n} samples")
        else:
            raise UsageError(f"subset takes indices, keys or a boolean mask, not an array of {sel.dtype}")
        if len(np.unique(idx)) != len(idx):
            raise UsageError("subset selection names a sample twice (a subset holds each sample at most once; "
                             "use sampler=Weighted(...) to draw samples more often)")
        part = copy.copy(self)
        part._subset = self._stored(idx)
        part._subset_pos = None
        return part

    @property
    def stored_indices(self) -> np.ndarray:
        """For each sample of this dataset, its index in the stored dataset (``arange`` unless a subset)."""
        return np.arange(self.manifest.num_samples, dtype=np.int64) if self._subset is None else self._subset.copy()

    def identity(self) -> str:
        """A short fingerprint of which samples this is (the stored dataset, or a subset of it)."""
        if self._subset is None:
            return f"all:{self.manifest.num_samples}"
        return "subset:" + hashlib.sha256(np.ascontiguousarray(self._subset, dtype="<i8").tobytes()).hexdigest()[:16]

    def column(self, name: str) -> np.ndarray:
        """Every sample's value of field ``name`` (a numpy array; strings as a numpy ``str`` array)."""
        if name == KEY_FIELD and name not in [f.name for f in self.manifest.fields]:
            return np.array(self.keys(np.arange(len(self))), dtype=str)
        with self.with_options(fields=[name], decode=False) as ds:
            f = ds.manifest.field(name)
            if f.ragged and not is_string(f):  # refused before anything is read, and on an empty subset too
                raise UsageError(f"field {name!r} is ragged; column() takes fixed-shape and string fields")
            parts: list[Any] = []
            for a in range(0, len(self), _COLUMN_CHUNK):
                b = ds.get_batch(np.arange(a, min(a + _COLUMN_CHUNK, len(self))))
                parts.append(np.array(b[name], dtype=str) if is_string(f) else b[name])
        if not parts:
            return np.array([], dtype=str if is_string(f) else f.np_dtype)
        return np.concatenate(parts)

    def split(self, fractions: Mapping[str, float], *, seed: int = 0, stratify: str | None = None) -> dict[str, Dataset]:
        """Disjoint subsets in stored order, e.g. ``{"train": 0.9, "val": 0.1}`` (fractions summing below 1 leave
        the rest out); a pure function of the arguments; ``stratify="label"`` keeps each value's share per part."""
        if not isinstance(fractions, Mapping) or not fractions:
            raise UsageError(f"split takes a dict of part name: fraction, e.g. {{'train': 0.9, 'val': 0.1}}, "
                             f"not {fractions!r}")
        names = list(fractions)
        for part in names:
            v = fractions[part]
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise UsageError(f"split fraction of part {part!r} must be a number between 0 and 1, not {v!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise UsageError(f"split seed must be an integer >= 0, not {seed!r}")
        fr = np.array([float(fractions[k]) for k in names], dtype=np.float64)
        if not np.isfinite(fr).all() or (fr <= 0).any() or fr.sum() > 1 + 1e-9:
            raise UsageError(f"split fractions must be positive and sum to at most 1, not {dict(fractions)}")
        n = len(self)
        rng = numpy_rng(seed, 0, Stream.SPLIT)
        if stratify is None:
            groups = [np.arange(n, dtype=np.int64)]
        else:
            col = self.column(stratify)
            if col.ndim != 1:
                raise UsageError(f"stratify={stratify!r}: the field must hold one value per sample, not shape {col.shape[1:]}")
            _, inverse = np.unique(col, return_inverse=True)
            order = np.argsort(inverse, kind="stable")
            cuts = np.flatnonzero(np.diff(inverse[order])) + 1
            groups = np.split(order, cuts) if n else []
        # each value's group is cut by the fractions, carrying rounding to the next: shares right within one sample
        fr_all = np.append(fr, max(0.0, 1.0 - fr.sum()))  # the last "part": what fractions below 1 leave out
        carry = np.zeros(len(fr_all))
        parts: list[list[np.ndarray]] = [[] for _ in fr_all]
        for g in groups:
            g = rng.permutation(g)
            exact = fr_all * len(g) + carry
            counts = np.maximum(np.floor(exact), 0).astype(np.int64)
            extra = len(g) - int(counts.sum())
            if extra > 0:
                counts[np.argsort(-(exact - counts), kind="stable")[:extra]] += 1
            while counts.sum() > len(g):  # a negative carry can overshoot: take back from the largest
                counts[int(np.argmax(counts - exact))] -= 1
            carry = exact - counts
            at = 0
            for k, c in enumerate(counts.tolist()):
                parts[k].append(g[at : at + c])
                at += c
        out = {}
        for k, name in enumerate(names):
            idx = np.sort(np.concatenate(parts[k])) if parts[k] else np.zeros(0, dtype=np.int64)
            out[name] = self.subset(idx.astype(np.int64))
        return out

    # --- reading -------------------------------------------------------------------------------

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"dataset indices must be integers, not {type(i).__name__} (use get_batch for many)")
        n = len(self)
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"index {i} out of range for a dataset of {n} samples")
        batch = self.get_batch([j])
        out = {}
        for f in self.schema:
            if f.name in self._hidden:
                continue
            a = batch[f.name][0]
            trimmed = f.ragged and f not in self._pixels and f not in self._encoded and f not in self._strings
            out[f.name] = a[: batch[f.name + LENGTHS_SUFFIX][0]] if trimmed else a
        if self._with_key:
            out[KEY_FIELD] = batch[KEY_FIELD][0]
        return out

    def get_batch(self, indices: Iterable[int] | np.ndarray, out: dict[str, np.ndarray] | None = None,
                  *, ragged: Literal["padded", "packed"] = "padded", companions: bool = False) -> Batch:
        """Read the samples ``indices`` (any order, repeats allowed) into one array per field.

        ``out``: preallocated arrays to fill (e.g. pinned buffers): fixed fields C-contiguous ``(len(indices),
        *shape)``; ragged fields any C-contiguous array of the dtype, used when large enough. ``ragged="padded"``
        zero-pads ragged fields and mixed-size ``pixels`` images; ``"packed"`` puts samples back to back with
        ``<name>_offsets`` (``B + 1`` row offsets; encoded images need ``decode=False``). ``companions=True``
        adds image fields' ``_shape``/``_codec`` fields (:meth:`trim` drops them).
        """
        idx = np.asarray(indices)
        if idx.size == 0:
            idx = idx.astype(np.int64)
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            raise TypeError("indices must be a 1-D sequence of integers")
        idx = idx.astype(np.int64, copy=False)
        n, b = len(self), len(idx)
        if b and (idx.min() < 0 or idx.max() >= n):
            bad = idx[(idx < 0) | (idx >= n)][0]
            raise IndexError(f"index {bad} out of range for a dataset of {n} samples")
        asked = idx
        idx = self._stored(idx)
        packed = self.check_ragged(ragged)
        segments, shards = self._segments(idx)
        with self._store.pinned(shards, self.readers):
            open_all([self.readers[s] for s in shards])  # side by side: a batch waits for one open, not many
            batch = self._read(segments, idx, asked, out, packed)
        return batch if companions else self.trim(batch)

    def _segments(self, idx: np.ndarray) -> tuple[list[Any], list[int]]:
        """The stored samples ``idx`` as segments (reader, rows in its shard, places in the batch), one per
        shard they touch, in shard order; and those shards."""
        if len(idx) == 0:
            return [], []
        order = np.argsort(idx, kind="stable")
        sidx = idx[order]
        shard_of = np.searchsorted(self._starts, sidx, side="right") - 1
        cuts = (np.flatnonzero(np.diff(shard_of)) + 1).tolist()
        firsts, ends = [0, *cuts], [*cuts, len(idx)]
        shards: list[int] = shard_of[firsts].tolist()
        local = sidx - self._starts[shard_of]
        return [(self.readers[s], local[a:e], order[a:e]) for s, a, e in zip(shards, firsts, ends)], shards

    def __getitems__(self, indices: list[int]) -> Batch:
        """A whole batch in one :meth:`get_batch` call: what a torch DataLoader with a batch sampler asks for;
        pair it with a collate_fn that takes the dict."""
        return self.get_batch(indices, companions=True)

    def check_ragged(self, ragged: str) -> bool:
        """True for ``ragged="packed"`` (see :meth:`fastdata.Dataset.get_batch`); refuses what cannot be packed."""
        if ragged == "padded":
            return False
        if ragged != "packed":
            raise UsageError(f"ragged={ragged!r}: expected 'padded' or 'packed'")
        if self._decoder is not None:
            raise UsageError(f"{self.root}: field {self._encoded[0].name!r} holds encoded images, which are decoded into a padded batch; "
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
        fixed = {f.name: result[f.name] for f in self.schema if not f.ragged}
        layouts: dict[str, Layout] = {}
        if self._pixels:  # the image shapes are needed first: read the fixed fields before the rest
            for reader, local, dest in segments:
                reader.read_into(local, dest, fixed)
            fixed = {}
        for f in self.schema:
            if not f.ragged:
                continue
            lengths = result[f.name + LENGTHS_SUFFIX]
            shape = (b, int(lengths.max()) if b else 0, *f.trailing)
            if f in self._pixels:  # padded as images (its lengths are only bytes)
                layouts[f.name] = shapes = result[f.name + SHAPE_SUFFIX]
                shape = check_shapes(f, shapes, result.pop(f.name + LENGTHS_SUFFIX), where)
            if packed and not is_string(f):
                result[f.name], layouts[f.name] = self._packed_array(f, lengths, out, result)
            else:  # encoded images: ``out`` takes the decoded pixels, not the stored bytes
                result[f.name] = self._ragged_array(f, shape, None if f in self._encoded else out)
        outs = {**fixed, **{f.name: result[f.name] for f in self.schema if f.ragged}}
        if outs:
            for reader, local, dest in segments:
                reader.read_into(local, dest, outs, layouts)
        if self._decoder is not None:
            for f in self._encoded:
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
        """The packed batch array of a ragged field and its layout; its row offsets go to
        ``result["<name>_offsets"]``."""
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        result[f.name + OFFSETS_SUFFIX] = offsets
        array = cls._ragged_array(f, (int(offsets[-1]), *f.trailing), out)
        return array, Packed((offsets[:-1] * f.row_nbytes).tolist())

    @staticmethod
    def _ragged_array(f: FieldSpec, shape: tuple[int, ...], out: dict[str, np.ndarray] | None) -> np.ndarray:
        """The padded batch array of a ragged field, in ``out[name]``'s memory when it is large enough."""
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

    def close(self) -> None:
        """Release this process's file handles and decode threads (they reopen on next use)."""
        for r in self.readers:
            r.close()
        if self._decoder is not None:
            self._decoder.close()
        self._store.release_pins()
        if self._keys is not None:
            self._keys.close()

    def __enter__(self) -> "Dataset":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


open = Dataset  # noqa: A001 - ``fastdata.open(path, fields, ...)``: the dataset at ``path`` (a folder or a URL)
