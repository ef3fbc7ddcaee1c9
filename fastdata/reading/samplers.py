"""Samplers: which samples an epoch visits, in which batches, as pure functions of (n, world, seed, epoch);
built-ins :class:`Weighted` and :class:`Episodic`, each rank taking an equal share (:func:`rank_batches`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence, Union, runtime_checkable

import numpy as np

from fastdata.errors import UsageError
from fastdata.reading.dataset import Dataset
from fastdata.reading.order import batch_plan, rank_share
from fastdata.seeds import Stream, numpy_rng
from fastdata.world import World


@runtime_checkable
class SamplerFn(Protocol):
    """``sampler(n, world, seed, epoch) -> batches``: the epoch's batches of indices into the
    dataset (``0 <= i < n``) for all ranks together. Must be a pure function of its arguments."""

    def __call__(self, n: int, world: World, seed: int, epoch: int) -> Sequence[np.ndarray]: ...


def rank_batches(batches: Sequence[np.ndarray], world: World, drop_last: bool) -> list[np.ndarray]:
    """This rank's contiguous share of the epoch's batches, the same count on every rank, wrapping around
    (``drop_last=False``) or dropping what does not fit."""
    return [batches[k] for k in rank_share(np.arange(len(batches)), world, drop_last).tolist()]


def class_codes(dataset: Dataset, by: str) -> np.ndarray:
    """Dense class codes ``0..C-1`` of field ``by`` (one value per sample), in sorted order of value."""
    names = [f.name for f in dataset.manifest.fields]
    if by not in names and by != "key":
        raise UsageError(f"the sampler groups samples by {by!r}, which is not a field of the dataset "
                         f"(fields: {', '.join(names)})")
    col = dataset.column(by)
    if col.ndim != 1:
        raise UsageError(f"the sampler groups samples by {by!r}, which holds shape {col.shape[1:]} per sample, "
                         "not one value")
    if col.dtype.kind in "iu" and len(col) and col.min() >= 0 and col.max() < 1 << 24:
        present = np.bincount(col.astype(np.int64)) > 0  # O(n), no sort
        lut = np.cumsum(present) - 1
        return lut[col.astype(np.int64)]
    if col.dtype.kind == "f":
        raise UsageError(f"the sampler groups samples by {by!r}, a float field; group by integers or strings")
    return np.unique(col, return_inverse=True)[1].reshape(-1).astype(np.int64)


def alias_table(p: np.ndarray) -> np.ndarray:
    """Walker's alias table for probabilities ``p`` (summing to 1), built without a Python loop: draw ``j``
    uniformly, keep it with probability ``p[j]``, else take ``a[j]``."""
    n = len(p)
    q = p * n
    small, large = np.flatnonzero(q < 1), np.flatnonzero(q >= 1)
    prob = np.ones(n)
    alias = np.arange(n)
    if len(small) and len(large):
        d = 1 - q[small]
        d_end = np.cumsum(d)
        d_start = d_end - d
        e_end = np.cumsum(q[large] - 1)
        donor = np.minimum(np.searchsorted(e_end, d_start, side="right"), len(large) - 1)
        prob[small], alias[small] = q[small], large[donor]
        i = np.searchsorted(d_end, e_end, side="right")  # the small whose deficit holds each stretch's end
        inside = i < len(small)
        short = np.zeros(len(large))
        ii = i[inside]
        short[inside] = np.where(d_start[ii] < e_end[inside], np.maximum(d_end[ii] - e_end[inside], 0.0), 0.0)
        has = np.flatnonzero(short[:-1] > 0)  # the last stretch ends with the line (rounding aside)
        prob[large[has]], alias[large[has]] = 1 - short[has], large[has + 1]
    table = np.empty(n, dtype=[("p", "<f4"), ("a", "<i4" if n < 1 << 31 else "<i8")])
    table["p"] = np.clip(prob, 0.0, 1.0)
    table["a"] = alias
    return table


@dataclass
class Weighted:
    """Samples drawn with probability proportional to ``weights`` (one per sample) or ``"balanced"`` (one over
    their class's size in field ``by``); ``num_samples`` draws an epoch, each once with ``replacement=False``."""

    weights: Union[Sequence[float], np.ndarray, str]
    num_samples: int | None = None
    replacement: bool = True
    by: str = "label"
    _p: np.ndarray | None = field(default=None, repr=False)
    _alias: np.ndarray | None = field(default=None, repr=False)  # (probability f4, alias i4) per sample
    _batch_size: int = field(default=0, repr=False)

    def bind(self, dataset: Dataset, batch_size: int) -> "Weighted":
        """This sampler checked against ``dataset`` (its size, and its classes for ``"balanced"``)."""
        balanced = isinstance(self.weights, str) and self.weights == "balanced"
        return self.prepare(len(dataset), class_codes(dataset, self.by) if balanced else None, batch_size)

    def prepare(self, n: int, codes: np.ndarray | None, batch_size: int) -> "Weighted":
        """Bound to ``n`` samples whose class codes (for ``"balanced"``) are ``codes``."""
        if isinstance(self.weights, str):
            if self.weights != "balanced":
                raise UsageError(f"Weighted: weights must be numbers or 'balanced', not {self.weights!r}")
            assert codes is not None
            w = 1.0 / np.bincount(codes)[codes]
        else:
            w = np.asarray(self.weights)
            if w.dtype.kind not in "biuf":
                raise UsageError(f"Weighted: weights must be numbers (one per sample) or 'balanced', not an array "
                                 f"of {w.dtype}")
            w = w.astype(np.float64)
            if w.shape != (n,):
                raise UsageError(f"Weighted: {w.shape[0] if w.ndim == 1 else w.shape} weights for a dataset of {n} "
                                 "samples; give one weight per sample")
        if not np.isfinite(w).all():
            raise UsageError(f"Weighted: weight {int(np.flatnonzero(~np.isfinite(w))[0])} is not a finite number")
        if (w < 0).any():
            raise UsageError(f"Weighted: weight {int(np.flatnonzero(w < 0)[0])} is negative ({w[w < 0][0]})")
        total = w.sum()
        if not total > 0:
            raise UsageError("Weighted: every weight is zero; nothing can be drawn")
        if not isinstance(self.replacement, (bool, np.bool_)):
            raise UsageError(f"Weighted: replacement must be True or False, not {self.replacement!r}")
        k = n if self.num_samples is None else self.num_samples
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise UsageError(f"Weighted: num_samples must be a positive integer, not {self.num_samples!r}")
        if not self.replacement and k > int((w > 0).sum()):
            raise UsageError(f"Weighted: {k} draws without replacement, but only {int((w > 0).sum())} samples "
                             "have a weight above zero")
        bound = Weighted(self.weights, int(k), self.replacement, self.by)
        bound._p = w / total
        bound._batch_size = batch_size
        if self.replacement:
            bound._alias = alias_table(bound._p)
        return bound

    def __call__(self, n: int, world: World, seed: int, epoch: int) -> list[np.ndarray]:
        if self._p is None:
            raise UsageError("Weighted: pass the sampler to fastdata.loader(..., sampler=...), which binds it")
        if len(self._p) != n:
            raise UsageError(f"Weighted: bound to {len(self._p)} samples, asked for {n}")
        k = int(self.num_samples or n)
        g = numpy_rng(seed, epoch, Stream.SAMPLER, batch=1)  # batch: which built-in sampler
        if self.replacement:  # i.i.d. draws from the alias table: one gather of 8 bytes a draw
            assert self._alias is not None
            j = g.integers(0, n, k, dtype=np.int64)
            rec = self._alias[j]
            idx = np.where(g.random(k, dtype=np.float32) < rec["p"], j, rec["a"])
        else:  # Efraimidis-Spirakis: the k largest u ** (1 / w), i.e. the k smallest Exp / w
            with np.errstate(divide="ignore"):
                key = g.standard_exponential(n) / self._p
            idx = np.argpartition(key, k - 1)[:k] if k < n else np.arange(n)
            idx = idx[np.argsort(key[idx], kind="stable")]
        return batch_plan(idx.astype(np.int64), self._batch_size, drop_last=False)


@dataclass
class Episodic:
    """Few-shot episodes: batches of ``n_way`` distinct classes of field ``by``, ``k_shot`` support then ``n_query``
    query samples of each, class by class; ``episodes_per_epoch`` defaults to one pass over the data."""

    n_way: int
    k_shot: int
    n_query: int = 0
    episodes_per_epoch: int | None = None
    by: str = "label"
    _members: np.ndarray | None = field(default=None, repr=False)  # sample indices grouped by class
    _starts: np.ndarray | None = field(default=None, repr=False)
    _counts: np.ndarray | None = field(default=None, repr=False)
    _eligible: np.ndarray | None = field(default=None, repr=False)

    @property
    def episode_size(self) -> int:
        return self.n_way * (self.k_shot + self.n_query)

    def bind(self, dataset: Dataset, batch_size: int | None) -> "Episodic":
        if batch_size is not None and batch_size != self.episode_size:
            raise UsageError(f"Episodic: an episode holds n_way * (k_shot + n_query) = {self.episode_size} samples; "
                             f"batch_size is {batch_size} (pass batch_size={self.episode_size} or None)")
        return self.prepare(class_codes(dataset, self.by))

    def prepare(self, codes: np.ndarray) -> "Episodic":
        """Bound to samples whose dense class codes (0..C-1, one per sample) are ``codes``."""
        for name, least in (("n_way", 1), ("k_shot", 1), ("n_query", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
                what = "a positive integer" if least else "an integer >= 0"
                raise UsageError(f"Episodic: {name} must be {what}, not {v!r}")
            setattr(self, name, int(v))  # a numpy integer becomes the plain int of the same value
        counts = np.bincount(codes) if len(codes) else np.zeros(0, dtype=np.int64)
        s = self.k_shot + self.n_query
        eligible = np.flatnonzero(counts >= s)
        if len(eligible) < self.n_way:
            raise UsageError(f"Episodic: an episode needs {self.n_way} classes of {self.by!r} with at least {s} "
                             f"samples each (k_shot + n_query); the dataset has {len(eligible)} such classes "
                             f"(of {len(counts)})")
        episodes = self.episodes_per_epoch
        if episodes is None:
            episodes = max(1, int(counts[eligible].sum()) // self.episode_size)
        if isinstance(episodes, bool) or not isinstance(episodes, (int, np.integer)) or episodes < 1:
            raise UsageError(f"Episodic: episodes_per_epoch must be a positive integer, not {episodes!r}")
        bound = Episodic(self.n_way, self.k_shot, self.n_query, int(episodes), self.by)
        small = codes.astype(np.uint16) if len(counts) <= 1 << 16 else codes  # radix sort up to 65536 classes
        order = np.argsort(small, kind="stable")  # sample indices grouped by class
        bound._members = order.astype(np.int32) if len(codes) < 1 << 31 else order
        bound._counts = counts
        bound._starts = np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64)
        bound._eligible = eligible
        return bound

    def __call__(self, n: int, world: World, seed: int, epoch: int) -> list[np.ndarray]:
        if self._members is None:
            raise UsageError("Episodic: pass the sampler to fastdata.loader(..., sampler=...), which binds it")
        assert self._counts is not None and self._starts is not None and self._eligible is not None
        if len(self._members) != n:
            raise UsageError(f"Episodic: bound to {len(self._members)} samples, asked for {n}")
        g = numpy_rng(seed, epoch, Stream.SAMPLER, batch=2)
        e, w, s = int(self.episodes_per_epoch or 1), self.n_way, self.k_shot + self.n_query
        # classes of each episode: rows of permutations of the eligible classes, n_way at a time
        m = len(self._eligible)
        per_row = m // w
        rows = -(-e // per_row)
        picks = self._eligible[np.argsort(g.random((rows, m)), axis=1)[:, : per_row * w]].reshape(-1)[: e * w]
        # s distinct members of each picked class: uniform positions, rows with a repeat drawn again
        size = self._counts[picks]
        exact32 = int(size.max()) < 1 << 24  # float32 uniforms reach every position of classes this small
        draw = np.float32 if exact32 else np.float64
        last = (size - 1)[:, None]  # rounding may carry u * size up to size: never past the class
        pos = np.minimum((g.random((len(picks), s), dtype=draw) * size[:, None].astype(draw)).astype(np.int64), last)
        small = size < 4 * s  # repeats likely: draw those from a per-row random order instead
        todo = np.flatnonzero(~small)
        for _ in range(16):
            srt = np.sort(pos[todo], axis=1)
            todo = todo[(srt[:, 1:] == srt[:, :-1]).any(axis=1)]
            if not len(todo):
                break
            pos[todo] = np.minimum((g.random((len(todo), s), dtype=draw) * size[todo, None].astype(draw))
                                   .astype(np.int64), last[todo])
        rest = np.concatenate([np.flatnonzero(small), todo])
        if len(rest):
            width = int(size[rest].max())
            keys = g.random((len(rest), width))
            keys[np.arange(width)[None, :] >= size[rest][:, None]] = 2.0
            pos[rest] = np.argsort(keys, axis=1)[:, :s]
        # gathered straight into the batch layout: support (class by class), then queries
        where = (self._starts[picks][:, None] + pos).reshape(e, w, s)
        episodes = np.empty((e, w * s), dtype=np.int64)
        k = self.k_shot
        episodes[:, : w * k] = self._members[where[:, :, :k]].reshape(e, w * k)
        episodes[:, w * k :] = self._members[where[:, :, k:]].reshape(e, w * (s - k))
        return list(episodes)


def world_batches(sampler: SamplerFn, n: int, world: World, seed: int, epoch: int) -> list[np.ndarray]:
    """The sampler's batches of ``epoch`` for all ranks, as the loader plans them, as int64 arrays; UsageError
    naming the batch unless each is a 1-D array of indices in ``0..n-1``."""
    batches = sampler(n, world, seed, epoch)
    name = describe(sampler)
    try:
        out = [np.asarray(b) for b in batches]
    except (TypeError, ValueError) as e:  # None, a number, ragged nested lists
        raise UsageError(f"sampler {name}: epoch {epoch} gave {type(batches).__name__}, not a list of 1-D arrays of "
                         f"indices ({e})") from None
    for k, b in enumerate(out):
        if b.ndim != 1 or (len(b) and b.dtype.kind not in "iu"):
            raise UsageError(f"sampler {name}: batch {k} of epoch {epoch} is not a 1-D array of integer indices")
    if out:
        flat = np.concatenate(out)
        if len(flat) and (flat.min() < 0 or flat.max() >= n):
            bad = int(np.flatnonzero((flat < 0) | (flat >= n))[0])
            k = int(np.searchsorted(np.cumsum([len(b) for b in out]), bad, side="right"))
            raise UsageError(f"sampler {name}: batch {k} of epoch {epoch} holds index {int(flat[bad])}, "
                             f"outside 0..{n - 1}")
        if flat.dtype != np.int64:
            out = [b.astype(np.int64) for b in out]
    return out


def describe(sampler: Any) -> str:
    """How a loader state names its sampler (a resumed state must come from the same one)."""
    if sampler is None:
        return "none"
    if isinstance(sampler, Weighted):
        p = sampler._p
        w = sampler.weights if isinstance(sampler.weights, str) else \
            "sha256:" + hashlib.sha256(np.ascontiguousarray(p if p is not None else [], dtype="<f8").tobytes()).hexdigest()[:16]
        return f"Weighted(weights={w}, num_samples={sampler.num_samples}, replacement={sampler.replacement}, by={sampler.by})"
    if isinstance(sampler, Episodic):
        return (f"Episodic(n_way={sampler.n_way}, k_shot={sampler.k_shot}, n_query={sampler.n_query}, "
                f"episodes_per_epoch={sampler.episodes_per_epoch}, by={sampler.by})")
    return getattr(sampler, "__qualname__", type(sampler).__qualname__)


__all__ = ["Episodic", "SamplerFn", "Weighted", "rank_batches", "world_batches"]
