"""The local engine: shards written in this process, or in a pool of forked worker processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import sys
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable

from fastdata.errors import FastdataError
from fastdata.format import ShardInfo
from fastdata.write.options import Progress
from fastdata.write.shard_task import ShardTask, init_worker, write_shard

Finished = Callable[[ShardTask, ShardInfo, bool], None]
__all__ = ["Finished", "LocalEngine", "mp_context"]


@dataclass
class LocalEngine:
    """Shards written in this process (one worker) or in a pool of forked processes."""

    workers: int

    def run(self, tasks: list[ShardTask], progress: Progress | None, finished: Finished) -> None:
        if self.workers <= 1:
            update = progress.update if progress is not None else None
            for t in tasks:
                finished(t, *write_shard(t, update))
        else:
            _write_parallel(tasks, self.workers, progress, finished)


def mp_context() -> Any:
    # fork on Linux, as torch's DataLoader: works without a ``__main__`` guard; workers never use a parent handle.
    return mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")


def _write_parallel(tasks: list[ShardTask], workers: int, progress: Progress | None, finished: Finished) -> None:
    ctx = mp_context()
    q = ctx.Queue()

    def drain() -> None:
        while True:
            try:
                n, b = q.get_nowait()
            except queue.Empty:
                return
            if progress is not None:
                progress.update(n, b)

    todo = iter(tasks)
    error: BaseException | None = None
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=init_worker,
                             initargs=(q, os.getpid())) as ex:
        # At most one task per worker, none ever cancelled: a cancelled future hangs the pool when a worker dies.
        pending: dict[Future[tuple[ShardInfo, bool]], ShardTask] = {}
        while True:
            while error is None and len(pending) < workers and (task := next(todo, None)) is not None:
                try:
                    pending[ex.submit(write_shard, task)] = task
                except BrokenProcessPool as e:  # a worker died while another task was finishing
                    error = e
            if not pending:
                break
            done, _ = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            drain()
            for fut in sorted(done, key=lambda f: pending[f].index):
                task = pending.pop(fut)
                if fut.exception() is not None:
                    # Journal the running shards that still finish: less to redo.
                    error = error or fut.exception()
                    continue
                try:
                    finished(task, *fut.result())
                except BaseException as e:  # the journal could not be written (disk full?)
                    error = error or e
    drain()  # workers flush their queue feeders when they exit at shutdown
    q.close()
    if isinstance(error, BrokenProcessPool):
        raise FastdataError("a conversion worker process died (killed, or out of memory?)") from None
    if error is not None:
        raise error
