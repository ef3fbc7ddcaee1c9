"""The doctor's fix, followed: for each of the five users' scripts (tests/doctor_scripts), the doctor's projected
speedup, and the measured one of its printed fix, loader against loader on the same data.

``python benchmarks/doctor_fix_speed.py [--seconds S] [--only NAME]``: makes each user's data in a temporary
folder, runs ``fastdata doctor --seconds 30`` on the unchanged script, runs the printed convert command and
loader line as printed, then times the script's own DataLoader (as the script builds it) and the printed
fastdata loader, S seconds each (whole passes, samples per second), and the script's own training loop
(optimizer steps per second, S seconds, each in a fresh process as the user runs it) with its DataLoader and
with the fastdata loader in its place (the batches put in the script's form by the report's account); one
JSON row per script.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "doctor_scripts"
sys.path.insert(0, str(SCRIPTS))
import make_data  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402


def _module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"user_{name}", SCRIPTS / name)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _own(script: str, data: Path) -> Any:
    """The script's own DataLoader, built as its main() builds it (default arguments)."""
    m = _module(script)
    if script == "flim3d.py":
        return DataLoader(m.FlimDataset(str(data)), batch_size=8, shuffle=True, num_workers=0)
    if script == "pose_episodic.py":
        ds = m.PoseDataset(str(data))
        return DataLoader(ds, batch_sampler=m.Episodes(ds.labels, 20), num_workers=1)
    if script == "headpose.py":
        return DataLoader(m.HeadPose(str(data)), batch_size=8, shuffle=True, num_workers=0)
    if script == "seq_lstm.py":
        return DataLoader(m.Recordings(str(data)), batch_size=16, shuffle=True, num_workers=0, collate_fn=m.pad)
    return DataLoader(m.TwoViews(str(data)), batch_size=16, shuffle=True, num_workers=0)


USERS: dict[str, tuple[Callable[[Path], Path], str, list[str]]] = {
    # 256 volumes: with the tests' 32 (4 batches a pass) each pass's start-up would dominate either loader
    "flim": (lambda p: make_data.flim(p, n=256), "flim3d.py", ["--epochs", "500"]),
    "pose": (make_data.pose, "pose_episodic.py", ["--episodes", "2000", "--workers", "0"]),
    "headpose": (make_data.faces, "headpose.py", ["--epochs", "1000"]),
    "cnn_lstm": (make_data.recordings, "seq_lstm.py", ["--epochs", "100"]),
    "ssl": (make_data.photos, "ssl_views.py", ["--epochs", "100"]),
}


def _rate(loader: Any, seconds: float) -> float:
    """Samples per second over whole passes until ``seconds`` are up (the first batch not counted)."""
    n, t0, first = 0, None, True
    while t0 is None or time.perf_counter() - t0 < seconds:
        for b in loader:
            x = b["image"] if isinstance(b, dict) and "image" in b else b["x"] if isinstance(b, dict) else b[0]
            if first:
                t0, first = time.perf_counter(), False
                continue
            n += len(x)
            if time.perf_counter() - t0 >= seconds:
                break
    return n / (time.perf_counter() - t0)


def _as_script_batch(b: dict[str, Any], acc: dict[str, Any]) -> tuple[Any, ...]:
    """A fastdata batch in the order and form of the script's own (the report's account of each element)."""
    import torch

    out = []
    for f in acc["fields"].values():
        if f["role"] == "data":
            x = b["image"] if "image" in b else b["x"]
            out.append(x[:, 0] if acc["views"] > 1 else x)
        elif f["role"] == "view":
            out.append(b["image"][:, 1])
        elif f["role"] == "folder label":
            out.append(b["label"])
        elif f["role"] == "table":
            cols = f["columns"]
            out.append(b[cols[0]] if len(cols) == 1 else torch.stack([b[c] for c in cols], 1))
    return tuple(out)


def _train_rate(script: str, data: Path, args: list[str], seconds: float, swap: Any = None) -> float:
    """Optimizer steps per second of the script's own training loop (in this process, stopped after
    ``seconds``); with ``swap``, its DataLoader is replaced by the fastdata loader in the script's batch form."""
    import runpy

    import torch
    import torch.utils.data as tud

    stamps: list[float] = []
    saved = {c: c.step for c in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)}

    class Done(Exception):
        pass

    def timed(orig: Any) -> Any:
        def step(self: Any, *a: Any, **k: Any) -> Any:
            stamps.append(time.perf_counter())
            if stamps[-1] - stamps[0] > seconds:
                raise Done
            return orig(self, *a, **k)
        return step

    class Swapped:
        """The fastdata loader where the script makes its DataLoader: pass after pass (the script's own
        loop, or the time limit, ends it), each batch in the script's form."""

        num_workers, multiprocessing_context = 0, None

        def __init__(self, *a: Any, **k: Any) -> None:
            self.dataset = a[0] if a else k.get("dataset")

        def __iter__(self) -> Any:
            while True:
                yield from (_as_script_batch(b, swap[1]) for b in swap[0])

        def __len__(self) -> int:
            return 10 ** 6

    real = tud.DataLoader
    for c in saved:
        c.step = timed(saved[c])  # type: ignore[method-assign]
    if swap is not None:
        tud.DataLoader = Swapped  # type: ignore[misc]
    argv = sys.argv
    sys.argv = [script, str(data), *args]
    try:
        runpy.run_path(str(SCRIPTS / script), run_name="__main__")
    except Done:
        pass
    finally:
        sys.argv = argv
        tud.DataLoader = real  # type: ignore[misc]
        for c, f in saved.items():
            c.step = f  # type: ignore[method-assign]
    steps = stamps[2:]  # the first steps pay start-up
    return (len(steps) - 1) / (steps[-1] - steps[0]) if len(steps) > 1 else 0.0


def _train_in_own_process(work: Path, script: str, data: Path, args: list[str], seconds: float,
                          report: dict[str, Any] | None) -> float:
    """:func:`_train_rate` in a fresh process (as the script runs for its user), with the report's fix or not."""
    spec = {"script": script, "data": str(data), "args": args, "seconds": seconds,
            "fix": report["fix"][1:] if report else None, "account": report["account"] if report else None}
    p = subprocess.run([sys.executable, __file__, "--train", json.dumps(spec)], cwd=work, capture_output=True, text=True)
    lines = [x for x in p.stdout.splitlines() if x.startswith("steps_per_s ")]
    if not lines:
        raise RuntimeError(p.stderr[-2000:])
    return float(lines[-1].split()[1])


def _train_main(spec: dict[str, Any]) -> None:
    try:  # imported before DataLoader is swapped: Lightning's own checks keep the real class
        import lightning  # noqa: F401
    except ImportError:
        pass
    swap = None
    if spec["fix"]:
        ns: dict[str, Any] = {}
        exec("\n".join(spec["fix"]), ns)
        swap = (ns["loader"], spec["account"])
    print("steps_per_s", _train_rate(spec["script"], Path(spec["data"]), spec["args"], spec["seconds"], swap))


def one(name: str, seconds: float) -> dict[str, Any]:
    make, script, args = USERS[name]
    with tempfile.TemporaryDirectory(prefix="fastdata-doctor-fix-") as tmp:
        work = Path(tmp)
        data = make(work / name)
        out = work / "r.json"
        subprocess.run([sys.executable, "-m", "fastdata", "doctor", "--seconds", "30", "--json", str(out), "--",
                        sys.executable, str(SCRIPTS / script), str(data), *args], cwd=work, capture_output=True)
        r = json.loads(out.read_text())
        convert, imports, line = r["fix"]
        done = subprocess.run(convert, shell=True, cwd=work, capture_output=True, text=True)
        if done.returncode:
            return {"script": script, "fix": r["fix"], "projected": r.get("projected_speedup"), "error": done.stderr}
        ns: dict[str, Any] = {}
        here = os.getcwd()
        os.chdir(work)
        try:
            exec(imports + "\n" + line, ns)
            own, fast = _rate(_own(script, data), seconds), _rate(ns["loader"], seconds)
            train_own = _train_in_own_process(work, script, data, args, seconds, None)
            train_fast = _train_in_own_process(work, script, data, args, seconds, r)
        finally:
            os.chdir(here)
        return {"script": script, "fix": r["fix"], "printed": bool(r["commands"]), "projected": r.get("projected_speedup"),
                "own_samples_per_s": own, "fastdata_samples_per_s": fast, "measured_loader": fast / own,
                "own_steps_per_s": train_own, "fastdata_steps_per_s": train_fast,
                "measured_training": train_fast / train_own if train_own else None}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--only", choices=sorted(USERS))
    p.add_argument("--train", help=argparse.SUPPRESS)  # one training loop in this process (a JSON spec)
    a = p.parse_args()
    if a.train:
        _train_main(json.loads(a.train))
        return
    for name in [a.only] if a.only else USERS:
        print(json.dumps(one(name, a.seconds)), flush=True)


if __name__ == "__main__":
    main()
