"""``fastdata.open``: a map-style dataset over a directory of shards.

``get_batch`` sorts the requested indices, groups them by shard, merges runs that are
consecutive on disk and in the batch, and reads straight into one preallocated array
per field (fastdata/reading/assembly.py). Ragged fields come back padded to the longest sample in the batch, with a
``<name>_lengths`` array. Image fields come back decoded, as uint8 ``(B, H, W, C)`` arrays
(see fastdata/reading/decode.py); ``decode=False`` returns their stored bytes instead. String fields
come back as lists of ``str``, and so do sample keys when ``"key"`` is among the fields.

Where the shards live (a local folder, a URL's shard cache) is a
:class:`fastdata.format.source.ShardSource`; ``subset`` and ``split`` give views
(fastdata/reading/selection.py): the same class over a subset of the samples, accepted wherever a
dataset is (loaders, ``fastdata.measure.bench``, the DALI backend).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Literal, Sequence

import numpy as np

from fastdata.errors import UsageError
from fastdata.format import IMAGE_ENCODINGS, LENGTHS_SUFFIX, FieldSpec, Manifest
from fastdata.format.backends import INDEX
from fastdata.format.interface import ShardReader
from fastdata.format.manifest import read_manifest
from fastdata.format.source import LocalShards, ShardSource
from fastdata.format.spec import ENCODING_PIXELS, KEY_FIELD, companions, is_string
from fastdata.handles import open_all
from fastdata.reading.assembly import Assembly, Batch
from fastdata.reading.decode import BatchDecoder
from fastdata.reading.selection import Selection
from fastdata.remote import RemoteOptions, is_url

if TYPE_CHECKING:
    from fastdata.reading.readahead import ReadAhead
    from fastdata.remote.prefetch import PlanFollower
    from fastdata.remote.store import RemoteStore


def open_source(src: str, remote: RemoteOptions | None) -> ShardSource:
    """Where the shards of the dataset at ``src`` (a folder or a URL) live."""
    if is_url(src):
        from fastdata.remote.shards import RemoteShards

        return RemoteShards(src, remote)
    if remote is not None:
        raise UsageError(f"{src}: remote= options apply to URLs (s3://...) only, and this is a local path")
    manifest = read_manifest(Path(src))
    if manifest.backend == INDEX:  # fastdata index: rows of existing files
        from fastdata.format.inplace import InPlaceShards

        return InPlaceShards(Path(src), manifest)
    return LocalShards(Path(src), manifest)


class Dataset(Selection, Assembly):
    """Samples of a fastdata dataset; ``ds[i]`` and ``ds.get_batch(indices)`` give dicts of numpy arrays.

    ``decode`` turns encoded and ragged image fields into pixels on read, with
    ``decode_threads`` threads per process (default: the usable CPUs); ``decode="float"`` gives
    encoded images as float32 in [0, 1] instead of uint8, each converted right after it is decoded
    (the torch loader's choice on the CPU; stored pixels stay uint8). ``root`` may be a URL
    (``s3://bucket/ds``): shards are then read through the node's shard cache, set up by
    ``remote`` (:class:`fastdata.RemoteOptions`; docs/remote.md).
    """


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
        self._source = open_source(src, remote)
        self.root: Path | str = self._source.root
        self.manifest: Manifest = self._source.manifest
        names = [f.name for f in self.manifest.fields]
        self._view: np.ndarray | None = None
        self._read_ahead_memo: dict[str, bool] = {}  # whether the last pass found its batches cached (read_ahead)
        self._all_open_pid: int | None = None  # this process had every shard open (_open_shards)
        self._view_pos: tuple[np.ndarray, np.ndarray] | None = None
        self._with_key = fields is not None and KEY_FIELD in fields and KEY_FIELD not in names
        self._keys = self._source.key_table()
        if self._with_key:
            self._check_keys()  # asked for keys that cannot be read: say why now, not at the first batch
        self.schema: list[FieldSpec] = self._schema(fields, names)
        # image fields' shape and codec fields read (to decode) but not asked for: left out of batches
        self._hidden = frozenset(f.name for f in self.schema if fields is not None and f.name not in fields)
        self._strings = [f for f in self.schema if is_string(f)]
        self._images = [f for f in self.schema if f.encoding in IMAGE_ENCODINGS] if decode else []
        self._pixels = [f for f in self._images if f.encoding == ENCODING_PIXELS]
        encoded = [f for f in self._images if f.encoding != ENCODING_PIXELS]
        if decode not in (True, False, "float"):
            raise UsageError(f"decode={decode!r}: expected True, False or 'float'")
        self._decoder = BatchDecoder(decode_threads, unit_float=decode == "float") if encoded else None
        self._readers: list[ShardReader] = self._source.open_readers(self.manifest.fields)
        self._starts = np.array([s.start for s in self.manifest.shards], dtype=np.int64)

    def _schema(self, fields: Sequence[str] | None, names: list[str]) -> list[FieldSpec]:
        """The fields read: those asked for (all when None), each image field with its shape (and codec) fields."""
        if fields is None:
            return list(self.manifest.fields)
        unknown = [f for f in fields if f not in names and not (f == KEY_FIELD and self._with_key)]
        if unknown:
            raise UsageError(f"{self.root}: no field {unknown[0]!r} (fields: {', '.join(names)}, and 'key')")
        wanted = set(fields).union(*(companions(f) for f in self.manifest.fields if f.name in fields))
        return [f for f in self.manifest.fields if f.name in wanted]

    def with_options(self, **changes: Any) -> "Dataset":
        """The same dataset opened again with some options changed (``fields``, ``decode``, ``decode_threads``)."""
        unknown = set(changes) - set(self.options)
        if unknown:
            raise TypeError(f"unknown dataset options: {sorted(unknown)}")
        ds = Dataset(self.root, **{**self.options, **changes})
        ds._view, ds._view_pos = self._view, self._view_pos  # a subset stays the same subset
        return ds

    @property
    def remote(self) -> "RemoteStore | None":
        """The remote store and shard cache when the dataset was opened from a URL, else None."""
        return self._source.remote

    def follow(self, plans: Sequence[Sequence[np.ndarray]], mine: int, first: int, lead: int) -> "PlanFollower | None":
        """For a URL dataset: start prefetching shards along an epoch plan (every rank's batches; this
        rank is ``mine``, starting at batch ``first``, readers up to ``lead`` batches ahead)."""
        return self._source.follow(plans, mine, first, lead)

    def read_ahead(self, plan: Sequence[np.ndarray], first: int, lead: int, ahead_bytes: int,
                   sendfile: bool = False) -> "ReadAhead | None":
        """For shards read in place (a local dataset): start hinting the byte ranges of ``plan[first:]`` to the kernel, up to
        ``ahead_bytes`` beyond the ``lead`` batches the readers may be reading (fastdata/reading/readahead.py;
        ``sendfile``: its stream reads go to ``/dev/null``, for plans whose streams lie within a few shards).
        None when off (``ahead_bytes=0``), for a URL dataset (its shard cache prefetches) or without
        ``posix_fadvise``."""
        from fastdata.reading.readahead import ReadAhead, supported

        if not self._source.in_place or ahead_bytes <= 0 or not supported():
            return None
        return ReadAhead(self.byte_ranges, plan, first, lead, ahead_bytes, memo=self._read_ahead_memo,
                         sendfile=sendfile)

    def byte_ranges(self, indices: Iterable[int] | np.ndarray) -> list[tuple[Path, np.ndarray, np.ndarray]]:
        """Where reading samples ``indices`` reads in the shard files: ``(file, starts, lengths)`` per
        shard, in bytes; columns held in memory, and records whose place is not known yet, give none."""
        idx = np.sort(self._stored(np.asarray(indices, dtype=np.int64)))
        if not self._source.in_place or len(idx) == 0:
            return []
        shard_of = np.searchsorted(self._starts, idx, side="right") - 1
        cuts = np.concatenate(([0], np.flatnonzero(np.diff(shard_of)) + 1, [len(idx)]))
        names = [f.name for f in self.schema]
        out = []
        firsts = cuts[:-1].tolist()
        shards = shard_of[firsts].tolist()
        self._open_shards(shards)
        for s, a, e in zip(shards, firsts, cuts[1:].tolist()):
            reader = self._readers[s]
            starts, lengths = reader.ranges(idx[a:e] - self._starts[s], names)
            if len(starts):
                out.append((reader.path, starts, lengths))
        return out

    def shard_paths(self) -> list[Path]:
        """Local files of the shards (for a URL dataset: where the cache keeps them, once downloaded)."""
        return [r.path for r in self._readers]

    @property
    def classes(self) -> list[str] | None:
        return self.manifest.classes

    def __len__(self) -> int:
        return self.manifest.num_samples if self._view is None else len(self._view)

    @property
    def fields(self) -> list[str]:
        """Names of the fields ``get_batch`` returns (``<name>_lengths`` of ragged fields aside)."""
        return [f.name for f in self.schema if f.name not in self._hidden] + ([KEY_FIELD] if self._with_key else [])

    def trim(self, batch: Any) -> Any:
        """``batch`` (a dict) without the companion fields read but not asked for in ``fields=``
        (an image field's ``_shape``/``_codec``): what a batch read with ``companions=True`` gives the user."""
        for name in self._hidden:
            batch.pop(name, None)
        return batch

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}:{'str' if is_string(f) else f.np_dtype}{'' if is_string(f) else list(f.shape)}"
                           for f in self.schema)
        view = f" (a subset of {self.manifest.num_samples})" if self._view is not None else ""
        return (f"<fastdata.Dataset {str(self.root)!r} {len(self)} samples{view}, {len(self._readers)} "
                f"{self.manifest.backend} shards; {fields}>")

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
            out[f.name] = a[: batch[f.name + LENGTHS_SUFFIX][0]] if f.ragged and f not in self._images and \
                f not in self._strings else a
        if self._with_key:
            out[KEY_FIELD] = batch[KEY_FIELD][0]
        return out

    def get_batch(self, indices: Iterable[int] | np.ndarray, out: dict[str, np.ndarray] | None = None,
                  *, ragged: Literal["padded", "packed"] = "padded", companions: bool = False) -> Batch:
        """Read the samples ``indices`` (any order, repeats allowed) into one array per field.

        ``out`` may supply preallocated arrays (for example pinned buffers, reused from batch to
        batch): for a fixed-shape field, C-contiguous with shape ``(len(indices), *shape)``; for a
        ragged field (or a ``pixels`` image field), any C-contiguous array of the field's dtype,
        whose memory holds the batch when it is large enough (else a new array is made).

        ``ragged="padded"`` (the default) pads each ragged field to its longest sample, and
        mixed-size ``pixels`` images to the batch's largest height and width, with zeros.
        ``ragged="packed"`` puts the samples of a ragged field back to back instead, as
        ``(total_rows, *shape[1:])`` (a ``pixels`` image field: its bytes, flat), with
        ``<name>_offsets`` (``B + 1`` row offsets: sample ``k`` is ``x[o[k]:o[k + 1]]``): no padding
        to write or to move to the GPU, for pipelines that take variable-size samples (nested
        tensors, DALI's external source, padding on the device). String fields still come back as
        ``str``; encoded images are decoded into a padded batch, so they need ``decode=False``.

        The batch holds the fields of ``fields=`` (all when None) and their ``_lengths``/``_offsets``;
        ``companions=True`` adds the ``_shape``/``_codec`` fields of image fields that were not asked
        for (what a decoder or loader stage needs; :meth:`trim` drops them again).
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
        with self._source.pinned(shards, self._readers):
            self._open_shards(shards)
            batch = self._read(segments, idx, asked, out, packed)
        return batch if companions else self.trim(batch)

    def _open_shards(self, shards: Sequence[int]) -> None:
        """Open the shards ``shards`` side by side (handles.open_all) until every shard has been open
        in this process; after that a batch skips the check (a shard closed since reopens on use). The
        flag keeps the check off warm batches, where it showed on batches of small samples."""
        if self._all_open_pid == os.getpid():
            return
        open_all([self._readers[s] for s in shards])
        if all(r.is_open() for r in self._readers):
            self._all_open_pid = os.getpid()

    def _segments(self, idx: np.ndarray) -> tuple[list[Any], list[int]]:
        """The stored samples ``idx`` as segments (reader, rows in its shard, places in the batch),
        one per shard they touch, in shard order; and those shards."""
        if len(idx) == 0:
            return [], []
        order = np.argsort(idx, kind="stable")
        sidx = idx[order]
        shard_of = np.searchsorted(self._starts, sidx, side="right") - 1
        cuts = (np.flatnonzero(np.diff(shard_of)) + 1).tolist()
        firsts, ends = [0, *cuts], [*cuts, len(idx)]
        shards: list[int] = shard_of[firsts].tolist()
        local = sidx - self._starts[shard_of]
        return [(self._readers[s], local[a:e], order[a:e]) for s, a, e in zip(shards, firsts, ends)], shards

    def __getitems__(self, indices: list[int]) -> Batch:
        """A whole batch in one :meth:`get_batch` call: what a torch DataLoader with a batch sampler
        asks for (instead of one ``ds[i]`` per sample); pair it with a collate_fn that takes the dict
        (the loader's ``collate_fn`` needs the image fields' shapes: they come too)."""
        return self.get_batch(indices, companions=True)

    def copy_phase(self, name: str) -> int:
        """Where (mod 64 bytes) samples of fixed field ``name`` start where they are copied from, in
        the first shard: an ``out=`` buffer at the same phase fills fastest (fastdata.loaders.buffers).
        0 when rows are not whole cache lines (then each row starts at another phase)."""
        f = next((f for f in self.schema if f.name == name), None)
        if f is None or f.ragged or f.row_nbytes % 64 or not self._readers:
            return 0
        try:
            return self._readers[0].copy_phase(name)
        except Exception:  # only a hint: the read itself reports what is wrong, naming the batch
            return 0

    def close(self) -> None:
        """Release this process's file handles and decode threads (they reopen on next use).
        Dropping the dataset releases them too."""
        for r in self._readers:
            r.close()
        self._all_open_pid = None
        if self._decoder is not None:
            self._decoder.close()
        self._source.close()
        if self._keys is not None:
            self._keys.close()

    def __enter__(self) -> "Dataset":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open(  # noqa: A001
    path: str | os.PathLike[str],
    fields: Sequence[str] | None = None,
    *,
    decode: bool | Literal["float"] = True,
    decode_threads: int | None = None,
    remote: RemoteOptions | None = None,
) -> Dataset:
    """Open the fastdata dataset at ``path`` (a directory with ``manifest.json``, or a URL such as
    ``s3://bucket/ds`` read through the shard cache set up by ``remote``); see :class:`Dataset`."""
    return Dataset(path, fields=fields, decode=decode, decode_threads=decode_threads, remote=remote)
