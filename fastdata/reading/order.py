"""Sample order as pure functions of (dataset size, world, seed, epoch): every rank computes the same
epoch order and takes its own contiguous, equal share of it (docs/loader.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence, Union

import numpy as np

from fastdata.errors import UsageError
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
