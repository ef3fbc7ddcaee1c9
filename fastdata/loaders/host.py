"""Host side of the torch backend: ``ThreadReader`` reads each batch with ``get_batch`` straight into
recycled (pinned on CUDA) buffers; the copies release the GIL, so threads scale."""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Iterator, Literal

import numpy as np
import torch

from fastdata.errors import LoaderWorkerError
from fastdata.format.spec import ENCODING_IMAGE, is_string
from fastdata.loaders.base import wrap_error
from fastdata.loaders.buffers import Recycler, torch_dtype
from fastdata.loaders.crop import CropStage
from fastdata.loaders.transform import BatchTransform, TransformError
from fastdata.reading.dataset import Dataset

HostBatch = dict[str, torch.Tensor]
Ragged = Literal["padded", "packed"]
Post = Callable[[HostBatch, int], HostBatch]


def reader_fields(dataset: Dataset) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict[str, str]]:
    """The native-endian fields a reader gives ``get_batch`` buffers for: fixed ones as (per-sample shape,
    dtype), ragged ones (and images stored ragged) as the dtype of their padded batch."""
    fixed = {f.name: (f.trailing, f.np_dtype.str) for f in dataset.schema if not f.ragged and f.np_dtype.isnative}
    unit_float = dataset.options.get("decode") == "float"  # encoded images decode to float32
    flat = {f.name: np.dtype(np.float32).str if unit_float and f.encoding == ENCODING_IMAGE else f.np_dtype.str
            for f in dataset.schema if f.ragged and f.np_dtype.isnative and not is_string(f)}
    return fixed, flat


def copy_phases(dataset: Dataset) -> dict[str, int]:
    """Per fixed field, where (mod 64 bytes) its samples lie in the first shard's memory: a batch buffer at the
    same phase fills fastest; fields whose rows are not whole cache lines are left out."""
    if not dataset.readers:
        return {}
    out = {}
    for f in dataset.schema:
        if f.ragged or f.row_nbytes % 64:
            continue
        try:
            phase = dataset.readers[0].copy_phase(f.name)
        except Exception:  # only a hint: the read itself reports what is wrong, naming the batch
            continue
        if phase % f.np_dtype.itemsize == 0:
            out[f.name] = phase
    return out


class _BufferPool:
    """Recycled buffers for the native-endian fields of a batch: the batch's shape for fixed fields, flat
    for ragged ones (sized from the batches seen so far)."""

    def __init__(self, dataset: Dataset, pin: bool) -> None:
        self.pin = pin
        fixed, flat = reader_fields(dataset)
        phases = copy_phases(dataset)
        self.fixed = [(name, trailing, torch_dtype(dt), phases.get(name, 0)) for name, (trailing, dt) in fixed.items()]
        self.ragged = {name: torch_dtype(dt) for name, dt in flat.items()}
        self.capacity = dict.fromkeys(self.ragged, 0)  # elements; 0 until a batch was seen
        self.recyclers = {name: Recycler(pin) for name in [*fixed, *flat]}

    def take(self, b: int) -> dict[str, torch.Tensor]:
        """Buffers for a batch of ``b``; they belong to the caller until :meth:`give_back`."""
        bufs = {name: self.recyclers[name].take((b, *shape), dtype, phase) for name, shape, dtype, phase in self.fixed}
        for name, dtype in self.ragged.items():
            if self.capacity[name]:
                bufs[name] = self.recyclers[name].take((self.capacity[name],), dtype)
        return bufs

    def saw(self, name: str, numel: int) -> None:
        """A batch of ragged field ``name`` needed ``numel`` elements: later buffers hold 25% more."""
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
        if isinstance(v, np.ndarray):
            out[k] = torch.from_numpy(v if v.dtype.isnative else v.astype(v.dtype.newbyteorder("=")))
        else:
            out[k] = v  # (a tensor: already in its final, recycled memory)
    return out


def _same_memory(t: torch.Tensor, a: Any) -> bool:
    """True when numpy array ``a`` is exactly tensor ``t``'s memory (shape, dtype and address)."""
    return isinstance(a, np.ndarray) and a.__array_interface__["data"][0] == t.data_ptr() \
        and tuple(a.shape) == tuple(t.shape) and a.dtype.itemsize == t.element_size() and a.flags.c_contiguous


class ThreadReader:
    """Reads batches in ``threads`` threads, at most ``prefetch`` batches ahead, in order; the user's
    ``transform`` runs in the thread that read the batch."""

    def __init__(self, dataset: Dataset, threads: int, prefetch: int, pin: bool, ragged: Ragged = "padded",
                 transform: BatchTransform | None = None, crop: CropStage | None = None,
                 timeout: float | None = None) -> None:
        self.dataset = dataset
        self.timeout = timeout
        self._stuck = False  # a read outlived the timeout
        self.crop = crop  # decodes the augmented image field window by window (crop.py)
        self.ragged = ragged
        self.transform = transform
        self.threads = threads  # 0: read in the iterating thread
        self.prefetch = max(prefetch, threads)
        self.pool = _BufferPool(dataset, pin)
        self._executor: ThreadPoolExecutor | None = None

    def _read(self, k: int, idx: np.ndarray, bufs: dict[str, torch.Tensor], post: Post | None,
              epoch: int, rank: int) -> HostBatch:
        where = f"loader thread {threading.current_thread().name!r}, batch {k}"
        try:
            batch = self.dataset.get_batch(idx, out={name: t.numpy() for name, t in bufs.items()}, ragged=self.ragged,
                                            companions=True)
            for name in self.pool.ragged:
                self.pool.saw(name, batch[name].size)  # ragged results are views of their buffer when large enough
            if self.crop is not None:
                root = self.dataset.root
                batch = self.crop(batch, epoch, rank, k, lambda j: f"{root}: sample {int(idx[j])}")
            if self.transform is not None:
                batch = self.transform(batch, epoch, rank, k)
            # a fixed field still in its buffer is handed out as the buffer itself (recycled once let go)
            result: dict[str, Any] = {name: bufs[name] for name, v in batch.items()
                                      if name in bufs and name not in self.pool.ragged and _same_memory(bufs[name], v)}
            result.update(to_tensors({name: v for name, v in batch.items() if name not in result}))
        except TransformError as e:
            raise LoaderWorkerError(f"{where}, in the transform: {e}") from e.__cause__
        except Exception as e:  # (also a transform's array torch cannot take: as processes mode says it)
            raise wrap_error(e, where) from e
        return post(result, k) if post is not None else result

    def run(self, plan: list[np.ndarray], first: int = 0, post: Post | None = None,
            epoch: int = 0, rank: int = 0) -> Iterator[HostBatch]:
        """Batches of ``plan`` (``first``, ... of ``epoch``) in order; ``post(batch, k)`` runs in the reader thread."""
        if self.threads == 0:
            for k, idx in enumerate(plan, first):
                bufs = self.pool.take(len(idx))
                yield self._read(k, idx, bufs, post, epoch, rank)
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
                    pending.append((self._executor.submit(self._read, first + nxt, plan[nxt], bufs, post, epoch, rank),
                                    bufs))
                    nxt += 1
                k = first + nxt - len(pending)
                fut, bufs = pending.popleft()
                try:
                    batch = fut.result(timeout=self.timeout)
                except FutureTimeout:
                    self._stuck = True  # its thread is still busy: close() must not wait for it
                    raise LoaderWorkerError(
                        f"batch {k} was not read within timeout={self.timeout} s: its read or transform hangs, or is "
                        "that slow; its reader thread cannot be stopped and stays busy (LoaderConfig(mode='processes') "
                        "kills a hung worker instead)") from None
                yield batch
                self.pool.give_back(bufs)
                del fut, bufs, batch
        finally:
            for fut, _ in pending:
                fut.cancel()
            pending.clear()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=not self._stuck, cancel_futures=True)
            self._executor = None
        self._stuck = False
