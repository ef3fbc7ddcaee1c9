"""Read ahead by the epoch plan: keep the disk busy with the bytes the next batches will read.

A loader knows every batch of its pass before the pass starts. :class:`ReadAhead` follows the
loader's position (``at(k)``: batch ``k`` is handed out now) in one small thread and, for each batch
up to a bounded distance ahead, tells the kernel the exact byte ranges of the shard files that
batch will read (``posix_fadvise(POSIX_FADV_WILLNEED)``, in pieces no longer than the kernel
reads for one hint). A range that continues the previous range of a file, or that the plan's next
batch continues (a sequential stream: ``shuffle="block"``, ``"shards"`` or ``False``), is read ahead
in order instead (:class:`_Streams`: copied into a reused buffer, or for streams that lie close together sent
to ``/dev/null``), which the kernel serves in larger requests. The
kernel queues those reads at once, many in flight, while the reader threads copy the batches before them; when a reader reaches a
sample, its pages are in the page cache or on their way. On a warm cache the hints are skipped:
one-byte non-blocking reads probe each batch (the end of each of its ranges), and once several
batches in a row were found cached, one probe a batch decides and a batch whose probe hits is not
hinted (one system call instead of one per range). A pass that found a batch not cached stays cold
to its end: what a later probe finds cached may be the read-ahead's own work.

The distance is bounded, so memory is too: hints go at most ``ahead_bytes`` of file ranges beyond
the batches the readers may already be reading (the loader's ``prefetch`` and workers), and at
least one batch. Hinted pages are ordinary page cache: the kernel drops them under memory pressure
like any other clean page, and nothing is held in the process (its RSS does not grow with it).
It works in whichever process reads (threads or worker processes share the page cache), for both
shard formats (HDF5 columns and per-sample chunks; LMDB records once their place is known), any
shuffle, sampler, DDP share or resumed position: it only hints, it never changes what is read.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

log = logging.getLogger("fastdata.reading.readahead")

DEFAULT_AHEAD_BYTES = 256 << 20
_MERGE_GAP = 64 << 10  # ranges closer than this are hinted as one (the gap is read too: cheaper than a seek)
WARM_STREAK = 4  # batches found in the page cache in a row before hints are skipped (ReadAhead._resident)
_MIN_CHUNK = 128 << 10  # Linux's default read-ahead: what one hint surely reads in full
_chunks: dict[int, int] = {}  # st_dev -> bytes one hint reads at most
STREAM_THREADS = 16  # threads reading sequential streams ahead (_Streams)
_STREAM_PIECE = 1 << 20  # bytes per read of a stream (_Streams._read)
SEQUENTIAL = True  # stream descriptors marked POSIX_FADV_SEQUENTIAL (_Streams._open)
SENDFILE: bool | None = None  # stream reads to /dev/null: None: as ReadAhead's sendfile says; True/False: always (A/Bs)
_STREAM_ENDS = 256  # stream ends remembered (the oldest forgotten first)
_STREAM_MIN = 1  # ranges a stream has had before its next ones are read, not hinted (its first is hinted)


def hint_chunk(path: Path | str) -> int:
    """The most one ``WILLNEED`` hint reads on the device holding ``path``: Linux reads at most
    ``max(read_ahead_kb, max_sectors_kb)`` of the device per call and drops the rest of a longer
    range (mm/readahead.c, ``force_page_cache_ra``), so longer ranges are hinted in pieces of this size.
    128 KiB (the default read-ahead) where the device's queue is not found (network filesystems)."""
    dev = os.stat(path).st_dev
    if dev not in _chunks:
        base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
        found = _MIN_CHUNK
        for queue in (f"{base}/queue", f"{base}/../queue"):  # a disk, or a partition of one
            try:
                kb = [int(Path(queue, name).read_text()) for name in ("read_ahead_kb", "max_sectors_kb")]
            except (OSError, ValueError):
                continue
            found = max(_MIN_CHUNK, max(kb) << 10)
            break
        _chunks[dev] = found
    return _chunks[dev]

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


def _merged(ranges: Ranges) -> list[tuple[Path, np.ndarray, np.ndarray]]:
    """Each file's ranges merged (:func:`merge_ranges`): what is probed, streamed and hinted."""
    return [(path, *merge_ranges(starts, lengths)) for path, starts, lengths in ranges]


class _Stream:
    """One sequential stream of a file: the ranges queued for it, read in order by one task at a time on
    one file descriptor (the kernel keeps its read-ahead window per open file, and grows it only for
    reads that follow each other on it)."""

    __slots__ = ("fd", "ranges", "queue", "busy", "dropped")

    def __init__(self) -> None:
        self.fd: int | None = None
        self.ranges = 0  # ranges the stream has had
        self.queue: deque[tuple[int, int]] = deque()
        self.busy = False  # a task is reading its queue
        self.dropped = False  # forgotten (too many streams, or closed): its task closes the fd


class _Streams:
    """Reads ahead the ranges that continue an earlier range of the same file (a sequential stream:
    ``shuffle="block"``/``"shards"``, or in order) with reads in order, each stream on its own
    file descriptor, by one task at a time (its next ranges queue behind the one being read). A hint
    (``WILLNEED``) fills the page cache with single pages, which the block layer sends to the disk as
    requests of at most ``max_segments`` pages (about 1 MB); reads in order on one descriptor let the
    kernel's own read-ahead grow the stream's window with large folios, in requests of several MB
    (benchmarks/bench_cold.py compares both). Each read is a ``pread`` into a reused buffer, or with
    ``sendfile`` sent to ``/dev/null`` (no copy, :meth:`_read`): on the test machine the faster for
    streams within a few shards (``"shards"``), slower for spread ones (``"block"``) and storage order
    (docs/loader.md); the loader chooses by its plan. The readers copy the bytes into the batch."""

    def __init__(self, sendfile: bool = False) -> None:
        self._pool = ThreadPoolExecutor(STREAM_THREADS, thread_name_prefix="fastdata-stream")
        self._ends: OrderedDict[tuple[Path, int], _Stream] = OrderedDict()  # (file, end of its last range)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._closed = False
        self._null: int | None = None  # /dev/null, the stream reads' sink (_read); open until close()
        if (sendfile if SENDFILE is None else SENDFILE) and hasattr(os, "sendfile"):
            with contextlib.suppress(OSError):
                self._null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        self._sendfile = self._null is not None  # False once a filesystem refused sendfile: pread from then on

    def continues(self, path: Path, off: int, size: int, starts: bool = False) -> bool:
        """Whether ``[off, off + size)`` is read here, in order: it starts where the last range of a
        stream of ``path`` ended, and that stream already had :data:`_STREAM_MIN` ranges, or ``starts``:
        the plan's next batch continues it (a stream's first range). Its end is remembered either way.
        (A uniform shuffle meets a neighbour by chance for a few ranges: those are read too, at the cost
        of one copy each.)"""
        with self._lock:
            st = self._ends.pop((path, off), None) or _Stream()
            read = (st.ranges >= _STREAM_MIN or starts) and not self._closed
            st.ranges += 1
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
                    st.fd = self._open(path)
                for at in range(off, off + size, _STREAM_PIECE):
                    if self._closed or self._read(st.fd, at, min(_STREAM_PIECE, off + size - at)) <= 0:
                        break
            except OSError as e:  # only read-ahead: the readers meet (and report) any real problem
                log.info("stream read-ahead of %s failed: %s", path, e)

    @staticmethod
    def _open(path: Path) -> int:
        """A stream's own descriptor, marked sequential where the platform allows
        (``POSIX_FADV_SEQUENTIAL``: Linux doubles the kernel's read-ahead window for it, so more of the
        stream is in flight at once: cold ``"block"`` read at 1.11x of the same without it in one
        run of benchmarks/bench_cold.py, whose streams are spread over the whole dataset)."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        if SEQUENTIAL and hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):  # only a hint
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return fd

    def _read(self, fd: int, at: int, n: int) -> int:
        """Read ``n`` bytes at ``at`` into the page cache, in order on ``fd``: sent to ``/dev/null``
        (``sendfile``: the kernel's read path and read-ahead, without copying the bytes to the process),
        else (not chosen, not available, or the filesystem refuses it) a ``pread`` into a reused buffer."""
        if self._sendfile and self._null is not None:
            try:
                return os.sendfile(self._null, fd, at, n)
            except OSError as e:
                if e.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                log.info("sendfile refused (%s): stream read-ahead copies with pread", e)
                self._sendfile = False
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = memoryview(bytearray(_STREAM_PIECE))
        return os.preadv(fd, [buf[:n]], at)

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
            if self._null is not None:
                os.close(self._null)
                self._null = None


class ReadAhead:
    """Hints the byte ranges of batches ``plan[first:]`` to the kernel, following :meth:`at`.

    ``ranges(batch)`` gives the file ranges one batch reads. ``lead``: batches the loader's readers
    may be reading ahead of the one handed out (hinted first, they are needed soonest);
    ``ahead_bytes``: how far beyond those the hints may run. ``memo``: a dict kept by the dataset across
    passes: ``memo["warm"]`` says the last batches probed were found cached; a pass that starts so
    probes one sample a batch at once (a pass of a few dozen batches otherwise spends its first ones
    hinting cached pages); a miss turns it cold, for the rest of the pass (:meth:`_resident`).
    ``sendfile``: stream reads go to ``/dev/null`` (:class:`_Streams`: streams within a few shards).
    ``close`` stops the thread."""

    def __init__(self, ranges: Callable[[np.ndarray], Ranges], plan: Sequence[np.ndarray], first: int, lead: int,
                 ahead_bytes: int = DEFAULT_AHEAD_BYTES, memo: dict[str, bool] | None = None,
                 sendfile: bool = False) -> None:
        self._ranges = ranges
        self._plan = plan
        self._k = first  # the batch handed out now
        self._next = first  # the next batch to hint
        self._lead = max(0, lead)
        self._ahead = max(0, ahead_bytes)
        self._sizes: dict[int, int] = {}  # batch -> bytes hinted (for the byte bound)
        self._fds: dict[Path, int] = {}
        self._chunk: dict[Path, int] = {}  # file -> bytes one hint may cover (hint_chunk)
        self._cond = threading.Condition()
        self._stop = False
        self.hinted_bytes = 0  # what was hinted in all (a figure for tests and benchmarks)
        self.skipped = 0  # batches not hinted: their data was found in the page cache (_resident)
        self._memo = {} if memo is None else memo
        self._hits = WARM_STREAK + 1 if self._memo.get("warm") else 0  # consecutive batches found resident
        self._missed = False  # a probe of this pass found a batch not cached: no more probes (_resident)
        self._probe = bytearray(1)
        self._can_probe = hasattr(os, "RWF_NOWAIT")
        self._streams = _Streams(sendfile)
        self.streamed_bytes = 0  # of hinted_bytes, what was read ahead as sequential streams
        self._kept: tuple[int, list[tuple[Path, np.ndarray, np.ndarray]]] | None = None  # (_merged_of)
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
            self._close_fds()

    def _fd(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            self._chunk[path] = hint_chunk(path)
        return fd

    def _resident(self, merged: list[tuple[Path, np.ndarray, np.ndarray]], warm: bool) -> bool:
        """Whether hints for this batch can be skipped: one-byte reads that may not block (``RWF_NOWAIT``)
        found its pages cached, and so did the probes of the WARM_STREAK batches before it. Until then
        (``warm`` false) the last byte of every merged range is probed (a batch only partly cached is
        not counted). Once warm, one probe in the middle of the batch's first range: on a warm cache the
        hints then cost one system call a batch; a probe that misses hints the batch at once (a cold or
        partly cached dataset). After a miss nothing is probed until the pass ends and every batch is
        hinted: a stream's read-ahead (the kernel's, 8 MB past the stream's last read on a disk like
        this one) caches whole ranges of the batches after it, so a streak of hits in a cold pass is the
        read-ahead's own work; taken for warm, it stops hinting and breaks the streams (5 of 32 batches
        of a cold ``"block"`` pass were skipped so, and that pass ran at 0.4 of the speed of the others)."""
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
        # warm so far: one sample's probe decides before the batch's ranges are worked out (their cost
        # showed on a warm cache); it missed, or not warm yet: the batch's ranges, probed and hinted
        warm = self._hits > WARM_STREAK
        batch = self._plan[j]
        merged = _merged(self._ranges(batch[:1])) if warm else self._merged_of(j)
        if self._resident(merged, warm):
            self.skipped += 1
            return 0
        if warm:
            merged = self._merged_of(j)
        following = {(path, o) for path, s, _ in self._merged_of(j + 1, keep=True) for o in s.tolist()}
        for path, s, n in merged:
            fd = self._fd(path)
            chunk = self._chunk[path]
            for off, size in zip(s.tolist(), n.tolist()):
                if self._streams.continues(path, off, size, starts=(path, off + size) in following):
                    self.streamed_bytes += size
                    continue
                for at in range(off, off + size, chunk):  # (a longer hint would be cut short by the kernel)
                    os.posix_fadvise(fd, at, min(chunk, off + size - at), os.POSIX_FADV_WILLNEED)
            total += int(n.sum())
        self.hinted_bytes += total
        return total

    def _merged_of(self, j: int, keep: bool = False) -> list[tuple[Path, np.ndarray, np.ndarray]]:
        """Batch ``j``'s merged ranges (none past the plan's end). ``keep``: remembered for the next call,
        which hints that batch: each batch's ranges are worked out once, though the batch before it asks
        for them too (where the ranges of the next batch start: a range of this batch ending at one of
        them begins a stream, read in order from its first range)."""
        if j >= len(self._plan):
            return []
        if self._kept is not None and self._kept[0] == j:
            merged = self._kept[1]
        else:
            merged = _merged(self._ranges(self._plan[j]))
        self._kept = (j, merged) if keep else None
        return merged

    def _close_fds(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()

    def close(self) -> None:
        """Stop hinting (a hint in flight finishes first; it is one system call)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._streams.stop()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


def supported() -> bool:
    """Whether this platform has ``posix_fadvise`` (Linux and most Unixes; not macOS or Windows)."""
    return hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_WILLNEED")


def drop_page_cache(paths: Sequence[Path | str]) -> int:
    """Ask the kernel to drop the cached pages of ``paths`` (``POSIX_FADV_DONTNEED`` on each whole
    file; no root needed, clean pages only, and pages some process has mapped stay): how cold reads
    are measured (benchmarks/bench_cold.py, ``fastdata bench --cold``). Returns the files' bytes."""
    total = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        try:
            total += os.fstat(fd).st_size
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return total


def resident_bytes(paths: Sequence[Path | str]) -> int:
    """Bytes of ``paths`` in the page cache now (``mincore`` over a fresh map of each file; Linux):
    how a cold measurement checks that the cache really was emptied."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    total = 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        with open(p, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as m:
            view = np.frombuffer(m, dtype=np.uint8)
            vec = np.zeros(-(-size // page), dtype=np.uint8)
            rc = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size),
                              ctypes.c_void_p(vec.ctypes.data))
            del view  # the map cannot close while numpy holds it
            if rc != 0:
                raise OSError(ctypes.get_errno(), f"mincore failed on {p}")
            total += min(int((vec & 1).sum()) * page, size)
    return total
