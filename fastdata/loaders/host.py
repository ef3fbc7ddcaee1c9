"""Host side of the torch backend: whole batches read by threads or by worker processes.

``ThreadReader`` reads each batch with ``get_batch`` straight into recycled (pinned, when
CUDA is used) buffers; h5py is bypassed on the hot path and LMDB and numpy copies release
the GIL, so threads scale. ``ProcessReader`` runs ``get_batch`` in torch DataLoader worker
processes; each batch crosses to the main process as one tensor per field.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator, Literal

import numpy as np
import torch

from .._compat import shutdown_workers
from ..dataset import Dataset
from ..format.spec import ENCODING_IMAGE, is_string
from .base import wrap_error
from .buffers import Recycler, torch_dtype

HostBatch = dict[str, torch.Tensor]
Ragged = Literal["padded", "packed"]
Post = Callable[[HostBatch, int], HostBatch]


class _BufferPool:
    """Recycled buffers (fastdata.loaders.buffers) for the native-endian fields of a batch: one of
    the batch's shape per fixed-shape field, and a flat one per ragged field (and image fields
    stored ragged), sized from the batches seen so far, which the padded batch is a view of.
    Byte-swapped fields are read fresh."""

    def __init__(self, dataset: Dataset, pin: bool) -> None:
        self.pin = pin
        self.fixed = [(f.name, f.trailing, torch_dtype(f.np_dtype), dataset.copy_phase(f.name))
                      for f in dataset.schema if not f.ragged and f.np_dtype.isnative]
        self.recyclers = {name: Recycler(pin) for name, *_ in self.fixed}  # one per field: its own phase
        unit_float = dataset.options.get("decode") == "float"  # encoded images decode to float32
        self.ragged = {f.name: torch.float32 if unit_float and f.encoding == ENCODING_IMAGE else torch_dtype(f.np_dtype)
                       for f in dataset.schema
                       if f.ragged and f.np_dtype.isnative and not is_string(f)}  # strings become lists of str
        self.capacity = dict.fromkeys(self.ragged, 0)  # elements; 0 until a batch was seen
        for name in self.ragged:
            self.recyclers[name] = Recycler(pin)

    def take(self, b: int) -> dict[str, torch.Tensor]:
        """Buffers for a batch of ``b``, aligned like the shard's bytes; they belong to the caller
        until :meth:`give_back`."""
        bufs = {name: self.recyclers[name].take((b, *shape), dtype, phase) for name, shape, dtype, phase in self.fixed}
        for name, dtype in self.ragged.items():
            if self.capacity[name]:
                bufs[name] = self.recyclers[name].take((self.capacity[name],), dtype)
        return bufs

    def saw(self, name: str, numel: int) -> None:
        """A batch of ragged field ``name`` needed ``numel`` elements: later buffers hold 25% more
        (a new recycler: buffers of the old size are dropped once their batches are)."""
        if numel > self.capacity.get(name, numel):
            self.capacity[name] = numel + numel // 4
            self.recyclers[name] = Recycler(self.pin)

    def give_back(self, bufs: dict[str, torch.Tensor]) -> None:
        """The batch was yielded: reuse its buffers once the consumer lets go of them."""
        for name, t in bufs.items():
            if t.numel() == self.capacity.get(name, t.numel()):  # not from a recycler since replaced
                self.recyclers[name].lend(t)


def to_tensors(batch: dict[str, Any]) -> HostBatch:
    """Arrays become tensors; lists of strings (string fields, keys) pass through unchanged."""
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if isinstance(v, list):
            out[k] = v
            continue
        if not v.dtype.isnative:
            v = v.astype(v.dtype.newbyteorder("="))
        out[k] = torch.from_numpy(v)
    return out


class ThreadReader:
    """Reads batches in ``threads`` threads, at most ``prefetch`` batches ahead, in order."""

    def __init__(self, dataset: Dataset, threads: int, prefetch: int, pin: bool, ragged: Ragged = "padded") -> None:
        self.dataset = dataset
        self.ragged = ragged
        self.threads = threads  # 0: read in the iterating thread
        self.prefetch = max(prefetch, threads)
        self.pool = _BufferPool(dataset, pin)
        self._executor: ThreadPoolExecutor | None = None

    def _read(self, k: int, idx: np.ndarray, bufs: dict[str, torch.Tensor], post: Post | None) -> HostBatch:
        try:
            batch = self.dataset.get_batch(idx, out={name: t.numpy() for name, t in bufs.items()}, ragged=self.ragged)
        except Exception as e:
            raise wrap_error(e, f"loader thread, batch {k}") from e
        for name in self.pool.ragged:
            self.pool.saw(name, batch[name].size)  # ragged results are views of their buffer when it was large enough
        fixed = {name: t for name, t in bufs.items() if name not in self.pool.ragged}
        result = to_tensors({name: v for name, v in batch.items() if name not in fixed})
        result.update(fixed)
        return post(result, k) if post is not None else result

    def run(self, plan: list[np.ndarray], first: int = 0, post: Post | None = None) -> Iterator[HostBatch]:
        """Batches of ``plan`` in order; ``post(batch, k)`` runs in the reader thread (CPU transforms)."""
        if self.threads == 0:
            for k, idx in enumerate(plan, first):
                bufs = self.pool.take(len(idx))
                yield self._read(k, idx, bufs, post)
                self.pool.give_back(bufs)
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="fastdata-read")
        pending: deque[tuple[Future[HostBatch], dict[str, torch.Tensor]]] = deque()
        nxt = 0
        try:
            while nxt < len(plan) or pending:
                while nxt < len(plan) and len(pending) < self.prefetch:
                    bufs = self.pool.take(len(plan[nxt]))
                    pending.append((self._executor.submit(self._read, first + nxt, plan[nxt], bufs, post), bufs))
                    nxt += 1
                fut, bufs = pending.popleft()
                yield fut.result()
                self.pool.give_back(bufs)
                del fut, bufs
        finally:
            for fut, _ in pending:
                fut.cancel()
            pending.clear()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None


class _BatchDataset(torch.utils.data.Dataset):
    """Map-style dataset whose 'index' is a whole batch of indices."""

    def __init__(self, dataset: Dataset, ragged: Ragged = "padded") -> None:
        self.dataset = dataset
        self.ragged = ragged

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: Any) -> HostBatch:
        return to_tensors(self.dataset.get_batch(idx, ragged=self.ragged))


class _PlanSampler(torch.utils.data.Sampler):
    def __init__(self) -> None:
        self.plan: list[np.ndarray] = []

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.plan)

    def __len__(self) -> int:
        return len(self.plan)


class ProcessReader:
    """Reads batches in persistent torch DataLoader worker processes (one tensor per field per batch)."""

    def __init__(self, dataset: Dataset, workers: int, prefetch: int, pin: bool, ragged: Ragged = "padded") -> None:
        self.sampler = _PlanSampler()
        per_worker = max(2, -(-prefetch // max(1, workers)))
        if dataset.options.get("decode_threads") is None:
            dataset = dataset.with_options(decode_threads=1)  # the workers are the parallelism: no oversubscription
        self.loader = torch.utils.data.DataLoader(
            _BatchDataset(dataset, ragged), batch_size=None, sampler=self.sampler, num_workers=workers,
            pin_memory=pin, persistent_workers=True, prefetch_factor=per_worker,
        )

    def run(self, plan: list[np.ndarray], first: int = 0, post: Post | None = None) -> Iterator[HostBatch]:
        """Batches of ``plan`` in order; ``post`` runs in this process (workers ship uint8, 4x fewer bytes)."""
        self.sampler.plan = plan
        for k, batch in enumerate(self.loader, first):
            yield post(batch, k) if post is not None else batch

    def close(self) -> None:
        shutdown_workers(self.loader)
