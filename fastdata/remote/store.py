"""A dataset at a URL: its manifest, read remotely, and its shards, downloaded whole into the cache.

``pin(i)`` makes shard ``i`` local and keeps it from eviction until ``unpin(i)``; the dataset
pins the shards of each batch while reading them. State that belongs to one process (the
filesystem client, pins, threads) is dropped when the store is pickled or crosses a fork.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable

from fastdata._units import fmt_bytes
from fastdata.errors import FormatError, IncompleteDatasetError, UsageError
from fastdata.format.files import JOURNAL_NAME  # what an interrupted conversion to a URL leaves
from fastdata.format.manifest import parse_manifest
from fastdata.format.spec import KEYS_KIND_FILE, MANIFEST_NAME, MAX_MANIFEST_BYTES, KeysInfo, Manifest, ShardInfo
from fastdata.remote.cache import CacheFullError, Pin, Priority, ShardCache
from fastdata.remote.options import RemoteOptions
from fastdata.remote.retry import RemoteError, RemoteNotFoundError, with_retries
from fastdata.remote.url import filesystem, join, root

log = logging.getLogger("fastdata.remote")
PART_PREFIXES = (".fastdata-part-", ".fastdata-journal-part-")  # what --part I/N leaves before merge-parts
_CHUNK = 8 << 20
_SWEEP_EVERY_S = 1.0
IDLE_PINS = 2  # shards a process keeps pinned after their last reader let go (most are read again at once)


_forks = 0  # forks this process is removed from its first ancestor: cheaper to compare than getpid()


def _forked() -> None:
    global _forks
    _forks += 1


_FORK_HOOK = hasattr(os, "register_at_fork")
if _FORK_HOOK:
    os.register_at_fork(after_in_child=_forked)


def cache_name(info: ShardInfo | KeysInfo) -> str:
    """The cache file of a shard (or of the sample keys' file), named by its content:
    ``<algorithm>-<digest><ext>`` from the manifest's checksum (xxh3_128, or sha256 for version-1
    manifests)."""
    algorithm, _, digest = str(info.checksum).partition(":")
    return f"{algorithm}-{digest}{PurePosixPath(str(info.file)).suffix}"


class RemoteStore:
    """Shards of the dataset at ``url`` through the node's shard cache (see fastdata/remote/cache.py)."""

    def __init__(self, url: str, options: RemoteOptions | None = None) -> None:
        self.url = root(url)
        self.options = options or RemoteOptions()
        self.priority: Priority | None = None  # set by a PlanFollower while a loader iterates
        self._reset()
        self.fs()  # an unknown scheme or a missing package fails here, before anything is created
        self.cache = ShardCache(self.options.cache_path(), self.options.limit_bytes())
        self.manifest: Manifest = self._read_manifest()
        self.names = [cache_name(s) for s in self.manifest.shards]
        keys = self.manifest.keys
        self.keys: KeysInfo | None = keys if keys is not None and keys.kind == KEYS_KIND_FILE else None
        for s in self.manifest.shards:
            if s.bytes > self.cache.limit:
                raise CacheFullError(f"{self.where(s.file)}: the shard is {fmt_bytes(s.bytes)}, larger than the "
                                     f"cache limit {fmt_bytes(self.cache.limit)}; raise RemoteOptions.cache_limit")

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._gen = _forks
        self._fs: Any = None
        self._lock = threading.Lock()
        self._pins: dict[int, list[Any]] = {}  # shard -> [Pin, count]; count 0: idle, kept for the next batch
        self._idle: list[int] = []  # shards pinned with count 0, oldest first (at most IDLE_PINS)
        self._inos: dict[int, tuple[int, Callable[[], None]]] = {}  # shard -> (inode its reader opened, close)
        self._swept = 0.0
        self.downloads = 0
        self.downloaded_bytes = 0

    def __getstate__(self) -> dict[str, Any]:
        keep = ("url", "options", "cache", "manifest", "names", "keys")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.priority = None
        self._reset()

    def _mine(self) -> None:
        if self._gen != _forks or (not _FORK_HOOK and self._pid != os.getpid()):  # forked: the parent's state
            for entry in self._pins.values():
                entry[0].release()  # closes our copy only; the parent's lock stays
            self.priority = None
            self._reset()

    # --- remote access -------------------------------------------------------------------

    def where(self, file: str | None = None) -> str:
        return join(self.url, file) if file else self.url

    def fs(self) -> Any:
        self._mine()
        if self._fs is None:
            self._fs = filesystem(self.url, self.options.storage_options, self.options.timeout)
        return self._fs

    def deadline(self) -> float:
        return time.monotonic() + self.options.timeout

    def _read_manifest(self) -> Manifest:
        where = self.where(MANIFEST_NAME)
        fs = self.fs()
        try:
            data = with_retries(lambda: fs.cat_file(where), where, self.deadline())
        except RemoteNotFoundError:
            if _exists(fs, self.where(JOURNAL_NAME), self.deadline()):
                raise IncompleteDatasetError(
                    f"{self.url}: incomplete dataset: no {MANIFEST_NAME} (the conversion did not finish: run the "
                    "same fastdata convert command with --resume to finish it, or with --overwrite to start over)"
                ) from None
            if _holds_parts(fs, self.url, self.deadline()):
                raise IncompleteDatasetError(
                    f"{self.url}: incomplete dataset: no {MANIFEST_NAME}, only parts of a conversion split with "
                    f"--part I/N: once every part is done, run fastdata merge-parts {self.url}"
                ) from None
            raise FormatError(f"{self.url}: no fastdata dataset there (no {MANIFEST_NAME})") from None
        if len(data) > MAX_MANIFEST_BYTES:
            raise FormatError(f"{where}: manifest is {len(data)} bytes, over the {MAX_MANIFEST_BYTES} limit")
        try:
            obj = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise FormatError(f"{where}: unreadable manifest: {e}") from None
        return parse_manifest(obj, where=where)

    def _fill(self, info: ShardInfo | KeysInfo, deadline: float) -> Callable[[BinaryIO], None]:
        """Writes the object's bytes into a file, retrying until ``deadline``: the fetch's own, which the
        wait for another download's lock has used up part of (one time bound per fetch, not one per step)."""
        where = self.where(str(info.file))

        def attempt(f: BinaryIO) -> None:
            f.seek(0)
            fs = self.fs()
            fs.invalidate_cache(where)  # a listing cached before the object was replaced would pin its old ETag
            with fs.open(where, "rb", block_size=_CHUNK, cache_type="none") as src:
                while chunk := src.read(_CHUNK):
                    f.write(chunk)
                    if f.tell() > info.bytes:  # not the object the manifest describes: stop reading it
                        break

        def fill(f: BinaryIO) -> None:
            with_retries(lambda: attempt(f), f"{where}: download", deadline)
            self.downloads += 1
            self.downloaded_bytes += f.tell()

        return fill

    # --- the cache -----------------------------------------------------------------------

    def local_path(self, i: int) -> Any:
        return self.cache.path(self.names[i])

    def fetch(self, i: int, bound: float | None = None) -> bool:
        """Download shard ``i`` into the cache unless it is there; see :meth:`ShardCache.fetch`."""
        self._mine()
        self._release_idle()  # our own idle pins must not keep the eviction this may need from happening
        info = self.manifest.shards[i]
        deadline = self.deadline()
        return self.cache.fetch(self.names[i], info.bytes, info.checksum, self._fill(info, deadline),
                                where=self.where(info.file), deadline=deadline, priority=self.priority, bound=bound)

    def _acquire(self, i: int) -> Pin:
        info = self.manifest.shards[i]
        return self._pin_file(self.names[i], info.bytes, self.where(info.file), lambda: self.fetch(i))

    def _pin_file(self, name: str, size: int, where: str, fetch: Callable[[], object]) -> Pin:
        deadline = self.deadline()
        while True:
            pin = self.cache.pin(name, size)
            if pin is not None:
                return pin
            if time.monotonic() > deadline:  # downloaded, then evicted by others, again and again
                raise RemoteError(f"{where}: the file keeps being evicted from the cache before it can be read; "
                                  "raise RemoteOptions.cache_limit")
            fetch()

    # --- the sample keys' file -----------------------------------------------------------

    def keys_path(self) -> Path:
        """Where the cache keeps the keys file (``keys.bin``), once downloaded."""
        if self.keys is None:
            raise UsageError(f"{self.url}: the dataset has no keys file")
        return self.cache.path(cache_name(self.keys))

    def fetch_keys(self) -> None:
        """Download the keys file into the cache unless it is there (checked like a shard)."""
        self._mine()
        k = self.keys
        if k is None:
            raise UsageError(f"{self.url}: the dataset has no keys file")
        self._release_idle()
        deadline = self.deadline()
        self.cache.fetch(cache_name(k), k.bytes, str(k.checksum), self._fill(k, deadline), where=self.where(str(k.file)),
                         deadline=deadline, priority=self.priority)

    def pin_keys(self) -> Callable[[], None]:
        """Make the keys file local and keep it from eviction; returns what releases it (the key
        table calls this once per process, when keys are first used, and releases it on close)."""
        self._mine()
        k = self.keys
        if k is None:
            raise UsageError(f"{self.url}: the dataset has no keys file")
        return self._pin_file(cache_name(k), k.bytes, self.where(str(k.file)), self.fetch_keys).release

    def pin(self, i: int, close_reader: Callable[[], None]) -> None:
        """Make shard ``i`` local and keep it until :meth:`unpin`; ``close_reader`` closes the reader's
        handle (called when the cached file was replaced since the reader opened it)."""
        self._mine()
        with self._lock:
            entry = self._pins.get(i)
            if entry is not None:
                if entry[1] == 0:
                    self._idle.remove(i)
                entry[1] += 1
                return
        pin = self._acquire(i)
        with self._lock:
            entry = self._pins.get(i)
            if entry is not None:  # another thread pinned it meanwhile
                if entry[1] == 0:
                    self._idle.remove(i)
                entry[1] += 1
                pin.release()
                return
            self._pins[i] = [pin, 1]
            old = self._inos.get(i)
            if old is not None and old[0] != pin.ino:
                old[1]()
            self._inos[i] = (pin.ino, close_reader)
            self._sweep()

    def unpin(self, i: int) -> None:
        with self._lock:
            entry = self._pins.get(i)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:  # idle: the next batch most likely reads this shard again
                self._idle.append(i)
                while len(self._idle) > IDLE_PINS:
                    self._pins.pop(self._idle.pop(0))[0].release()

    def _release_idle(self) -> None:
        with self._lock:
            for j in self._idle:
                self._pins.pop(j)[0].release()
            self._idle.clear()

    def _sweep(self) -> None:
        """Close readers of unpinned shards whose file was evicted, so the disk space comes back."""
        now = time.monotonic()
        if now - self._swept < _SWEEP_EVERY_S:
            return
        self._swept = now
        for j, (ino, close) in list(self._inos.items()):
            if j in self._pins:  # pinned (idle ones too): the file is still ours
                continue
            try:
                gone = os.stat(self.local_path(j)).st_ino != ino
            except FileNotFoundError:
                gone = True
            if gone:
                close()
                del self._inos[j]

    def release_all(self) -> None:
        """Drop every pin of this process (the dataset is being closed)."""
        with self._lock:
            for entry in self._pins.values():
                entry[0].release()
            self._pins.clear()
            self._idle.clear()
            self._inos.clear()

    def stats(self) -> dict[str, Any]:
        """Downloads made by this process, and what the node's cache holds."""
        return {"downloads": self.downloads, "downloaded_bytes": self.downloaded_bytes,
                "cache_dir": str(self.cache.root), "cache_bytes": self.cache.held_bytes(),
                "cache_limit": self.cache.limit}


def _holds_parts(fs: Any, url: str, deadline: float) -> bool:
    """Whether ``url`` holds part records or part journals (``convert --part I/N`` without merge-parts yet)."""
    try:
        names = with_retries(lambda: fs.ls(url, detail=False, refresh=True), url, deadline)
    except RemoteError:
        return False
    return any(str(n).rstrip("/").rsplit("/", 1)[-1].startswith(PART_PREFIXES) for n in names)


def _exists(fs: Any, url: str, deadline: float) -> bool:
    try:
        return bool(with_retries(lambda: fs.exists(url), url, deadline))
    except RemoteError:
        return False
