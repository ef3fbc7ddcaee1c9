"""Worker processes of ``LoaderConfig(mode="processes")`` and their shared-memory ring: batch ``k`` is read by
worker ``k % workers`` into an anonymous ``memfd`` slot and handed back in order as tensors without a copy (what
does not fit crosses pickled and the slot grows); workers ignore Ctrl-C and exit when the parent goes."""

from __future__ import annotations

import gc
import math
import mmap
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
import traceback
from collections import deque
from multiprocessing import reduction
from multiprocessing.connection import Connection, wait
from typing import Any, Iterator

import numpy as np
import torch

from fastdata._compat import storage_use_count
from fastdata.errors import LoaderWorkerError, UsageError
from fastdata.handles import parent_only
from fastdata.loaders.base import wrap_error
from fastdata.loaders.host import ALIGN, HostBatch, Post, Ragged, reader_fields, to_tensors, torch_dtype
from fastdata.loaders.transform import BatchTransform, TransformError
from fastdata.reading.dataset import Dataset

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


_PARENT_POLL_S = 0.5  # how often a worker checks that the training process still runs
_STOP_WAIT_S = 5.0  # how long close() lets a worker finish before it is terminated


class _Worker:
    """A worker process, the training process's end of its socket (closed in a forked child, which must see
    the training process go), the slots it has mapped and its pending batches."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.proc: Any = None
        self.known: dict[int, int] = {}  # slot id -> generation it has mapped
        self.pending: deque[tuple[int, Slot]] = deque()  # (batch, slot) sent, not yet received
        parent_only(self)

    def _after_fork_in_child(self) -> None:
        self.conn.close()


class _RemoteTraceback(Exception):
    """The traceback of an error in a worker process, shown as the cause of the error raised here."""

    def __str__(self) -> str:
        return "\n" + str(self.args[0])


def _exit_when_orphaned(parent: int) -> None:
    """A worker's watch thread: end the worker once the training process is gone (killed), whatever the worker
    is doing (waiting for work, reading, or in the user's transform, even one that hangs)."""
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_S)
    os._exit(0)


def _worker_main(conn: Connection, parent: int, dataset: Dataset, ragged: Ragged, transform: BatchTransform | None,
                 fixed: dict[str, tuple[tuple[int, ...], str]], flat: dict[str, str]) -> None:
    """A worker's loop: map the slots it is sent, read each batch it is asked for into its slot (the field
    layout comes from the training process, so no worker opens a shard for it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the training process decides
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True, name="fastdata-orphan-watch").start()
    slots = WorkerSlots()
    try:
        while True:
            msg = conn.recv()  # a training process that is gone: the watch thread ends this worker
            if msg[0] == "stop":
                return
            if msg[0] == "slot":
                _, sid, gen, size, layout = msg
                slots.add(sid, gen, reduction.recv_handle(conn), size, layout)
                continue
            _, k, idx, sid, epoch, rank = msg
            stage = "reading"
            try:
                batch = dataset.get_batch(idx, out=slots.outs(sid, len(idx), fixed, flat), ragged=ragged,
                                          companions=True)
                if transform is not None:
                    stage = "transform"
                    batch = transform(batch, epoch, rank, k)
                stage = "handing over"
                reply: tuple[Any, ...] = ("ok", k, *slots.place(sid, batch, set(flat)))
                del batch
            except KeyboardInterrupt:  # raised by the user's code (Ctrl-C itself is ignored here): not an exit
                reply = ("err", k, stage, None, "interrupted (KeyboardInterrupt)", traceback.format_exc())
            except Exception as e:
                reply = ("err", k, stage, *_sendable(e))
            conn.send(reply)
    except (EOFError, OSError, KeyboardInterrupt):
        return  # the training process closed the socket or is going away
    finally:
        dataset.close()


def _sendable(e: Exception) -> tuple[bytes | None, str, str]:
    """A worker's error as sent: the user's own exception (pickled when it pickles), its text, its traceback."""
    original = e.__cause__ if isinstance(e, TransformError) and e.__cause__ is not None else e
    try:
        sent: bytes | None = pickle.dumps(original)
    except Exception:
        sent = None
    text = str(e) if isinstance(e, TransformError) else f"{type(e).__name__}: {e}"
    return sent, text, "".join(traceback.format_exception(original))


class ProcessReader:
    """Reads batches in ``workers`` worker processes into the shared ring, at most ``prefetch``
    batches (and at least three per worker) ahead, in order."""

    def __init__(self, dataset: Dataset, workers: int, prefetch: int, ragged: Ragged = "padded",
                 transform: BatchTransform | None = None, timeout: float | None = None) -> None:
        self.dataset = dataset
        self.workers = workers
        self.ragged = ragged
        self.transform = transform
        self.timeout = timeout
        # three batches per worker: a worker keeps reading while the training process is off the CPU
        self.depth = max(prefetch, 3 * workers)
        self._fields = reader_fields(dataset)  # what the workers read into
        fixed, flat = self._fields
        self.ring = Ring({n: math.prod(tr) * np.dtype(dt).itemsize for n, (tr, dt) in fixed.items()}, list(flat),
                         self.depth + 2)
        self._workers: list[_Worker] = []
        self._pass = 0  # passes started: an older, unfinished pass must not take a newer one's results

    def stats(self) -> dict[str, int]:
        """Slots made, made because batches were held, and arrays that crossed as a copy (did not fit)."""
        return {"ring_slots": len(self.ring.slots), "ring_grown": self.ring.grown, "ring_copied": self.ring.copied}

    def _start(self) -> None:
        ctx = mp.get_context()
        if ctx.get_start_method() != "fork" and self.transform is not None:
            self.transform.check_pickles(f"worker processes started by {ctx.get_start_method()!r}")
        # a forked worker must not collect the parent's garbage: finalizers waiting on its threads would hang
        gc.freeze()
        try:
            for w in range(self.workers):
                mine, theirs = ctx.Pipe(duplex=True)  # a socket pair: descriptors travel over it
                worker = _Worker(mine)  # (before the fork: the worker closes its copy of our end too)
                worker.proc = ctx.Process(target=_worker_main, name=f"fastdata-worker-{w}", daemon=True,
                                          args=(theirs, os.getpid(), self.dataset, self.ragged, self.transform,
                                                *self._fields))
                worker.proc.start()
                theirs.close()
                self._workers.append(worker)
        finally:
            gc.unfreeze()

    def _send(self, w: int, k: int, idx: np.ndarray, epoch: int, rank: int) -> None:
        slot = self.ring.take(len(idx))
        worker = self._workers[w]
        try:
            if worker.known.get(slot.id) != slot.gen:
                worker.conn.send(("slot", slot.id, slot.gen, slot.size, slot.layout))
                reduction.send_handle(worker.conn, slot.fd, worker.proc.pid)
                worker.known[slot.id] = slot.gen
            worker.conn.send(("read", k, idx, slot.id, epoch, rank))
        except OSError:
            self.ring.free.append(slot)
            raise self._lost(w, k) from None
        worker.pending.append((k, slot))

    def _receive(self, w: int) -> tuple[tuple[Any, ...], Slot]:
        """The next result of worker ``w``, or the error of its death."""
        worker = self._workers[w]
        k, slot = worker.pending[0]
        while True:
            ready = wait([worker.conn, worker.proc.sentinel], self.timeout)
            if not ready:
                raise self._lost(w, k, hung=True)
            if worker.conn in ready:  # (first: a worker that sent its result and then died delivered it)
                try:
                    msg = worker.conn.recv()
                    break
                except (EOFError, OSError):
                    raise self._lost(w, k) from None
            if worker.proc.sentinel in ready:
                raise self._lost(w, k)
        worker.pending.popleft()
        return msg, slot

    def _lost(self, w: int, k: int, hung: bool = False) -> LoaderWorkerError:
        """Worker ``w`` died on batch ``k`` (or, ``hung``, outlived the timeout and is killed): every worker
        is stopped."""
        proc = self._workers[w].proc
        if hung:
            proc.kill()
        proc.join(_STOP_WAIT_S)  # its socket may close a moment before it can be reaped: wait for the exit code
        pid, code = proc.pid, proc.exitcode
        self.close()
        if hung:
            how = (f"did not finish batch {k} within timeout={self.timeout} s: its read or transform hangs, or is "
                   "that slow; it was killed")
        else:
            how = (f"was killed by signal {-code}" if code is not None and code < 0 else
                   f"exited with code {code}" if code is not None else "closed its socket and stopped answering")
            how += f" while batch {k} was being read"
        return LoaderWorkerError(f"worker process {w} (pid {pid}) {how}; the loader's other workers are stopped "
                                 "(the next pass starts new ones)")

    def _drain(self) -> None:
        """Results of a pass that ended early: received and dropped, their slots reused."""
        for w, worker in enumerate(self._workers):
            while worker.pending:
                _, slot = self._receive(w)
                self.ring.free.append(slot)

    def run(self, plan: list[np.ndarray], first: int = 0, post: Post | None = None,
            epoch: int = 0, rank: int = 0) -> Iterator[HostBatch]:
        """Batches of ``plan`` (``first``, ... of ``epoch``) in order; ``post(batch, k)`` runs here."""
        self._pass += 1
        mine = self._pass
        if not self._workers:
            self._start()
        self._drain()
        nxt = 0
        order: deque[int] = deque()
        while nxt < len(plan) or order:
            if self._pass != mine:  # (its results were drained by the newer pass)
                raise UsageError("a newer pass over this loader started while this one was unfinished: "
                                 "a loader in mode='processes' reads one pass at a time (iterate it again)")
            while nxt < len(plan) and len(order) < self.depth:
                self._send(nxt % self.workers, first + nxt, plan[nxt], epoch, rank)
                order.append(nxt % self.workers)
                nxt += 1
            w = order.popleft()
            msg, slot = self._receive(w)
            batch = self._unpack(w, msg, slot)
            self.ring.lent.append(slot)
            yield post(batch, msg[1]) if post is not None else batch
            del batch

    def _unpack(self, w: int, msg: tuple[Any, ...], slot: Slot) -> HostBatch:
        if msg[0] == "err":
            self.ring.free.append(slot)
            raise self._error(w, msg)
        _, k, placed, needs = msg
        self.ring.saw(needs)
        out: dict[str, Any] = {}
        loose: dict[str, Any] = {}
        for name, (how, what) in placed.items():
            if how == "slot":
                offset, shape, dtype = what
                out[name] = slot.tensor(offset, tuple(shape), dtype)
            else:
                loose[name] = what
                self.ring.copied += isinstance(what, np.ndarray)
        out.update(to_tensors(loose))
        return out

    def _error(self, w: int, msg: tuple[Any, ...]) -> Exception:
        """A worker's error as raised here: its type kept where it pickles, prefixed with the worker and batch,
        the worker's traceback as its cause."""
        _, k, stage, sent, text, tb = msg
        where = f"worker process {w} (pid {self._workers[w].proc.pid}), batch {k}"
        try:
            original = pickle.loads(sent) if sent is not None else None
        except Exception:  # (an exception class this process cannot rebuild)
            original = None
        remote = _RemoteTraceback(tb)
        if stage != "transform":
            err = wrap_error(original if isinstance(original, Exception) else LoaderWorkerError(text), where)
            err.__cause__ = remote
            return err
        if original is not None:  # the user's own exception, with the worker's traceback as its cause
            original.__cause__ = remote
        err = LoaderWorkerError(f"{where}, in the transform: {text}")
        err.__cause__ = original if original is not None else remote
        return err

    def close(self) -> None:
        """Stop the workers (asked first, then terminated), close the sockets and the ring."""
        workers, self._workers = self._workers, []
        for worker in workers:
            try:
                worker.conn.send(("stop",))
            except OSError:
                pass
            worker.conn.close()  # a worker still sending a result gets EPIPE at once, instead of a wait for us to read
        for p in (worker.proc for worker in workers):
            p.join(_STOP_WAIT_S)
            if p.is_alive():
                p.terminate()
                p.join(_STOP_WAIT_S)
            if p.is_alive():
                p.kill()
                p.join()
            p.close()
        self.ring.close()
