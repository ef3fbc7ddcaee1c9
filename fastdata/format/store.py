"""Where a dataset's shards live and how they are opened and kept readable: :class:`ShardStore`, the one
interface ``Dataset`` reads through (local folders here, URLs in remote.store, indexes in inplace)."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Sequence

from fastdata.errors import CorruptShardError
from fastdata.fileio import not_regular
from fastdata.format.backends import backend
from fastdata.format.interface import ShardReader
from fastdata.format.keys import KeyTable
from fastdata.format.manifest import read_manifest, shard_path
from fastdata.format.spec import KEYS_KIND_FILE, FieldSpec, Manifest

if TYPE_CHECKING:
    from fastdata.remote.store import RemoteStore

_UNPINNED: AbstractContextManager[None] = nullcontext()  # reusable: nothing to hold while a batch reads


class ShardStore(Protocol):
    """A dataset's shards: the manifest, one reader per shard, and what keeps a shard readable."""

    root: Path | str  # what names the dataset in messages (a folder, or a URL)
    manifest: Manifest
    remote: RemoteStore | None  # the remote store and shard cache of a URL dataset, else None

    def open_readers(self, fields: list[FieldSpec]) -> list[ShardReader]:
        """One reader per shard of the manifest (files are opened lazily, per process); checks what
        can be checked before the first read."""

    def key_table(self) -> KeyTable | None:
        """The reader of the sample keys' file, or None when the manifest has none."""

    def pinned(self, shards: Sequence[int], readers: Sequence[ShardReader]) -> AbstractContextManager[None]:
        """Keeps ``shards`` readable (local, checked, not evicted) while a batch reads them."""

    def release_pins(self) -> None:
        """Releases what this process holds for the store (pins); readers are closed by the caller."""


class LocalShards:
    """Shards in a local folder, read where they are."""

    remote: RemoteStore | None = None

    def __init__(self, root: Path, manifest: Manifest | None = None) -> None:
        self.root: Path | str = root
        self.folder = root
        self.manifest: Manifest = manifest if manifest is not None else read_manifest(root)

    def open_readers(self, fields: list[FieldSpec]) -> list[ShardReader]:
        impl = backend(self.manifest.backend)
        readers = []
        for info in self.manifest.shards:
            path = shard_path(self.folder, info)
            try:
                st = path.stat()
            except FileNotFoundError:
                raise CorruptShardError(f"{self.root}: shard {info.file!r} is missing") from None
            except OSError as e:
                raise CorruptShardError(f"{self.root}: shard {info.file!r} cannot be read: {e.strerror or e}") from None
            if why := not_regular(st.st_mode):
                raise CorruptShardError(f"{self.root}: shard {info.file!r} {why}")
            size = st.st_size
            if size != info.bytes:
                raise CorruptShardError(
                    f"{self.root}: shard {info.file!r} is {size} bytes, the manifest says {info.bytes} (truncated or replaced)"
                )
            readers.append(impl.ShardReader(path, info, fields))
        return readers

    def key_table(self) -> KeyTable | None:
        keys = self.manifest.keys
        if keys is None or keys.kind != KEYS_KIND_FILE:
            return None
        real = os.path.realpath(self.folder / str(keys.file))
        if os.path.dirname(real) != os.path.realpath(self.folder):  # as for shards: never outside the dataset
            raise CorruptShardError(f"{self.root}: keys file {keys.file!r} points outside the dataset directory")
        return KeyTable(Path(real), self.manifest.num_samples, keys.bytes)

    def pinned(self, shards: Sequence[int], readers: Sequence[ShardReader]) -> AbstractContextManager[None]:
        return _UNPINNED

    def release_pins(self) -> None:
        pass


__all__ = ["LocalShards", "ShardStore"]
