"""Worker processes and their shared-memory ring (fastdata/loaders/procs.py): the same batches
as reader threads for every kind of field, handed out without a copy from slots that are reused once
let go; a batch held by the training loop stays intact; a worker's death is an error naming it; and
whatever ends the training process or a worker (a normal exit, an exception, Ctrl-C, SIGKILL), no
process and no shared memory of the loader is left behind, and the next run starts cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import imagegen as g
import numpy as np
import psutil
import pytest
import torch
from crashkit import wait_dead
from scenarios.kit import make_dataset

import fastdata
from fastdata.errors import LoaderWorkerError
from fastdata.loaders import LoaderConfig

ROOT = Path(__file__).resolve().parents[1]
VICTIM = ROOT / "tests" / "scenarios" / "ring_victim.py"
PROCS = LoaderConfig(mode="processes")


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("ring"), n=64)


def _mixed(tmp_path: Path) -> Path:
    """Ragged sequences of growing length, mixed-size JPEG/PNG images and a string field."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(24):
        h, w = 6 + i % 7, 5 + (i * 3) % 11
        (g.png_rgb if i % 2 else g.jpeg)(src / "a" / f"{i:03d}.{'png' if i % 2 else 'jpg'}", h=h, w=w, seed=i)
    fastdata.convert(src, tmp_path / "img", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)))
    seq = tmp_path / "seq"
    seq.mkdir()
    for i in range(24):
        np.save(seq / f"{i:02d}.npy", np.full((1 + i * 2, 3), i, np.int32))  # later batches are longer
    fastdata.convert(seq, tmp_path / "seqds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)))
    return tmp_path


def _epoch(path, mode, workers=2, **kw):
    with fastdata.loader(path, 5, shuffle=False, device="cpu", num_workers=workers,
                         config=LoaderConfig(mode=mode, **kw)) as ld:
        return [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()} for b in ld], ld.stats()


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], torch.Tensor):
                assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k], k


@pytest.mark.parametrize("kind", ["img", "seqds"])
def test_ragged_fields_and_decoded_images_match_threads_and_slots_grow_to_fit(tmp_path, kind):
    path = _mixed(tmp_path) / kind
    threads, _ = _epoch(path, "threads", image_dtype="uint8")
    procs, stats = _epoch(path, "processes", image_dtype="uint8")
    _same(threads, procs)
    # the first batches of each slot did not fit (ragged sizes are learnt) and crossed as counted copies
    assert stats["ring_copied"] >= 1
    with fastdata.loader(path, 5, shuffle=False, device="cpu", num_workers=2,
                         config=LoaderConfig(mode="processes", image_dtype="uint8")) as ld:
        for _ in range(3):
            got = [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in b.items()} for b in ld]
        _same(threads, got)
        copied = ld.stats()["ring_copied"]
        list(ld)
        assert ld.stats()["ring_copied"] == copied, "slots grown to the batches' sizes: no more copies"


def test_batches_come_from_reused_slots_without_copies(ds):
    with fastdata.loader(ds, 4, device="cpu", num_workers=2, config=PROCS) as ld:
        ptrs = set()
        for _ in range(3):
            for b in ld:
                ptrs.add(b["x"].data_ptr())
        s = ld.stats()
        assert s["ring_copied"] == 0 and s["ring_grown"] == 0
        assert len(ptrs) <= s["ring_slots"] < 3 * len(ld), "slots are reused, not made per batch"
        # a batch's tensors are views of one shared slot (nothing was copied into private memory)
        b = next(iter(ld))
        assert b["x"].untyped_storage().data_ptr() == b["label"].untyped_storage().data_ptr()


def test_held_batches_stay_intact_and_the_ring_grows_instead_of_waiting(ds):
    with fastdata.loader(ds, 4, shuffle=False, device="cpu", num_workers=2, config=PROCS) as ld:
        held = list(ld)  # every batch kept: no slot may be reused under them
        assert ld.stats()["ring_grown"] > 0
        list(ld)  # another epoch reads into other slots
    assert [i for b in held for i in b["label"].tolist()] == list(range(64))
    stored = fastdata.open(ds).get_batch(np.arange(64))["x"]
    np.testing.assert_array_equal(torch.cat([b["x"] for b in held]).numpy(), stored)


def test_a_killed_worker_is_an_error_naming_it_and_the_next_pass_starts_new_workers(ds):
    ld = fastdata.loader(ds, 4, shuffle=False, device="cpu", num_workers=2, config=PROCS)
    before = {p.pid for p in psutil.Process().children()}  # (an earlier test's children may still be exiting)
    it = iter(ld)
    next(it)
    workers = [p for p in psutil.Process().children() if p.pid not in before]
    assert len(workers) == 2, workers
    victim = max(workers, key=lambda p: p.pid)
    victim.kill()
    assert wait_dead(victim.pid)  # gone before the loader next writes to it or waits on it: both notice alike
    with pytest.raises(LoaderWorkerError, match=rf"worker process \d \(pid {victim.pid}\) was killed by signal 9"):
        for _ in it:
            pass
    assert [i for b in ld for i in b["label"].tolist()] == list(range(64))
    ld.close()


def _start(ds, action, ready):
    return subprocess.Popen([sys.executable, str(VICTIM), str(ds), action, str(ready)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"})


def _wait_ready(proc, ready: Path) -> dict:
    deadline = time.monotonic() + 120
    while not ready.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the training process ended (rc {proc.returncode}) before it was ready: {err}{out}")
        assert time.monotonic() < deadline, "the training process never got ready"
        time.sleep(0.02)
    return json.loads(ready.read_text())


def _case(ds, tmp_path: Path, action: str) -> None:
    """Run the training process to ``action`` and check that nothing of its loader is left."""
    ready = tmp_path / f"ready-{action}"
    proc = _start(ds, "loop" if action in ("sigint", "sigkill", "kill-worker") else action, ready)
    state = _wait_ready(proc, ready)
    pids = [state["pid"], *state["workers"]]
    assert len(state["workers"]) == 2
    maps = [m for p in pids for m in state["maps"][str(p)]]
    assert not [m for m in maps if m.startswith("/dev/shm/")], "the ring has no name in /dev/shm"
    assert all(any(m.startswith("/memfd:fastdata-ring") for m in state["maps"][str(p)]) for p in pids), \
        "the training process and both workers map the ring"
    if action == "sigint":
        os.kill(proc.pid, signal.SIGINT)
    elif action == "sigkill":
        os.kill(proc.pid, signal.SIGKILL)
    elif action == "kill-worker":
        os.kill(state["workers"][1], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    expected = {"exit": 0, "raise": 1, "sigkill": -signal.SIGKILL, "kill-worker": 3}
    if action == "sigint":
        assert "KeyboardInterrupt" in err or proc.returncode == -signal.SIGINT
    else:
        assert proc.returncode == expected[action], err
    if action == "raise":
        assert "the training step failed" in err
    if action == "kill-worker":
        assert re.search(rf"worker process \d \(pid {state['workers'][1]}\) was killed by signal 9", err), err
    for pid in pids:
        assert wait_dead(pid, timeout=10), f"process {pid} of the loader outlived {action}"
    assert not [m for m in maps if m.startswith("/dev/shm/") and os.path.exists(m)]


@pytest.mark.parametrize("action", ["raise", *(pytest.param(a, marks=pytest.mark.slow) for a in ("sigint", "sigkill", "kill-worker"))])
def test_nothing_of_the_loader_outlives_its_processes(ds, tmp_path, action):
    """A training process ends (by an exception, by Ctrl-C, by SIGKILL) or loses a worker (SIGKILL):
    every process of the loader is gone, and it mapped nothing under /dev/shm (the ring's memory has no
    name: it goes with its last process). After the SIGKILL, the next run starts cleanly and ends
    normally (leaving nothing either)."""
    _case(ds, tmp_path, action)
    if action == "sigkill":
        _case(ds, tmp_path, "exit")


@pytest.mark.slow
def test_workers_stuck_in_a_transform_go_when_the_training_process_is_killed(ds, tmp_path):
    """Both workers are inside a transform that sleeps for an hour when the training process is SIGKILLed:
    each notices within half a second all the same (they only checked between batches, and stayed)."""
    ready = tmp_path / "ready-hang"
    proc = _start(ds, "hang", ready)
    state = _wait_ready(proc, ready)
    time.sleep(1)  # both workers are in the transform by now
    assert all(psutil.pid_exists(pid) for pid in state["workers"])
    os.kill(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=60)  # not communicate(): a stuck worker holds its pipes open
        for pid in state["workers"]:
            assert wait_dead(pid, timeout=10), f"worker {pid} outlived the killed training process"
    finally:
        for pid in state["workers"]:
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)
        proc.communicate()
