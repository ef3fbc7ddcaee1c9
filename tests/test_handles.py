"""Per-process handles: different shards open at once, one shard once, and a fork starts clean."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import fastdata
from fastdata.handles import PerProcessHandle, open_all


class _Slow(PerProcessHandle[int]):
    """A handle whose opening waits at a barrier: it opens only if enough openings run at once."""

    def __init__(self, barrier: threading.Barrier, opened: list[int]) -> None:
        self.barrier = barrier
        self.opened = opened

    def _open_handle(self) -> int:
        self.barrier.wait(timeout=10)  # BrokenBarrierError if the others open one after another
        self.opened.append(id(self))
        return len(self.opened)


def test_open_all_opens_different_handles_at_once() -> None:
    opened: list[int] = []
    barrier = threading.Barrier(4)
    owners = [_Slow(barrier, opened) for _ in range(4)]
    open_all(owners)
    assert sorted(opened) == sorted(id(o) for o in owners)
    assert all(o.is_open() for o in owners)
    open_all(owners)  # already open: nothing opens again
    assert len(opened) == 4


def test_one_handle_racing_threads_open_it_once() -> None:
    opened: list[int] = []
    owner = _Slow(threading.Barrier(1), opened)
    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.append(owner.handle())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert opened == [id(owner)] and got == [1] * 8


def test_open_all_raises_the_opening_error() -> None:
    class Broken(PerProcessHandle[int]):
        def _open_handle(self) -> int:
            raise OSError("shard-00001.h5: unreadable")

    with pytest.raises(OSError, match="shard-00001.h5: unreadable"):
        open_all([Broken(), Broken()])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_another_thread_opens_leaves_the_child_able_to_open() -> None:
    entered, release = threading.Event(), threading.Event()

    class Held(PerProcessHandle[int]):
        def _open_handle(self) -> int:
            if os.getpid() == parent:
                entered.set()
                release.wait(timeout=10)
            return os.getpid()

    parent = os.getpid()
    owner = Held()
    t = threading.Thread(target=owner.handle)
    t.start()
    entered.wait(timeout=10)  # the parent's opening lock of `owner` is held now
    pid = os.fork()
    if pid == 0:  # the child: its own lock, so it opens instead of waiting for the parent's thread
        os._exit(0 if owner.handle() == os.getpid() else 1)
    release.set()
    t.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert owner.handle() == parent


def test_a_batch_over_many_shards_opens_them_all(tmp_path) -> None:
    src = tmp_path / "npy"
    for i in range(12):
        (src / "c").mkdir(parents=True, exist_ok=True)
        np.save(src / "c" / f"{i:03d}.npy", np.full((4,), i, dtype=np.float32))
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(
        write=fastdata.WriteOptions(backend="hdf5", shard_size=48, workers=1)), progress=None)
    with fastdata.open(tmp_path / "ds") as ds:
        readers = ds.readers
        assert len(readers) == 4 and not any(r.is_open() for r in readers)
        b = ds.get_batch(np.arange(12))
        assert all(r.is_open() for r in readers)
        assert [int(v) for v in b["x"][:, 0]] == list(range(12))
        ds.close()  # closed: the next batch opens them all again
        assert not any(r.is_open() for r in readers)
        ds.get_batch(np.arange(12))
        assert all(r.is_open() for r in readers)
    with fastdata.open(tmp_path / "ds") as ds:  # the read-ahead's first step opens them too
        ds.byte_ranges(np.arange(12))
        assert all(r.is_open() for r in ds.readers)
