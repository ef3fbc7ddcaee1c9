"""The private torch internal fastdata relies on (a storage's use count), isolated here with a loud test
(tests/test_compat.py) so that a torch upgrade that changes it fails CI."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("fastdata")

_use_count = getattr(torch._C, "_storage_Use_Count", None)
_warned = False


def storage_use_count(t: torch.Tensor) -> int | None:
    """How many tensors, views and numpy arrays share ``t``'s storage (``t`` itself included), or None
    when this torch cannot tell: then callers must assume the storage is still in use."""
    global _warned
    if _use_count is None:
        if not _warned:
            _warned = True
            log.warning("this torch has no storage use count: batch buffers are not recycled (slower, still correct)")
        return None
    # minus the temporary storage object that untyped_storage() makes for this call
    return int(_use_count(t.untyped_storage()._cdata)) - 1

