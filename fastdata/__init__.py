"""fastdata: sharded HDF5/LMDB datasets and fast PyTorch input pipelines. ``convert`` writes a dataset,
``open`` reads one, ``loader`` feeds training; torch is imported only when the loader or augmentation is used."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastdata import errors
from fastdata._version import __version__
from fastdata.reading.dataset import Dataset, open
from fastdata.reading.samplers import Block, Shards
from fastdata.remote import RemoteOptions

if TYPE_CHECKING:  # what mypy and editors see; at run time __getattr__ imports them when first used
    from fastdata.converters import ConvertConfig, ImageOptions
    from fastdata.converters.convert import convert, merge
    from fastdata.loaders import Loader, LoaderConfig, PerSample, loader
    from fastdata.write import ConvertReport, MergeReport, WriteOptions
    from fastdata.write.inplace import index

# imported when first used: converting needs no torch, reading needs neither torch nor the write side
_LAZY = {"convert": "fastdata.converters.convert", "merge": "fastdata.converters.convert",
         "ConvertConfig": "fastdata.converters", "ImageOptions": "fastdata.converters", "WriteOptions": "fastdata.write",
         "ConvertReport": "fastdata.write", "MergeReport": "fastdata.write", "index": "fastdata.write.inplace",
         "Loader": "fastdata.loaders", "LoaderConfig": "fastdata.loaders", "PerSample": "fastdata.loaders",
         "loader": "fastdata.loaders"}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "augment":
        return importlib.import_module("fastdata.augment")
    raise AttributeError(f"module 'fastdata' has no attribute {name!r}")


__all__ = ["Block", "ConvertConfig", "ConvertReport", "Dataset", "ImageOptions", "Loader", "LoaderConfig",
           "MergeReport", "PerSample", "RemoteOptions", "Shards", "WriteOptions", "__version__", "convert", "errors",
           "index", "loader", "merge", "open"]
