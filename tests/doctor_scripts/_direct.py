"""Direct timing for the doctor's test scripts: with $DIRECT_TIMING=FILE, time each next() of the loop.

Leaves out the first 2 batches of each pass, as the doctor does, and writes {"wait_fraction", "step_s"}.
Without the variable the batches pass through untouched.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Iterable, Iterator

_waits: list[float] = []
_steps: list[float] = []


def timed(loader: Iterable[Any]) -> Iterator[Any]:
    if not os.environ.get("DIRECT_TIMING"):
        yield from loader
        return
    it = iter(loader)
    prev, pos = None, 0
    while True:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            return
        got = time.perf_counter()
        if pos >= 2 and prev is not None:
            _waits.append(got - t0)
            _steps.append(got - prev)
        prev, pos = got, pos + 1
        yield batch
        _write()


def _write() -> None:
    path = os.environ.get("DIRECT_TIMING")
    if path and _steps and len(_steps) % 5 == 0:
        json.dump({"wait_fraction": sum(_waits) / sum(_steps), "step_s": sum(_steps) / len(_steps),
                   "steps": len(_steps)}, open(path, "w"))
