"""A small LRU of decoded chunks, shared by the reader threads of one process.

Reading a chunked array row by row would decode a whole chunk for each row. Readers of an
in-place index (fastdata/format/inplace.py) keep the chunks they decoded here, so consecutive
batches drawn from the same few chunks (``shuffle=Shards()``) decode each chunk once. A chunk
that one thread is decoding is waited for by the others, never decoded twice at the same time.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Callable, Hashable

import numpy as np

DEFAULT_BYTES = 64 << 20
_RETIRED = 4  # dropped chunk buffers kept for reuse
MIN_CHUNKS = 6  # kept at least: shuffle=Shards() mixes 2 chunks at a time, and readers run a batch or two ahead


class ChunkCache:
    """Decoded chunks by key, least recently used dropped first beyond ``capacity`` bytes (the
    chunk being added is always kept). ``decoded_bytes`` counts what was decoded, for measurements."""

    def __init__(self, capacity: int = DEFAULT_BYTES) -> None:
        self.capacity = capacity
        self._items: OrderedDict[Hashable, np.ndarray] = OrderedDict()
        self._pending: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self._bytes = 0
        self._retired: list[np.ndarray] = []  # dropped chunks, for reuse once no reader holds them
        self.decoded_bytes = 0

    def buffer(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An array for a chunk to be decoded into: a dropped chunk's memory when no reader still
        holds it (its pages are mapped already: no page faults, unlike a fresh one), else a new one."""
        with self._lock:
            for k in range(len(self._retired)):
                a = self._retired[k]
                # held by this list, ``a`` and getrefcount's argument only: no reader is copying from it
                if a.shape == shape and a.dtype == dtype and sys.getrefcount(a) == 3:
                    return self._retired.pop(k)
        return np.empty(shape, dtype=dtype)

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
                self._retired = [old, *self._retired[: _RETIRED - 1]]
            self._pending.pop(key).set()
        return chunk
