"""The doctor's host-to-device figure: CUDA events around each copy of a loader's batch to a GPU, on the current
stream and read lazily (the script's timing is unchanged); other copies are only counted, apart."""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import torch

from fastdata.handles import parent_only

MAX_TRACKED = 16  # the last batches whose tensors' storages are remembered (the loop copies the current one)
MAX_TENSORS = 256  # tensors remembered per batch
MAX_PENDING = 4096  # copies whose events are not resolved yet; further copies are counted, not timed


class CudaClock:
    """Marks points on a device's current stream (``torch.cuda.Event(enable_timing=True)``) and reads the time
    between two; tests inject a fake with the same methods."""

    def available(self) -> bool:
        return bool(torch.cuda.is_available())

    def mark(self, device: torch.device) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(device))
        return ev

    def ready(self, mark: Any) -> bool:
        return bool(mark.query())

    def wait(self, mark: Any) -> None:
        mark.synchronize()

    def seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1e3  # elapsed_time is in milliseconds


@dataclass
class Bucket:
    """Copies of one kind: of one loader's batches, inside a loader's next(), or of other tensors."""

    copies: int = 0
    bytes: int = 0
    pinned: int = 0
    non_blocking: int = 0
    batches: int = 0  # distinct batches with at least one copy
    last_batch: int = -1
    timed: int = 0
    timed_bytes: int = 0
    seconds: float = 0.0

    def add(self, nbytes: int, pinned: bool, non_blocking: bool, batch: int) -> None:
        self.copies += 1
        self.bytes += nbytes
        self.pinned += pinned
        self.non_blocking += non_blocking
        if batch != self.last_batch:
            self.batches, self.last_batch = self.batches + 1, batch


_Owner = tuple[int, int, bool]  # (loader key, batch number, counted: False for the warm-up batches)


class Accountant:
    """Counts and times the copies; ``clock`` and ``is_pinned`` are injected (tests fake them without CUDA)."""

    def __init__(self, clock: Any, is_pinned: Callable[[torch.Tensor], bool] | None = None) -> None:
        self.clock = clock
        self.is_pinned = is_pinned or (lambda t: bool(t.is_pinned()))
        self.loaders: dict[int, Bucket] = {}
        self.inside, self.other = Bucket(), Bucket()
        # storage -> the batch it came from, while the storage lives (a freed one's address reused is not it)
        self.owner: weakref.WeakKeyDictionary[Any, _Owner] = weakref.WeakKeyDictionary()
        self.latest: int | None = None  # the newest batch tracked: copies of the last MAX_TRACKED count
        self.pending: deque[tuple[Any, Any, Bucket, int]] = deque()
        self.depth = 0  # > 0 while the training thread is inside a loader's next()
        self.active = True  # False once the doctor replays cached batches
        self.usable: bool | None = None  # CUDA works here (asked at the first copy to a CUDA device)
        self.lock = threading.Lock()

    def _after_fork_in_child(self) -> None:
        global _acc
        _acc = None

    def track(self, batch: Any, key: int, number: int, counted: bool) -> None:
        """Remember the storages of a batch's CPU tensors (batch ``number``, counting up), to know a later
        copy as a copy of it."""
        found: list[torch.Tensor] = []
        _cpu_tensors(batch, found, 0)
        storages = [s for s in map(_storage, found) if s is not None]
        with self.lock:
            self.latest = number
            for s in storages:
                self.owner[s] = (key, number, counted)

    def copy(self, src: torch.Tensor, device: torch.device, non_blocking: bool, do: Callable[[], Any]) -> Any:
        """Run ``do`` (the copy of CPU ``src`` to CUDA ``device``), counting it and timing a batch's."""
        if self.usable is None:
            self.usable = self.clock.available()
        if not self.active or _compiling() or not self.usable:
            # without CUDA the copy raises the script's own error; torch.compile traces the plain copy
            return do()
        if self.depth:
            bucket, number, timed = self.inside, -1, False
        else:
            storage = _storage(src)
            owner = self.owner.get(storage) if storage is not None else None
            if self.latest is None:  # before the first batch: setting up (the model's .to), not the loop
                return do()
            if owner is None or owner[1] <= self.latest - MAX_TRACKED:
                bucket, number, timed = self.other, -1, False
            elif not owner[2]:
                return do()  # a warm-up batch (the first copies also pay CUDA's start-up)
            else:
                bucket, number, timed = self.loaders.setdefault(owner[0], Bucket()), owner[1], True
        with self.lock:
            bucket.add(src.numel() * src.element_size(), self.is_pinned(src), non_blocking, number)
            while self.pending and self.clock.ready(self.pending[0][1]):  # the copies done by now: never waits
                self._resolve(self.pending.popleft())
            timed = timed and len(self.pending) < MAX_PENDING
        if not timed:
            return do()
        start = self.clock.mark(device)
        out = do()
        end = self.clock.mark(device)
        with self.lock:
            self.pending.append((start, end, bucket, src.numel() * src.element_size()))
        return out

    def _resolve(self, item: tuple[Any, Any, Bucket, int]) -> None:
        start, end, bucket, nbytes = item
        bucket.timed += 1
        bucket.timed_bytes += nbytes
        bucket.seconds += self.clock.seconds(start, end)

    def finish(self) -> None:
        """Wait for the copies still in flight (the doctor is stopping: no step is timed any more)."""
        with self.lock:
            while self.pending:
                item = self.pending.popleft()
                self.clock.wait(item[1])
                self._resolve(item)

    def dump(self) -> dict[str, Any]:
        cuda = self.usable if self.usable is not None else self.clock.available()
        return {"cuda": cuda, "loaders": {str(k): vars(b) for k, b in self.loaders.items()},
                "inside_loader": vars(self.inside), "other": vars(self.other)}


def _storage(t: torch.Tensor) -> Any:
    """The tensor's storage (one Python object while it lives), or None (no storage, or an empty one)."""
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, a wrapper subclass
        return None
    return storage if storage.data_ptr() else None


def _cpu_tensors(batch: Any, out: list[torch.Tensor], depth: int) -> None:
    """The CPU tensors of a batch (tensors, and dicts, lists and tuples of them, a few levels deep)."""
    if isinstance(batch, torch.Tensor):
        if batch.is_cpu and len(out) < MAX_TENSORS:
            out.append(batch)
        return
    if depth > 4 or len(out) >= MAX_TENSORS:
        return
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for v in itertools.islice(items, MAX_TENSORS):
        _cpu_tensors(v, out, depth + 1)


# -- the patches ----------------------------------------------------------------------------------------
def cuda_target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    """The CUDA device a ``Tensor.to(...)`` call moves to, or None (a dtype, the CPU, another device)."""
    dev = kwargs.get("device") if kwargs else None
    if dev is None and args:
        dev = args[0]
    kind = type(dev)
    if kind is torch.dtype or dev is None:  # the common CPU calls leave here
        return None
    if kind is str:
        return torch.device(dev) if dev.startswith("cuda") else None
    if isinstance(dev, torch.Tensor):
        dev = dev.device
    if isinstance(dev, torch.device):
        return dev if dev.type == "cuda" else None
    if isinstance(dev, int) and not isinstance(dev, bool):
        return torch.device("cuda", dev)
    return None


def _flag(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``non_blocking``: the keyword, or the first positional bool (``to(device, dtype, non_blocking)``)."""
    if kwargs and "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    return next((a for a in args if isinstance(a, bool)), False)


def _cuda_call_target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device:
    """The device a ``Tensor.cuda(...)`` call moves to (the current CUDA device when none is named)."""
    dev = kwargs.get("device", args[0] if args else None)
    return torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev or "cuda")


def _wrap_move(target: Callable[[tuple[Any, ...], dict[str, Any]], torch.device | None]
               ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A wrapper for a method that moves ``self`` (``to``, ``cuda``): a CPU tensor moved to the CUDA device
    ``target(args, kwargs)`` names is reported as a copy; every other call goes straight to torch."""
    def wrap(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def move(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            acc = _acc
            if acc is None or not self.is_cpu:
                return orig(self, *args, **kwargs)
            dev = target(args, kwargs)
            if dev is None:
                return orig(self, *args, **kwargs)
            return acc.copy(self, dev, _flag(args[1:], kwargs), lambda: orig(self, *args, **kwargs))

        return move

    return wrap


_wrap_to = _wrap_move(cuda_target)
_wrap_cuda = _wrap_move(_cuda_call_target)


def _wrap_copy(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def copy_(self: torch.Tensor, src: Any, *args: Any, **kwargs: Any) -> Any:
        acc = _acc
        if acc is None or not self.is_cuda or not isinstance(src, torch.Tensor) or not src.is_cpu:
            return orig(self, src, *args, **kwargs)
        return acc.copy(src, self.device, _flag(args, kwargs), lambda: orig(self, src, *args, **kwargs))

    return copy_


_acc: Accountant | None = None
_compiling: Callable[[], bool] = getattr(torch.compiler, "is_compiling", None) or (lambda: False)
_saved: list[tuple[str, Any]] = []  # (attribute, what torch.Tensor's own __dict__ held: None when inherited)


def install(clock: Any = None) -> Accountant:
    """Wrap the copy methods of ``torch.Tensor`` to report to a new Accountant (the CUDA clock by default)."""
    global _acc
    _acc = Accountant(clock or CudaClock())
    parent_only(_acc)  # a forked DataLoader worker copies nothing to a GPU: it forgets the Accountant
    for name, wrap in (("to", _wrap_to), ("cuda", _wrap_cuda), ("copy_", _wrap_copy)):
        _saved.append((name, torch.Tensor.__dict__.get(name)))
        setattr(torch.Tensor, name, wrap(getattr(torch.Tensor, name)))
    return _acc


def uninstall() -> Accountant | None:
    """Give back torch's methods, wait for the copies in flight, and return the Accountant."""
    global _acc
    acc, _acc = _acc, None
    while _saved:
        name, own = _saved.pop()
        if own is None:
            delattr(torch.Tensor, name)  # inherited from torch._C.TensorBase: nothing of ours stays
        else:
            setattr(torch.Tensor, name, own)
    if acc is not None:
        acc.finish()
    return acc

