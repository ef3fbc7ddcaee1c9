"""fastdata: sharded HDF5/LMDB datasets and fast PyTorch input pipelines.

``fastdata.open`` reads a dataset; ``fastdata.loader`` feeds training. torch is imported
only when the loader or augmentation is first used, so converting data does not need it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import errors
from .dataset import Dataset, open

if TYPE_CHECKING:
    from .loaders import Loader, LoaderConfig

__version__ = "0.1.0"


def loader(*args: Any, **kwargs: Any) -> "Loader":
    """Batches of a fastdata dataset as dicts of tensors on the device; see :func:`fastdata.loaders.loader`."""
    from .loaders import loader as _loader

    return _loader(*args, **kwargs)


def __getattr__(name: str) -> Any:
    if name in ("Loader", "LoaderConfig"):
        from . import loaders

        return getattr(loaders, name)
    if name == "augment":
        import importlib

        return importlib.import_module(".augment", __name__)
    raise AttributeError(f"module 'fastdata' has no attribute {name!r}")


__all__ = ["Dataset", "Loader", "LoaderConfig", "__version__", "errors", "loader", "open"]
