"""Dataset reads through the ShardStore interface (fastdata/format/store.py) whatever kind of
source it is: a source of another kind (here one that counts what it is asked) needs no change in
Dataset, and a local dataset never pins or prefetches."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pytest
from conftest import four_shard_dataset

import fastdata
import fastdata.reading.dataset as dataset_module
from fastdata.format.interface import ShardReader
from fastdata.format.store import LocalShards, ShardStore


class CountingShards(LocalShards):
    """Local shards that record which shards each batch pinned, and whether they were closed."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.batches: list[list[int]] = []
        self.held = 0
        self.closed = False

    @contextmanager
    def pinned(self, shards: Sequence[int], readers: Sequence[ShardReader]) -> Iterator[None]:
        self.batches.append(list(shards))
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1

    def release_pins(self) -> None:
        self.closed = True


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_a_source_of_another_kind_serves_the_dataset(tmp_path, monkeypatch, backend):
    path, arrays = four_shard_dataset(tmp_path, backend)
    ref = np.stack([arrays[k] for k in sorted(arrays)])
    made: list[CountingShards] = []

    def open_store(src: str, remote: object) -> ShardStore:
        made.append(CountingShards(Path(src)))
        return made[0]

    monkeypatch.setattr(dataset_module, "open_store", open_store)
    ds = fastdata.open(path)
    src = made[0]
    starts = [s.start for s in ds.manifest.shards]
    idx = [29, 0, 5, 17, 1]
    assert np.array_equal(ds.get_batch(idx)["x"], ref[idx])
    want = sorted({int(np.searchsorted(starts, i, side="right") - 1) for i in idx})
    assert src.batches == [want] and src.held == 0  # the shards of the batch, held only while it was read
    assert ds.remote is None
    ds.close()
    assert src.closed


def test_local_shards_read_in_place(tmp_path):
    path, _ = four_shard_dataset(tmp_path, "hdf5")
    src = LocalShards(path)
    readers = src.open_readers(src.manifest.fields)
    assert src.remote is None
    assert [r.path for r in readers] == [path / s.file for s in src.manifest.shards]
    with src.pinned([0, 1], readers):  # nothing to hold for files that stay where they are
        pass
