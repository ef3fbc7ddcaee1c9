"""Process concerns in one place: file handles opened lazily once per process.

h5py files and LMDB environments break when they cross a fork, and cannot be pickled
for spawn workers. Readers therefore inherit :class:`PerProcessHandle`: the handle is
opened on first use in each process and dropped when the object is pickled. Right after
a fork, the child closes the handles it inherited (py-lmdb refuses to open a file the
process already has open, and LMDB must not be used across a fork); the parent keeps its own.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, Generic, TypeVar

H = TypeVar("H")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS has one), at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


_open_handles: "weakref.WeakSet[PerProcessHandle[Any]]" = weakref.WeakSet()


class PerProcessHandle(Generic[H]):
    """Mixin: ``self.handle()`` opens via ``_open_handle()`` on first use in each process."""

    _handle: H | None = None
    _handle_pid: int | None = None

    def _open_handle(self) -> H:  # pragma: no cover - abstract
        raise NotImplementedError

    def _close_handle(self, handle: H) -> None:
        """Release a handle (default: nothing to do)."""

    def handle(self) -> H:
        if self._handle is None or self._handle_pid != os.getpid():
            self._drop()
            self._handle = self._open_handle()
            self._handle_pid = os.getpid()
            _open_handles.add(self)
        return self._handle

    def close(self) -> None:
        """Release this process's handle; the next use opens a new one."""
        self._drop()

    def _after_fork_in_child(self) -> None:
        """Called in a forked child for a handle the parent had open: close the child's copy."""
        self._drop()

    def _drop(self) -> None:
        handle, self._handle, self._handle_pid = self._handle, None, None
        _open_handles.discard(self)
        if handle is not None:
            try:
                self._close_handle(handle)
            except Exception:  # closing a handle that is already unusable must not mask the real work
                pass

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_handle", None)
        state.pop("_handle_pid", None)
        return state


def _close_inherited_handles() -> None:
    """In a forked child: close (the child's copies of) every handle the parent had open."""
    for obj in list(_open_handles):
        obj._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited_handles)


class World:
    """Which share of the data this process reads: distributed rank and world size.

    The only place that asks torch.distributed; everything else takes a World value.
    """

    __slots__ = ("rank", "size")

    def __init__(self, rank: int = 0, size: int = 1) -> None:
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"bad world: rank {rank} of {size}")
        self.rank = rank
        self.size = size

    @classmethod
    def detect(cls) -> "World":
        """The torch.distributed rank and world size when a process group is up, else a world of one."""
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch always ships it
            return cls()
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @staticmethod
    def cuda_index(device_count: int) -> int | None:
        """The GPU a process of a multi-GPU launch owns: ``LOCAL_RANK`` (torchrun sets it) when it
        names one of the ``device_count`` GPUs, else None (use torch's current device)."""
        local = os.environ.get("LOCAL_RANK")
        if local is not None and local.isdigit() and int(local) < device_count:
            return int(local)
        return None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, World) and (self.rank, self.size) == (other.rank, other.size)

    def __hash__(self) -> int:
        return hash((self.rank, self.size))

    def __repr__(self) -> str:
        return f"World(rank={self.rank}, size={self.size})"
