"""What every loader backend shares: the epoch plan, epochs, exact resume and stats.

A backend only turns a list of index batches into batches of tensors (``_batches``); the order
(fastdata.sampling), the rank share, ``drop_last``, ``len()``, ``set_epoch``, ``state_dict`` and
``stats`` live here once, so the torch and DALI backends cannot drift apart. A state saved by one
backend resumes in the other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import torch

from ..augment import Augment
from ..dataset import Dataset
from ..errors import FastdataError, LoaderWorkerError, UsageError
from ..sampling import SHUFFLES, Shuffle, all_rank_batches, num_batches
from ..world import World

if TYPE_CHECKING:
    from .config import LoaderConfig

_STATE_VERSION = 1


@dataclass
class _Stats:
    batches: int = 0
    samples: int = 0
    waits: list[float] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0

    def as_dict(self) -> dict[str, float]:
        wall = max(self.ended - self.started, 1e-9) if self.batches else 0.0
        w = np.array(self.waits) if self.waits else np.zeros(1)  # no batch yet: every figure 0
        return {
            "batches": self.batches,
            "samples": self.samples,
            "seconds": wall,
            "samples_per_s": self.samples / wall if wall else 0.0,
            "wait_s": float(w.sum()),
            "wait_fraction": float(w.sum() / wall) if wall else 0.0,
            "first_batch_s": float(w[0]),
            "wait_ms_median": float(np.median(w) * 1e3),
            "wait_ms_p95": float(np.percentile(w, 95) * 1e3),
        }


def wrap_error(e: Exception, where: str) -> Exception:
    """A reader's error, prefixed with ``where`` (the batch); fastdata's error types are kept (their
    message already names shard and sample), anything else becomes a LoaderWorkerError."""
    if isinstance(e, FastdataError):
        return type(e)(f"{where}: {e}")
    return LoaderWorkerError(f"{where}: {type(e).__name__}: {e}")


class Loader:
    """Iterate to get batches (dicts of tensors on the device). See :func:`fastdata.loader`.

    The base of every backend: subclasses implement ``_batches(plan, epoch, first)`` and ``close``,
    and take these constructor arguments as ``**common``.
    """

    backend = "base"

    def __init__(self, dataset: Dataset, batch_size: int, *, shuffle: Shuffle, drop_last: bool, seed: int,
                 device: torch.device, augment: Augment | None, config: "LoaderConfig", world: World) -> None:
        if batch_size < 1:
            raise UsageError("batch_size must be positive")
        if not any(shuffle is s or (isinstance(s, str) and shuffle == s) for s in SHUFFLES):
            raise UsageError(f"shuffle must be True, False, 'block' or 'shards', not {shuffle!r}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.device = device
        self.augment = augment
        self.world = world
        self.config = config
        self.epoch = 0
        self._resume_at = 0  # batches to skip at the next iteration (from load_state_dict)
        self._done = 0  # batches consumed in the current pass
        self._stats = _Stats()

    def _batches(self, plan: list[np.ndarray], epoch: int, first: int) -> Iterator[dict[str, torch.Tensor]]:
        """The batches of ``plan`` (batches ``first``, ``first + 1``, ... of ``epoch``), in order."""
        raise NotImplementedError(f"{type(self).__name__} does not produce batches")

    def __len__(self) -> int:
        return num_batches(len(self.dataset), self.world, self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields (the order is a function of seed and epoch)."""
        self.epoch = int(epoch)
        self._resume_at = 0

    def plan(self, epoch: int | None = None) -> list[np.ndarray]:
        """This rank's index batches for ``epoch`` (default: the current one)."""
        return self._plans(epoch, [self.world.rank])[0]

    def _plans(self, epoch: int | None, ranks: list[int] | None) -> list[list[np.ndarray]]:
        counts = [s.count for s in self.dataset.manifest.shards] if self.shuffle == "shards" else None
        return all_rank_batches(len(self.dataset), world=self.world, batch_size=self.batch_size, shuffle=self.shuffle,
                                drop_last=self.drop_last, seed=self.seed, epoch=self.epoch if epoch is None else epoch,
                                block=self.config.block, window=self.config.window, shard_counts=counts,
                                shard_window=self.config.shard_window, ranks=ranks)

    def _lead(self) -> int:
        """Batches the backend may read ahead of the one handed out (remote prefetch starts beyond)."""
        return self.config.prefetch + int(getattr(self, "workers", 0) or 0)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        epoch, first = self.epoch, self._resume_at
        self._resume_at = 0
        follower = None
        if self.dataset.remote is not None:  # every rank's plan: the node's cache ranks shards by next use
            plans = self._plans(epoch, None)
            plan = plans[self.world.rank][first:]
            follower = self.dataset.follow(plans, self.world.rank, first, self._lead())
        else:
            plan = self.plan(epoch)[first:]
        self._done = first
        self._stats = _Stats(started=time.perf_counter())
        try:
            yield from self._iterate(plan, epoch, first, follower)
        finally:
            if follower is not None:
                follower.close()
        if self._done == len(self) and self.epoch == epoch:
            self.epoch = epoch + 1  # a complete pass moves on; set_epoch overrides
            self._done = 0

    def _iterate(self, plan: list[np.ndarray], epoch: int, first: int, follower: Any) -> Iterator[dict[str, torch.Tensor]]:
        it = self._batches(plan, epoch, first)
        while True:
            if follower is not None:
                follower.at(self._done)
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            now = time.perf_counter()
            s = self._stats
            s.waits.append(now - t0)
            s.batches += 1
            s.samples += len(plan[s.batches - 1])
            s.ended = now
            self._done += 1
            yield batch

    def stats(self) -> dict[str, float]:
        """Throughput and input wait of the current or last pass: samples/s, wait fraction, per-batch wait."""
        return self._stats.as_dict()

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: resuming from it yields exactly the rest of the epoch."""
        return {"version": _STATE_VERSION, "epoch": self.epoch, "batches_done": self._done, "seed": self.seed,
                "batch_size": self.batch_size, "num_samples": len(self.dataset), "shuffle": self.shuffle,
                "drop_last": self.drop_last, "world_size": self.world.size, "rank": self.world.rank}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (see :meth:`state_dict`); refuses a state saved with other settings."""
        if state.get("version") != _STATE_VERSION:
            raise UsageError(f"unknown loader state version {state.get('version')!r}")
        mine = self.state_dict()
        for key in ("seed", "batch_size", "num_samples", "shuffle", "drop_last", "world_size"):
            if state[key] != mine[key]:
                raise UsageError(f"loader state was saved with {key}={state[key]!r}, this loader has {mine[key]!r}")
        done = int(state["batches_done"])
        if not 0 <= done <= len(self):
            raise UsageError(f"loader state has batches_done={done}, but an epoch has {len(self)} batches")
        self.epoch = int(state["epoch"])
        self._resume_at = done
        self._done = done

    def close(self) -> None:
        """Release the backend's threads, processes or pipelines."""

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
