"""The torch backend's reader threads start the next epoch's first batches while an epoch ends
(ThreadReader._carry): the batches stay exactly those of each epoch, and reads are not repeated."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import fastdata
from fastdata.augment import HorizontalFlip
from fastdata.loaders import LoaderConfig

N = 53  # 7 batches of 8, the last partial


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> Path:
    return make(tmp_path_factory.mktemp("carry"))


def make(tmp: Path) -> Path:
    rng = np.random.default_rng(0)
    np.save(tmp / "img.npy", rng.integers(0, 256, (N, 6, 5, 3), dtype=np.uint8))
    np.save(tmp / "y.npy", np.arange(N, dtype=np.int64))
    fastdata.convert(None, tmp / "ds", arrays={"image": tmp / "img.npy", "label": tmp / "y.npy"})
    return tmp / "ds"


def counted(ld, delay: float = 0.0) -> list[np.ndarray]:
    """Record every index batch the loader's reader threads read (each read taking ``delay`` s more)."""
    reads: list[np.ndarray] = []
    dataset = ld._reader.dataset
    real = dataset.get_batch

    def get_batch(idx, *a, **kw):
        reads.append(np.array(idx))
        time.sleep(delay)
        return real(idx, *a, **kw)

    dataset.get_batch = get_batch
    return reads


def epochs(ld, n: int) -> list[list[dict[str, torch.Tensor]]]:
    return [[{k: v.clone() for k, v in b.items()} for b in ld] for _ in range(n)]


def same(a, b) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
                                    for x, y in zip(a, b))


def test_epochs_are_unchanged_and_nothing_is_read_twice(ds):
    ref = fastdata.loader(ds, 8, device="cpu", num_workers=0, seed=3)  # in the iterating thread: no carry
    want = epochs(ref, 3)
    ref.close()
    ld = fastdata.loader(ds, 8, device="cpu", num_workers=2, seed=3, config=LoaderConfig(prefetch=4))
    reads = counted(ld)
    got = epochs(ld, 3)
    assert all(same(g, w) for g, w in zip(got, want))
    carried = ld._reader._carried
    assert carried is not None and carried.key == (3, 0) and 1 <= len(carried.reads) <= 4  # epoch 3 started
    # each epoch's 7 batches read once, plus epoch 3's carried ones; epochs 1 and 2 began from carried reads
    assert len(reads) == 3 * 7 + len(carried.reads)
    plans = [ld.plan(e) for e in range(4)]
    assert all(any(np.array_equal(r, p) for r in reads) for e in range(4) for p in plans[e][:len(carried.reads)])
    ld.close()
    assert ld._reader._carried is None


def test_carried_batches_are_augmented_for_their_own_epoch(ds):
    aug = [HorizontalFlip()]
    ld = fastdata.loader(ds, 8, device="cpu", num_workers=2, seed=5, augment=aug)
    got = epochs(ld, 2)[1]  # epoch 1 started from reads carried at the end of epoch 0
    ld.close()
    fresh = fastdata.loader(ds, 8, device="cpu", num_workers=2, seed=5, augment=aug)
    fresh.set_epoch(1)
    want = epochs(fresh, 1)[0]
    fresh.close()
    assert same(got, want)


def test_a_different_next_pass_drops_the_carried_reads(ds):
    ld = fastdata.loader(ds, 8, device="cpu", num_workers=2, seed=7)
    epochs(ld, 1)
    assert ld._reader._carried is not None and ld._reader._carried.key == (1, 0)
    ld.set_epoch(4)  # not the epoch that was carried
    got = epochs(ld, 1)[0]
    fresh = fastdata.loader(ds, 8, device="cpu", num_workers=0, seed=7)
    fresh.set_epoch(4)
    assert same(got, epochs(fresh, 1)[0])
    fresh.close()
    # a pass stopped part-way carries nothing; the next pass yields that epoch from its start again
    it = iter(ld)
    first = next(it)["label"].clone()
    it.close()
    assert ld._reader._carried is None
    rest = [b["label"].clone() for b in ld]
    assert len(rest) == 7 and torch.equal(first, rest[0])
    ld.close()


def test_carried_reads_end_with_their_pass_and_a_changed_file_drops_them(tmp_path):
    ds = make(tmp_path)
    ld = fastdata.loader(ds, 8, device="cpu", num_workers=2, seed=3)
    counted(ld, delay=0.2)  # slow reads: the carried ones are still running when the epoch's last batch is out
    epochs(ld, 1)
    carried = ld._reader._carried
    # a pass that ran out leaves no read running (a file changed right after must not fault a memory map)
    assert carried is not None and carried.reads and all(f.done() for f, _, _ in carried.reads)
    path = ld._reader.dataset.shard_paths()[0]
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the shard changed between the epochs
    reads = counted(ld)
    got = epochs(ld, 1)[0]
    # every batch of epoch 1 read again from the file as it is now, none taken from the carry
    assert all(any(np.array_equal(r, b) for r in reads) for b in ld.plan(1))
    fresh = fastdata.loader(ds, 8, device="cpu", num_workers=0, seed=3)
    fresh.set_epoch(1)
    assert same(got, epochs(fresh, 1)[0])
    fresh.close()
    ld.close()


def test_a_sampler_plan_is_not_carried(ds):
    ld = fastdata.loader(ds, 8, device="cpu", num_workers=2,
                         sampler=lambda n, world, seed, epoch: [np.arange(i, min(i + 8, n)) for i in range(0, n, 8)])
    epochs(ld, 1)
    assert ld._reader._carried is None  # a user's sampler may plan the next epoch differently once this one ends
    ld.close()


@pytest.mark.gpu  # needs CUDA: tests/conftest.py skips it without
def test_carried_epochs_on_a_gpu(ds):
    ref = fastdata.loader(ds, 8, device="cpu", num_workers=0, seed=3)
    want = epochs(ref, 3)
    ref.close()
    ld = fastdata.loader(ds, 8, device="cuda", num_workers=2, seed=3)  # pinned buffers, copies on a side stream
    got = [[{k: v.cpu() for k, v in b.items()} for b in e] for e in epochs(ld, 3)]
    assert ld._reader._carried is not None
    ld.close()
    assert all(same(g, w) for g, w in zip(got, want))
