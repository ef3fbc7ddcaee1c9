"""The worker processes' shared-memory ring: anonymous ``memfd`` slots (nothing left behind) filled in place
by workers and handed out as tensors without a copy; what does not fit crosses pickled and the slot grows."""

from __future__ import annotations

import math
import mmap
import os
from typing import Any

import numpy as np
import torch

from fastdata._compat import storage_use_count
from fastdata.handles import parent_only
from fastdata.loaders.buffers import ALIGN, torch_dtype

Layout = dict[str, tuple[int, int]]  # region name -> (offset, bytes); SPARE: arrays a transform makes
SPARE = ""
Placed = tuple[str, Any]  # ("slot", (offset, shape, dtype str)) or ("copy", value)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def anonymous_segment(size: int) -> int:
    """A descriptor of ``size`` bytes of shared memory that has no name anywhere."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("fastdata-ring", os.MFD_CLOEXEC)
    else:  # pragma: no cover - macOS: a POSIX segment unlinked at once (named for microseconds)
        from multiprocessing import shared_memory

        shm = shared_memory.SharedMemory(create=True, size=size)
        fd = os.dup(shm._fd)  # type: ignore[attr-defined]
        shm.close()
        shm.unlink()
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd


class Slot:
    """One batch buffer of the ring, in the training process: its memory, layout and generation."""

    def __init__(self, sid: int, gen: int, layout: Layout, size: int) -> None:
        self.id, self.gen, self.layout, self.size = sid, gen, layout, size
        self.fd = anonymous_segment(size)
        mm = mmap.mmap(self.fd, size)
        self.base = torch.frombuffer(mm, dtype=torch.uint8)  # keeps the mapping while any view lives
        parent_only(self)  # a forked child closes its copy of the descriptor

    def tensor(self, offset: int, shape: tuple[int, ...], dtype: str) -> torch.Tensor:
        """A view of the slot's bytes at ``offset`` as an array of ``shape`` and ``dtype``."""
        dt = np.dtype(dtype)
        nbytes = math.prod(shape) * dt.itemsize
        if nbytes == 0:
            return torch.from_numpy(np.empty(shape, dtype=dt))
        flat = self.base[offset: offset + nbytes]
        return flat.view(torch_dtype(dt)).view(shape)

    def close(self) -> None:
        """Close the descriptor; the memory stays mapped until the last view of it is dropped."""
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    _after_fork_in_child = close  # a forked child closes its copy of the descriptor; the mapping is harmless


class Ring:
    """The training process's slots: handed to a worker to fill, lent to the consumer, reused."""

    def __init__(self, fixed: dict[str, int], ragged: list[str], size: int) -> None:
        self.fixed = fixed  # field -> bytes per sample
        self.capacity: dict[str, int] = {**dict.fromkeys(ragged, 0), SPARE: 0}  # bytes, grown by what batches needed
        self.rows = 0  # samples the fixed regions hold
        self.want = size  # slots kept free or lent before more are made
        self.slots: list[Slot] = []
        self.free: list[Slot] = []  # also those whose batch was never handed out (a pass ended early, a read failed)
        self.lent: list[Slot] = []  # their batch went to the consumer
        self.copied = 0  # arrays that crossed pickled (did not fit their slot)
        self.grown = 0  # slots made beyond ``want`` because the consumer held on to batches

    def _layout(self) -> tuple[Layout, int]:
        """Offsets of the regions (fixed fields for ``rows`` samples, then ragged ones, the spare last); size."""
        sizes = {**{n: self.rows * row for n, row in self.fixed.items()}, **self.capacity}
        layout: Layout = {}
        at = 0
        for name, nbytes in sizes.items():
            layout[name] = (at, nbytes)
            at = _aligned(at + nbytes)
        return layout, max(ALIGN, at)

    def take(self, rows: int) -> Slot:
        """A slot to fill with a batch of ``rows`` samples: a free one, made anew when too small."""
        self.rows = max(self.rows, rows)
        self._reclaim()
        if not self.free:
            self.grown += len(self.slots) >= self.want
            return self._make(len(self.slots), 0)
        slot = self.free.pop()
        if slot.layout != self._layout()[0]:  # (regions only grow: a slot of another layout is too small)
            slot.close()
            slot = self._make(slot.id, slot.gen + 1)
        return slot

    def _make(self, sid: int, gen: int) -> Slot:
        layout, size = self._layout()
        slot = Slot(sid, gen, layout, size)
        if sid == len(self.slots):
            self.slots.append(slot)
        else:
            self.slots[sid] = slot
        return slot

    def saw(self, needs: dict[str, int]) -> None:
        """A batch needed ``needs`` bytes in some regions: slots made or reused later hold a quarter more."""
        for name, n in needs.items():
            if n > self.capacity.get(name, n):
                self.capacity[name] = n + n // 4

    def _reclaim(self) -> None:
        still: list[Slot] = []
        for slot in self.lent:  # reused once no view of its memory exists outside the ring (None: cannot tell)
            users = storage_use_count(slot.base)
            (still if users is None or users > 1 else self.free).append(slot)
        self.lent = still

    def close(self) -> None:
        for slot in self.slots:
            slot.close()
        self.slots, self.free, self.lent = [], [], []


class WorkerSlots:
    """A worker's mappings of the slots it was given, and placing a finished batch in one."""

    def __init__(self) -> None:
        self.maps: dict[int, tuple[int, mmap.mmap, np.ndarray, Layout]] = {}  # id -> (gen, mapping, bytes, layout)

    def add(self, sid: int, gen: int, fd: int, size: int, layout: Layout) -> None:
        try:
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.maps[sid] = (gen, mm, np.frombuffer(mm, dtype=np.uint8), layout)  # (unmapped when the worker exits)

    def outs(self, sid: int, rows: int, fixed: dict[str, tuple[tuple[int, ...], str]],
             ragged: dict[str, str]) -> dict[str, np.ndarray]:
        """``get_batch(out=...)`` arrays in slot ``sid``: fixed fields shaped for ``rows`` samples,
        ragged fields flat (``get_batch`` uses them when they are large enough)."""
        _, _, whole, layout = self.maps[sid]
        out = {}
        for name, (trailing, dtype) in fixed.items():
            off, _ = layout[name]
            dt = np.dtype(dtype)
            out[name] = whole[off: off + rows * math.prod(trailing) * dt.itemsize].view(dt).reshape(rows, *trailing)
        for name, dtype in ragged.items():
            off, nbytes = layout[name]
            dt = np.dtype(dtype)
            out[name] = whole[off: off + nbytes - nbytes % dt.itemsize].view(dt)
        return out

    def place(self, sid: int, batch: dict[str, Any], ragged: set[str]) -> tuple[dict[str, Placed], dict[str, int]]:
        """Where each value of ``batch`` is for the training process: in slot ``sid`` or sent pickled; and the
        bytes ragged fields and transform-made arrays needed (the ring grows its slots by them)."""
        _, _, whole, layout = self.maps[sid]
        start = whole.ctypes.data
        end = start + whole.nbytes
        placed: dict[str, Placed] = {}
        loose: dict[str, np.ndarray] = {}
        used: list[tuple[int, int]] = []  # byte ranges of the slot that values already occupy
        needs: dict[str, int] = {}
        for name, v in batch.items():
            if not isinstance(v, np.ndarray):
                placed[name] = ("copy", v)
                continue
            if name in ragged:
                needs[name] = v.nbytes
            p = v.__array_interface__["data"][0]
            if v.flags.c_contiguous and v.dtype.isnative and start <= p and p + v.nbytes <= end:
                placed[name] = ("slot", (p - start, v.shape, v.dtype.str))
                used.append((p - start, p - start + v.nbytes))
            else:
                loose[name] = v
        spare_at, spare_left = layout[SPARE]
        spare_need = 0
        for name, v in loose.items():
            dt = v.dtype.newbyteorder("=")
            at = None
            own = layout.get(name)
            if own is not None and own[1] >= v.nbytes and not any(a < own[0] + v.nbytes and own[0] < e for a, e in used):
                at = own[0]  # the field's own region, which no other value uses
            elif name not in ragged:
                spare_need += v.nbytes + ALIGN
                if v.nbytes <= spare_left:
                    at = spare_at
                    spare_at, spare_left = _aligned(spare_at + v.nbytes), spare_left - _aligned(v.nbytes)
            if at is None:
                placed[name] = ("copy", v)
                continue
            dst = whole[at: at + v.nbytes].view(dt).reshape(v.shape)
            np.copyto(dst, v)
            used.append((at, at + v.nbytes))
            placed[name] = ("slot", (at, v.shape, dt.str))
        needs[SPARE] = spare_need
        return placed, needs
