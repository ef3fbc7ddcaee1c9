"""Plan-aware prefetch: download the shards an epoch plan needs, in the order it first needs them; the same
plan evicts the cached shard needed furthest ahead first (on any rank of the node)."""

from __future__ import annotations

import bisect
import logging
import math
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from fastdata.errors import FastdataError
from fastdata.remote.store import RemoteStore

log = logging.getLogger("fastdata.remote")


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
