"""Read ahead by the epoch plan: hint (``POSIX_FADV_WILLNEED``) or stream in order the byte ranges the
next batches will read, so the disk stays busy; it only fills the page cache, never changes what is read."""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

log = logging.getLogger("fastdata.reading.readahead")

_MERGE_GAP = 64 << 10  # ranges closer than this are hinted as one (the gap is read too: cheaper than a seek)
WARM_STREAK = 4  # batches found in the page cache in a row before hints are skipped (ReadAhead._resident)
HINT_PIECE = 128 << 10  # Linux's default read-ahead: what one WILLNEED hint surely reads in full
STREAM_THREADS = 16  # threads reading sequential streams ahead (_Streams)
_STREAM_PIECE = 1 << 20  # bytes per read of a stream (the page cache keeps them)
_STREAM_ENDS = 256  # stream ends remembered (the oldest forgotten first)


Ranges = list[tuple[Path, np.ndarray, np.ndarray]]  # per shard file: (path, starts, lengths) in bytes


def merge_ranges(starts: np.ndarray, lengths: np.ndarray, gap: int = _MERGE_GAP) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, merged byte ranges covering ``starts``/``lengths`` (ranges closer than ``gap`` joined)."""
    if len(starts) == 0:
        return starts, lengths
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], starts[order] + lengths[order]
    reach = np.maximum.accumulate(e)
    new = np.concatenate(([True], s[1:] > reach[:-1] + gap))
    first = np.flatnonzero(new)
    last = np.concatenate((first[1:], [len(s)])) - 1
    return s[first], reach[last] - s[first]


def _merged(ranges: Ranges) -> Ranges:
    """Each file's ranges merged (:func:`merge_ranges`): what is probed, streamed and hinted."""
    return [(path, *merge_ranges(starts, lengths)) for path, starts, lengths in ranges]


@dataclass(slots=True)
class _Stream:
    """One sequential stream of a file: its queued ranges, read in order on its own descriptor (the kernel
    grows its read-ahead per open file)."""

    fd: int | None = None
    queue: deque[tuple[int, int]] = field(default_factory=deque)
    busy: bool = False  # a task is reading its queue
    dropped: bool = False  # forgotten (too many streams, or closed): its task closes the fd


class _Streams:
    """Reads ahead sequential streams with ``pread``s in order, one task per stream at a time, so the
    kernel's read-ahead sends the disk large requests."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(STREAM_THREADS, thread_name_prefix="fastdata-stream")
        self._ends: OrderedDict[tuple[Path, int], _Stream] = OrderedDict()  # (file, end of its last range)
        self._lock = threading.Lock()
        self._closed = False

    def continues(self, path: Path, off: int, size: int, starts: bool = False) -> bool:
        """Whether ``[off, off + size)`` is read here: it continues a stream of ``path``, or ``starts`` one (the
        plan's next batch continues it). Its end is remembered either way."""
        with self._lock:
            found = self._ends.pop((path, off), None)
            st = found or _Stream()
            read = (found is not None or starts) and not self._closed
            self._ends[(path, off + size)] = st
            while len(self._ends) > _STREAM_ENDS:
                self._forget(self._ends.popitem(last=False)[1])
            if read:
                st.queue.append((off, size))
                if not st.busy:
                    st.busy = True
                    self._pool.submit(self._drain, path, st)
        return read

    def _forget(self, st: _Stream) -> None:
        """(Under the lock.) A stream no longer followed: its fd closes now, or when its task ends."""
        st.dropped = True
        if not st.busy and st.fd is not None:
            os.close(st.fd)
            st.fd = None

    def _drain(self, path: Path, st: _Stream) -> None:
        """Read the stream's queued ranges in order on its fd until the queue is empty."""
        while True:
            with self._lock:
                if not st.queue or self._closed:
                    st.busy = False
                    if (st.dropped or self._closed) and st.fd is not None:
                        os.close(st.fd)
                        st.fd = None
                    return
                off, size = st.queue.popleft()
            try:
                if st.fd is None:
                    st.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                for at in range(off, off + size, _STREAM_PIECE):
                    if self._closed or not os.pread(st.fd, min(_STREAM_PIECE, off + size - at), at):  # (EOF)
                        break
            except OSError as e:  # only read-ahead: the readers meet (and report) any real problem
                log.info("stream read-ahead of %s failed: %s", path, e)

    def stop(self) -> None:
        """Stop reading: a read in flight ends after its current piece."""
        self._closed = True

    def close(self) -> None:
        """Wait for the reads submitted (all of them, unless :meth:`stop` came first), then close."""
        self._pool.shutdown(wait=True, cancel_futures=self._closed)
        self._closed = True
        with self._lock:
            for st in self._ends.values():
                if st.fd is not None:
                    os.close(st.fd)
                    st.fd = None
            self._ends.clear()


class ReadAhead:
    """Hints the byte ranges (``ranges(batch)``) of batches ``plan[first:]`` to the kernel, following :meth:`at`:
    the ``lead`` batches the readers may be at first, then up to ``ahead_bytes`` more; ``memo`` spans passes."""

    def __init__(self, ranges: Callable[[np.ndarray], Ranges], plan: Sequence[np.ndarray], first: int, lead: int,
                 ahead_bytes: int, memo: dict[str, bool] | None = None) -> None:
        self._ranges = ranges
        self._plan = plan
        self._k = first  # the batch handed out now
        self._next = first  # the next batch to hint
        self._lead = max(0, lead)
        self._ahead = max(0, ahead_bytes)
        self._sizes: dict[int, int] = {}  # batch -> bytes hinted (for the byte bound)
        self._fds: dict[Path, int] = {}
        self._cond = threading.Condition()
        self._stop = False
        self.hinted_bytes = 0  # what was hinted in all
        self.skipped = 0  # batches not hinted: their data was found in the page cache (_resident)
        self._memo = {} if memo is None else memo
        self._hits = WARM_STREAK + 1 if self._memo.get("warm") else 0  # consecutive batches found resident
        self._missed = False  # a probe of this pass found a batch not cached: no more probes (_resident)
        self._probe = bytearray(1)
        self._can_probe = hasattr(os, "RWF_NOWAIT")
        self._streams = _Streams()
        self.streamed_bytes = 0  # of hinted_bytes, what was read ahead as sequential streams
        self._thread = threading.Thread(target=self._run, name="fastdata-readahead", daemon=True)
        self._thread.start()

    def at(self, k: int) -> None:
        """The loader hands out batch ``k`` now."""
        with self._cond:
            self._k = k
            self._cond.notify()

    def _may_hint(self) -> bool:
        """Whether batch ``_next`` is within the bound (called with the lock held)."""
        j = self._next
        if j >= len(self._plan):
            return False
        if j <= self._k + self._lead:
            return True  # the readers may be at it already
        beyond = sum(n for b, n in self._sizes.items() if b > self._k + self._lead)
        return beyond < self._ahead or j == self._k + self._lead + 1

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop and not self._may_hint():
                        if self._next >= len(self._plan):
                            return
                        self._cond.wait()
                    if self._stop:
                        return
                    j = self._next
                    self._next += 1
                    for b in [b for b in self._sizes if b < self._k]:
                        del self._sizes[b]
                self._sizes[j] = self._hint(j)
        except Exception as e:  # noqa: BLE001 - only a hint: the readers meet (and report) any real problem
            log.info("read-ahead stopped: %s: %s", type(e).__name__, e)
        finally:
            self._streams.close()
            for fd in self._fds.values():
                os.close(fd)

    def _fd(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return fd

    def _resident(self, merged: Ranges, warm: bool) -> bool:
        """Whether hints for this batch can be skipped: non-blocking one-byte reads (``RWF_NOWAIT``) found it and
        the WARM_STREAK batches before it cached; after a miss the pass stays cold (the streams fill the cache)."""
        if not self._can_probe or self._missed or not merged or len(merged[0][1]) == 0:
            return False
        if warm:
            path, starts, lengths = merged[0]
            probes = [(path, int(starts[0]) + int(lengths[0]) // 2)]
        else:
            probes = [(path, o + n - 1) for path, starts, lengths in merged
                      for o, n in zip(starts.tolist(), lengths.tolist())]
        try:
            for path, at in probes:
                os.preadv(self._fd(path), [self._probe], at, os.RWF_NOWAIT)
        except BlockingIOError:
            self._hits = 0
            self._missed = True
            self._memo["warm"] = False
            return False
        except OSError:  # this filesystem does not take RWF_NOWAIT: always hint
            self._can_probe = False
            return False
        self._hits += 1
        self._memo["warm"] = self._hits > WARM_STREAK
        return self._hits > WARM_STREAK

    def _hint(self, j: int) -> int:
        """Hint (or stream) the byte ranges of batch ``j``; the bytes they cover (0: found cached)."""
        total = 0
        # warm: one sample's probe decides before the whole batch's ranges are worked out
        warm = self._hits > WARM_STREAK
        batch = self._plan[j]
        merged = _merged(self._ranges(batch[:1])) if warm else self._merged_of(j)
        if self._resident(merged, warm):
            self.skipped += 1
            return 0
        if warm:
            merged = self._merged_of(j)
        following = {(path, o) for path, s, _ in self._merged_of(j + 1) for o in s.tolist()}
        for path, s, n in merged:
            fd = self._fd(path)
            for off, size in zip(s.tolist(), n.tolist()):
                if self._streams.continues(path, off, size, starts=(path, off + size) in following):
                    self.streamed_bytes += size
                    continue
                for at in range(off, off + size, HINT_PIECE):  # (a longer hint may be cut short by the kernel)
                    os.posix_fadvise(fd, at, min(HINT_PIECE, off + size - at), os.POSIX_FADV_WILLNEED)
            total += int(n.sum())
        self.hinted_bytes += total
        return total

    def _merged_of(self, j: int) -> Ranges:
        """Batch ``j``'s merged ranges (none past the plan's end)."""
        return _merged(self._ranges(self._plan[j])) if j < len(self._plan) else []

    def close(self, _current: Callable[[], threading.Thread] = threading.current_thread) -> None:
        """Stop hinting (a hint in flight finishes first; it is one system call). ``_current`` is bound here: a
        pass left open to the interpreter's exit is closed after this module's globals are gone."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._streams.stop()
        if self._thread is not _current():
            self._thread.join(timeout=5)


def supported() -> bool:
    """Whether this platform has ``posix_fadvise`` (Linux and most Unixes; not macOS or Windows)."""
    return hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_WILLNEED")


def drop_page_cache(paths: Sequence[Path | str]) -> int:
    """Ask the kernel to drop the cached pages of ``paths`` (``POSIX_FADV_DONTNEED``; clean, unmapped pages
    only, no root needed), to measure cold reads; returns the files' bytes."""
    total = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        try:
            total += os.fstat(fd).st_size
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return total
