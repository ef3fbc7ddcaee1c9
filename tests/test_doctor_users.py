"""The doctor's fix keeps what each of the five users' scripts uses (tests/doctor_scripts, /work/shared/context).

Each script runs unchanged under ``fastdata doctor``; its convert command and loader line are run as printed
(the JSON's ``fix``, which is what the report prints whenever it prints a fix), and the fastdata batches must
hold every target the script's own samples held, sample by sample (matched by value: the loader shuffles).
The fast tests check the same logic on a synthetic account, without running a script.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

SCRIPTS = Path(__file__).parent / "doctor_scripts"
sys.path.insert(0, str(SCRIPTS))
import make_data  # noqa: E402


def _script_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"user_{name}", SCRIPTS / name)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _doctor(tmp_path: Path, script: str, data: Path, *args: str, seconds: str = "20") -> tuple[dict[str, Any], str]:
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "fastdata", "doctor", "--seconds", seconds, "--json", str(out), "--",
                        sys.executable, str(SCRIPTS / script), str(data), *args],
                       capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert out.exists(), p.stdout + p.stderr
    return json.loads(out.read_text()), p.stdout


def _run_fix(tmp_path: Path, r: dict[str, Any], text: str) -> Any:
    """Run the fix as printed, in ``tmp_path`` (so DATASET is a folder there); the loader it makes."""
    fix = r["fix"]
    if r["commands"]:  # printed: exactly these lines
        assert r["commands"] == fix and all(f"  {c}\n" in text for c in fix)
    else:
        assert "No input bottleneck to remove" in text and "the fix:" not in text
    convert, imports, line = fix
    done = subprocess.run(convert, shell=True, cwd=tmp_path, capture_output=True, text=True)
    if "a metadata table must be .csv, .tsv, .jsonl or .parquet" in done.stderr:  # before the coords branch
        pytest.skip("--meta with a JSON file needs the coords branch's fastdata convert")
    assert done.returncode == 0, done.stderr
    ns: dict[str, Any] = {}
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(imports + "\n" + line, ns)
    finally:
        os.chdir(here)
    return ns["loader"]


def _pass(loader: Any, tmp_path: Path) -> list[dict[str, Any]]:
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        return [{k: v for k, v in b.items()} for b in loader]
    finally:
        os.chdir(here)


def _match(mine: np.ndarray, theirs: np.ndarray, tol: float) -> None:
    """Every row of ``mine`` is within ``tol`` of its own row of ``theirs`` (a one-to-one match)."""
    used: set[int] = set()
    for row in mine:
        d = np.abs(theirs - row).reshape(len(theirs), -1).max(1)
        j = int(np.argmin(d))
        assert d[j] <= tol and j not in used, (row, theirs[j], d[j])
        used.add(j)


@pytest.fixture
def calm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scripts' random ops at rest: no mirror, crops at the origin, factors of one."""
    monkeypatch.setattr(random, "random", lambda: 0.99)
    monkeypatch.setattr(random, "randint", lambda a, b: a)
    monkeypatch.setattr(random, "uniform", lambda a, b: 1.0 if a <= 1.0 <= b else a)


@pytest.mark.slow
def test_flim_regression_targets(tmp_path: Path) -> None:
    data = make_data.flim(tmp_path / "flim")
    r, text = _doctor(tmp_path, "flim3d.py", data, "--epochs", "200")
    assert "--meta" in r["fix"][0] and "targets.csv" in r["fix"][0]
    assert r["account"]["fields"]["f1"]["columns"] == ["tau1", "tau2", "fraction"]
    batches = _pass(_run_fix(tmp_path, r, text), tmp_path)
    ds = _script_module("flim3d.py").FlimDataset(str(data))
    theirs = np.stack([ds[i][1].numpy() for i in range(len(ds))])
    mine = np.concatenate([torch.stack([b["tau1"], b["tau2"], b["fraction"]], 1).numpy() for b in batches])
    assert len(mine) == len(ds)
    _match(mine, theirs, 1e-6)


@pytest.mark.slow
def test_episodic_pose_keypoints_and_classes(tmp_path: Path) -> None:
    data = make_data.pose(tmp_path / "pose")
    r, text = _doctor(tmp_path, "pose_episodic.py", data, "--episodes", "400", "--workers", "0")
    assert "--meta" in r["fix"][0] and "ann.json" in r["fix"][0] and "--size" not in r["fix"][0]
    assert "Episodic(5, 2)" in r["fix"][2] and "Keypoints()" in r["fix"][2] and "Resize((128, 128))" in r["fix"][2]
    batches = _pass(_run_fix(tmp_path, r, text), tmp_path)
    ds = _script_module("pose_episodic.py").PoseDataset(str(data))
    theirs = np.stack([np.concatenate([ds[i][1].numpy().ravel(), [1000.0 * ds[i][2]]]) for i in range(len(ds))])
    mine = np.concatenate([np.concatenate([b["keypoints"].reshape(len(b["label"]), -1).numpy(),
                                           1000.0 * b["label"].numpy()[:, None]], 1) for b in batches])
    assert all(len(b["label"]) == 10 and len(set(b["label"].tolist())) == 5 for b in batches)
    _match(np.unique(mine, axis=0), theirs, 0.5)  # episodes may repeat a sample: each distinct one matches


@pytest.mark.slow
def test_head_pose_angles_and_landmarks_follow_the_flip(tmp_path: Path, calm: None) -> None:
    from fastdata import open as fd_open

    data = make_data.faces(tmp_path / "faces")
    r, text = _doctor(tmp_path, "headpose.py", data, "--epochs", "400")
    line = r["fix"][2]
    assert "RandomCrop((64, 64))" in line and "HorizontalFlip()" in line
    assert "'yaw': Custom(on_hflip=lambda a: -a)" in line and "'roll': Custom(on_hflip=lambda a: -a)" in line
    assert "'pitch'" not in line and "Keypoints(flip_pairs=[(0, 67), (1, 66)" in line
    loader = _run_fix(tmp_path, r, text)
    batches = _pass(loader, tmp_path)
    assert tuple(batches[0]["image"].shape[1:]) == (3, 64, 64) and tuple(batches[0]["landmarks"].shape[1:]) == (68, 2)
    # stored: the script's own targets, unmirrored and uncropped (its random ops at rest)
    mod = _script_module("headpose.py")
    ds = mod.HeadPose(str(data))
    stored = fd_open(str(tmp_path / "DATASET"))
    for i in range(len(stored)):
        s = stored[i]
        j = [row["path"] for row in ds.rows].index(os.path.basename(stored.key(i)))
        _, angles, lm = ds[j]
        assert np.allclose([s["yaw"], s["pitch"], s["roll"]], angles.numpy(), atol=1e-3)
        assert np.allclose(s["landmarks"], lm.numpy(), atol=1e-3)
    # the printed loader mirrors as the script does: yaw and roll negated together, landmarks swapped left/right
    table = np.array([[stored[i]["yaw"], stored[i]["pitch"], stored[i]["roll"]] for i in range(len(stored))])
    mirrored = 0
    for b in batches:
        for k in range(len(b["yaw"])):
            ang = np.array([float(b["yaw"][k]), float(b["pitch"][k]), float(b["roll"][k])])
            j = int(np.argmin(np.abs(np.abs(table) - np.abs(ang)).max(1)))
            assert np.allclose(np.abs(table[j]), np.abs(ang), atol=1e-3)
            flip = ang[0] * table[j, 0] < 0
            assert (ang[2] * table[j, 2] < 0) == flip and ang[1] == pytest.approx(table[j, 1], abs=1e-3)
            out, src = b["landmarks"][k].numpy(), np.asarray(stored[j]["landmarks"])
            src = src[mod.MIRROR] if flip else src
            dx = out[:, 0] + src[:, 0] if flip else out[:, 0] - src[:, 0]  # mirrored: x' = c - x
            assert np.ptp(dx) < 1e-3 and np.ptp(out[:, 1] - src[:, 1]) < 1e-3  # one crop offset for all points
            mirrored += flip
    assert 0 < mirrored < sum(len(b["yaw"]) for b in batches)  # both kinds were seen


@pytest.mark.slow
def test_cnn_lstm_labels(tmp_path: Path) -> None:
    data = make_data.recordings(tmp_path / "seqs")
    r, text = _doctor(tmp_path, "seq_lstm.py", data, "--epochs", "100")
    assert "--meta" in r["fix"][0] and "labels.csv" in r["fix"][0]
    batches = _pass(_run_fix(tmp_path, r, text), tmp_path)
    ds = _script_module("seq_lstm.py").Recordings(str(data))
    theirs = np.array([[ds[i][1], len(ds[i][0])] for i in range(len(ds))], dtype=np.float64)
    mine = np.concatenate([np.stack([b["label"].numpy(), b["x_lengths"].numpy()], 1) for b in batches])
    assert sorted(map(tuple, mine.tolist())) == sorted(map(tuple, theirs.tolist()))


@pytest.mark.slow
def test_ssl_two_views(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    data = make_data.photos(tmp_path / "photos")
    r, text = _doctor(tmp_path, "ssl_views.py", data, "--epochs", "100", seconds="30")
    assert r["account"]["views"] == 2 and r["account"]["fields"]["f1"]["role"] == "view"
    assert "views=2" in r["fix"][2]
    batches = _pass(_run_fix(tmp_path, r, text), tmp_path)
    assert tuple(batches[0]["image"].shape[1:]) == (2, 3, 64, 64)
    assert sum(len(b["image"]) for b in batches) == 48


COMPUTE_BOUND = '''
import torch
from torch.utils.data import DataLoader, TensorDataset

ds = TensorDataset(torch.randn(64, 16), torch.randint(0, 2, (64,)))
w = torch.randn(512, 512)
for epoch in range(200):
    for x, y in DataLoader(ds, batch_size=8):
        for _ in range(40):  # a step far longer than the wait
            w = torch.tanh(w @ w / 512)
'''


@pytest.mark.slow
def test_nothing_to_gain_gets_no_fix(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(COMPUTE_BOUND)
    p = subprocess.run([sys.executable, "-m", "fastdata", "doctor", "--seconds", "15", "--json", str(tmp_path / "r.json"),
                        "--", sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["projected_speedup"] < 1.1 and r["commands"] == []
    assert "No input bottleneck to remove" in p.stdout and "the fix:" not in p.stdout


SLOW_STEP = '''
import time
import torch
from torch.utils.data import DataLoader, TensorDataset

ds = TensorDataset(torch.randn(64, 16), torch.randint(0, 2, (64,)))
for epoch in range(100):
    for x, y in DataLoader(ds, batch_size=8):
        time.sleep(4.0)  # a step on a slow CPU
'''


@pytest.mark.slow
def test_a_seconds_budget_ends_in_a_verdict_on_slow_steps(tmp_path: Path) -> None:
    import time

    script = tmp_path / "train.py"
    script.write_text(SLOW_STEP)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "fastdata", "doctor", "--seconds", "30", "--json", str(tmp_path / "r.json"),
                        "--", sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    took = time.monotonic() - t0
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["bottleneck"] == "compute" and r["confidence"] == "low", p.stdout
    assert "low confidence" in p.stdout and "too few batches" not in p.stdout
    assert took < 45, took


# -- fast: the fix from a synthetic account, and the account of synthetic samples ----------------------
def _report(account: dict[str, Any], speedup: float, shapes: dict[str, list[int]], ops: list[str],
            kinds: dict[str, int], batch_size: int | None = 8) -> dict[str, Any]:
    from fastdata.measure.doctor.project import commands
    from fastdata.measure.doctor.report import _image_size

    proj = {"ok": True, "workers": 2, "shapes": shapes, "ops": ops, "account": account}
    source = {"folder": "/d", "kinds": kinds, "files_seen": 8, "convertible": True}
    fix, notes = commands({"settings": {"batch_size": batch_size}}, proj, source, _image_size(source, proj),
                          {"classes": 5, "per_class": 2})
    return {"fix": fix, "notes": notes}


HEAD_POSE = {
    "data": "f0", "views": 1,
    "fields": {"f0": {"role": "data", "shape": [3, 64, 64]},
               "f1": {"role": "table", "table": "/d/meta.csv", "kind": "angles", "columns": ["yaw", "pitch", "roll"],
                      "signs": [-1, 1, -1]},
               "f2": {"role": "table", "table": "/d/meta.csv", "kind": "keypoints", "columns": ["landmarks"],
                      "mirrored": True, "flip_pairs": [[0, 1]]},
               "f3": {"role": "left out", "why": "computed in __getitem__"}},
    "tables": {"/d/meta.csv": {"path_column": "path", "root": "/d",
                               "used": ["yaw", "pitch", "roll", "landmarks"]}},
    "geometry": {"op": "RandomCrop", "size": [64, 64], "mirrored": True},
}


def test_printed_fix_keeps_the_targets_and_makes_flips_target_safe() -> None:
    import copy

    r = _report(copy.deepcopy(HEAD_POSE), 3.0, {"f0": [3, 64, 64]}, ["HorizontalFlip", "Normalize"], {".jpg": 8})
    convert, imports, line = r["fix"]
    assert convert == "fastdata convert /d DATASET --images raw --meta /d/meta.csv"  # no --size: coordinates
    assert "RandomCrop((64, 64)), HorizontalFlip(), Normalize(IMAGENET_MEAN, IMAGENET_STD)" in line
    assert "'yaw': Custom(on_hflip=lambda a: -a), 'roll': Custom(on_hflip=lambda a: -a)" in line
    assert "'landmarks': Keypoints(flip_pairs=[(0, 1)])" in line and "'pitch'" not in line
    ns: dict[str, Any] = {}
    exec(imports + "\n" + line.replace("fastdata.loader(", "(lambda *a, **k: k)("), ns)  # the line is valid Python as printed
    aug = ns["loader"]["augment"]
    assert set(aug.targets) == {"yaw", "roll", "landmarks"}
    from fastdata.measure.doctor.project import lines

    said = "\n".join(lines(HEAD_POSE, True))
    assert "f3: left out: computed in __getitem__" in said and "yaw, pitch, roll of meta.csv" in said


def test_flip_left_out_when_the_targets_never_mirrored() -> None:
    import copy

    acc = copy.deepcopy(HEAD_POSE)
    acc["fields"]["f1"].update(kind="values", signs=[1, 1, 1])
    acc["fields"]["f2"].update(mirrored=False, flip_pairs=[])
    acc["geometry"] = None
    r = _report(acc, 3.0, {"f0": [3, 64, 64]}, ["HorizontalFlip", "Normalize"], {".jpg": 8})
    assert "HorizontalFlip" not in r["fix"][2] and "Keypoints()" in r["fix"][2]
    assert any("HorizontalFlip left out" in n for n in r["notes"])


def test_flip_left_out_when_an_element_left_out_of_the_fix_was_negated(tmp_path: Path) -> None:
    """BIWI-like head pose: angles read from a per-frame .txt (no table), yaw and roll negated on a mirror. The
    angles are left out of the fix, so its HorizontalFlip would flip images under angles that no longer follow."""
    from fastdata.measure.doctor.project import account

    samples = []
    for i in range(4):
        f = tmp_path / f"{i}_rgb.jpg"
        f.write_bytes(b"")
        ang = np.array([10.0 + i, -5.0, 3.0], np.float32)
        samples.append({"file": str(f), "first": {"f0": np.zeros((3, 8, 8), np.float32), "f1": ang},
                        "again": {"f1": ang * np.array([-1, 1, -1], np.float32) if i % 2 else ang}})
    acc = account(samples, [])
    assert acc["fields"]["f1"]["role"] == "left out" and acc["fields"]["f1"]["negated"]
    r = _report(acc, 3.0, {"f0": [3, 8, 8]}, ["HorizontalFlip", "Normalize"], {".jpg": 8})
    assert "HorizontalFlip" not in r["fix"][2] and "Normalize(IMAGENET_MEAN, IMAGENET_STD)" in r["fix"][2]
    assert any("HorizontalFlip left out: the script negates f1 on a mirror" in n for n in r["notes"])
    samples[1]["again"]["f1"] = samples[1]["first"]["f1"] + 1  # changed by other random work, not negated
    assert not account([samples[0], samples[1]], [])["fields"]["f1"]["negated"]


def test_views_labels_and_episodes_in_the_fix() -> None:
    views = {"data": "f0", "views": 2, "tables": {},
             "fields": {"f0": {"role": "data", "shape": [3, 32, 32]}, "f1": {"role": "view", "of": "f0"}}}
    line = _report(views, 2.0, {"f0": [3, 32, 32]}, ["HorizontalFlip", "Normalize"], {".jpg": 8})["fix"][2]
    assert "augment=Augment([HorizontalFlip(), Normalize(IMAGENET_MEAN, IMAGENET_STD)], views=2)" in line
    labels = {"data": "f0", "views": 1,
              "fields": {"f0": {"role": "data", "shape": [40, 16]},
                         "f1": {"role": "table", "table": "/d/y.csv", "kind": "values", "columns": ["y"], "signs": [1]}},
              "tables": {"/d/y.csv": {"path_column": "file", "root": "/d", "used": ["y"]}}}
    r = _report(labels, 2.0, {"f0": [40, 16]}, [], {".npy": 8}, batch_size=None)
    assert r["fix"][0] == "fastdata convert /d DATASET --labels /d/y.csv --labels-columns file,y"
    assert "sampler=Episodic(5, 2)" in r["fix"][2]


def test_no_fix_below_the_threshold(tmp_path: Path) -> None:
    from fastdata.measure.doctor.report import render

    base = {"command": ["python", "t.py"], "bottleneck": "compute", "steps_measured": 4, "confidence": "low",
            "stop_reason": "budget spent", "verdict": "compute-bound: the loop waited 1.0% of its time for data",
            "projected_speedup": 1.02, "projected_wait_fraction": 0.0, "loader": {"kind": "torch", "dataset": "D",
            "settings": {}}, "step_s": 0.1, "wait_fraction": 0.01, "compute_only_step_s": 0.1,
            "compute_only_method": "replay", "projection": {"ok": False, "why": "x"}, "commands": [],
            "no_fix": "no input bottleneck to remove: fastdata is projected at 1.02x, below 1.1x; keep your loader"}
    text = render(base)
    assert "No input bottleneck to remove" in text and "the fix:" not in text and "low confidence" in text
    text = render({**base, "commands": ["fastdata convert /d DATASET"], "no_fix": None})
    assert "the fix:\n  fastdata convert /d DATASET" in text


def test_account_of_samples_from_a_table(tmp_path: Path) -> None:
    """Targets found by value in the table the script read: columns stacked into a vector, angles negated
    by a mirror, coordinates shifted, mirrored and swapped; the rest named as left out."""
    from fastdata.measure.doctor.project import account, lines

    rng = np.random.default_rng(0)
    rows, samples = ["path,yaw,pitch,roll,kp,pts"], []
    for i in range(6):
        f = tmp_path / f"{i}.npy"
        np.save(f, np.zeros(2))
        ang = rng.uniform(-50, 50, 3).round(3)
        kp = rng.uniform(0, 30, (4, 2)).round(2)
        pts = np.concatenate([kp, rng.integers(0, 3, (4, 1))], 1)  # x, y, visibility (CAPE's COCO keypoints)
        rows.append(f'{i}.npy,{ang[0]},{ang[1]},{ang[2]},"{json.dumps(kp.tolist())}","{json.dumps(pts.tolist())}"')
        flipped = ang * [-1, 1, -1]
        mirrored = np.stack([40 - kp[:, 0], kp[:, 1] - 2], 1)[[1, 0, 2, 3]]
        samples.append({"file": str(f), "first": {"f0": np.zeros((8, 8), np.float32), "f1": ang.astype(np.float32),
                                                  "f2": (kp - [3, 2]).astype(np.float32), "f3": np.float32(7.5),
                                                  "f4": pts[:, 2].astype(np.float32)},
                        "again": {"f1": flipped.astype(np.float32), "f2": mirrored.astype(np.float32)}})
    (tmp_path / "meta.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "order.csv").write_text("score\n7.5\n")  # rows by position: nothing names the files
    # COCO keypoints (what CAPE's MP-100 ships): not a table at all, so adding a 'path' column is not the advice
    (tmp_path / "coco.json").write_text(json.dumps({"images": [{"id": 1, "file_name": "0.npy"}], "annotations": []}))
    acc = account(samples, [str(tmp_path / "meta.csv"), str(tmp_path / "order.csv"), str(tmp_path / "coco.json")])
    f = acc["fields"]
    assert f["f0"]["role"] == "data"
    assert f["f1"]["columns"] == ["yaw", "pitch", "roll"] and f["f1"]["signs"] == [-1, 1, -1] and f["f1"]["kind"] == "angles"
    assert f["f2"]["kind"] == "keypoints" and f["f2"]["mirrored"] and f["f2"]["flip_pairs"] == [(0, 1)]
    assert f["f3"]["role"] == "left out" and "order.csv: no column names the sample files" in f["f3"]["why"]
    assert "coco.json: not read as a table (DataError: " in f["f3"]["why"] and "entry 'images' is a list" in f["f3"]["why"]
    assert "coco.json: no column" not in f["f3"]["why"]
    # the visibility flags the script split off its (K, 3) keypoints are that column's last position, not left out
    assert f["f4"]["role"] == "table" and f["f4"]["columns"] == ["pts"] and f["f4"]["part"] == 2
    assert "f4: pts[..., 2] of meta.csv (values) -> pts[..., 2]" in lines(acc, False)
    assert acc["tables"][str(tmp_path / "meta.csv")]["root"] == str(tmp_path)


def test_class_names_in_a_table_are_the_label(tmp_path: Path) -> None:
    """An integer the script makes from a text column (sorted class names) is that column: as 'label' it is
    kept by --meta as indices; under another name the fix says to rename it."""
    from fastdata.measure.doctor.project import account, commands

    names, rows, samples = ["dog", "cat", "eel"], ["path,species"], []
    for i in range(6):
        np.save(tmp_path / f"{i}.npy", np.zeros(3))
        rows.append(f"{i}.npy,{names[i % 3]}")
        samples.append({"file": str(tmp_path / f"{i}.npy"), "again": {},
                        "first": {"f0": np.zeros((9, 9)), "f1": np.asarray(sorted(names).index(names[i % 3]))}})
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    acc = account(samples, [str(tmp_path / "t.csv")])
    assert acc["fields"]["f1"]["kind"] == "classes" and acc["fields"]["f1"]["columns"] == ["species"]
    source = {"folder": str(tmp_path), "kinds": {".npy": 6}, "files_seen": 6, "convertible": True}
    fix, notes = commands({"settings": {"batch_size": 2}}, {"ok": True, "workers": 1, "account": acc}, source, None, None)
    assert fix[0].endswith(f"--meta {tmp_path / 't.csv'}") and "rename it" in notes[0]



def _user_samples(tmp_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Drawn samples of user 003 (a variable-length .npy, its length, a label from t.csv) and of user 000 (a
    FLIM volume turned into log1p(x) / 10 plus a mask channel by __getitem__, a label)."""
    rows, seqs, vols = ["path,label"], [], []
    for i in range(6):
        a = np.random.default_rng(i).normal(size=(20 + 7 * i, 4)).astype(np.float32)
        np.save(tmp_path / f"s{i}.npy", a)
        rows.append(f"s{i}.npy,{i % 2}")
        seqs.append({"file": str(tmp_path / f"s{i}.npy"), "again": {},
                     "first": {"f0": a, "f1": np.asarray(len(a)), "f2": np.asarray(i % 2)}})
        v = np.full((3, 5, 5), i, np.float32)
        np.save(tmp_path / f"v{i}.npy", v)
        vols.append({"file": str(tmp_path / f"v{i}.npy"), "again": {},
                     "first": {"f0": np.stack([np.log1p(v) / 10, v > 0]).astype(np.float32), "f1": np.asarray(i % 2)}})
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    return seqs, vols


def test_a_sequence_length_from_getitem_is_the_fix_x_lengths(tmp_path: Path) -> None:
    """User 003 (/work/shared/context): the length a CNN-LSTM's __getitem__ returns beside its variable-length
    .npy is the fix's ``x_lengths`` (the batch holds it), not "left out: compute it from the batch"."""
    from fastdata.measure.doctor.project import account, lines

    seqs, _ = _user_samples(tmp_path)
    acc = account(seqs, [str(tmp_path / "t.csv")])
    assert acc["fields"]["f1"] == {"role": "lengths"} and "changed" not in acc["fields"]["f0"]
    assert "f1: the length of the sample's file (its first axis) -> x_lengths" in lines(acc, False)
    assert acc["fields"]["f2"]["columns"] == ["label"]


def test_a_file_changed_by_getitem_is_said_to_be_stored_as_it_is(tmp_path: Path) -> None:
    """User 000 (/work/shared/context): a FLIM volume that __getitem__ turns into log1p(x) / 10 plus a mask
    channel is not what the fix stores (the file); the account says so, and to redo the change on the batch."""
    from fastdata.measure.doctor.project import account, lines

    seqs, vols = _user_samples(tmp_path)
    acc = account(vols, [])
    assert acc["fields"]["f0"]["changed"] == "float32 (3, 5, 5) -> float32 (2, 3, 5, 5)"
    assert "as __getitem__ changed it" in lines(acc, False)[0] and "redo the change on the batch" in lines(acc, False)[0]
    assert "changed" not in account(seqs, [str(tmp_path / "t.csv")])["fields"]["f0"]


def test_a_dataloader_sampler_that_picks_the_samples_is_named_and_the_fix_says_so() -> None:
    """User 000 (/work/shared/context): train_cv.py trains on a fold, ``sampler=SubsetRandomSampler(train_idx)``.
    The fix's loader line reads every sample (the validation fold too): the report's loader line names the
    sampler and a note under the fix says to pass the subset; torch's own orders get no note."""
    from torch.utils.data import DataLoader, SubsetRandomSampler, TensorDataset

    from fastdata.measure.doctor._probe import _torch_settings
    from fastdata.measure.doctor.project import commands

    ds = TensorDataset(torch.zeros(10, 2))
    fold = _torch_settings(DataLoader(ds, batch_size=4, sampler=SubsetRandomSampler(range(6))))
    assert fold["sampler"] == "SubsetRandomSampler(6 draws of 10 samples)"
    assert _torch_settings(DataLoader(ds, batch_size=4, shuffle=True))["sampler"] is None
    assert _torch_settings(DataLoader(ds, batch_size=4))["sampler"] is None
    source = {"folder": "/d", "kinds": {".npy": 10}, "files_seen": 10, "convertible": True}
    _, notes = commands({"settings": fold}, None, source, None, None)
    assert any("SubsetRandomSampler(6 draws of 10 samples), is not in the loader line" in n and ".subset(" in n
               for n in notes)
    _, notes = commands({"settings": {**fold, "sampler": None}}, None, source, None, None)
    assert notes == []


def test_a_script_on_a_split_of_its_table_is_told_the_dataset_holds_every_row(tmp_path: Path, run_cli: Any) -> None:
    """A script that trains on a split (4 of the table's 6 rows): the fix converts every row, so it says so and
    how to train on the script's own samples, rather than silently training on the held-out ones too."""
    from fastdata.measure.doctor.project import _sample, commands

    rows = ["path,label"]
    for i in range(6):
        np.save(tmp_path / f"{i}.npy", np.full(3, i, np.float32))
        rows.append(f"{i}.npy,{i % 2}")
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")

    class Split:
        files = [tmp_path / f"{i}.npy" for i in (0, 2, 3, 5)]

        def __len__(self) -> int:
            return len(self.files)

        def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
            return np.load(self.files[i]), int(self.files[i].stem) % 2

    (tmp_path / "work").mkdir()
    s = _sample(Split(), 2, tmp_path / "work", tables=[str(tmp_path / "t.csv")])
    source = {"folder": str(tmp_path), "kinds": {".npy": 4}, "files_seen": 4, "convertible": True}
    fix, notes = commands({"settings": {"batch_size": 2}}, {"ok": True, "workers": 1, "account": s.account}, source,
                          None, None)
    s.remove()
    assert "--meta" in fix[0]
    assert any("lists 6 files, the script's dataset has 4" in n and ".subset(KEYS)" in n for n in notes), notes
    # the fix and the note run as printed, DATASET and KEYS filled in: the script's own 4 samples and labels
    import shlex

    import fastdata

    dataset = tmp_path.parent / f"{tmp_path.name}-dataset"
    code, _, err = run_cli(*shlex.split(fix[0].replace("DATASET", str(dataset)))[1:])
    assert code == 0, err
    keys = [str(f.relative_to(tmp_path)) for f in Split.files]
    batch = next(iter(fastdata.loader(fastdata.open(str(dataset)).subset(keys), 4, shuffle=False, device="cpu")))
    assert batch["x"][:, 0].tolist() == [0.0, 2.0, 3.0, 5.0] and batch["label"].tolist() == [0, 0, 1, 1]


def _node_files(root: Path) -> list[Path]:
    """Six .npy samples split between the sub-folders node0 and node1 (user 004's recordings per node)."""
    files = []
    for i in range(6):
        (root / f"node{i % 2}").mkdir(parents=True, exist_ok=True)
        files.append(root / f"node{i % 2}/{i}.npy")
        np.save(files[-1], np.full(3, i, np.float32))
    return files


def test_a_str_element_leaves_the_table_targets_in_the_fix(tmp_path: Path) -> None:
    """A sample that also returns a str (a device name) beside its array and a label from the table: the str is
    left out and the fix still converts with --meta (the label kept). It stopped the projection, and the fix then
    converted the folder as it was, the sub-folders node0/node1 becoming class labels in place of the table's."""
    from fastdata.measure.doctor.project import _sample, commands

    rows = ["path,label"] + [f"{f.relative_to(tmp_path)},{['lte', 'wifi', 'zigbee'][i % 3]}"
                             for i, f in enumerate(_node_files(tmp_path))]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")

    class Psd:
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"psd": np.load(tmp_path / f"node{i % 2}/{i}.npy"), "label": i % 3, "device": f"node{i % 2}"}

    (tmp_path / "work").mkdir()
    s = _sample(Psd(), 2, tmp_path / "work", tables=[str(tmp_path / "t.csv")])
    s.remove()
    assert s.account is not None and s.account["fields"]["device"]["role"] == "left out"
    source = {"folder": str(tmp_path), "kinds": {".npy": 6}, "files_seen": 6, "convertible": True}
    fix, _ = commands({"settings": {"batch_size": 2}}, {"ok": True, "workers": 1, "account": s.account}, source,
                      None, None)
    assert fix[0] == f"fastdata convert {tmp_path} DATASET --meta {tmp_path / 't.csv'}", fix


def test_a_table_of_absolute_paths_gives_a_fix_that_runs(tmp_path: Path, run_cli: Any) -> None:
    """A manifest naming its files by absolute path: the fix was 'fastdata convert / DATASET --meta TABLE', which
    fails (DATASET inside /, and --meta takes paths relative to SRC). Now the table's columns are left out with
    a note saying how to keep them, and the sub-folders (node0, node1) make no label the script never had."""
    import shlex

    from fastdata.measure.doctor.project import _sample, commands

    src = tmp_path / "src"
    rows = ["path,snr"] + [f"{f},{i / 4}" for i, f in enumerate(_node_files(src))]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")

    class Psd:
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> tuple[np.ndarray, float]:
            return np.load(src / f"node{i % 2}/{i}.npy"), i / 4

    (tmp_path / "work").mkdir()
    s = _sample(Psd(), 2, tmp_path / "work", tables=[str(tmp_path / "t.csv")])
    s.remove()
    source = {"folder": str(src), "kinds": {".npy": 6}, "files_seen": 6, "convertible": True}
    fix, notes = commands({"settings": {"batch_size": 2}}, {"ok": True, "workers": 1, "account": s.account}, source,
                          None, None)
    assert fix[0] == f"fastdata convert {src} DATASET --no-labels", fix
    assert any("its paths are absolute" in n for n in notes), notes
    code, _, err = run_cli(*shlex.split(fix[0].replace("DATASET", str(tmp_path / "DATASET")))[1:])
    assert code == 0, err
    import fastdata

    assert fastdata.open(tmp_path / "DATASET").fields == ["x"]
