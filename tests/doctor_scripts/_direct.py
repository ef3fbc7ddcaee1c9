"""Direct timing for the doctor's test scripts: with $DIRECT_TIMING=FILE, time each next() of the loop.

Records, for every batch after the first 2 of its pass (as the doctor does), the wait in next() and the
step since the previous batch, with the batch's number in the run, and writes them to FILE as JSON.
Without the variable the batches pass through untouched.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Iterable, Iterator

_rows: list[tuple[int, float, float]] = []  # (batch number in the run, wait, step)
_count = [0]


def timed(loader: Iterable[Any]) -> Iterator[Any]:
    if not os.environ.get("DIRECT_TIMING"):
        yield from loader
        return
    it = iter(loader)
    prev, pos = 0.0, 0
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            return
        got = time.perf_counter()
        mark(pos, got - t0, got - prev)
        prev, pos = got, pos + 1
        yield batch


def mark(pos: int, wait: float, step: float) -> None:
    """One batch: its position in the pass, the wait for it, the time since the previous batch."""
    if pos >= 2:
        _rows.append((_count[0], wait, step))
    _count[0] += 1
    if _count[0] % 4 == 0:
        with open(os.environ["DIRECT_TIMING"], "w") as f:
            json.dump(_rows, f)
