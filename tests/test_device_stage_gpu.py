"""The experimental staging thread of the torch backend's device stage (DeviceStage.stage_thread): the
same batches as the staging in the training thread, errors raised in the training thread, and a pass
stopped early stops the helper. CUDA only (skipped without it)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import fastdata
from fastdata.augment import HorizontalFlip


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("stage")
    rng = np.random.default_rng(0)
    np.save(tmp / "img.npy", rng.integers(0, 256, (50, 12, 10, 3), dtype=np.uint8))
    np.save(tmp / "y.npy", np.arange(50, dtype=np.int64))
    fastdata.convert(None, tmp / "ds", arrays={"image": tmp / "img.npy", "label": tmp / "y.npy"})
    return tmp / "ds"


def passes(ld, n: int) -> list[list[dict[str, torch.Tensor]]]:
    return [[{k: v.cpu() for k, v in b.items()} for b in ld] for _ in range(n)]


@pytest.mark.gpu  # needs CUDA: tests/conftest.py skips it without
def test_staging_thread_gives_the_same_batches(ds):
    want = passes(fastdata.loader(ds, 8, device="cuda", seed=2, augment=[HorizontalFlip()]), 2)
    ld = fastdata.loader(ds, 8, device="cuda", seed=2, augment=[HorizontalFlip()])
    ld._device.stage_thread = True
    got = passes(ld, 2)
    assert all(torch.equal(a[k], b[k]) for e, f in zip(want, got) for a, b in zip(e, f) for k in a)
    it = iter(ld)  # stopped after one batch: the helper thread ends
    next(it)
    it.close()
    assert not any(t.name == "fastdata-stage" and t.is_alive() for t in threading.enumerate())
    ld.close()
