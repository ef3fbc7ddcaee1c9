"""Which samples a dataset is: sample keys, subsets and splits (the views of :class:`fastdata.Dataset`).

A subset is the same dataset class over some of the stored samples (``_view``: this dataset's
sample ``i`` is the stored sample ``_view[i]``); a split is disjoint subsets, a pure function of
the dataset, the fractions and the seed.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Literal, Mapping, Sequence, cast

import numpy as np

from fastdata.errors import UsageError
from fastdata.format.keys import KeyTable
from fastdata.format.spec import KEY_FIELD, Manifest, is_string
from fastdata.seeds import Stream, numpy_rng

if TYPE_CHECKING:
    from fastdata.reading.dataset import Batch, Dataset

_COLUMN_CHUNK = 1 << 16


class Selection:
    """Keys, subsets and splits of a dataset; mixed into :class:`fastdata.Dataset`."""

    manifest: Manifest
    root: Path | str
    _view: np.ndarray | None  # a subset: this dataset's sample i is the stored sample _view[i]
    _view_pos: tuple[np.ndarray, np.ndarray] | None  # (sorted _view, its argsort), for index_of
    _keys: KeyTable | None

    if TYPE_CHECKING:
        def __len__(self) -> int: ...

        def with_options(self, **changes: Any) -> Dataset: ...

        def get_batch(self, indices: Iterable[int] | np.ndarray, out: dict[str, np.ndarray] | None = None,
                      *, ragged: Literal["padded", "packed"] = "padded", companions: bool = False) -> Batch: ...

    def _stored(self, indices: np.ndarray) -> np.ndarray:
        return indices if self._view is None else self._view[indices]

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
            raise IndexError(f"index {i!r} out of range for a dataset of {n} samples")
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
        if j >= 0 and self._view is not None:
            if self._view_pos is None:
                order = np.argsort(self._view, kind="stable")
                self._view_pos = (self._view[order], order)
            sv, order = self._view_pos
            p = int(np.searchsorted(sv, j))
            j = int(order[p]) if p < len(sv) and sv[p] == j else -1
        if j < 0:
            raise KeyError(f"{self.root}: no sample keyed {key!r}" + (" in this subset" if self._view is not None else ""))
        return j

    def subset(self, selection: Sequence[int] | Sequence[str] | np.ndarray) -> Dataset:
        """A view of some samples: ``selection`` is indices (into this dataset), keys, or a boolean
        mask of ``len(self)``. The view's sample ``i`` is the ``i``-th selected; no sample twice."""
        sel = np.asarray(selection) if not isinstance(selection, np.ndarray) else selection
        n = len(self)
        if sel.ndim != 1:
            raise UsageError(f"subset takes a 1-D selection (indices, keys or a mask), not shape {sel.shape}")
        if sel.dtype == bool:
            if len(sel) != n:
                raise UsageError(f"a subset mask needs {n} entries (one per sample), not {len(sel)}")
            idx = np.flatnonzero(sel).astype(np.int64)
        elif sel.dtype.kind in "US":
            idx = np.array([self._index_or_error(str(k)) for k in sel.tolist()], dtype=np.int64)
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
        view = copy.copy(self)
        view._view = self._stored(idx)
        view._view_pos = None
        return cast("Dataset", view)

    def _index_or_error(self, key: str) -> int:
        try:
            return self.index_of(key)
        except KeyError as e:
            raise UsageError(str(e.args[0])) from None

    @property
    def stored_indices(self) -> np.ndarray:
        """For each sample of this dataset, its index in the stored dataset (``arange`` unless a subset)."""
        return np.arange(self.manifest.num_samples, dtype=np.int64) if self._view is None else self._view.copy()

    def identity(self) -> str:
        """A short fingerprint of which samples this is (the stored dataset, or a subset of it)."""
        if self._view is None:
            return f"all:{self.manifest.num_samples}"
        return "subset:" + hashlib.sha256(np.ascontiguousarray(self._view, dtype="<i8").tobytes()).hexdigest()[:16]

    def column(self, name: str) -> np.ndarray:
        """Every sample's value of field ``name`` (a numpy array; strings as a numpy ``str`` array)."""
        if name == KEY_FIELD and name not in [f.name for f in self.manifest.fields]:
            return np.array(self.keys(np.arange(len(self))), dtype=str)
        ds = self.with_options(fields=[name], decode=False)
        f = ds.manifest.field(name)
        parts: list[Any] = []
        for a in range(0, len(self), _COLUMN_CHUNK):
            b = ds.get_batch(np.arange(a, min(a + _COLUMN_CHUNK, len(self))))
            parts.append(np.array(b[name], dtype=str) if is_string(f) else b[name])
        ds.close()
        if not parts:
            return np.array([], dtype=str if is_string(f) else f.np_dtype)
        if f.ragged and not is_string(f):
            raise UsageError(f"field {name!r} is ragged; column() takes fixed-shape and string fields")
        return np.concatenate(parts)

    def split(self, fractions: Mapping[str, float], *, seed: int = 0, stratify: str | None = None) -> dict[str, Dataset]:
        """Disjoint subsets, e.g. ``{"train": 0.9, "val": 0.1}``: a pure function of the dataset, the
        fractions and ``seed``. ``stratify="label"`` keeps each value's share in every part. Each part
        lists its samples in stored order (loaders shuffle). Fractions summing to less than 1 leave
        the rest out."""
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
        # each value's group is cut by the fractions, carrying each part's rounding error over to the next
        # group: totals come out right to within one sample, and so does every value's share in each part
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


__all__ = ["Selection"]
