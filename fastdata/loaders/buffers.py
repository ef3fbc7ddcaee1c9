"""Recycled batch buffers: a fresh 50 MB tensor page-faults on every batch (the copy into it then
costs ~5x more than into memory already mapped), so batch buffers are reused.

A buffer is handed out again only when nothing outside the pool uses its memory: no other
reference to the tensor, and no view, numpy array or other tensor on its storage. Anything a
training loop keeps therefore stays intact.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import torch

def torch_dtype(dt: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (native byte order)."""
    import numpy as np

    return torch.from_numpy(np.empty(0, dtype=np.dtype(dt).newbyteorder("="))).dtype


_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _in_use(t: torch.Tensor, refs_held_by_caller: int) -> bool:
    # getrefcount counts its own argument and this function's parameter; the caller says how many
    # references it holds itself.
    if sys.getrefcount(t) - 2 > refs_held_by_caller:
        return True
    if _use_count is not None:
        # the tensor itself + the temporary storage object made by untyped_storage()
        return _use_count(t.untyped_storage()._cdata) > 2
    return False  # pragma: no cover - without the counter, only direct references are seen


class Recycler:
    """Hands out tensors of a shape and dtype, reusing returned ones that nothing else uses."""

    def __init__(self, pin: bool = False) -> None:
        self.pin = pin
        self._free: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        self._lent: list[torch.Tensor] = []
        self._lock = threading.Lock()  # reader threads take and lend concurrently

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A tensor of ``shape`` and ``dtype``; call :meth:`lend` once it has been handed on."""
        with self._lock:
            self._reclaim()
            bucket = self._free.get((tuple(shape), dtype))
            if bucket:
                return bucket.pop()
        return torch.empty(tuple(shape), dtype=dtype, pin_memory=self.pin)

    def lend(self, t: torch.Tensor) -> None:
        """``t`` now belongs to the consumer; reuse it once nothing refers to it any more."""
        with self._lock:
            self._lent.append(t)

    def _reclaim(self) -> None:
        still = []
        while self._lent:
            t = self._lent.pop()
            if _in_use(t, refs_held_by_caller=1):  # the local name ``t``
                still.append(t)
            else:
                self._free.setdefault((tuple(t.shape), t.dtype), []).append(t)
            del t
        self._lent = still
