"""What every loader backend shares: its settings (``LoaderConfig``), the epoch plan, epochs, exact resume and
stats; a backend only turns index batches into tensor batches, so a state saved by one backend resumes in the other."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal

import numpy as np
import torch

from fastdata.augment import Augment
from fastdata.errors import FastdataError, LoaderWorkerError, UsageError
from fastdata.format.inplace import unit_counts
from fastdata.reading.dataset import Dataset
from fastdata.reading.readahead import ReadAhead, supported
from fastdata.reading.samplers import (
    ORDER_RULE,
    Block,
    SamplerFn,
    Shards,
    Shuffle,
    all_rank_batches,
    describe,
    num_batches,
    rank_batches,
    shuffle_mode,
    world_batches,
)
from fastdata.remote.store import PlanFollower
from fastdata.world import World

_STATE_VERSION = 1


# sizes that moved into the shuffle modes: a config that names one is refused, naming the mode to pass instead
_MOVED = {"block": "Block({})", "window": "Block(window={})", "shard_window": "Shards(window={})"}

# the knobs that take one of a few names, and those names
_CHOICES = {"mode": ("threads", "processes"), "image_dtype": ("float32", "uint8"), "ragged": ("padded", "packed"),
            "crop_decode": ("auto", "off")}


@dataclass(frozen=True)
class LoaderConfig:
    """Tuning knobs of the torch backend (the DALI backend uses ``prefetch``, ``channels_last`` and ``images``).

    ``mode``: ``"threads"`` (recycled, pinned buffers) or ``"processes"`` (fastdata's worker processes and a
    shared-memory ring, for transforms that hold the GIL). ``prefetch``: batches read ahead. ``pin_memory``:
    None pins on CUDA. ``images``: uint8 HWC fields made float NCHW (None: detected); ``image_dtype``:
    ``"float32"`` in [0, 1] or ``"uint8"`` HWC (no ``augment``). ``ragged``: ``"padded"`` or ``"packed"``.
    ``readahead``: bytes hinted ahead (0: off). ``crop_decode``: ``"auto"`` decodes only an initial crop's
    window, ``"off"`` whole images. ``timeout``: seconds per batch (None: no limit).
    """

    mode: Literal["threads", "processes"] = "threads"
    prefetch: int = 4
    pin_memory: bool | None = None
    channels_last: bool = True
    images: tuple[str, ...] | None = None
    image_dtype: Literal["float32", "uint8"] = "float32"
    ragged: Literal["padded", "packed"] = "padded"
    readahead: int = 256 << 20
    crop_decode: Literal["auto", "off"] = "auto"
    timeout: float | None = None

    def __new__(cls, *args: Any, **kw: Any) -> "LoaderConfig":
        moved = sorted(_MOVED.keys() & kw.keys())
        if moved:
            key = moved[0]
            raise UsageError(f"LoaderConfig({key}=...) is gone: the shuffle mode carries its sizes, "
                             f"fastdata.loader(..., shuffle=fastdata.{_MOVED[key].format(kw[key])})")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if str(self.crop_decode) == "region":  # the Literal no longer has it: users of old code may pass it
            raise UsageError("crop_decode='region' was removed (no faster than 'auto': benchmarks/results/jpeg_crop.md); "
                             "use crop_decode='auto'")
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise UsageError(f"{name} must be {' or '.join(map(repr, choices))}, not {value!r}")
        if self.prefetch < 1:
            raise UsageError("prefetch must be at least 1")
        if isinstance(self.readahead, bool) or not isinstance(self.readahead, int) or self.readahead < 0:
            raise UsageError(f"readahead must be a number of bytes >= 0 (0: off), not {self.readahead!r}")
        if self.timeout is not None and (isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float))
                                         or not self.timeout > 0):
            raise UsageError(f"timeout must be a number of seconds > 0 (or None: no limit), not {self.timeout!r}")


@dataclass
class _Stats:
    samples: int = 0
    waits: list[float] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0

    def as_dict(self) -> dict[str, float]:
        wall = max(self.ended - self.started, 1e-9) if self.waits else 0.0
        w = np.array(self.waits) if self.waits else np.zeros(1)  # no batch yet: every figure 0
        return {
            "batches": len(self.waits),
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
    """A reader's error prefixed with ``where``: fastdata's types are kept, anything else is a LoaderWorkerError."""
    if isinstance(e, FastdataError):
        return type(e)(f"{where}: {e}")
    return LoaderWorkerError(f"{where}: {type(e).__name__}: {e}")


class Loader:
    """Iterate to get batches (dicts of tensors on the device); see :func:`fastdata.loader`. A pass that
    delivers the epoch's last batch moves to the next epoch, even when the caller stops after ``len(loader)``."""

    backend = "base"
    # read by Accelerate's skip_first_batches, which rebuilds a DataLoader (no workers: no prefetch factor)
    prefetch_factor = None

    def __init__(self, dataset: Dataset, batch_size: int, *, shuffle: Shuffle, drop_last: bool, seed: int,
                 device: torch.device, augment: Augment | None, config: LoaderConfig,
                 owns_dataset: bool = False, sampler: SamplerFn | None = None) -> None:
        if batch_size < 1:
            raise UsageError("batch_size must be positive")
        self.shuffle = shuffle_mode(shuffle)
        if isinstance(self.shuffle, Shards):
            unit_counts(dataset.manifest, dataset.stored_indices)  # refuses what it cannot plan, now
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.seed = seed
        self.device = device
        self.augment = augment
        self._fixed_world: World | None = None  # None: read from torch.distributed when each pass starts
        self._pass_world: World | None = None  # the world of the pass in progress
        self._owns_dataset = owns_dataset  # opened by fastdata.loader from a path: closed with the loader
        self.config = config
        self.epoch = 0
        self._resume_at = 0  # batches to skip at the next iteration (from load_state_dict)
        self._resume_world: int | None = None  # world size of the state loaded by load_state_dict
        self._done = 0  # batches consumed in the current pass
        self._collate_at = (0, 0)  # (epoch, batch) that collate_fn finishes next (set by batch_sampler)
        self._stats = _Stats()
        self.sample_fn = sampler  # replaces the shuffled order (fastdata.reading.samplers); bound by fastdata.loader
        self._sampled: dict[tuple[int, int, int], list[np.ndarray]] = {}  # (epoch, rank, size) -> the world's batches
        self._cache_memo: dict[str, bool] = {}  # the read-ahead's finding, kept across passes (ReadAhead's memo)

    def _sampled_batches(self, epoch: int, world: World) -> list[np.ndarray]:
        """``sample_fn``'s batches of ``epoch`` for the whole world, kept for the epoch."""
        key = (epoch, world.rank, world.size)  # a sampler may plan by the world it is given
        if key in self._sampled:
            return self._sampled[key]
        assert self.sample_fn is not None
        batches = world_batches(self.sample_fn, len(self.dataset), world, self.seed, epoch)
        self._sampled = {k: b for k, b in self._sampled.items() if k[0] in (epoch - 1, epoch + 1) and k[1:] == key[1:]}
        self._sampled[key] = batches  # kept: this epoch's and the neighbouring one (DALI plans one ahead)
        return batches

    def _num_batches(self, world: World, epoch: int) -> int:
        if self.sample_fn is not None:
            return len(rank_batches(self._sampled_batches(epoch, world), world, self.drop_last))
        return num_batches(len(self.dataset), world, self.batch_size, self.drop_last)

    @property
    def world(self) -> World:
        """This process's rank and the world size: those of the pass in progress, else read now."""
        if self._fixed_world is not None:
            return self._fixed_world
        return self._pass_world if self._pass_world is not None else World.current()

    def _batches(self, plan: list[np.ndarray], epoch: int, first: int) -> Iterator[dict[str, torch.Tensor]]:
        """The batches of ``plan`` (batches ``first``, ``first + 1``, ... of ``epoch``), in order."""
        raise NotImplementedError(f"{type(self).__name__} does not produce batches")

    def __len__(self) -> int:
        return self._num_batches(self.world, self.epoch)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration yields; the one the loader stands at keeps a position restored
        by :meth:`load_state_dict` (trainers call ``set_epoch`` after restoring state)."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self._resume_at = 0
            self._resume_world = None

    @property
    def sampler(self) -> "EpochSampler":
        """What trainers look for: ``sampler.set_epoch`` (Lightning calls it every epoch)."""
        return EpochSampler(self)

    @property
    def batch_sampler(self) -> "EpochBatchSampler":
        """The index batches of the epoch the next pass yields (Accelerate's ``skip_first_batches`` uses them)."""
        return EpochBatchSampler(self)

    def plan(self, epoch: int | None = None) -> list[np.ndarray]:
        """This rank's index batches for ``epoch`` (default: the current one)."""
        return self._plans(epoch, [self.world.rank])[0]

    def _plans(self, epoch: int | None, ranks: list[int] | None) -> list[list[np.ndarray]]:
        """The index batches of ``epoch`` for each rank in ``ranks`` (None: every rank), from one epoch plan."""
        ep = self.epoch if epoch is None else epoch
        world = self.world
        if self.sample_fn is not None:
            batches = self._sampled_batches(ep, world)
            wanted = range(world.size) if ranks is None else ranks
            return [rank_batches(batches, World(r, world.size), self.drop_last) for r in wanted]
        ds = self.dataset
        counts = unit_counts(ds.manifest, ds.stored_indices) if isinstance(self.shuffle, Shards) else None
        return all_rank_batches(len(self.dataset), world=world, batch_size=self.batch_size, shuffle=self.shuffle,
                                drop_last=self.drop_last, seed=self.seed, epoch=ep, shard_counts=counts, ranks=ranks)

    def _lead(self) -> int:
        """Batches the backend may read ahead of the one handed out (remote prefetch starts beyond)."""
        return self.config.prefetch + int(getattr(self, "workers", 0) or 0)

    def _read_ahead(self, plan: list[np.ndarray], first: int) -> ReadAhead | None:
        """Hint the kernel to read ``plan[first:]``'s byte ranges ahead of the readers; None when off, or
        when the shards give no byte ranges (LMDB)."""
        if self.config.readahead <= 0 or not supported() or first >= len(plan):
            return None
        if not self.dataset.byte_ranges(plan[first][:1]):
            return None
        return ReadAhead(self.dataset.byte_ranges, plan, first, self._lead(), self.config.readahead,
                         memo=self._cache_memo)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        # A generator: nothing runs until the first batch (Lightning calls iter(), then set_epoch, then asks)
        follower: PlanFollower | ReadAhead | None = None
        ahead: list[np.ndarray] | None = None  # a local plan whose read-ahead starts after the first batch
        try:
            world = self._fixed_world or World.current()
            epoch = self.epoch
            first = self._resume_at
            if first and self._resume_world is not None and self._resume_world != world.size:
                raise UsageError(
                    f"the loader state was saved mid-epoch with world_size={self._resume_world}, but this run has "
                    f"{world.size} process(es): resume with the same number of ranks, or call set_epoch(epoch + 1) "
                    "to start the next epoch over")
            self._resume_at, self._resume_world = 0, None
            self._pass_world = world
            if self.dataset.remote is not None:  # every rank's plan: the node's cache ranks shards by next use
                plans = self._plans(epoch, None)
                plan = plans[world.rank]
                follower = PlanFollower(self.dataset.remote, plans, world.rank, first, self._lead())
            else:
                plan = self.plan(epoch)
                if self.config.mode == "threads":
                    follower = self._read_ahead(plan, first)
                else:  # worker processes fork when the first batch is asked for: no hinting thread then
                    ahead = plan
            last = len(plan) - 1
            plan = plan[first:]
            self._done = first
            self._stats = _Stats(started=time.perf_counter())
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
                s.samples += len(plan[len(s.waits) - 1])
                s.ended = now
                self._done += 1
                if ahead is not None:
                    follower = self._read_ahead(ahead, self._done)
                    ahead = None
                if self._done - 1 == last and self.epoch == epoch:
                    self.epoch = epoch + 1  # the epoch's last batch is delivered: the next pass is the next epoch
                    self._done = 0  # (set_epoch during the pass overrides)
                yield self.dataset.trim(batch)
        finally:
            self._pass_world = None
            if follower is not None:
                follower.close()

    def stats(self) -> dict[str, float]:
        """Throughput and input wait of the current or last pass: samples/s, wait fraction, per-batch wait."""
        return self._stats.as_dict()

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: resuming from it yields exactly the rest of the epoch (or the next one)."""
        return {"version": _STATE_VERSION, "epoch": self.epoch, "batches_done": self._done, **self._settings(),
                "world_size": self.world.size, "rank": self.world.rank, "order": self._order_rule()}

    def _settings(self) -> dict[str, Any]:
        """What a state must match to resume here (the shuffle as ``True``, ``False``, ``"block"`` or ``"shards"``)."""
        shuffle = self.shuffle if isinstance(self.shuffle, bool) else type(self.shuffle).__name__.lower()
        return {"seed": self.seed, "batch_size": self.batch_size, "num_samples": len(self.dataset), "shuffle": shuffle,
                "drop_last": self.drop_last, "sampler": describe(self.sample_fn), "samples": self.dataset.identity()}

    def _order_rule(self) -> dict[str, int] | None:
        """What fixes a windowed shuffle's order besides the seed (the rule's version and the mode's sizes):
        a mid-epoch state resumes only with the same."""
        s = self.shuffle
        if isinstance(s, bool) or self.sample_fn is not None:
            return None
        sizes = {"block": s.size, "window": s.window} if isinstance(s, Block) else {"shard_window": s.window}
        return {"rule": ORDER_RULE, **sizes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (see :meth:`state_dict`); refuses a state saved with other settings. The world
        size is checked when the next pass starts; a state saved after an epoch's last batch resumes at the next."""
        if state.get("version") != _STATE_VERSION:
            raise UsageError(f"unknown loader state version {state.get('version')!r}")
        if state.get("shuffle") == "chunks":  # older fastdata's name for Shards on an in-place index: the same order
            state = {**state, "shuffle": "shards"}
        mine = self._settings()
        for key in mine:
            if key in state and state[key] != mine[key]:  # states saved before samplers lack the last two
                raise UsageError(f"loader state was saved with {key}={state[key]!r}, this loader has {mine[key]!r}")
        size = int(state["world_size"])
        done = int(state["batches_done"])
        epoch = int(state["epoch"])
        per_epoch = self._num_batches(World(0, size), epoch)
        if not 0 <= done <= per_epoch:
            raise UsageError(f"loader state has batches_done={done}, but an epoch has {per_epoch} batches")
        if done == per_epoch:  # saved after the epoch's last batch (older fastdata): the next epoch
            epoch, done = epoch + 1, 0
        if done and state.get("order") != self._order_rule():
            raise UsageError(
                f"loader state was saved mid-epoch with shuffle={self.shuffle!r} order {state.get('order')!r} "
                f"(older fastdata, or another Block/Shards size), this loader orders by {self._order_rule()!r}: "
                f"the rest of epoch {epoch} would differ. Use the same settings, or skip this state and "
                f"start epoch {epoch + 1} afresh with set_epoch({epoch + 1})")
        self.epoch = epoch
        self._resume_at = done
        self._resume_world = size if done else None
        self._done = done

    def collate_fn(self, batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """A batch read by ``dataset.get_batch`` as this loader yields it: what a torch DataLoader built
        from ``dataset`` and :attr:`batch_sampler` (Accelerate's ``skip_first_batches``) uses."""
        raise UsageError(f"the {self.backend} backend cannot finish batches outside its own pipeline: restore "
                         "the position with load_state_dict (Accelerate: register_for_checkpointing) instead")

    def _release(self) -> None:
        """Release the backend's threads, processes or pipelines (they restart on the next pass)."""

    def close(self) -> None:
        """Release threads, processes, pipelines and the dataset this loader opened; iterating starts them again."""
        self._release()
        if getattr(self, "_owns_dataset", False):
            self.dataset.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        """Pickling (``ddp_spawn``) keeps settings and position; threads, processes and handles are made again."""
        state = self.__dict__.copy()
        state["_pass_world"] = None
        state["_stats"] = _Stats()
        state["_sampled"] = {}  # planned again on the other side (a pure function)
        for name in self._unpicklable:
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._make_stages()

    _unpicklable: tuple[str, ...] = ()

    def _make_stages(self) -> None:
        """(Re)create what ``_unpicklable`` names (after unpickling)."""

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class EpochSampler(torch.utils.data.Sampler[int]):
    """``loader.sampler``: this rank's sample indices of the epoch the next pass yields; its ``set_epoch``
    is the loader's."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        for idx in self.loader.plan():
            yield from idx.tolist()

    def __len__(self) -> int:
        return sum(len(b) for b in self.loader.plan())


class EpochBatchSampler(torch.utils.data.Sampler[list[int]]):
    """``loader.batch_sampler``: the epoch's index batches; with ``loader.collate_fn``, a DataLoader over
    ``loader.dataset`` yields the loader's batches."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self.sampler = EpochSampler(loader)
        self.batch_size = loader.batch_size
        self.drop_last = loader.drop_last

    def __iter__(self) -> Iterator[list[int]]:
        ld = self.loader
        epoch = ld.epoch
        plan = ld.plan(epoch)
        for k, idx in enumerate(plan):
            ld._collate_at = (epoch, k)  # the batch a collate_fn call finishes next (seeds augmentation)
            if k == len(plan) - 1 and ld.epoch == epoch:
                ld.set_epoch(epoch + 1)
            yield idx.tolist()

    def __len__(self) -> int:
        return len(self.loader)
