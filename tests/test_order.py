"""Epoch order and rank shares are pure functions: check their invariants exhaustively on small sizes."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata.errors import UsageError
from fastdata.reading.samplers import STREAMS, Block, Shards, all_rank_batches, epoch_order, num_batches, shuffle_mode
from fastdata.world import World


@pytest.mark.parametrize("shuffle", [True, False, Block(8, window=3)])
def test_invariants_over_sizes_worlds_and_drop_last(shuffle):
    for n in (0, 1, 7, 100, 1001):
        for size in (1, 2, 3, 4):
            for drop_last in (False, True):
                for bs in (1, 4, 64):
                    plans = all_rank_batches(n, world=World(0, size), batch_size=bs, shuffle=shuffle,
                                             drop_last=drop_last, seed=3, epoch=2)
                    expect = num_batches(n, World(0, size), bs, drop_last)
                    assert [len(p) for p in plans] == [expect] * size  # equal on every rank: no DDP hang
                    flat = np.concatenate([b for p in plans for b in p]) if expect else np.zeros(0, int)
                    if drop_last:
                        assert len(np.unique(flat)) == len(flat)  # disjoint, nothing read twice
                        assert all(len(b) == bs for p in plans for b in p)
                    else:
                        assert set(flat.tolist()) == set(range(n))  # every sample
                        assert len(flat) - n == (-(-n // size) * size - n if size > 1 else 0)


def test_order_depends_only_on_seed_and_epoch():
    a = epoch_order(1000, shuffle=True, seed=1, epoch=0)
    assert np.array_equal(a, epoch_order(1000, shuffle=True, seed=1, epoch=0))
    assert not np.array_equal(a, epoch_order(1000, shuffle=True, seed=1, epoch=1))
    assert not np.array_equal(a, epoch_order(1000, shuffle=True, seed=2, epoch=0))
    assert sorted(a.tolist()) == list(range(1000))
    for seed in (-1, 1 << 64):  # 2**64 would silently give seed 0's order
        with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\)"):
            epoch_order(10, shuffle=True, seed=seed, epoch=0)


def test_block_shuffle_keeps_reads_local():
    block, window = 16, 4
    order = epoch_order(1024, shuffle=Block(block, window=window), seed=0, epoch=0)
    assert sorted(order.tolist()) == list(range(1024))
    span = block * window
    for a in range(0, 1024, span):
        blocks = order[a : a + span] // block
        assert len(set(blocks.tolist())) == window  # each window is exactly `window` whole blocks
        assert all((blocks == k).sum() == block for k in set(blocks.tolist()))
    uniform = epoch_order(1024, shuffle=True, seed=0, epoch=0)
    assert len(set((uniform[:span] // block).tolist())) > 3 * window  # what a uniform shuffle touches


def _stream_starts(window: np.ndarray) -> int:
    """Samples of ``window`` whose predecessor (sample - 1) is in the window but comes later in the
    order: where a stream starts. A window read as k sequential streams has at most k."""
    pos = {int(s): i for i, s in enumerate(window)}
    return sum(1 for s, i in pos.items() if s - 1 in pos and pos[s - 1] > i)


@pytest.mark.parametrize("n,block,window", [(1024, 16, 4), (1000, 16, 4), (37, 16, 4), (1024, 256, 1), (5000, 64, 16)])
def test_block_shuffle_reads_each_window_as_streams(n, block, window):
    """A window (``window`` whole blocks) is read as at most STREAMS sequential streams side by side,
    and its first round mixes places far apart (not consecutive samples)."""
    order = epoch_order(n, shuffle=Block(block, window=window), seed=5, epoch=1)
    assert sorted(order.tolist()) == list(range(n))
    blk = order // block
    pos = 0
    while pos < n:  # each window: `window` whole blocks (the last may have fewer), then the next
        seen: set[int] = set()
        end = pos
        while end < n and len(seen | {int(blk[end])}) <= window:
            seen.add(int(blk[end]))
            end += 1
        assert sum(min(block, n - b * block) for b in seen) == end - pos
        assert len(seen) == window or end == n
        w = order[pos:end]
        assert _stream_starts(w) <= STREAMS
        if len(w) >= 8 * STREAMS:
            assert np.all(np.diff(np.sort(w[:8])) > 1)  # the first samples come from different streams
        pos = end
    assert not np.array_equal(order, epoch_order(n, shuffle=Block(block, window=window), seed=6, epoch=1)) or n < 40


def test_shard_shuffle_reads_streams_within_a_window_of_shards():
    counts = [300, 200, 260, 100, 140]
    n = sum(counts)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    order = epoch_order(n, shuffle=Shards(window=2), seed=2, epoch=0, shard_counts=counts)
    assert sorted(order.tolist()) == list(range(n))
    shard_of = np.searchsorted(starts, order, side="right") - 1
    pos = 0
    while pos < n:  # each window: two whole shards (the last may be one), read as at most STREAMS streams
        seen: set[int] = set()
        end = pos
        while end < n and len(seen | {int(shard_of[end])}) <= 2:
            seen.add(int(shard_of[end]))
            end += 1
        assert sum(counts[s] for s in seen) == end - pos
        w = order[pos:end]
        assert _stream_starts(w) <= STREAMS
        assert len(set(shard_of[pos : pos + 8].tolist())) == len(seen)  # a batch mixes both shards
        pos = end


def test_shuffle_modes_carry_their_sizes_and_the_strings_are_their_defaults():
    """"block" and "shards" are Block() and Shards(); "chunks" (now Shards on an in-place index) and bad
    sizes are refused with a message naming what to pass."""
    assert shuffle_mode("block") == Block(256, window=16) and shuffle_mode("shards") == Shards(window=2)
    assert np.array_equal(epoch_order(5000, shuffle="block", seed=1, epoch=0),
                          epoch_order(5000, shuffle=Block(), seed=1, epoch=0))
    assert not np.array_equal(epoch_order(5000, shuffle=Block(64), seed=1, epoch=0),
                              epoch_order(5000, shuffle=Block(), seed=1, epoch=0))
    with pytest.raises(UsageError, match=r"fastdata\.Shards\(.*chunks"):
        shuffle_mode("chunks")
    for bad in (1, "uniform", None):
        with pytest.raises(UsageError, match="shuffle must be"):
            shuffle_mode(bad)  # type: ignore[arg-type]
    for make in (lambda: Block(0), lambda: Block(8, window=-1), lambda: Shards(window=0), lambda: Block(2.5)):
        with pytest.raises(UsageError, match="positive integer"):
            make()
