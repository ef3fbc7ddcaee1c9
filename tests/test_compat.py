"""The private torch internals of fastdata/_compat.py: these fail loudly when a torch upgrade changes them."""

from __future__ import annotations

import numpy as np
import torch

from fastdata import _compat


def test_storage_use_count_sees_every_user() -> None:
    t = torch.zeros(16)
    assert _compat.storage_use_count(t) == 1, "torch's storage use count changed meaning: fix fastdata/_compat.py"
    view = t[2:5]
    assert _compat.storage_use_count(t) == 2
    arr = view.numpy()
    back = torch.from_numpy(arr)
    assert _compat.storage_use_count(t) >= 3
    del view, arr, back
    assert _compat.storage_use_count(t) == 1


def test_recycler_never_reuses_a_buffer_in_use() -> None:
    from fastdata.loaders.host import Recycler

    pool = Recycler()
    a = pool.take((4, 4), torch.float32)
    a.fill_(7)
    kept = a.numpy()[1]  # a numpy view of one row outlives the tensor
    pool.lend(a)
    del a
    b = pool.take((4, 4), torch.float32)
    b.fill_(0)
    assert np.all(kept == 7)
    pool.lend(b)
    del b, kept
    c = pool.take((4, 4), torch.float32)  # now nothing uses the first buffer: it may come back
    assert c.shape == (4, 4)
