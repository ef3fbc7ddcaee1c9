"""Datasets on object storage through fsspec: the manifest read remotely, shards downloaded whole into a
node-wide cache and read with the ordinary readers (docs/remote.md)."""

from __future__ import annotations

from fastdata.remote.options import RemoteOptions
from fastdata.remote.url import is_url

__all__ = ["RemoteOptions", "is_url"]
