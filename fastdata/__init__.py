"""fastdata: sharded HDF5/LMDB datasets and fast PyTorch input pipelines.

``fastdata.convert`` writes a dataset (``fastdata.merge`` joins several); ``fastdata.open`` reads
one; ``fastdata.loader`` feeds training. torch is imported only when the loader or augmentation is
first used, so converting data does not need it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal, Sequence

from fastdata import errors
from fastdata._version import __version__
from fastdata.dataset import Dataset, open
from fastdata.indexer import index
from fastdata.order import Shuffle
from fastdata.remote import RemoteOptions

if TYPE_CHECKING:
    import torch

    from fastdata.augment import Augment
    from fastdata.conversion import convert, merge
    from fastdata.converters import ConvertConfig, ImageOptions
    from fastdata.loaders import Loader, LoaderConfig
    from fastdata.loaders.transform import TransformFn
    from fastdata.samplers import SamplerFn
    from fastdata.write import ConvertReport, MergeReport, WriteOptions


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
    """Batches of a fastdata dataset as dicts of tensors on ``device``.

    ``source``: a dataset folder, a URL (``s3://bucket/ds``, read through the node's shard cache set
    up by ``remote``: docs/remote.md) or a :class:`Dataset`. Each epoch is a permutation drawn from
    ``(seed, epoch)`` (``shuffle="block"``: nearly sequential reads; ``"shards"``: shard by shard, for
    datasets larger than the cache; ``"chunks"``: chunk by chunk, for an in-place index of chunked
    files, docs/in-place.md; ``False``: storage order), split
    into disjoint equal shares across torch.distributed ranks. ``augment``: an
    :class:`fastdata.augment.Augment` or a list of its ops, applied on the device. ``fields``: the
    fields to read (default: all). ``num_workers``: reader threads (or processes with
    ``LoaderConfig(mode="processes")``), 0 reads in the iterating thread, ``"auto"`` uses
    ``fastdata tune``'s stored settings or a default. ``backend="dali"`` decodes and augments with
    NVIDIA DALI; ``"auto"`` picks it for encoded images on CUDA. ``sampler``: replaces the shuffled
    order (``fastdata.samplers.Weighted``, ``Episodic`` (``batch_size`` may then be None), or a
    function ``(n, world, seed, epoch) -> batches``). ``transform(batch, rng)``: your function on
    each batch's numpy arrays, run in the readers (worker processes with ``LoaderConfig(mode=
    "processes")``), with a generator drawn from ``(seed, epoch, rank, batch)``; ``PerSample(fn)``
    for a function of one sample. Details: docs/loader.md.
    """
    # A mirror of fastdata.loaders.loader (tests/test_architecture.py checks the signatures agree),
    # so that `import fastdata` does not import torch and help(fastdata.loader) shows the parameters.
    from fastdata.loaders import loader as _loader

    return _loader(source, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed, device=device,
                   augment=augment, fields=fields, num_workers=num_workers, backend=backend, config=config,
                   remote=remote, sampler=sampler, transform=transform)


_WRITE_SIDE = {"convert": "conversion", "merge": "conversion", "ConvertConfig": "converters",
               "ImageOptions": "converters", "WriteOptions": "write", "ConvertReport": "write", "MergeReport": "write"}


def __getattr__(name: str) -> Any:
    if name in _WRITE_SIDE:  # the write side (converting): imported when first used
        import importlib

        return getattr(importlib.import_module(f".{_WRITE_SIDE[name]}", __name__), name)
    if name in ("Loader", "LoaderConfig", "PerSample"):
        from fastdata import loaders

        return getattr(loaders, name)
    if name == "augment":
        import importlib

        return importlib.import_module(".augment", __name__)
    raise AttributeError(f"module 'fastdata' has no attribute {name!r}")


__all__ = ["ConvertConfig", "ConvertReport", "Dataset", "ImageOptions", "Loader", "LoaderConfig", "MergeReport",
           "PerSample", "RemoteOptions", "WriteOptions", "__version__", "convert", "errors", "index", "loader", "merge",
           "open"]
