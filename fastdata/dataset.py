"""``fastdata.open``: a map-style dataset over a directory of shards.

``get_batch`` sorts the requested indices, groups them by shard, merges runs that are
consecutive on disk and in the batch, and reads straight into one preallocated array
per field. Ragged fields come back padded to the longest sample in the batch, with a
``<name>_lengths`` array. Image fields come back decoded, as uint8 ``(B, H, W, C)`` arrays
(see fastdata/decode.py); ``decode=False`` returns their stored bytes instead.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from .decode import BatchDecoder, check_shapes
from .errors import CorruptShardError, UsageError
from .format import (
    IMAGE_ENCODINGS,
    LENGTHS_SUFFIX,
    FieldSpec,
    Manifest,
    backend,
    read_manifest,
    shard_path,
)
from .format.spec import ENCODING_PIXELS, SHAPE_SUFFIX, companions
from .remote import RemoteOptions, is_url

if TYPE_CHECKING:
    from .remote.prefetch import PlanFollower
    from .remote.store import RemoteStore


class Dataset:
    """Samples of a fastdata dataset; ``ds[i]`` and ``ds.get_batch(indices)`` give dicts of numpy arrays.

    ``decode`` turns encoded and ragged image fields into pixels on read, with
    ``decode_threads`` threads per process (default: the usable CPUs). ``root`` may be a URL
    (``s3://bucket/ds``): shards are then read through the node's shard cache, set up by
    ``remote`` (:class:`fastdata.RemoteOptions`; docs/remote.md).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        fields: Sequence[str] | None = None,
        *,
        decode: bool = True,
        decode_threads: int | None = None,
        remote: RemoteOptions | None = None,
    ) -> None:
        src = root if isinstance(root, str) else os.fspath(root)
        self.options: dict[str, Any] = {"fields": fields, "decode": decode, "decode_threads": decode_threads,
                                        "remote": remote}
        self._remote: RemoteStore | None = None
        if is_url(src):
            from .remote.store import RemoteStore

            self._remote = RemoteStore(src, remote)
            self.root: Path | str = self._remote.url
            self.manifest: Manifest = self._remote.manifest
        else:
            if remote is not None:
                raise UsageError(f"{src}: remote= options apply to URLs (s3://...) only, and this is a local path")
            self.root = Path(src)
            self.manifest = read_manifest(self.root)
        names = [f.name for f in self.manifest.fields]
        wanted = None
        if fields is not None:
            unknown = [f for f in fields if f not in names]
            if unknown:
                raise UsageError(f"{self.root}: no field {unknown[0]!r} (fields: {', '.join(names)})")
            # an image field is read together with its shape (and codec) fields
            wanted = set(fields).union(*(companions(f) for f in self.manifest.fields if f.name in fields))
        self.schema: list[FieldSpec] = [f for f in self.manifest.fields if wanted is None or f.name in wanted]
        self._images = [f for f in self.schema if f.encoding in IMAGE_ENCODINGS] if decode else []
        # raw pixels are placed straight into the padded image batch as they are read
        self._pixels = [f for f in self._images if f.encoding == ENCODING_PIXELS]
        encoded = [f for f in self._images if f.encoding != ENCODING_PIXELS]
        self._decoder = BatchDecoder(decode_threads) if encoded else None
        impl = backend(self.manifest.backend)
        self._readers = []
        for i, info in enumerate(self.manifest.shards):
            if self._remote is not None:  # downloaded (and checked) when a batch first needs it
                self._readers.append(impl.ShardReader(self._remote.local_path(i), info, self.manifest.fields))
                continue
            assert isinstance(self.root, Path)
            path = shard_path(self.root, info)
            if not path.is_file():
                raise CorruptShardError(f"{self.root}: shard {info.file!r} is missing")
            size = path.stat().st_size
            if size != info.bytes:
                raise CorruptShardError(
                    f"{self.root}: shard {info.file!r} is {size} bytes, the manifest says {info.bytes} (truncated or replaced)"
                )
            self._readers.append(impl.ShardReader(path, info, self.manifest.fields))
        self._starts = np.array([s.start for s in self.manifest.shards], dtype=np.int64)

    def with_options(self, **changes: Any) -> "Dataset":
        """The same dataset opened again with some options changed (``fields``, ``decode``, ``decode_threads``)."""
        unknown = set(changes) - set(self.options)
        if unknown:
            raise TypeError(f"unknown dataset options: {sorted(unknown)}")
        return Dataset(self.root, **{**self.options, **changes})

    @property
    def remote(self) -> "RemoteStore | None":
        """The remote store and shard cache when the dataset was opened from a URL, else None."""
        return self._remote

    def follow(self, plans: Sequence[Sequence[np.ndarray]], mine: int, first: int, lead: int) -> "PlanFollower | None":
        """For a URL dataset: start prefetching shards along an epoch plan (every rank's batches; this
        rank is ``mine``, starting at batch ``first``, readers up to ``lead`` batches ahead)."""
        if self._remote is None:
            return None
        from .remote.prefetch import PlanFollower

        return PlanFollower(self._remote, plans, mine, first, lead)

    def shard_paths(self) -> list[Path]:
        """Local files of the shards (for a URL dataset: where the cache keeps them, once downloaded)."""
        return [r.path for r in self._readers]

    @property
    def classes(self) -> list[str] | None:
        return self.manifest.classes

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}:{f.np_dtype}{list(f.shape)}" for f in self.schema)
        return f"<fastdata.Dataset {str(self.root)!r} {len(self)} samples, {len(self._readers)} {self.manifest.backend} shards; {fields}>"

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"dataset indices must be integers, not {type(i).__name__} (use get_batch for many)")
        n = len(self)
        j = int(i) + n if i < 0 else int(i)
        if not 0 <= j < n:
            raise IndexError(f"index {i} out of range for a dataset of {n} samples")
        batch = self.get_batch([j])
        out = {}
        for f in self.schema:
            a = batch[f.name][0]
            out[f.name] = a[: batch[f.name + LENGTHS_SUFFIX][0]] if f.ragged and f not in self._images else a
        return out

    def get_batch(self, indices: Iterable[int] | np.ndarray, out: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Read the samples ``indices`` (any order, repeats allowed) into one array per field.

        ``out`` may supply preallocated arrays (for example pinned buffers, reused from batch to
        batch): for a fixed-shape field, C-contiguous with shape ``(len(indices), *shape)``; for a
        ragged field (or a ``pixels`` image field), any C-contiguous array of the field's dtype,
        whose memory holds the padded batch when it is large enough (else a new array is made).
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
        order = np.argsort(idx, kind="stable")
        sidx = idx[order]
        shard_of = np.searchsorted(self._starts, sidx, side="right") - 1
        cuts = np.flatnonzero(np.diff(shard_of)) + 1
        segments = [
            (self._readers[shard_of[a]], sidx[a:e] - self._starts[shard_of[a]], order[a:e])
            for a, e in zip(np.concatenate(([0], cuts)), np.concatenate((cuts, [b])))
            if e > a
        ]
        if self._remote is None:
            result = self._read(segments, idx, out)
        else:
            shards = [int(shard_of[a]) for a in np.concatenate(([0], cuts)) if a < b]
            pinned: list[int] = []
            try:
                for s in shards:  # local, checked, and kept from eviction while we read
                    self._remote.pin(s, self._readers[s].close)
                    pinned.append(s)
                result = self._read(segments, idx, out)
            finally:
                for s in pinned:
                    self._remote.unpin(s)
        return result

    def _read(self, segments: list[Any], idx: np.ndarray, out: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """Read ``segments`` (reader, rows in its shard, places in the batch) of the batch ``idx``; decode images."""
        b = len(idx)
        result: dict[str, np.ndarray] = {}
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
        shapes: dict[str, np.ndarray] = {}
        if self._pixels:  # the image shapes are needed first: read the fixed fields before the rest
            for reader, local, dest in segments:
                reader.read_into(local, dest, first)
            for f in self._pixels:
                s = result[f.name + SHAPE_SUFFIX]
                padded = check_shapes(f, s, result.pop(f.name + LENGTHS_SUFFIX), where)
                result[f.name] = self._ragged_array(f, padded, out)
                shapes[f.name] = s
            first = {}
        decoded = {f.name for f in self._images if f.encoding != ENCODING_PIXELS}
        for f in self.schema:
            if f.ragged and f.name not in result:
                lengths = result[f.name + LENGTHS_SUFFIX]
                # encoded images: ``out`` takes the decoded pixels, not the stored bytes
                result[f.name] = self._ragged_array(f, (b, int(lengths.max()) if b else 0, *f.trailing),
                                                    None if f.name in decoded else out)
        outs = {**first, **{f.name: result[f.name] for f in self.schema if f.ragged}}
        if outs:
            for reader, local, dest in segments:
                reader.read_into(local, dest, outs, shapes)
        if self._decoder is not None:
            for f in self._images:
                if f.encoding != ENCODING_PIXELS:
                    self._decoder.finish(f, result, where, None if out is None else out.get(f.name))
        return result

    def __getitems__(self, indices: list[int]) -> dict[str, np.ndarray]:
        """A whole batch in one :meth:`get_batch` call: what a torch DataLoader with a batch sampler
        asks for (instead of one ``ds[i]`` per sample); pair it with a collate_fn that takes the dict."""
        return self.get_batch(indices)

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
        if self._decoder is not None:
            self._decoder.close()
        if self._remote is not None:
            self._remote.release_all()

    def __enter__(self) -> "Dataset":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open(  # noqa: A001
    path: str | os.PathLike[str],
    fields: Sequence[str] | None = None,
    *,
    decode: bool = True,
    decode_threads: int | None = None,
    remote: RemoteOptions | None = None,
) -> Dataset:
    """Open the fastdata dataset at ``path`` (a directory with ``manifest.json``, or a URL such as
    ``s3://bucket/ds`` read through the shard cache set up by ``remote``); see :class:`Dataset`."""
    return Dataset(path, fields=fields, decode=decode, decode_threads=decode_threads, remote=remote)
