"""``fastdata.loader``: batches of tensors on the device, read whole from fastdata shards, by the torch or
the DALI backend (the shared plan, epochs, resume and stats: base.py; semantics: docs/loader.md)."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Literal, Sequence

import torch

from fastdata.augment import Augment
from fastdata.errors import UsageError
from fastdata.format.spec import ENCODING_IMAGE
from fastdata.loaders.base import Loader, LoaderConfig
from fastdata.loaders.settings_cache import load_tuned
from fastdata.loaders.torch_backend import TorchLoader, resolve_device
from fastdata.loaders.transform import PerSample, TransformFn
from fastdata.reading.dataset import Dataset
from fastdata.reading.samplers import Block, Episodic, SamplerFn, Shards, Shuffle, Weighted
from fastdata.remote import RemoteOptions
from fastdata.world import usable_cpus

log = logging.getLogger("fastdata.loader")


def _resolve_workers(num_workers: int | Literal["auto"], ds: Dataset, batch_size: int, device: torch.device,
                     config: LoaderConfig | None, transform: TransformFn | None = None) -> tuple[int, LoaderConfig]:
    """Explicit workers (checked by :func:`loader`) win; ``"auto"`` takes ``fastdata tune``'s stored
    settings, else the default."""
    if num_workers != "auto":
        return num_workers, config or LoaderConfig()
    tuned = load_tuned(ds, batch_size, device.type, transform)
    if tuned is None:
        workers = min(4, usable_cpus())
        log.info("num_workers='auto': %d reader threads (default; run `fastdata tune` to measure better ones)", workers)
        return workers, config or LoaderConfig()
    kept = {k: tuned[k] for k in ("mode", "prefetch") if k in tuned}  # the rest keeps LoaderConfig's defaults
    if config is not None:  # a config of the user's keeps the mode and prefetch it changed from the defaults
        default = LoaderConfig()
        kept = {k: v for k, v in kept.items() if getattr(config, k) == getattr(default, k)}
    config = dataclasses.replace(config or LoaderConfig(), **kept)
    log.info("num_workers='auto': using tuned settings %s (from fastdata tune): %d workers, mode=%r, prefetch=%d",
             tuned, int(tuned["num_workers"]), config.mode, config.prefetch)
    return int(tuned["num_workers"]), config

def loader(
    source: str | os.PathLike[str] | Dataset,
    batch_size: int | None,
    *,
    shuffle: Shuffle = True,
    drop_last: bool = False,
    seed: int = 0,
    device: str | torch.device = "auto",
    augment: Augment | Sequence[Any] | None = None,
    fields: Sequence[str] | None = None,
    num_workers: int | Literal["auto"] = "auto",
    backend: Literal["torch", "dali", "auto"] = "torch",
    config: LoaderConfig | None = None,
    remote: RemoteOptions | None = None,
    sampler: SamplerFn | None = None,
    transform: TransformFn | None = None,
) -> Loader:
    """Batches of a fastdata dataset as dicts of tensors on ``device`` (docs/loader.md).

    ``source``: a dataset folder, a URL (cached as ``remote`` says) or an open :class:`Dataset`. ``shuffle``:
    True (a permutation from ``(seed, epoch)``), ``Block()``, ``Shards()`` or False; ranks get disjoint equal
    shares. ``augment``: an ``Augment`` or its ops, run on the device. ``num_workers``: reader threads (processes
    with ``LoaderConfig(mode="processes")``; DALI's CPU threads), 0 reads inline. ``backend="auto"``: DALI when
    installed, on CUDA, for encoded images it can take. ``sampler`` replaces the order (``batch_size`` None with
    ``Episodic``); ``fields`` may include ``"key"``; ``transform(batch, rng)`` runs in the readers on numpy
    batches (see :class:`PerSample`). Close it (or use ``with``) to release threads, processes and files.
    """
    if backend not in ("torch", "dali", "auto"):
        raise UsageError(f"backend must be 'torch', 'dali' or 'auto', not {backend!r}")
    if not isinstance(source, Dataset):
        ds = Dataset(source, fields=fields, remote=remote)
    elif remote is not None:
        raise UsageError("remote= is for loaders given a URL; this Dataset was opened already (pass remote= to "
                         "fastdata.open instead)")
    else:
        ds = source if fields is None else source.with_options(fields=fields)  # keeps the caller's decode settings
    if sampler is not None and shuffle is not True:  # (True is the default: no choice was made)
        raise UsageError(f"shuffle={shuffle!r} cannot be honoured with sampler=: the sampler decides the order; "
                         "drop shuffle= (a sampler of your own may return its batches in storage order)")
    batch_size, sampler = _bind_sampler(sampler, ds, batch_size, drop_last)
    aug = augment if augment is None or isinstance(augment, Augment) else Augment(tuple(augment))
    dev = resolve_device(device)
    chosen = _pick_backend(dev, ds, aug, config, transform) if backend == "auto" else backend
    if num_workers != "auto" and (not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0):
        raise UsageError(f"num_workers must be 'auto' or an integer >= 0, not {num_workers!r}")
    # the loader closes a dataset it opened itself (from a path, or a copy with other options), not the caller's
    common: dict[str, Any] = dict(shuffle=shuffle, drop_last=drop_last, seed=seed, device=dev, augment=aug,
                                  owns_dataset=ds is not source, sampler=sampler)
    return _backend_loader(chosen, ds, batch_size, num_workers, config, transform, common)


def _backend_loader(chosen: str, ds: Dataset, batch_size: int, num_workers: int | Literal["auto"],
                    config: LoaderConfig | None, transform: TransformFn | None, common: dict[str, Any]) -> Loader:
    """The chosen backend's loader; the world is read when each pass starts (a loader may be built
    before init_process_group)."""
    if chosen == "dali":
        if transform is not None:
            raise UsageError("transform= runs in the torch backend's readers; DALI pipelines have no place for it: "
                             "use backend='torch' (or 'auto'), or express the work as DALI/augment ops")
        if config is not None and config.timeout is not None:
            raise UsageError("LoaderConfig(timeout=...) bounds the torch backend's readers; DALI's pipeline has none: "
                             "use backend='torch', or no timeout")
        from fastdata.loaders.dali import DaliLoader

        threads = usable_cpus() if num_workers == "auto" else num_workers
        common["owns_dataset"] = True  # a copy of the caller's dataset (decode=False): the loader's own
        return DaliLoader(ds.with_options(decode=False), batch_size, threads=threads, config=config or LoaderConfig(),
                          **common)
    workers, config = _resolve_workers(num_workers, ds, batch_size, common["device"], config, transform)
    return TorchLoader(ds, batch_size, workers=workers, config=config, transform=transform, **common)


def _bind_sampler(sampler: SamplerFn | None, ds: Dataset, batch_size: int | None,
                  drop_last: bool = False) -> tuple[int, SamplerFn | None]:
    """Check the sampler against the dataset now (not mid-epoch) and settle the batch size (``Weighted`` cuts its
    draws into batches: without a short last one under ``drop_last``)."""
    if sampler is None:
        if batch_size is None:
            raise UsageError("batch_size is needed (None is only for samplers that make their own batches, like Episodic)")
        return batch_size, None
    if not callable(sampler):
        raise UsageError(f"sampler must be a fastdata sampler or a function (n, world, seed, epoch) -> batches, "
                         f"not {type(sampler).__name__}")
    if isinstance(sampler, Episodic):
        bound = sampler.bind(ds, batch_size)
        return bound.episode_size, bound
    if batch_size is None:
        raise UsageError(f"batch_size is needed with {type(sampler).__name__} (None is only for Episodic)")
    if isinstance(sampler, Weighted):
        return batch_size, sampler.bind(ds, batch_size, drop_last)
    bind = getattr(sampler, "bind", None)
    return batch_size, (bind(ds, batch_size) if callable(bind) else sampler)


def _pick_backend(device: torch.device, ds: Dataset | None = None, augment: Augment | None = None,
                  config: LoaderConfig | None = None, transform: TransformFn | None = None) -> Literal["torch", "dali"]:
    """``backend="auto"``: DALI when it is installed, the device is CUDA and ``ds`` has encoded images that
    DALI can take with ``augment``; else torch (the choice and its reason are logged at DEBUG)."""
    if device.type != "cuda":
        problem: str | None = "DALI is picked for CUDA devices only"
    elif transform is not None:
        problem = "a transform runs in the torch backend's readers"
    elif ds is not None and not any(f.encoding == ENCODING_IMAGE for f in ds.schema):
        problem = "no encoded images to decode on the GPU"
    else:
        from fastdata.loaders.dali import dali_problem, dali_unsupported

        problem = dali_problem(device) or (dali_unsupported(ds, augment, config) if ds is not None else None)
    if problem:
        log.debug("backend='auto': torch (device %s: %s)", device, problem)
        return "torch"
    log.debug("backend='auto': dali (device %s)", device)
    return "dali"

__all__ = ["Block", "Loader", "LoaderConfig", "PerSample", "Shards", "TorchLoader", "loader"]
