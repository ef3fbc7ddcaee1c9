"""A small LRU of decoded chunks shared by one process's reader threads: each chunk of an in-place
index is decoded once, and threads asking for a chunk being decoded wait for it."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable

import numpy as np

DEFAULT_BYTES = 64 << 20
MIN_CHUNKS = 6  # kept at least: shuffle=Shards() mixes 2 chunks at a time, and readers run a batch or two ahead


class ChunkCache:
    """Decoded chunks by key, least recently used dropped beyond ``capacity`` bytes (the newest always kept);
    ``decoded_bytes`` counts what was decoded."""

    def __init__(self, capacity: int = DEFAULT_BYTES) -> None:
        self.capacity = capacity
        self._items: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._pending: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self._bytes = 0
        self.decoded_bytes = 0

    def get(self, key: Hashable, load: Callable[[], np.ndarray]) -> np.ndarray:
        """The chunk ``key``: cached, or loaded by ``load()`` (once, whoever asks at the same time)."""
        while True:
            with self._lock:
                hit = self._items.get(key)
                if hit is not None:
                    self._items.move_to_end(key)
                    return hit
                wait = self._pending.get(key)
                if wait is None:
                    self._pending[key] = threading.Event()
                    break
            wait.wait()  # another thread decodes it; then look again (it may have failed)
        try:
            chunk = load()
        except BaseException:
            with self._lock:
                self._pending.pop(key).set()
            raise
        with self._lock:
            self._items[key] = chunk
            self._bytes += chunk.nbytes
            self.decoded_bytes += chunk.nbytes
            while self._bytes > self.capacity and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.nbytes
            self._pending.pop(key).set()
        return chunk
