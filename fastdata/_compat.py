"""The private torch internals fastdata relies on, each isolated in one function with a loud test
(tests/test_compat.py) so a torch upgrade that changes one fails CI instead of misbehaving.

No public API covers either need: torch exposes no count of the tensors, views and numpy arrays
sharing a storage, and no way to stop a DataLoader's persistent workers short of dropping every
reference to its iterator.
"""

from __future__ import annotations

import logging
from typing import Any

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


def shutdown_workers(loader: Any) -> None:
    """Stop the worker processes of a torch DataLoader's current iterator now (persistent workers
    otherwise live as long as any reference to the iterator does)."""
    it = getattr(loader, "_iterator", None)
    if it is not None:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        loader._iterator = None
