"""Epoch order and samplers: which samples an epoch visits, in which batches, as pure functions of (n, world,
seed, epoch); shuffle modes (:class:`Block`, :class:`Shards`) and built-ins :class:`Weighted` and :class:`Episodic`,
every rank computing the same order and taking its own contiguous, equal share (docs/loader.md)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Sequence, Union, runtime_checkable

import numpy as np

from fastdata.errors import UsageError
from fastdata.reading.dataset import Dataset
from fastdata.seeds import Stream, numpy_rng
from fastdata.world import World

STREAMS = 16  # a window of blocks or shards is read as about this many sequential streams (_streams)
ORDER_RULE = 2  # bumped when an order changes for the same arguments (a loader state records it)


@dataclass(frozen=True)
class _Windowed:
    def __post_init__(self) -> None:
        for key, v in vars(self).items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(f"{type(self).__name__}({key}={v!r}): {key} must be a positive integer")


@dataclass(frozen=True)
class Block(_Windowed):
    """``shuffle=Block(size, window=...)``: blocks of ``size`` consecutive samples in random order, ``window``
    blocks mixed at a time: nearly sequential reads for data larger than RAM (docs/loader.md)."""

    size: int = 256
    window: int = 16


@dataclass(frozen=True)
class Shards(_Windowed):
    """``shuffle=Shards(window=...)``: the shards in random order, ``window`` of them mixed at a time, so only a
    few are needed at once (remote datasets larger than the cache); an in-place index's shards are its chunks."""

    window: int = 2


Shuffle = Union[bool, Block, Shards, Literal["block", "shards"]]


def shuffle_mode(shuffle: Shuffle) -> bool | Block | Shards:
    """``shuffle`` checked, with the shorthands ``"block"`` and ``"shards"`` as ``Block()`` and ``Shards()``."""
    if shuffle is True or shuffle is False or isinstance(shuffle, (Block, Shards)):
        return shuffle
    if shuffle == "block" or shuffle == "shards":
        return Block() if shuffle == "block" else Shards()
    raise UsageError(f"shuffle must be True, False, fastdata.Block(...) or fastdata.Shards(...) (an in-place index's "
                     f"shards are its chunks; 'block' and 'shards' are the defaults), not {shuffle!r}")


def epoch_order(n: int, *, shuffle: Shuffle, seed: int, epoch: int,
                shard_counts: Sequence[int] | None = None) -> np.ndarray:
    """A permutation of ``range(n)``: uniform (``True``), storage order (``False``), or a :class:`Block` or
    :class:`Shards` order over units (``shard_counts`` samples each, in storage order)."""
    mode = shuffle_mode(shuffle)
    if mode is False:
        return np.arange(n, dtype=np.int64)
    rng = numpy_rng(seed, epoch, Stream.ORDER)
    if isinstance(mode, bool):
        return rng.permutation(n).astype(np.int64)
    if isinstance(mode, Block):
        starts = np.arange(0, n, mode.size)
        return _windows(starts, np.minimum(starts + mode.size, n) - starts, mode.window, rng)
    if shard_counts is None:
        raise ValueError("Shards needs the samples per shard (shard_counts)")
    sizes = np.asarray(shard_counts, dtype=np.int64)
    if sizes.sum() != n or (sizes < 0).any():
        raise ValueError(f"shard_counts add up to {int(sizes.sum())}, not to the {n} samples")
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])) if len(sizes) else sizes
    return _windows(starts, sizes, mode.window, rng)


def _windows(starts: np.ndarray, sizes: np.ndarray, window: int, rng: np.random.Generator) -> np.ndarray:
    """Units (``starts``/``sizes`` in samples) in a random order, taken ``window`` at a time, each window
    read as :data:`STREAMS` streams side by side."""
    perm = rng.permutation(len(starts))
    parts = [_streams(_split(sizes[u], starts[u], STREAMS), rng)
             for u in (perm[w : w + window] for w in range(0, len(perm), window))]
    return np.concatenate(parts).astype(np.int64) if parts else np.arange(0, dtype=np.int64)


def _streams(segments: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """A window's ``segments`` (contiguous runs in storage order) consumed side by side in random order:
    the disk serves sequential runs while a batch mixes the window."""
    if len(segments) <= 1:
        return segments[0] if segments else np.zeros(0, dtype=np.int64)
    per = max(len(g) for g in segments)
    grid = np.full((len(segments), per), -1, dtype=np.int64)
    for i, g in enumerate(segments):
        grid[i, : len(g)] = g
    rounds = rng.permuted(grid.T, axis=1).ravel()
    return rounds[rounds >= 0]


def _split(sizes: np.ndarray, starts: np.ndarray, streams: int) -> list[np.ndarray]:
    """Units (``starts``/``sizes`` in samples) cut into about ``streams`` segments in all, in proportion
    to their sizes, each segment inside one unit."""
    total = int(sizes.sum())
    out = []
    for s, n in zip(starts.tolist(), sizes.tolist()):
        if n:
            k = max(1, min(n, round(streams * n / total)))
            out += np.array_split(np.arange(s, s + n, dtype=np.int64), k)
    return out


def _share_size(n: int, world: World, drop_last: bool) -> int:
    """Samples per rank: ``n`` split evenly, the remainder dropped or filled up by wrapping around."""
    return n // world.size if drop_last else -(-n // world.size)


def rank_share(order: np.ndarray, world: World, drop_last: bool) -> np.ndarray:
    """This rank's contiguous share of the epoch order, equal on every rank: ``drop_last=False`` wraps around
    (at most ``size - 1`` samples read twice), ``True`` drops the rest."""
    n, size = len(order), world.size
    per = _share_size(n, world, drop_last)
    total = per * size
    if total > n:
        order = np.concatenate([order, np.resize(order, total - n)]) if n else order
    return order[world.rank * per : (world.rank + 1) * per]


def batch_plan(indices: np.ndarray, batch_size: int, drop_last: bool) -> list[np.ndarray]:
    """Cut a rank's indices into batches; ``drop_last`` drops a final partial batch."""
    stop = len(indices) - len(indices) % batch_size if drop_last else len(indices)
    return [indices[a : min(a + batch_size, stop)] for a in range(0, stop, batch_size)]


def num_batches(n: int, world: World, batch_size: int, drop_last: bool) -> int:
    """Batches per epoch on every rank (what ``len(loader)`` returns)."""
    per = _share_size(n, world, drop_last)
    return per // batch_size if drop_last else -(-per // batch_size)


def all_rank_batches(
    n: int, *, world: World, batch_size: int, shuffle: Shuffle, drop_last: bool, seed: int, epoch: int,
    shard_counts: Sequence[int] | None = None, ranks: Sequence[int] | None = None,
) -> list[list[np.ndarray]]:
    """The batches of one epoch for each rank in ``ranks`` (default: every rank of ``world``),
    from one epoch order."""
    order = epoch_order(n, shuffle=shuffle, seed=seed, epoch=epoch, shard_counts=shard_counts)
    ranks = range(world.size) if ranks is None else ranks
    return [batch_plan(rank_share(order, World(r, world.size), drop_last), batch_size, drop_last) for r in ranks]


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
    _drop_last: bool = field(default=False, repr=False)  # the loader's drop_last: no short last batch

    def bind(self, dataset: Dataset, batch_size: int, drop_last: bool = False) -> "Weighted":
        """This sampler checked against ``dataset`` (its size, and its classes for ``"balanced"``)."""
        balanced = isinstance(self.weights, str) and self.weights == "balanced"
        return self.prepare(len(dataset), class_codes(dataset, self.by) if balanced else None, batch_size, drop_last)

    def prepare(self, n: int, codes: np.ndarray | None, batch_size: int, drop_last: bool = False) -> "Weighted":
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
        bound._batch_size, bound._drop_last = batch_size, drop_last
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
        return batch_plan(idx.astype(np.int64), self._batch_size, drop_last=self._drop_last)


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
