"""Helpers for the reliability tests: run a real ``fastdata`` process, stop it at a fault point, kill it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import fastdata

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: object, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``python -m fastdata ARGS`` to completion; returns the completed process (text output)."""
    return subprocess.run([sys.executable, "-m", "fastdata", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, cwd=ROOT)


def start_paused(args: list[object], fault: str, ready: Path) -> subprocess.Popen:
    """Start ``fastdata ARGS`` with ``FASTDATA_FAULT=fault`` and wait until it pauses there."""
    env = {**os.environ, "FASTDATA_FAULT": fault, "FASTDATA_FAULT_READY": str(ready)}
    # SIGINT back to its default in the child: pytest started in the background (`cmd &`) ignores it, and an
    # ignored signal stays ignored across exec, so the child would never see the test's Ctrl-C
    proc = subprocess.Popen([sys.executable, "-m", "fastdata", *map(str, args)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"fastdata ended (rc {proc.returncode}) before reaching {fault}: {err}{out}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"fastdata never reached {fault}")
        time.sleep(0.02)
    return proc


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the process and reap it."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def wait_dead(pid: int, timeout: float = 10) -> bool:
    """True once ``pid`` no longer runs (a zombie counts as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ", 1)[1].startswith("Z"):
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.02)
    return False


def same_dataset(a: Path, b: Path) -> None:
    """``b`` is byte for byte the dataset ``a``: the same files, shards and manifest."""
    names = sorted(p.name for p in a.iterdir())
    assert sorted(p.name for p in b.iterdir()) == names
    for n in names:
        assert (a / n).read_bytes() == (b / n).read_bytes(), n
    ra, rb = fastdata.open(a), fastdata.open(b)
    idx = np.arange(len(ra))
    for k, v in ra.get_batch(idx).items():
        assert np.array_equal(v, rb.get_batch(idx)[k]), k
