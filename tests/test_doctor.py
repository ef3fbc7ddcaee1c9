"""fastdata doctor: runs a script unchanged under the hooks, stops it at the budget, and reports.

The scripts are tiny (tests/doctor_scripts and one written here); the checks are on behaviour: the
report's fields, the verdict for a loop that plainly waits, the batches the script sees, the page.
"""

from __future__ import annotations

import html.parser
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fastdata.cli import main
from fastdata.measure.doctor.report import timeline

SCRIPTS = Path(__file__).parent / "doctor_scripts"
sys.path.insert(0, str(SCRIPTS))
from make_data import sequences, volumes  # noqa: E402

SLOW_DATASET = '''
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        time.sleep(0.02)  # a slow read: the loop must wait for it
        return torch.full((4,), float(i)), i

seen = open(sys.argv[1], "w")
loader = DataLoader(Slow(), batch_size=4, shuffle=False, num_workers=1)
for epoch in range(3):
    for x, y in loader:
        seen.write(" ".join(str(v) for v in y.tolist()) + "\\n")
        seen.flush()
        x.mul_(2)  # an in-place change by the script must not leak into the doctor's cached batch
'''


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().out


def test_input_bound_script_is_read_only_and_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text(SLOW_DATASET)
    before = script.read_text()
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    code, text = _run(["doctor", "--steps", "8", "--json", str(out_json), "--html", str(out_html), "--no-project",
                       "--", sys.executable, str(script), str(tmp_path / "seen.txt")], capsys)
    assert code == 0
    r = json.loads(out_json.read_text())
    for key in ("wait_fraction", "step_s", "compute_only_step_s", "bottleneck", "projected_wait_fraction",
                "projected_speedup", "commands"):
        assert key in r
    assert r["bottleneck"] == "dataset_getitem"  # 20 ms of sleep per sample, one worker, a trivial step
    assert r["wait_fraction"] > 0.5 and text.startswith("doctor report on:")
    assert "Input-bound: the loop waited" in text and "__getitem__" in text
    assert r["loader"]["settings"]["num_workers"] == 1 and r["loader"]["settings"]["batch_size"] == 4
    assert r["workers"]["getitem_s_per_sample"] > 0.015
    assert r["compute_only_method"].startswith("replay")
    assert r["stop_reason"] == "budget spent" and r["projected_speedup"] is None
    # the script saw exactly the batches of an unhooked run (in order, shuffle=False), then was stopped
    lines = (tmp_path / "seen.txt").read_text().splitlines()
    real = lines[:r["loader"]["batches"]]
    assert real == [" ".join(str(4 * b + k) for k in range(4)) for b in range(len(real))]
    assert script.read_text() == before
    page = out_html.read_text()
    parser = html.parser.HTMLParser()
    parser.feed(page)
    svg = ET.fromstring(page[page.index("<svg"):page.index("</svg>") + 6])
    classes = {e.get("class") for e in svg.iter("{http://www.w3.org/2000/svg}rect")}
    assert {"wait", "step", "replay"} <= classes
    assert "<script" not in page and "http" not in page.replace("http://www.w3.org/2000/svg", "")


def test_npy_folder_script_with_projection(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTDATA_DOCTOR_TMP", str(tmp_path))
    data = volumes(tmp_path / "vol", n=24, side=12)
    out_json = tmp_path / "r.json"
    code, text = _run(["doctor", "--steps", "6", "--json", str(out_json), "--", sys.executable,
                       str(SCRIPTS / "cnn3d_npy.py"), str(data), "--epochs", "4"], capsys)
    assert code == 0
    r = json.loads(out_json.read_text())
    assert r["projection"]["ok"], r["projection"]
    assert r["projection"]["samples"] == 24 and r["projection"]["batch_s"] > 0
    assert r["projected_speedup"] > 0 and 0 <= r["projected_wait_fraction"] <= 1
    # the projection is the script's step replayed while fastdata's loader read the sample beside it
    assert "step replayed beside" in r["projection_basis"] and r["beside"]["steps"] >= 2
    assert r["projected_step_s"] >= r["beside"]["step_s"] > 0
    assert not list(tmp_path.glob("fastdata-doctor-*"))  # the sample is removed
    io = r["workers"]["io"]
    assert io["rchar"] >= 24 * 12 ** 3 * 4 * 0.5  # the workers read (at least half of) the volumes once
    assert "reading arrays (np.load)" in r["workers"]["causes"]
    # the folder the workers read is named; the label is its class folder
    assert r["workers"]["source"]["folder"] == str(data) and r["workers"]["source"]["convertible"]
    assert r["account"]["fields"]["f1"] == {"role": "folder label"}
    if r["projected_speedup"] < 1.1:  # nothing to gain: no fix is printed
        assert r["commands"] == [] and "No input bottleneck to remove" in text and "the fix:" not in text
        return
    assert "the fix:" in text and r["commands"][0] == f"fastdata convert {data} DATASET"
    assert any("fastdata.loader(" in c and "batch_size=8" in c for c in r["commands"])


def test_image_script_projection_redoes_its_transforms(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The image classifier (PIL crop, flip, normalise to floats in __getitem__), on the CPU: the projection
    reads the images as uint8 with a flip and Normalize on the batch, and the report and the fix say so."""
    from make_data import jpegs

    monkeypatch.setenv("FASTDATA_DOCTOR_TMP", str(tmp_path))
    data = jpegs(tmp_path / "img", n=48, side=128)
    out_json = tmp_path / "r.json"
    code, text = _run(["doctor", "--steps", "6", "--json", str(out_json), "--", sys.executable,
                       str(SCRIPTS / "image_folder.py"), str(data), "--epochs", "8", "--workers", "0",
                       "--batch-size", "8"], capsys)
    assert code == 0, text
    r = json.loads(out_json.read_text())
    assert r["projection"]["ok"], r["projection"]
    assert r["projection"]["ops"] == ["HorizontalFlip", "Normalize"] and r["beside"]["steps"] >= 2
    assert "images as uint8 with HorizontalFlip + Normalize on the batch" in text
    fix = r["fix"]  # printed unless the projected gain is below NO_GAIN: a timing, not what this test checks
    assert r["commands"] in (fix, []) and (r["commands"] or r["no_fix"].startswith("no input bottleneck"))
    assert fix[0].endswith("--images raw --size 112 112")
    assert "augment=[HorizontalFlip(), Normalize(IMAGENET_MEAN, IMAGENET_STD)]" in fix[2]


@pytest.mark.slow  # a Lightning fit under the doctor: ~10 s
def test_lightning_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("lightning")
    data = sequences(tmp_path / "seq", n=32)
    out_json = tmp_path / "r.json"
    code, _ = _run(["doctor", "--steps", "6", "--no-project", "--json", str(out_json), "--", sys.executable,
                    str(SCRIPTS / "lightning_seq.py"), str(data), "--epochs", "3"], capsys)
    assert code == 0
    r = json.loads(out_json.read_text())
    assert r["stop_reason"] == "budget spent" and r["loader"]["kind"] == "torch"
    assert r["loader"]["batches"] >= 6 and r["compute_only_method"].startswith("replay")
    assert r["workers"]["collate_s_per_batch"] is not None  # the script's own collate_fn was timed


def test_watch_in_process(tmp_path: Path) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    import fastdata.measure.doctor

    ds = TensorDataset(torch.arange(64.0).view(32, 2), torch.arange(32))
    with fastdata.measure.doctor.watch(json_path=tmp_path / "w.json", project=True, quiet=True) as w:
        total = sum(float(x.sum()) for x, _ in DataLoader(ds, batch_size=4))
    assert total == float(torch.arange(64.0).sum())  # the loop's result is unchanged
    assert w.report["loader"]["settings"]["num_workers"] == 0
    assert w.report["bottleneck"] in {"compute", "num_workers=0"}
    assert w.report["compute_only_method"].startswith("estimate")  # watch() never replays
    assert w.report["projection"]["ok"] and json.loads((tmp_path / "w.json").read_text())["step_s"] > 0
    # the hooks are gone after the block
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    assert "doctor" not in _BaseDataLoaderIter.__next__.__qualname__ + str(_BaseDataLoaderIter.__next__.__module__)


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--steps", "5"]) == 2
    assert "give the command to run after --" in capsys.readouterr().err
    assert main(["doctor", "--", "bash", "train.sh"]) == 2
    assert "runs Python training scripts" in capsys.readouterr().err
    assert main(["doctor", "--", "python", str(tmp_path / "missing.py")]) == 2
    assert "no such script" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["doctor", "--steps", "5", "--seconds", "3", "--", "python", "x.py"])


def test_a_script_already_on_fastdata_gets_no_convert_fix(tmp_path: Path) -> None:
    """The loop reads through fastdata.loader: measured, and no fix telling it to convert and switch."""
    import fastdata

    np.save(tmp_path / "x.npy", np.ones((6, 4), np.float32))
    fastdata.convert(tmp_path / "x.npy", tmp_path / "ds")
    script = tmp_path / "train.py"
    script.write_text("import sys, time, fastdata\nloader = fastdata.loader(sys.argv[1], batch_size=2)\n"
                      "for epoch in range(100):\n    for b in loader:\n        time.sleep(0.01)\n")
    p = subprocess.run([sys.executable, "-m", "fastdata", "doctor", "--steps", "4", "--json", str(tmp_path / "r.json"),
                        "--", sys.executable, str(script), str(tmp_path / "ds")], capture_output=True, text=True,
                       timeout=300)
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["loader"]["kind"] == "fastdata" and r["commands"] == [] and "fastdata convert" not in p.stdout
    assert "Nothing to convert: the loop already reads through fastdata.loader." in p.stdout


def test_timeline_without_steps() -> None:
    assert "no steps" in timeline({"timeline": []})


def test_script_failure_is_reported(tmp_path: Path) -> None:
    script = tmp_path / "bad.py"
    script.write_text("raise ValueError('broken before any batch')\n")
    p = subprocess.run([sys.executable, "-m", "fastdata", "doctor", "--steps", "3", "--", sys.executable,
                        str(script)], capture_output=True, text=True)
    assert p.returncode == 1 and "no DataLoader was iterated" in p.stdout and "ValueError" in p.stderr


def test_projection_with_fewer_samples_than_a_batch_ends(tmp_path: Path) -> None:
    """One batch a pass: the first is start-up, the later passes are timed (this once looped forever)."""
    import numpy as np

    from fastdata.measure.doctor.project import _measure, _sample

    s = _sample([(np.zeros(3, np.float32), 1)] * 3, 4, tmp_path)
    assert not isinstance(s, str)
    r = _measure(s)
    assert r["ok"] and r["batch_size"] == 3 and r["batch_s"] > 0


@pytest.mark.parametrize("element,named", [("a name", "'name' is a str"), (None, "'name' is None"),
                                           ({"a": 1.0}, "'name' is a dict"),
                                           ([np.zeros(1), np.zeros(2)], "'name' is a list")])
def test_a_sample_element_no_field_holds_is_named_and_the_fix_leaves_it_out(tmp_path: Path, element, named) -> None:
    """A str, None, a nested dict or a list of arrays in a sample: the account names the element and its type
    as left out, and the projection goes on with the arrays and numbers; a sample of nothing else names the
    sample too (it said only 'holds objects'), and the printed fix writes only the arrays and numbers; an empty
    dataset says so (it was an IndexError)."""
    from types import SimpleNamespace

    from fastdata.measure.doctor.project import commands, sample

    def rec(ds):
        return SimpleNamespace(loaders={0: SimpleNamespace(events=[1])}, datasets={0: ds}, batch_sizes={0: 2},
                               tables=[], sample_budget_s=None, step_on_cpu=lambda: True)

    s = sample(rec([{"x": np.zeros(3, np.float32), "name": element}] * 4))
    assert not isinstance(s, str) and s.account is not None, s
    s.remove()
    left = s.account["fields"]["name"]
    assert left["role"] == "left out" and re.fullmatch(rf"{named.split(' is ')[1]}, not an array or a number.*",
                                                       left["why"]), left
    why = sample(rec([{"name": element}] * 4))
    assert isinstance(why, str) and re.fullmatch(rf"sample \d: element {named}, not an array or a number.*"
                                                 r"the fix leaves it out", why), why
    fix = commands({"settings": {"batch_size": 2}}, None, None, None, None)[0]
    assert "write the arrays and numbers of each __getitem__ output as SRC/NNNNNN.npz" in fix[0]
    assert sample(rec([])) == "the dataset is empty (its __len__ is 0): nothing to sample"


def test_accelerate_prepared_loader_is_measured() -> None:
    pytest.importorskip("accelerate")
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    import fastdata.measure.doctor

    ds = TensorDataset(torch.arange(64.0).view(32, 2), torch.arange(32))
    acc = Accelerator(cpu=True)
    model, opt, dl = acc.prepare(torch.nn.Linear(2, 1), torch.optim.SGD([torch.zeros(1, requires_grad=True)]),
                                 DataLoader(ds, batch_size=4, num_workers=1))
    with fastdata.measure.doctor.watch(project=False, quiet=True) as w:
        seen = sorted(int(v) for _, y in dl for v in y)
    assert seen == list(range(32))  # every sample, once: the hooks change nothing
    assert w.report["loader"]["batches"] == 8 and w.report["loader"]["settings"]["num_workers"] == 1
    assert w.report["workers"]["processes"] >= 1  # the worker's __getitem__ was timed through Accelerate's wrapper


SPAWNED_JPEG = '''
import glob, sys
import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

class Jpegs(Dataset):
    def __init__(self, root):
        self.files = sorted(glob.glob(root + "/*/*.jpg"))
    def __len__(self):
        return len(self.files)
    def __getitem__(self, i):
        im = Image.open(self.files[i])
        im.load()  # the decode is the work
        return torch.tensor(im.size)

if __name__ == "__main__":
    loader = DataLoader(Jpegs(sys.argv[1]), batch_size=4, num_workers=1, multiprocessing_context="spawn")
    for epoch in range(3):
        for x in loader:
            x.sum()
'''


def test_spawned_workers_and_the_decode_cause(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Workers started with spawn report their figures too, and the JPEG decode inside __getitem__ is named."""
    from make_data import jpegs

    data = jpegs(tmp_path / "img", n=64, side=768)  # one pass covers the budget: one worker start-up
    script = tmp_path / "train.py"
    script.write_text(SPAWNED_JPEG)
    out_json = tmp_path / "r.json"
    code, text = _run(["doctor", "--steps", "12", "--json", str(out_json), "--no-project", "--", sys.executable,
                       str(script), str(data)], capsys)
    assert code == 0, text
    r = json.loads(out_json.read_text())
    assert r["loader"]["settings"]["multiprocessing_context"] == "spawn"
    w = r["workers"]
    assert w is not None and w["processes"] >= 1 and w["samples"] >= 12 * 4  # a worker per pass: not persistent
    assert "decoding JPEG (PIL)" in w["causes"] and w["causes"]["decoding JPEG (PIL)"] > 0
    assert w["source"]["folder"] == str(data) and w["source"]["kinds"] == {".jpg": w["source"]["files_seen"]}
    assert r["commands"][0] == f"fastdata convert {data} DATASET"
    assert "decoding JPEG (PIL)" in text
    # a loop of 4 decodes per trivial step waits, and the decode is most of __getitem__: it is the cause
    assert r["bottleneck"] == "decode" and "decoding JPEG (PIL)" in r["verdict"]


def _browser() -> str | None:
    import shutil

    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.mark.skipif(_browser() is None, reason="no headless Chromium on this machine (apt install chromium)")
def test_html_page_renders_in_a_headless_browser(tmp_path: Path) -> None:
    """The page as a browser draws it: the timeline's wait, step and replay colours are on the screenshot."""
    from PIL import Image

    from fastdata.measure.doctor.report import page

    ev = [[i * 0.1, i * 0.1 + 0.04, 0] for i in range(20)]
    r = {"timeline": ev, "replay": [[2.0 + 0.05 * k, 0.0] for k in range(5)]}
    path = tmp_path / "r.html"
    path.write_text(page(r, "input-bound: the loop waited 40.0% of its time for data"))
    shot = tmp_path / "shot.png"
    subprocess.run([str(_browser()), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--screenshot={shot}", "--window-size=1100,800", path.as_uri()],
                   check=True, capture_output=True, timeout=120)
    colours = {c for _, c in Image.open(shot).convert("RGB").getcolors(1 << 20) or []}
    assert {(0xD9, 0x53, 0x4F), (0x5B, 0x8B, 0xD9), (0x5C, 0xB8, 0x5C)} <= colours


def test_projection_beside_the_step_leaves_out_pass_start_ups() -> None:
    """Steps come from consecutive hand-outs less the doctor's copy; a pass's first batch is left out."""
    from fastdata.measure.doctor.report import _beside

    # (handed out, waited for fastdata, copy, position in the pass)
    rows = [[0.0, 0.0, 0.0, 1], [0.11, 0.01, 0.01, 2], [0.21, 0.0, 0.0, 0], [1.21, 0.9, 0.0, 1],
            [1.33, 0.02, 0.02, 2], [1.43, 0.0, 0.0, 3]]
    b = _beside({"beside": rows})
    assert b is not None and b["steps"] == 4  # the step ending in the pass start (position 0) is left out
    assert b["step_s"] == pytest.approx(0.325)  # mean of 0.10, 1.0, 0.10, 0.10
    assert b["wait_fraction"] == pytest.approx((0.01 + 0.9 + 0.02) / 1.3)
    assert b["wait_s"] == pytest.approx((0.01 + 0.9 + 0.02) / 4)
    assert _beside({"beside": [], "beside_why": "sample 3 holds objects"}) == {"why": "sample 3 holds objects"}
    assert _beside({"beside": []}) is None


def test_storage_verdict_needs_a_real_volume_of_reads() -> None:
    """Saturated, CPU-idle workers whose few reads came from storage (a module imported) are not storage-bound."""
    from fastdata.measure.doctor.report import _bottleneck

    loader = {"settings": {"num_workers": 2}}
    w = {"getitem_fraction": 0.95, "collate_fraction": 0.0, "cpu_fraction": 0.05, "samples": 100,
         "getitem_s_per_sample": 0.02, "collate_s_per_batch": 0.0, "causes": {},
         "io": {"rchar": 8192, "read_bytes": 8192, "from_storage_fraction": 1.0}}
    assert _bottleneck(0.5, loader, w)[0] == "dataset_getitem"
    w["io"] = {"rchar": 50 << 20, "read_bytes": 40 << 20, "from_storage_fraction": 0.8}
    kind, text = _bottleneck(0.5, loader, w)
    assert kind == "storage" and "80.0% of the bytes" in text


def test_projection_takes_the_replay_for_busy_workers_and_the_step_less_wait_otherwise() -> None:
    """Busy workers stole CPU from the step, or the loop is input-bound: the step replayed beside fastdata
    is the projection. Idle workers under a compute-bound loop: the step's own work (less the wait) stays,
    unless fastdata's readers slow the replay further."""
    from fastdata.measure.doctor.report import _projection

    proj = {"ok": True, "batch_s": 0.002}
    beside = {"step_s": 0.010, "wait_s": 0.001, "wait_fraction": 0.1, "steps": 12}
    busy = {"getitem_fraction": 0.8, "collate_fraction": 0.05}
    idle = {"getitem_fraction": 0.1, "collate_fraction": 0.0}
    r = _projection(proj, 0.050, 0.020, 0.012, busy, beside)
    assert r["projected_step_s"] == 0.010 and r["projected_speedup"] == pytest.approx(5.0)
    r = _projection(proj, 0.050, 0.002, 0.040, idle, beside)
    assert r["projected_step_s"] == pytest.approx(0.049) and r["projected_wait_fraction"] == pytest.approx(0.001 / 0.049)
    r = _projection(proj, 0.012, 0.006, 0.005, idle, beside)  # the replay beside fastdata is the longer
    assert r["projected_step_s"] == 0.010
    r = _projection(proj, 0.050, 0.010, 0.009, idle, beside)  # input-bound (20% wait), idle workers
    assert r["projected_step_s"] == 0.010 and "replayed beside" in r["projection_basis"]
    r = _projection(proj, 0.050, 0.004, 0.040, idle, beside)  # compute-bound (8% wait): the step less its wait
    assert r["projected_step_s"] == pytest.approx(0.047) and "longer of" in r["projection_basis"]


def _commands(main: dict[str, Any], proj: dict[str, Any] | None, source: dict[str, Any] | None) -> list[str]:
    """The printed commands, as fastdata.measure.doctor.report.analyse makes them."""
    from fastdata.measure.doctor.project import commands
    from fastdata.measure.doctor.report import _image_size

    return commands(main, proj, source, _image_size(source, proj) if source else None, None)[0]


def test_convert_command_decodes_images_once_at_the_size_the_samples_have() -> None:
    """The projection read what __getitem__ returned (decoded, resized): the command converts image files to
    that, raw; per-sample arrays, or a sample without exactly one image-shaped field, convert as they are."""
    main = {"settings": {"batch_size": 32}}
    jpgs = {"folder": "/data/img", "kinds": {".jpg": 40}, "files_seen": 40, "convertible": True}
    proj = {"ok": True, "workers": 2, "shapes": {"f0": [3, 112, 96], "f1": []}}
    assert _commands(main, proj, jpgs)[0] == "fastdata convert /data/img DATASET --images raw --size 112 96"
    hwc = {**proj, "shapes": {"image": [64, 48, 3], "label": []}}
    assert _commands(main, hwc, jpgs)[0].endswith("--images raw --size 64 48")
    two = {**proj, "shapes": {"a": [3, 8, 8], "b": [3, 8, 8]}}
    assert _commands(main, two, jpgs)[0] == "fastdata convert /data/img DATASET"
    npys = {**jpgs, "kinds": {".npy": 40}}
    assert _commands(main, proj, npys)[0] == "fastdata convert /data/img DATASET"
    assert _commands(main, None, jpgs)[0] == "fastdata convert /data/img DATASET"


class _Images:
    """Float CHW images; ``random``: a brightness drawn per call (two draws of one index differ)."""

    def __init__(self, random: bool, normalised: bool) -> None:
        import numpy as np

        self.random, self.normalised = random, normalised
        self.base = np.random.default_rng(0).random((40, 3, 16, 12), dtype=np.float32)
        self.rng = np.random.default_rng(1)

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        x = self.base[i]
        if self.random:
            x = x * np.float32(self.rng.uniform(0.8, 1.0))
        return ((x - 0.5) / 0.25 if self.normalised else x).copy(), i % 2


@pytest.mark.parametrize("random,normalised,ops", [(True, True, ["HorizontalFlip", "Normalize"]),
                                                   (False, True, ["Normalize"]), (False, False, [])])
def test_image_samples_are_stored_as_uint8_and_the_loader_redoes_the_transforms(
        tmp_path: Path, random: bool, normalised: bool, ops: list[str]) -> None:
    """On the CPU the script's image transforms become the loader's ops: the sample keeps uint8 images (what
    --images raw stores), the loader turns them into floats and runs the ops standing in for the script's."""
    from fastdata import open as fd_open
    from fastdata.measure.doctor.project import _sample

    s = _sample(_Images(random, normalised), 8, tmp_path)
    assert not isinstance(s, str)
    assert list(s.ops) == ops and s.images == ("f0",) and s.shapes["f0"] == [3, 16, 12]
    ds = fd_open(str(s.path))
    assert ds[0]["f0"].dtype == np.uint8 and ds[0]["f0"].shape == (16, 12, 3)
    batch = next(iter(s.loader()))
    assert batch["f0"].dtype == torch.float32 and tuple(batch["f0"].shape) == (8, 3, 16, 12)
    line = _commands({"settings": {"batch_size": 8}}, {"ok": True, "workers": 2, "shapes": s.shapes, "ops": ops},
                     None)[2]
    assert ("augment=[" in line) == bool(ops) and all(o in line for o in ops)


def test_image_samples_stay_float_when_the_step_runs_on_a_gpu(tmp_path: Path) -> None:
    """With the step on a GPU the ops run there (cheap): the sample keeps the floats, no ops are added."""
    from fastdata import open as fd_open
    from fastdata.measure.doctor.project import _sample

    s = _sample(_Images(True, True), 8, tmp_path, on_cpu=False)
    assert not isinstance(s, str) and s.ops == () and s.images == ()
    assert fd_open(str(s.path))[0]["f0"].dtype == np.float32


def test_replay_hands_the_first_batches_in_turn(tmp_path: Path) -> None:
    """Ragged batches: the replay cycles over copies of the first batches after the warm-up (each its own
    length), not one batch whose length may be far from the run's."""
    from torch.utils.data import DataLoader

    from fastdata.measure.doctor import _probe

    lengths = [5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27]
    loader = DataLoader([torch.zeros(n) for n in lengths], batch_size=None)
    rec = _probe.install(tmp_path, steps=10, replay=True)
    seen = []
    try:
        for x in loader:
            seen.append(len(x))
            x += 1  # the script may change a batch in place: the next copy is fresh
    except _probe.BudgetReached:
        pass
    finally:
        _probe.uninstall()
    cached = lengths[_probe.WARMUP:_probe.WARMUP + _probe.CACHED_BATCHES]
    replayed = seen[_probe.WARMUP + 10:]
    assert len(replayed) == _probe.REPLAY and replayed == cached[:_probe.REPLAY]
    assert all(float(c.sum()) == 0.0 for c in rec.cached)
    assert _probe._nbytes({"a": torch.zeros(4), "b": (np.zeros(3, np.int64), "s")}) == 40
