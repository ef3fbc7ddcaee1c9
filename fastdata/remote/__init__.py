"""Datasets on object storage (S3, GCS, Azure, HTTP, ... through fsspec).

A remote dataset is a URL whose ``manifest.json`` is read remotely; its shards are downloaded
whole into a local cache shared by every process on the node and read with the ordinary shard
readers. See docs/remote.md. ``is_url`` is the one test for "this is not a local path".
"""

from __future__ import annotations

from fastdata.remote.options import RemoteOptions
from fastdata.remote.url import is_url

__all__ = ["RemoteOptions", "is_url"]
