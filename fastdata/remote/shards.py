"""Shards of a URL dataset as a :class:`fastdata.format.store.ShardStore`: read from the node's
shard cache, downloaded (and checked) when a batch first needs them, pinned while it reads them."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from fastdata.format.backends import backend
from fastdata.format.interface import ShardReader
from fastdata.format.keys import KeyTable
from fastdata.format.spec import FieldSpec, Manifest
from fastdata.remote.options import RemoteOptions
from fastdata.remote.store import RemoteStore


class RemoteShards:
    """The shards of the dataset at ``url``, through a :class:`RemoteStore`."""

    def __init__(self, url: str, options: RemoteOptions | None) -> None:
        self.remote: RemoteStore | None = RemoteStore(url, options)
        self.store = self.remote
        self.root: Path | str = self.store.url
        self.manifest: Manifest = self.store.manifest

    def open_readers(self, fields: list[FieldSpec]) -> list[ShardReader]:
        impl = backend(self.manifest.backend)
        return [impl.ShardReader(self.store.local_path(i), info, fields) for i, info in enumerate(self.manifest.shards)]

    def key_table(self) -> KeyTable | None:
        if self.store.keys is None:
            return None
        # downloaded through the shard cache when keys are first used
        return KeyTable(self.store.keys_path(), self.manifest.num_samples, self.store.keys.bytes,
                        prepare=self.store.pin_keys, fetch=self.store.fetch_keys)

    @contextmanager
    def pinned(self, shards: Sequence[int], readers: Sequence[ShardReader]) -> Iterator[None]:
        held: list[int] = []
        try:
            for s in shards:  # local, checked, and kept from eviction while we read
                self.store.pin(s, readers[s].close)
                held.append(s)
            yield
        finally:
            for s in held:
                self.store.unpin(s)

    def close(self) -> None:
        self.store.release_all()


__all__ = ["RemoteShards"]
