"""Resource lifecycle: datasets and loaders release what they opened (files, threads, worker
processes) on close(), on leaving a ``with`` block, and when dropped without either; a loader closes
a dataset it opened itself, never the caller's. A churn of loaders abandoned mid-epoch stays flat."""

from __future__ import annotations

import gc
import os
import threading
import time

import psutil
import pytest
from scenarios.kit import make_dataset

import fastdata
from fastdata.loaders import LoaderConfig


@pytest.fixture(scope="module", params=["hdf5", "lmdb"])
def ds(request, tmp_path_factory):
    # 40 samples in 4+ shards: a leak of one handle per shard is easy to see
    return make_dataset(tmp_path_factory.mktemp("life"), request.param, shard_size=200)


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def shard_handles(ds) -> int:
    """Open descriptors of this process on the dataset's shard files."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        n += target.startswith(str(ds)) and "shard-" in target
    return n


def _snapshot() -> tuple[int, int, int]:
    gc.collect()
    return open_files(), threading.active_count(), len(psutil.Process().children(recursive=True))


def resources() -> tuple[int, int, int]:
    """(open files, threads, child processes) of this process, after a collection, once two readings
    0.1 s apart agree (at most 5 s): a thread or child of an earlier loader that is already ending
    finishes first, so it is not counted on one side of a comparison only (seen once under load)."""
    last, deadline = _snapshot(), time.monotonic() + 5
    while True:
        time.sleep(0.1)
        now = _snapshot()
        if now == last or time.monotonic() > deadline:
            return now
        last = now


def test_dataset_has_several_shards(ds):
    assert len(fastdata.open(ds).manifest.shards) >= 4


def test_dataset_close_and_context_manager_release_shard_files(ds):
    with fastdata.open(ds) as d:
        d.get_batch(range(40))
        assert shard_handles(ds) >= 4
    assert shard_handles(ds) == 0
    d.get_batch([0, 39])  # reopens on use
    assert shard_handles(ds) >= 2
    d.close()
    assert shard_handles(ds) == 0


def test_a_dropped_dataset_releases_its_files(ds):
    d = fastdata.open(ds)
    d.get_batch(range(40))
    assert shard_handles(ds) >= 4
    del d
    gc.collect()
    assert shard_handles(ds) == 0


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_a_loader_closes_the_dataset_it_opened_but_not_the_callers(ds, mode):
    cfg = LoaderConfig(mode=mode)
    gc.collect()
    kids = {p.pid for p in psutil.Process().children(recursive=True)}  # other tests' may still be exiting
    with fastdata.loader(ds, 8, device="cpu", num_workers=2, config=cfg) as ld:
        list(ld)
        assert mode == "threads" or {p.pid for p in psutil.Process().children(recursive=True)} - kids
    assert shard_handles(ds) == 0, "closing the loader closes the files it opened"
    assert not {p.pid for p in psutil.Process().children(recursive=True)} - kids, "and stops its workers"
    mine = fastdata.open(ds)
    mine.get_batch(range(40))
    held = shard_handles(ds)
    with fastdata.loader(mine, 8, device="cpu", num_workers=2, config=cfg) as ld:
        list(ld)
    assert shard_handles(ds) == held  # the caller's dataset stays open...
    assert mine.get_batch([3])["label"].tolist() == [3]  # ...and usable
    mine.close()
    assert shard_handles(ds) == 0


@pytest.mark.parametrize("mode,workers,count", [("threads", 2, 300), ("threads", 0, 100), ("processes", 2, 12)])
def test_churn_of_abandoned_loaders_leaves_files_threads_and_children_flat(ds, mode, workers, count):
    """Loaders created, iterated part-way and dropped without close(), as a notebook re-running a cell."""
    cfg = LoaderConfig(mode=mode)

    def churn(n: int) -> None:
        for _ in range(n):
            ld = fastdata.loader(ds, 4, device="cpu", num_workers=workers, config=cfg)
            it = iter(ld)
            next(it), next(it)  # mid-epoch: reads in flight, every shard likely open
            del it, ld

    churn(2)  # warm-up: torch's and h5py's own one-time files and threads
    before = resources()
    rss0 = psutil.Process().memory_info().rss
    churn(count)
    after = resources()
    assert after == before, f"(files, threads, children) went from {before} to {after}"
    assert shard_handles(ds) == 0
    assert psutil.Process().memory_info().rss - rss0 < 64 << 20  # nothing per loader stays behind
