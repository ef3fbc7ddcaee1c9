"""Plan-aware prefetch: download the shards an epoch plan needs, in the order it first needs them.

The loader knows its whole epoch before it starts. A :class:`PlanFollower` is told the batch
the loader is at; background threads keep the shards of the next batches the readers may be
reading, plus ``prefetch_shards`` more, in the cache. The same plan ranks cached shards for
eviction: the one whose next use (on any rank of the node) is furthest goes first, and a
prefetch never evicts a shard that is needed before the one it fetches.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Sequence

import numpy as np

from ..errors import FastdataError
from .store import RemoteStore

log = logging.getLogger("fastdata.remote")


def shards_of(batch: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The shards (indices into the manifest) holding the samples of ``batch``."""
    return np.unique(np.searchsorted(starts, batch, side="right") - 1)


class PlanFollower:
    """Prefetches for one rank's plan; ``plans`` holds every rank's batches (global positions)."""

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
                for s in shards_of(batch, starts).tolist():
                    uses.setdefault(s, set()).add(k)
                    if r == mine and k >= first and s not in seen:
                        seen.add(s)
                        seq.append((k, s))
        self._uses = {store.names[s]: sorted(ks) for s, ks in uses.items()}
        self._seq = seq
        self._k = first
        self._wake_at = first  # at() wakes the prefetch thread only once the loader reaches this batch
        self._done: set[int] = set()
        self._busy: dict[int, Future[bool]] = {}
        self._deferred_at: dict[int, int] = {}
        self._cond = threading.Condition()
        self._stop = False
        self._pool = ThreadPoolExecutor(store.options.download_threads, thread_name_prefix="fastdata-prefetch")
        store.priority = self.priority
        self._thread = threading.Thread(target=self._run, name="fastdata-prefetch-plan", daemon=True)
        self._thread.start()

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
        if k >= self._wake_at:
            with self._cond:
                self._cond.notify_all()

    def _wanted(self) -> list[tuple[int, int]]:
        horizon = self._k + self.lead
        out: list[tuple[int, int]] = []
        extra = 0
        for first, s in self._seq:
            if first > horizon:
                if extra >= self.store.options.prefetch_shards:
                    break
                extra += 1
            out.append((first, s))
        return out

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    return
                todo = [(first, s) for first, s in self._wanted()
                        if s not in self._done and s not in self._busy and self._deferred_at.get(s) != self._k]
                room = self.store.options.download_threads - len(self._busy)
                for _, s in todo[:max(room, 0)]:
                    bound = self.priority(self.store.names[s])
                    fut = self._pool.submit(self._fetch, s, bound)
                    self._busy[s] = fut
                # nothing changes until the horizon reaches the next shard's first batch (or a deferred
                # shard may find room once the loader moves on)
                later = [first for first, s in self._seq if first > self._k + self.lead]
                self._wake_at = self._k + 1 if self._deferred_at or not later else later[0] - self.lead
                self._cond.wait(timeout=0.5)

    def _fetch(self, s: int, bound: float) -> bool:
        ok = False
        try:
            ok = self.store.fetch(s, bound=bound)
        except FastdataError as e:  # the reader meets it too, and raises it with the batch named
            log.info("prefetch of %s failed: %s", self.store.where(self.store.manifest.shards[s].file), e)
            ok = True
        except Exception as e:  # noqa: BLE001 - never kill the prefetch thread
            log.warning("prefetch of shard %d failed: %s: %s", s, type(e).__name__, e)
            ok = True
        finally:
            with self._cond:
                self._busy.pop(s, None)
                if ok:
                    self._done.add(s)
                else:
                    self._deferred_at[s] = self._k  # no room now: try again when the loader moves on
                self._cond.notify_all()
        return ok

    def close(self) -> None:
        """Stop prefetching (downloads in flight finish in the background, then the threads end)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self.store.priority == self.priority:
            self.store.priority = None
        self._pool.shutdown(wait=False, cancel_futures=True)
