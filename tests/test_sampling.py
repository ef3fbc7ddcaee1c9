"""Epoch order and rank shares are pure functions: check their invariants exhaustively on small sizes."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata.sampling import epoch_batches, epoch_order, num_batches
from fastdata.world import World


@pytest.mark.parametrize("shuffle", [True, False, "block"])
def test_invariants_over_sizes_worlds_and_drop_last(shuffle):
    for n in (0, 1, 7, 100, 1001):
        for size in (1, 2, 3, 4):
            for drop_last in (False, True):
                for bs in (1, 4, 64):
                    plans = [epoch_batches(n, world=World(r, size), batch_size=bs, shuffle=shuffle,
                                           drop_last=drop_last, seed=3, epoch=2, block=8, window=3)
                             for r in range(size)]
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


def test_block_shuffle_keeps_reads_local():
    block, window = 16, 4
    order = epoch_order(1024, shuffle="block", seed=0, epoch=0, block=block, window=window)
    assert sorted(order.tolist()) == list(range(1024))
    span = block * window
    for a in range(0, 1024, span):
        blocks = order[a : a + span] // block
        assert len(set(blocks.tolist())) == window  # each window is exactly `window` whole blocks
        assert all((blocks == k).sum() == block for k in set(blocks.tolist()))
    uniform = epoch_order(1024, shuffle=True, seed=0, epoch=0)
    assert len(set((uniform[:span] // block).tolist())) > 3 * window  # what a uniform shuffle touches
