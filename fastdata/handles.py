"""Per-process handles: opened on first use in each process, dropped when pickled, closed in a forked child
(h5py and LMDB break across a fork) and released when their owner is garbage-collected."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Generic, Protocol, Sequence, TypeVar

H = TypeVar("H")


# what a forked child closes its copy of (each has an ``_after_fork_in_child()``): open handles, parent_only objects
_open_handles: "weakref.WeakSet[Any]" = weakref.WeakSet()
_opening = threading.Lock()  # guards making a handle's own opening lock (brief)


class PerProcessHandle(Generic[H]):
    """Mixin: ``self.handle()`` opens via ``_open_handle()`` on first use in each process."""

    _handle: H | None = None
    _handle_pid: int | None = None
    _finalizer: "weakref.finalize[Any, Any] | None" = None

    def _open_handle(self) -> H:  # pragma: no cover - abstract
        raise NotImplementedError

    @staticmethod
    def _close_handle(handle: Any) -> None:
        """Release a handle (default: nothing to do); static, as it also runs from the finalizer when the owner
        is gone."""

    def handle(self) -> H:
        handle = self._handle
        if handle is not None and self._handle_pid == os.getpid():
            return handle
        with self._open_lock():  # reader threads racing to open the same shard must not leak the loser's handle
            handle = self._handle
            if handle is None or self._handle_pid != os.getpid():
                self.close()
                handle = self._open_handle()
                self._handle = handle
                self._handle_pid = os.getpid()
                self._finalizer = weakref.finalize(self, _close_quietly, type(self)._close_handle, handle)
                _open_handles.add(self)
            return handle

    def is_open(self) -> bool:
        """Whether this process has the handle open now (nothing is opened)."""
        return self._handle is not None and self._handle_pid == os.getpid()

    def _open_lock(self) -> Any:
        """This object's opening lock in this process (different shards open at once, the same one once); made
        anew after a fork and not pickled."""
        pair = self.__dict__.get("_opening_lock")
        if pair is None or pair[0] != os.getpid():
            with _opening:
                pair = self.__dict__.get("_opening_lock")
                if pair is None or pair[0] != os.getpid():
                    pair = self.__dict__["_opening_lock"] = (os.getpid(), threading.RLock())
        return pair[1]

    def close(self) -> None:
        """Release this process's handle; the next use opens a new one."""
        handle = self._forget()
        if handle is not None:
            _close_quietly(type(self)._close_handle, handle)

    _after_fork_in_child = close  # called in a forked child for a handle the parent had open: close the child's copy

    def _forget(self) -> H | None:
        """Stop tracking this process's handle without closing it; returns it."""
        handle, self._handle, self._handle_pid = self._handle, None, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        _open_handles.discard(self)
        return handle

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_handle", "_handle_pid", "_finalizer", "_opening_lock"):
            state.pop(name, None)
        return state


def _close_quietly(close: Any, handle: Any) -> None:
    try:
        close(handle)
    except Exception:  # closing a handle that is already unusable must not mask the real work
        pass


def parent_only(obj: Any) -> None:
    """Register ``obj`` (with an ``_after_fork_in_child()`` method) as the parent's alone: a forked child
    closes its copy (a child holding the loader's slots or sockets would keep them alive)."""
    _open_handles.add(obj)


class _ForkGate:
    """A fork waits until no call inside :func:`no_fork_during` is in flight in another thread, and holds
    new ones off until it is done (the gate is its own context manager: it guards every LMDB read)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._busy = 0

    def __enter__(self) -> None:
        with self._cond:
            self._busy += 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._busy -= 1
            if not self._busy:
                self._cond.notify_all()

    def before_fork(self) -> None:
        self._cond.acquire()
        self._cond.wait_for(lambda: self._busy == 0)

    def after_fork_in_parent(self) -> None:
        self._cond.release()


_gate = _ForkGate()


def no_fork_during() -> _ForkGate:
    """A context in which this process does not fork: for calls a forked child cannot recover from if they
    were in flight (py-lmdb's close would wait forever)."""
    return _gate


def _close_inherited_handles() -> None:
    """In a forked child: close (the child's copies of) every handle the parent had open."""
    global _opening, _gate
    _opening = threading.Lock()  # another thread of the parent may have held it at fork time
    _gate = _ForkGate()
    for obj in list(_open_handles):
        obj._after_fork_in_child()
    _open_handles.clear()


class _Opens(Protocol):
    def is_open(self) -> bool: ...

    def handle(self) -> Any: ...


def open_all(owners: Sequence[_Opens], threads: int = 8) -> None:
    """Open the handles of ``owners`` not open in this process yet, several at once, so a batch spread over
    many shards on a cold disk does not wait for their opens one after another."""
    todo = [o for o in owners if not o.is_open()]
    if len(todo) < 2:
        for o in todo:
            o.handle()
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, len(todo)), thread_name_prefix="fastdata-open") as pool:
        for f in [pool.submit(o.handle) for o in todo]:
            f.result()  # the first error, as a plain open would raise it


os.register_at_fork(before=lambda: _gate.before_fork(), after_in_parent=lambda: _gate.after_fork_in_parent(),
                    after_in_child=_close_inherited_handles)
