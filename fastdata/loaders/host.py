"""Host side of the torch backend: whole batches read by threads or by worker processes.

``ThreadReader`` reads each batch with ``get_batch`` straight into recycled (pinned, when
CUDA is used) buffers; h5py is bypassed on the hot path and LMDB and numpy copies release
the GIL, so threads scale. Worker processes (procs.py) read into a shared ring instead. A user
transform (transform.py) runs in the reader, on the batch's numpy arrays.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal

import numpy as np
import torch

from fastdata.errors import LoaderWorkerError
from fastdata.format.external import size_mtime
from fastdata.format.spec import ENCODING_IMAGE, FieldSpec, is_string
from fastdata.loaders.base import wrap_error
from fastdata.loaders.buffers import Recycler, torch_dtype
from fastdata.loaders.crop import CropStage
from fastdata.loaders.transform import BatchTransform, TransformError
from fastdata.reading.dataset import Dataset

HostBatch = dict[str, torch.Tensor]
Ragged = Literal["padded", "packed"]
Post = Callable[[HostBatch, int], HostBatch]
NextPass = Callable[[], tuple[list[np.ndarray], Post | None, int, int]]


@dataclass
class _Carried:
    """Reads of the next pass's first batches (future, buffers, indices), for epoch and rank ``key``."""

    key: tuple[int, int]
    files: tuple[tuple[int, int] | None, ...]  # the shard files' (size, mtime) when the reads started
    reads: list[tuple[Future[HostBatch], dict[str, torch.Tensor], np.ndarray]] = field(default_factory=list)


def copy_phase(dataset: Dataset, f: FieldSpec) -> int:
    """Where (mod 64 bytes) samples of fixed field ``f`` start in the first shard, where they are copied
    from: a batch buffer at the same phase fills fastest (fastdata.loaders.buffers). 0 when rows are not
    whole cache lines (each row then starts at another phase)."""
    if f.row_nbytes % 64 or not dataset.readers:
        return 0
    try:
        return dataset.readers[0].copy_phase(f.name)
    except Exception:  # only a hint: the read itself reports what is wrong, naming the batch
        return 0


def reader_fields(dataset: Dataset) -> tuple[dict[str, tuple[tuple[int, ...], str, int]], dict[str, str]]:
    """The fields a reader gives ``get_batch`` buffers for: fixed-shape ones as (per-sample shape,
    dtype, address phase), and ragged ones (and images stored ragged) as the dtype of their padded
    batch; byte-swapped fields are read fresh, and string fields become lists of str."""
    fixed = {f.name: (f.trailing, f.np_dtype.str, copy_phase(dataset, f))
             for f in dataset.schema if not f.ragged and f.np_dtype.isnative}
    unit_float = dataset.options.get("decode") == "float"  # encoded images decode to float32
    flat = {f.name: np.dtype(np.float32).str if unit_float and f.encoding == ENCODING_IMAGE else f.np_dtype.str
            for f in dataset.schema if f.ragged and f.np_dtype.isnative and not is_string(f)}
    return fixed, flat


class _BufferPool:
    """Recycled buffers (fastdata.loaders.buffers) for the native-endian fields of a batch: one of
    the batch's shape per fixed-shape field, and a flat one per ragged field (and image fields
    stored ragged), sized from the batches seen so far, which the padded batch is a view of.
    Byte-swapped fields are read fresh."""

    def __init__(self, dataset: Dataset, pin: bool) -> None:
        self.pin = pin
        fixed, flat = reader_fields(dataset)
        self.fixed = [(name, trailing, torch_dtype(dt), phase) for name, (trailing, dt, phase) in fixed.items()]
        self.recyclers = {name: Recycler(pin) for name, *_ in self.fixed}  # one per field: its own phase
        self.ragged = {name: torch_dtype(dt) for name, dt in flat.items()}
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
        if isinstance(v, (list, torch.Tensor)):  # a tensor: already in its final (recycled) memory
            out[k] = v
            continue
        if not v.dtype.isnative:
            v = v.astype(v.dtype.newbyteorder("="))
        out[k] = torch.from_numpy(v)
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
        self._stuck = False  # a read outlived the timeout: its thread is still busy, close() must not wait
        self.crop = crop  # decodes the augmented image field window by window (crop.py)
        self.ragged = ragged
        self.transform = transform
        self.threads = threads  # 0: read in the iterating thread
        self.prefetch = max(prefetch, threads)
        self.pool = _BufferPool(dataset, pin)
        self._executor: ThreadPoolExecutor | None = None
        self._carried: _Carried | None = None  # the next pass's first reads, started as this one ended

    def stats(self) -> dict[str, int]:
        return {}

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
        except Exception as e:
            raise wrap_error(e, where) from e
        if self.transform is not None:
            try:
                batch = self.transform(batch, epoch, rank, k)
            except TransformError as e:
                raise LoaderWorkerError(f"{where}, in the transform: {e}") from e.__cause__
        # a fixed field still in its buffer is handed out as the buffer itself (recycled once let go)
        result: dict[str, Any] = {name: bufs[name] for name, v in batch.items()
                                  if name in bufs and name not in self.pool.ragged and _same_memory(bufs[name], v)}
        try:
            result.update(to_tensors({name: v for name, v in batch.items() if name not in result}))
        except Exception as e:  # a transform's array torch cannot take (object dtype): as processes mode says it
            raise wrap_error(e, where) from e
        return post(result, k) if post is not None else result

    def _wait(self, fut: Future[HostBatch], k: int) -> HostBatch:
        """Batch ``k``'s result, waiting at most ``timeout`` seconds for it."""
        try:
            return fut.result(timeout=self.timeout)
        except FutureTimeout:
            self._stuck = True
            raise LoaderWorkerError(
                f"batch {k} was not read within timeout={self.timeout} s: its read or transform hangs, or is that "
                "slow; its reader thread cannot be stopped and stays busy (LoaderConfig(mode='processes') kills "
                "a hung worker instead)") from None

    def run(self, plan: list[np.ndarray], first: int = 0, post: Post | None = None,
            epoch: int = 0, rank: int = 0, then: NextPass | None = None) -> Iterator[HostBatch]:
        """Batches of ``plan`` (batches ``first``, ... of ``epoch``) in order; ``post(batch, k)`` runs
        in the reader thread (CPU transforms). ``then()``: the pass that follows this one (its plan,
        post, epoch, rank); once this pass's last batch is asked for, the free read slots start that
        pass's first batches, so an epoch boundary costs no pipeline refill (see :meth:`_adopt`)."""
        if self.threads == 0:
            for k, idx in enumerate(plan, first):
                bufs = self.pool.take(len(idx))
                yield self._read(k, idx, bufs, post, epoch, rank)
                self.pool.give_back(bufs)
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="fastdata-read")
        pending = self._adopt(plan, first, epoch, rank)
        nxt = len(pending)
        nxt_pass: tuple[list[np.ndarray], Post | None, int, int] | None = None
        try:
            while nxt < len(plan) or pending:
                while nxt < len(plan) and len(pending) < self.prefetch:
                    bufs = self.pool.take(len(plan[nxt]))
                    pending.append((self._executor.submit(self._read, first + nxt, plan[nxt], bufs, post, epoch, rank),
                                    bufs))
                    nxt += 1
                if nxt == len(plan) and then is not None:
                    nxt_pass = nxt_pass or then()
                    self._carry(nxt_pass, self.prefetch - len(pending))
                k = first + nxt - len(pending)
                fut, bufs = pending.popleft()
                yield self._wait(fut, k)
                self.pool.give_back(bufs)
                del fut, bufs
            if self._carried is not None:  # the pass ran out: no read of the next may outlast it (a file the
                wait([f for f, _, _ in self._carried.reads])  # caller changes now must not fault a memory map)
        finally:
            for fut, _ in pending:
                fut.cancel()
            pending.clear()

    def _carry(self, nxt: tuple[list[np.ndarray], Post | None, int, int], room: int) -> None:
        """Start the first batches of the next pass (plan, post, epoch, rank) in ``room`` free slots."""
        plan, post, epoch, rank = nxt
        assert self._executor is not None
        carried = self._carried  # (none at a pass's start: _adopt took or dropped the last one)
        if carried is None:
            carried = self._carried = _Carried((epoch, rank), self._files())
        while room > len(carried.reads) and len(carried.reads) < len(plan):
            j = len(carried.reads)
            bufs = self.pool.take(len(plan[j]))
            carried.reads.append((self._executor.submit(self._read, j, plan[j], bufs, post, epoch, rank), bufs, plan[j]))

    def _adopt(self, plan: list[np.ndarray], first: int, epoch: int,
               rank: int) -> deque[tuple[Future[HostBatch], dict[str, torch.Tensor]]]:
        """The reads the last pass started for this one, when this pass is the one they were read
        for (same epoch, rank, start and index batches); others are dropped once done."""
        carried = self._carried
        if carried is not None and carried.key == (epoch, rank) and first == 0 and len(carried.reads) <= len(plan) \
                and all(np.array_equal(idx, plan[j]) for j, (_, _, idx) in enumerate(carried.reads)) \
                and carried.files == self._files():  # read from the files as they still are
            self._carried = None
            return deque((fut, bufs) for fut, bufs, _ in carried.reads)
        self._drop_carried()
        return deque()

    def _files(self) -> tuple[tuple[int, int] | None, ...]:
        """Size and modification time of each shard file: reads carried to the next pass are used only
        when no file changed since they started."""
        out: list[tuple[int, int] | None] = []
        for path in self.dataset.shard_paths():
            try:
                out.append(size_mtime(str(path)))
            except OSError:
                out.append(None)
        return tuple(out)

    def _drop_carried(self) -> None:
        """Cancel or finish the carried reads (their errors belong to a pass that will not run)."""
        carried, self._carried = self._carried, None
        for fut, bufs, _ in carried.reads if carried is not None else ():
            if not fut.cancel():
                try:
                    fut.result()
                except Exception:  # noqa: BLE001 - a batch nobody will ask for
                    pass
            self.pool.give_back(bufs)

    def close(self) -> None:
        if self._stuck:  # a thread is hung in a read or transform: waiting for it would hang here too
            self._carried = None
        self._drop_carried()
        if self._executor is not None:
            self._executor.shutdown(wait=not self._stuck, cancel_futures=True)
            self._executor = None
        self._stuck = False
