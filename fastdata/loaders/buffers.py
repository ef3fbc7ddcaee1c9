"""Recycled batch buffers (a fresh large tensor page-faults on every batch), optionally at the address phase
of the bytes they are filled from; a buffer is reused only once nothing outside the pool uses its memory."""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

import numpy as np
import torch

from fastdata._compat import storage_use_count


def torch_dtype(dt: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (native byte order)."""
    return torch.from_numpy(np.empty(0, dtype=np.dtype(dt).newbyteorder("="))).dtype


ALIGN = 64  # a cache line (every dtype's alignment)


def allocate(shape: tuple[int, ...], dtype: torch.dtype, phase: int, pin: bool) -> torch.Tensor:
    """An uninitialised contiguous tensor whose data starts at ``phase`` mod 64 bytes when that
    suits the dtype's alignment (otherwise wherever the allocator puts it)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    nbytes = math.prod(shape) * itemsize
    if phase % ALIGN == 0 or nbytes == 0:
        return torch.empty(shape, dtype=dtype, pin_memory=pin)
    if pin and (nbytes - 1).bit_length() != (nbytes + ALIGN - 1).bit_length():
        return torch.empty(shape, dtype=dtype, pin_memory=pin)  # pinned memory comes in powers of two
    flat = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=pin)
    start = (phase - flat.data_ptr()) % ALIGN
    if start % itemsize:
        return torch.empty(shape, dtype=dtype, pin_memory=pin)
    # set_ rather than a view: a view keeps its base tensor, which _in_use would count as a user
    return torch.empty(0, dtype=dtype).set_(flat.untyped_storage(), start // itemsize, shape)  # type: ignore[call-overload]


def _in_use(t: torch.Tensor) -> bool:
    """True while anything but the pool uses ``t``'s memory; when torch cannot tell, assume it is."""
    # getrefcount counts its argument, this function's parameter and the caller's one name for ``t``
    if sys.getrefcount(t) > 3:
        return True
    users = storage_use_count(t)
    return users is None or users > 1  # only the tensor itself may use the storage


class Recycler:
    """Hands out tensors of a shape and dtype, reusing returned ones that nothing else uses."""

    def __init__(self, pin: bool = False) -> None:
        self.pin = pin
        self._free: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        self._lent: list[torch.Tensor] = []
        self._lock = threading.Lock()  # reader threads take and lend concurrently

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, phase: int = 0) -> torch.Tensor:
        """A tensor of ``shape`` and ``dtype`` at address phase ``phase`` where possible (a recycled one keeps
        its own phase: one Recycler per phase); call :meth:`lend` once handed on."""
        with self._lock:
            self._reclaim()
            bucket = self._free.get((tuple(shape), dtype))
            if bucket:
                return bucket.pop()
        return allocate(tuple(shape), dtype, phase, self.pin)

    def lend(self, t: torch.Tensor) -> None:
        """``t`` now belongs to the consumer; reuse it once nothing refers to it any more."""
        with self._lock:
            self._lent.append(t)

    def _reclaim(self) -> None:
        still = []
        while self._lent:
            t = self._lent.pop()
            if _in_use(t):
                still.append(t)
            else:
                self._free.setdefault((tuple(t.shape), t.dtype), []).append(t)
            del t
        self._lent = still
