"""A training process for the shared-ring kill tests (tests/test_process_ring.py).

Usage: python ring_victim.py DATASET ACTION READY. Starts a loader with 2 worker processes, reads
a batch, writes READY as JSON (its pid, the workers' pids, and every shared mapping of those
processes: /dev/shm files and memfds), then does ACTION:
- ``exit``: return without closing anything; ``raise``: raise an error mid-epoch;
- ``loop``: keep reading batches, slowly, until stopped (the test kills or interrupts it); a
  worker's death ends it with exit code 3 and the loader's error on stderr;
- ``hang``: the loader (in order) has a transform that sleeps for an hour on every batch after the
  first, so both workers are stuck in it while the training process waits (the test kills it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import psutil

import fastdata
from fastdata.errors import LoaderWorkerError
from fastdata.loaders import LoaderConfig


def shared_mappings(pid: int) -> list[str]:
    """Paths of the shared memory ``pid`` maps: /dev/shm files and memfds."""
    with open(f"/proc/{pid}/maps") as f:
        paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    return sorted(p for p in paths if p.startswith("/dev/shm/") or p.startswith("/memfd:"))


def _stuck(batch, rng):
    if batch["label"][0] >= 4:  # every batch after the first (in order)
        time.sleep(3600)


def main(path: str, action: str, ready: str) -> int:
    # Ctrl-C raises KeyboardInterrupt, as in a training process started from a terminal; a process started in the
    # background by a non-interactive shell (a CI job, say) inherits SIGINT ignored, and Python then keeps it so
    signal.signal(signal.SIGINT, signal.default_int_handler)
    hang = {"shuffle": False, "transform": _stuck} if action == "hang" else {}
    ld = fastdata.loader(path, 4, device="cpu", num_workers=2, config=LoaderConfig(mode="processes"), **hang)
    it = iter(ld)
    next(it)
    workers = [p.pid for p in psutil.Process().children()]
    state = {"pid": os.getpid(), "workers": workers,
             "maps": {str(p): shared_mappings(p) for p in [os.getpid(), *workers]}}
    with open(ready + ".tmp", "w") as f:
        json.dump(state, f)
    os.replace(ready + ".tmp", ready)
    if action == "exit":
        return 0
    if action == "raise":
        raise RuntimeError("the training step failed")
    try:
        while True:
            for _batch in ld:
                time.sleep(0.01)
    except LoaderWorkerError as e:
        print(e, file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
