"""Does ``fastdata doctor`` measure what a script measures itself, and does its projection hold?

Five small training scripts (tests/doctor_scripts: a 3D CNN over .npy volumes, an image classifier over
JPEGs with PIL transforms, a LightningModule CNN-LSTM over variable-length .npy, an episodic few-shot
sampler, and the 3D CNN again with more workers), each on small data made here. Per script:
1. the script alone, timing its own waits ($DIRECT_TIMING: tests/doctor_scripts/_direct.py), and
2. the script switched to ``fastdata.loader`` over the converted data (``fastdata convert``), interleaved,
   ROUNDS times each (medians);
3. the script under ``fastdata doctor --steps N`` (timing itself too: the same run's direct figure),
   in the same rounds; the row shows the doctor run whose projection is the median, and the JSON every run.
Figures: the doctor's wait fraction vs the direct ones (separate runs and the same run), its projected
speedup vs the one measured (step time of 1 / step time of 2), and its overhead: the step time
the script measures under the doctor vs alone, and the hooks' own cost per batch measured in-process.
Usage: python benchmarks/bench_doctor.py [--quick]   (quick: tiny data, figures meaningless)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROUNDS = 5  # runs of the script alone and switched to fastdata (median step); a single run moves 25% either way
ROOT = HERE.parent
SCRIPTS = ROOT / "tests" / "doctor_scripts"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(SCRIPTS))
import _harness  # noqa: E402
import make_data  # noqa: E402

from fastdata.measure.doctor.report import render  # noqa: E402


def _cases(work: Path, quick: bool) -> list[dict[str, Any]]:
    k = 4 if quick else 1
    vol = make_data.volumes(work / "vol", n=128 // k, side=40)
    img = make_data.jpegs(work / "img", n=384 // k, side=448)
    seq = make_data.sequences(work / "seq", n=256 // k, longest=400)
    clip = make_data.clips(work / "clip", classes=10, per_class=24 // k, length=256 * 256)
    return [
        {"name": "3D CNN, .npy volumes, 1 worker", "script": "cnn3d_npy.py", "data": vol, "args": ["--epochs", "3"],
         "convert": []},
        {"name": "3D CNN, .npy volumes, 0 workers", "script": "cnn3d_npy.py", "data": vol,
         "args": ["--epochs", "3", "--workers", "0"], "convert": []},
        {"name": "image classifier, JPEG + PIL", "script": "image_folder.py", "data": img, "args": ["--epochs", "3"],
         "convert": ["--images", "raw", "--size", "112", "112"]},
        {"name": "Lightning CNN-LSTM, ragged .npy", "script": "lightning_seq.py", "data": seq,
         "args": ["--epochs", "3"], "convert": []},
        {"name": "episodic few-shot sampler", "script": "episodic.py", "data": clip, "args": ["--episodes", "60"],
         "convert": []},
    ]


def _run(cmd: list[str], timing: Path, env_extra: dict[str, str] | None = None) -> list[list[float]]:
    env = dict(os.environ, DIRECT_TIMING=str(timing), PYTHONPATH=os.pathsep.join([str(ROOT), str(SCRIPTS)]),
               **(env_extra or {}))
    timing.unlink(missing_ok=True)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return json.loads(timing.read_text()) if timing.exists() else []


def _fraction(rows: list[list[float]], below: int | None = None) -> tuple[float, float]:
    rows = [r for r in rows if below is None or r[0] < below]
    waits, steps = sum(r[1] for r in rows), sum(r[2] for r in rows)
    return waits / steps, steps / len(rows)


def _case(c: dict[str, Any], work: Path, steps: int) -> dict[str, Any]:
    script = [sys.executable, str(SCRIPTS / c["script"]), str(c["data"]), *c["args"]]
    ds = work / (c["data"].name + ".fd")
    if not ds.exists():
        subprocess.run([sys.executable, "-m", "fastdata", "convert", str(c["data"]), str(ds), "--quiet",
                        *c["convert"]], check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    alone, after, doctor = [], [], []
    for k in range(ROUNDS):  # interleaved: the machine's other load drifts between runs
        alone.append(_fraction(_run(script, work / "t_alone.json")))
        after.append(_fraction(_run([*script, "--fastdata", str(ds)], work / "t_fastdata.json")))
        report = work / f"doctor{k}.json"
        under = _run([sys.executable, "-m", "fastdata", "doctor", "--steps", str(steps), "--json", str(report),
                      "--", *script], work / "t_doctor.json")
        r = json.loads(report.read_text())
        doctor.append((r, _fraction(under, below=r["loader"]["batches"])))
    # the doctor run whose projection is the median of the rounds: one run's figures, its report and its
    # same-run direct timing, like the medians of the script's own runs (a single run moved 20% either way)
    doctor.sort(key=lambda d: d[0]["projected_speedup"] or 0.0)
    r, (same_wait, same_step) = doctor[len(doctor) // 2]
    direct_wait = statistics.median(w for w, _ in alone)
    direct_step = statistics.median(st for _, st in alone)
    fd_step = statistics.median(st for _, st in after)
    return {"name": c["name"], "doctor_wait": r["wait_fraction"], "direct_wait": direct_wait,
            "direct_wait_same_run": same_wait, "verdict": r["bottleneck"], "doctor_step_s": r["step_s"],
            "direct_step_s": direct_step, "step_s_under_doctor": same_step,
            "compute_only_step_s": r["compute_only_step_s"], "projected_speedup": r["projected_speedup"],
            "actual_speedup": direct_step / fd_step, "fastdata_step_s": fd_step, "rendered": render(r),
            "doctor_runs": [{"projected_speedup": d["projected_speedup"], "wait": d["wait_fraction"],
                             "same_run_wait": sw, "verdict": d["bottleneck"], "step_s": d["step_s"],
                             "projected_step_s": d.get("projected_step_s"), "beside": d.get("beside"),
                             "basis": d.get("projection_basis")} for d, (sw, _) in doctor],
            "report": {k: r.get(k) for k in ("verdict", "projected_wait_fraction", "projection", "workers",
                                             "projected_step_s", "projection_basis", "beside")}}


def hook_cost(batches: int = 3000) -> dict[str, float]:
    """The hooks' own time per batch, in interleaved rounds with and without them: a DataLoader without
    workers whose dataset reads a tiny .npy file per sample (4 a batch), so the main-process hooks and the
    worker-side ones (fetch and collate timing, the wrapped open() and np.load) all run in this process;
    the difference is what the doctor adds to each step (to the workers' time, with workers)."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    from fastdata.measure.doctor import _probe

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.npy"
        np.save(path, np.zeros(2, np.float32))

        class Files(Dataset):  # type: ignore[type-arg]
            def __len__(self) -> int:
                return batches * 4

            def __getitem__(self, i: int) -> torch.Tensor:
                return torch.from_numpy(np.load(path))

        def once() -> float:
            t = time.perf_counter()
            for _ in DataLoader(Files(), batch_size=4):
                pass
            return (time.perf_counter() - t) / batches

        plain, hooked = [], []
        for _ in range(5):
            plain.append(once())
            _probe.install(Path(tmp) / "doctor")
            try:
                hooked.append(once())
            finally:
                _probe.uninstall()
    return {"plain_s_per_batch": statistics.median(plain), "hooked_s_per_batch": statistics.median(hooked),
            "added_s_per_batch": statistics.median(hooked) - statistics.median(plain)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny data (CI smoke run; figures meaningless)")
    p.add_argument("--out", default=str(_harness.DEFAULT_RESULTS_DIR))
    p.add_argument("--only", metavar="TEXT", help="only the scripts whose name contains TEXT (results: doctor_only)")
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="fastdata-bench-doctor-"))
    try:
        rows = [_case(c, work, steps=8 if a.quick else 24) for c in _cases(work, a.quick)
                if a.only is None or a.only.lower() in c["name"].lower()]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cost = hook_cost(300 if a.quick else 3000)
    for r in rows:
        r["hook_overhead_fraction"] = cost["added_s_per_batch"] / r["direct_step_s"]
        r["step_overhead_fraction"] = r["step_s_under_doctor"] / r["direct_step_s"] - 1
    table = _harness.markdown_table(
        ["script", "doctor wait", "direct wait (own run)", "direct wait (same run)", "verdict", "projected speedup",
         "actual speedup", "hooks' cost / step", "step under doctor vs alone"],
        [[r["name"], f"{r['doctor_wait']:.0%}", f"{r['direct_wait']:.0%}", f"{r['direct_wait_same_run']:.0%}",
          r["verdict"], f"{r['projected_speedup']:.2f}x" if r["projected_speedup"] else "-",
          f"{r['actual_speedup']:.2f}x", f"{r['hook_overhead_fraction']:.2%}", f"{r['step_overhead_fraction']:+.1%}"]
         for r in rows])
    runs = _harness.markdown_table(
        ["script", "projected speedup per doctor run", "doctor wait / same-run direct wait per run"],
        [[r["name"], ", ".join(f"{d['projected_speedup']:.2f}x" if d["projected_speedup"] else "-"
                                for d in r["doctor_runs"]),
          ", ".join(f"{d['wait']:.0%} / {d['same_run_wait']:.0%}" for d in r["doctor_runs"])] for r in rows])
    md = (f"# fastdata doctor vs direct measurement{' (quick: meaningless)' if a.quick else ''}\n\n{table}\n\n"
          f"Each doctor run (ROUNDS={ROUNDS}, interleaved with the script's own runs; the row above is the "
          f"median run's):\n\n{runs}\n\n"
          f"Hooks' cost per batch (in-process, a loader of 4 tiny .npy files a batch, main-process and worker-side "
          f"hooks): {cost['added_s_per_batch'] * 1e6:.1f} us of {cost['plain_s_per_batch'] * 1e6:.0f} us.\n\n"
          + "".join("## The doctor's report on the image classifier (docs/doctor.md shows it)\n\n```text\n"
                    f"{r['rendered']}```\n" for r in rows if r["name"].startswith("image")))
    name = "doctor_quick" if a.quick else "doctor_only" if a.only else "doctor"
    _harness.write_results(name, {"machine": _harness.machine_info(), "quick": a.quick, "cases": rows,
                                  "hook_cost": cost}, md, a.out)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
