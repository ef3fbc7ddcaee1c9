"""A dataset at a URL as a :class:`fastdata.format.store.ShardStore`: its manifest, read remotely, and its
shards, downloaded whole into the node's cache (and checked) when a batch first needs them, pinned while it
reads them; and the plan-aware prefetch that downloads them ahead of the loader, in the plan's order."""

from __future__ import annotations

import bisect
import logging
import math
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable, Iterator, Sequence

import numpy as np

from fastdata._units import fmt_bytes
from fastdata.errors import FastdataError, FormatError, RemoteError, RemoteNotFoundError
from fastdata.format.backends import backend
from fastdata.format.interface import ShardReader, ShardReaderBase
from fastdata.format.keys import KeyTable
from fastdata.format.manifest import manifest_of, no_manifest_error
from fastdata.format.spec import KEYS_KIND_FILE, MANIFEST_NAME, FieldSpec, KeysInfo, Manifest, ShardInfo
from fastdata.handles import PerProcessHandle
from fastdata.remote import RemoteOptions, filesystem, join, root, with_retries
from fastdata.remote.cache import CacheFullError, Pin, Priority, ShardCache

log = logging.getLogger("fastdata.remote")
_CHUNK = 8 << 20
_SWEEP_EVERY_S = 1.0
IDLE_PINS = 2  # shards a process keeps pinned after their last reader let go (most are read again at once)


@dataclass
class _Local:
    """What one process holds of a store: its filesystem client, pins, and what it downloaded."""

    fs: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    pins: dict[int, list[Any]] = field(default_factory=dict)  # shard -> [Pin, count]; count 0: idle, kept
    idle: list[int] = field(default_factory=list)  # shards pinned with count 0, oldest first (at most IDLE_PINS)
    inos: dict[int, tuple[int, Callable[[], None]]] = field(default_factory=dict)  # shard -> (its reader's inode, close)
    swept: float = 0.0
    downloads: int = 0
    downloaded_bytes: int = 0


def cache_name(info: ShardInfo | KeysInfo) -> str:
    """The cache file of a shard (or the keys file), named by its content: ``<algorithm>-<digest><ext>``."""
    algorithm, _, digest = str(info.checksum).partition(":")
    return f"{algorithm}-{digest}{PurePosixPath(str(info.file)).suffix}"


class RemoteStore(PerProcessHandle[_Local]):
    """Shards of the dataset at ``url`` through the node's shard cache (see fastdata/remote/cache.py);
    what a process holds (client, pins) is its own (fastdata/handles.py)."""

    def __init__(self, url: str, options: RemoteOptions | None = None) -> None:
        self.url = root(url)
        self.root: Path | str = self.url
        self.remote: RemoteStore | None = self
        self.options = options or RemoteOptions()
        self.priority: Priority | None = None  # set by a PlanFollower while a loader iterates
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

    def _open_handle(self) -> _Local:
        return _Local(filesystem(self.url, self.options.storage_options, self.options.timeout))

    @staticmethod
    def _close_handle(handle: _Local) -> None:
        for entry in handle.pins.values():
            entry[0].release()  # after a fork: closes the child's copy only; the parent's lock stays

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "priority": None}

    def _after_fork_in_child(self) -> None:
        super()._after_fork_in_child()
        self.priority = None  # the parent's PlanFollower: its threads are not in this process

    # --- remote access -------------------------------------------------------------------

    def where(self, file: str | None = None) -> str:
        return join(self.url, file) if file else self.url

    def fs(self) -> Any:
        return self.handle().fs

    def deadline(self) -> float:
        return time.monotonic() + self.options.timeout

    def _read_manifest(self) -> Manifest:
        where = self.where(MANIFEST_NAME)
        fs = self.fs()
        try:
            data = with_retries(lambda: fs.cat_file(where), where, self.deadline())
        except RemoteNotFoundError:
            try:  # what is there instead says what to do (format/manifest.py, as for a folder)
                names = {str(n).rstrip("/").rsplit("/", 1)[-1] for n in
                         with_retries(lambda: fs.ls(self.url, detail=False, refresh=True), self.url, self.deadline())}
            except RemoteError:
                names = set()
            if not names:
                raise FormatError(f"{self.url}: no fastdata dataset there (no {MANIFEST_NAME})") from None
            raise no_manifest_error(self.url, names) from None
        return manifest_of(data, where)

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
            h = self.handle()
            h.downloads += 1
            h.downloaded_bytes += f.tell()

        return fill

    # --- the cache -----------------------------------------------------------------------

    def local_path(self, i: int) -> Any:
        return self.cache.path(self.names[i])

    def fetch(self, i: int, bound: float | None = None) -> bool:
        """Download shard ``i`` into the cache unless it is there; see :meth:`ShardCache.fetch`."""
        return self._fetch(self.manifest.shards[i], bound)

    def _fetch(self, info: ShardInfo | KeysInfo, bound: float | None = None) -> bool:
        h = self.handle()
        with h.lock:  # our own idle pins must not keep the eviction this may need from happening
            for j in h.idle:
                h.pins.pop(j)[0].release()
            h.idle.clear()
        deadline = self.deadline()
        return self.cache.fetch(cache_name(info), info.bytes, str(info.checksum), self._fill(info, deadline),
                                where=self.where(str(info.file)), deadline=deadline, priority=self.priority,
                                bound=bound)

    def _pin_file(self, info: ShardInfo | KeysInfo) -> Pin:
        deadline = self.deadline()
        while (pin := self.cache.pin(cache_name(info), info.bytes)) is None:
            if time.monotonic() > deadline:  # downloaded, then evicted by others, again and again
                raise RemoteError(f"{self.where(str(info.file))}: the file keeps being evicted from the cache before "
                                  "it can be read; raise RemoteOptions.cache_limit")
            self._fetch(info)
        return pin

    # --- the ShardStore interface ------------------------------------------------------

    def open_readers(self, fields: list[FieldSpec]) -> list[ShardReader]:
        impl = backend(self.manifest.backend)
        readers = [impl.ShardReader(self.local_path(i), info, fields) for i, info in enumerate(self.manifest.shards)]
        for r, info in zip(readers, self.manifest.shards):
            assert isinstance(r, ShardReaderBase)  # (the HDF5 and LMDB readers: a URL dataset is never in place)
            r.shown = f"{self.where(info.file)} (cached copy {r.path}: delete it to download it again)"
        return readers

    def key_table(self) -> KeyTable | None:
        if self.keys is None:
            return None
        # downloaded through the shard cache when keys are first used
        return KeyTable(self.keys_path(), self.manifest.num_samples, self.keys.bytes, prepare=self.pin_keys,
                        fetch=self.fetch_keys)

    def _keys(self) -> KeysInfo:
        assert self.keys is not None  # its callers (key_table, verify) look first
        return self.keys

    def keys_path(self) -> Path:
        """Where the cache keeps the keys file (``keys.bin``), once downloaded."""
        return self.cache.path(cache_name(self._keys()))

    def fetch_keys(self) -> None:
        """Download the keys file into the cache unless it is there (checked like a shard)."""
        self._fetch(self._keys())

    def pin_keys(self) -> Callable[[], None]:
        """Make the keys file local and keep it from eviction; returns what releases it (the key
        table calls this once per process, when keys are first used, and releases it on close)."""
        return self._pin_file(self._keys()).release

    @contextmanager
    def pinned(self, shards: Sequence[int], readers: Sequence[ShardReader]) -> Iterator[None]:
        held: list[int] = []
        try:
            for s in shards:  # local, checked, and kept from eviction while we read
                self.pin(s, readers[s].close)
                held.append(s)
            yield
        finally:
            for s in held:
                self.unpin(s)

    def pin(self, i: int, close_reader: Callable[[], None]) -> None:
        """Make shard ``i`` local and keep it until :meth:`unpin`; ``close_reader`` closes the reader's
        handle (called when the cached file was replaced since the reader opened it)."""
        h = self.handle()
        with h.lock:
            if _count_in(h, i):
                return
        pin = self._pin_file(self.manifest.shards[i])
        with h.lock:
            if _count_in(h, i):  # another thread pinned it meanwhile
                pin.release()
                return
            h.pins[i] = [pin, 1]
            old = h.inos.get(i)
            if old is not None and old[0] != pin.ino:
                old[1]()
            h.inos[i] = (pin.ino, close_reader)
            self._sweep(h)

    def unpin(self, i: int) -> None:
        h = self.handle()
        with h.lock:
            entry = h.pins.get(i)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:  # idle: the next batch most likely reads this shard again
                h.idle.append(i)
                while len(h.idle) > IDLE_PINS:
                    h.pins.pop(h.idle.pop(0))[0].release()

    def _sweep(self, h: _Local) -> None:
        """Close readers of unpinned shards whose file was evicted, so the disk space comes back."""
        now = time.monotonic()
        if now - h.swept < _SWEEP_EVERY_S:
            return
        h.swept = now
        for j, (ino, close) in list(h.inos.items()):
            if j in h.pins:  # pinned (idle ones too): the file is still ours
                continue
            try:
                gone = os.stat(self.local_path(j)).st_ino != ino
            except FileNotFoundError:
                gone = True
            if gone:
                close()
                del h.inos[j]

    def release_pins(self) -> None:
        """Drop every pin of this process (the dataset is being closed); the client stays open."""
        h = self.handle()
        with h.lock:
            self._close_handle(h)
            h.pins.clear()
            h.idle.clear()
            h.inos.clear()

    def stats(self) -> dict[str, Any]:
        """Downloads made by this process, and what the node's cache holds."""
        h = self.handle()
        return {"downloads": h.downloads, "downloaded_bytes": h.downloaded_bytes,
                "cache_dir": str(self.cache.root), "cache_bytes": self.cache.held_bytes(),
                "cache_limit": self.cache.limit}


def _count_in(h: _Local, i: int) -> bool:
    """Count one more reader of shard ``i`` if this process pins it already (idle or not); False if not."""
    entry = h.pins.get(i)
    if entry is None:
        return False
    if entry[1] == 0:
        h.idle.remove(i)
    entry[1] += 1
    return True


class PlanFollower:
    """Prefetches for one rank's plan; ``plans`` holds every rank's batches (global positions). Scheduling runs
    inline (:meth:`at`, a download's end): only real downloads wake a thread."""

    def __init__(self, store: RemoteStore, plans: Sequence[Sequence[np.ndarray]], mine: int, first: int,
                 lead: int) -> None:
        self.store = store
        self.lead = lead
        starts = np.array([s.start for s in store.manifest.shards], dtype=np.int64)
        uses: dict[int, set[int]] = {}
        seq: list[tuple[int, int]] = []  # (first batch that needs it, shard) for this rank
        seen: set[int] = set()
        for r, plan in enumerate(plans):
            for k, batch in enumerate(plan):
                for s in np.unique(np.searchsorted(starts, batch, side="right") - 1).tolist():  # its shards
                    uses.setdefault(s, set()).add(k)
                    if r == mine and k >= first and s not in seen:
                        seen.add(s)
                        seq.append((k, s))
        self._uses = {store.names[s]: sorted(ks) for s, ks in uses.items()}
        self._seq = seq
        self._k = first
        self._wake_at = first  # at() schedules again only once the loader reaches this batch
        self._retry_at = math.inf  # a shard deferred for lack of room is tried again after this time
        self._done: set[int] = set()
        self._busy: set[int] = set()
        self._deferred: set[int] = set()
        self._lock = threading.Lock()
        self._stop = False
        self._pool = ThreadPoolExecutor(store.options.download_threads, thread_name_prefix="fastdata-prefetch")
        store.priority = self.priority
        self._schedule()

    def priority(self, name: str) -> float:
        """When the plan next needs the cached file ``name`` (a batch position; inf: not this epoch)."""
        ks = self._uses.get(name)
        if not ks:
            return math.inf
        j = bisect.bisect_left(ks, self._k)
        return float(ks[j]) if j < len(ks) else math.inf

    def at(self, k: int) -> None:
        """The loader hands out batch ``k`` now."""
        self._k = k
        if k >= self._wake_at or time.monotonic() >= self._retry_at:
            self._schedule()

    def _wanted(self) -> list[int]:
        horizon = self._k + self.lead
        out: list[int] = []
        extra = 0
        for first, s in self._seq:
            if first > horizon:
                if extra >= self.store.options.prefetch_shards:
                    break
                extra += 1
            out.append(s)
        return out

    def _schedule(self) -> None:
        with self._lock:
            if self._stop:
                return
            room = self.store.options.download_threads - len(self._busy)
            for s in self._wanted():
                if s in self._done or s in self._busy:
                    continue
                if self.store.local_path(s).exists():  # cached already: nothing to do, no thread woken
                    self._done.add(s)
                    continue
                if room <= 0:
                    break
                room -= 1
                self._busy.add(s)
                self._deferred.discard(s)
                self._pool.submit(self._fetch, s, self.priority(self.store.names[s]))
            later = [first for first, _ in self._seq if first > self._k + self.lead]
            self._wake_at = later[0] - self.lead if later else sys.maxsize
            self._retry_at = time.monotonic() + 0.2 if self._deferred else math.inf

    def _fetch(self, s: int, bound: float) -> None:
        ok = True
        try:
            ok = self.store.fetch(s, bound=bound)
        except FastdataError as e:  # the reader meets it too, and raises it with the batch named
            log.info("prefetch of %s failed: %s", self.store.where(self.store.manifest.shards[s].file), e)
        except Exception as e:  # noqa: BLE001 - never kill the prefetch thread
            log.warning("prefetch of shard %d failed: %s: %s", s, type(e).__name__, e)
        with self._lock:
            self._busy.discard(s)
            (self._done if ok else self._deferred).add(s)  # deferred: no room now, try again later
        self._schedule()

    def close(self) -> None:
        """Stop prefetching (downloads in flight finish in the background, then the threads end)."""
        with self._lock:
            self._stop = True
        if self.store.priority == self.priority:
            self.store.priority = None
        self._pool.shutdown(wait=False, cancel_futures=True)
