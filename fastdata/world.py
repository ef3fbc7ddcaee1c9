"""Where this process runs: its rank and world size, and how many CPUs it may use; the only module
that asks torch.distributed."""

from __future__ import annotations

import os
from dataclasses import dataclass

from fastdata.errors import UsageError


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS has one), at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class World:
    """Which share of the data this process reads: distributed rank and world size."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"bad world: rank {self.rank} of {self.size}")

    @classmethod
    def detect(cls) -> "World":
        """The torch.distributed rank and world size when a process group is up, else a world of one."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @classmethod
    def current(cls) -> "World":
        """The world a loader reads in now (asked when an iteration starts); refuses ``WORLD_SIZE`` > 1 without a
        process group, where every rank would read everything."""
        world = cls.detect()
        if world.size == 1:
            declared = os.environ.get("WORLD_SIZE", "1").strip()  # what torchrun, Lightning, Accelerate announce
            if declared.isdigit() and int(declared) > 1:
                raise UsageError(
                    f"WORLD_SIZE={declared} but torch.distributed has no process group yet, so this process "
                    "cannot know its share of the data: iterate the loader (or take its len()) after "
                    "torch.distributed.init_process_group (Lightning and Accelerate start it in fit()/"
                    "Accelerator()), or unset WORLD_SIZE for a single-process run")
        return world

    @staticmethod
    def cuda_index(device_count: int) -> int | None:
        """The GPU a process of a multi-GPU launch owns: ``LOCAL_RANK`` (torchrun sets it) when it
        names one of the ``device_count`` GPUs, else None (use torch's current device)."""
        local = os.environ.get("LOCAL_RANK")
        if local is not None and local.isdigit() and int(local) < device_count:
            return int(local)
        return None


__all__ = ["World", "usable_cpus"]
