"""fastdata: sharded HDF5/LMDB datasets and fast PyTorch input pipelines."""

from __future__ import annotations

from . import errors
from .dataset import Dataset, open

__version__ = "0.1.0"

__all__ = ["Dataset", "__version__", "errors", "open"]
