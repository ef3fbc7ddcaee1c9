"""CI runs the benchmark suites in --quick mode: each completes and writes its outputs; docs/benchmarks.md
is what benchmarks/report.py renders from the committed results; the harness flags ratios above 1.1 of a
ceiling. No timing is asserted here; speed claims live in benchmarks/results and docs/benchmarks.md."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _bench_module(name: str):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


# suites whose quick run has a test of its own (tests/test_images_bench.py, tests/test_bench_cold.py):
# not run twice in the default suite, which has a 10-minute budget
OWN_TESTS = {"images", "cold"}


@pytest.mark.slow  # a subprocess run of the benchmark in quick mode; .ci/run runs the slow set after the README's command
def test_quick_suite_completes_and_writes_json_markdown_and_plots(tmp_path):
    suites = [s for s in _bench_module("run_all").SUITES if s not in OWN_TESTS]
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--quick", "--jobs", "2", "--out", str(tmp_path),
                        "--only", *suites], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    plotted = set(_bench_module("plot").PLOTTERS)
    for suite in suites:
        data = json.loads((tmp_path / f"{suite}_quick.json").read_text())
        assert data, suite
        assert (tmp_path / f"{suite}_quick.md").read_text().strip(), suite
        png = tmp_path / f"{suite}_quick.png"
        assert suite not in plotted or png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", suite
    pair = _bench_module("pair_trees")  # the paired before/after run reads these suites' rows from their JSON
    for suite in ("loader", "raw", "jpeg_crop"):
        rows, _ = pair.BENCHES[suite].parse(json.loads((tmp_path / f"{suite}_quick.json").read_text()))
        assert rows and all(passes and min(passes) > 0 for _, passes in rows.values()), suite
    for suite in ("get_batch", "loader", "raw"):  # the suites with ceilings record the check, flags and all
        check = json.loads((tmp_path / f"{suite}_quick.json").read_text())["ceiling_check"]
        assert check["quick"] is True and check["checked"] > 0 and check["limit"] == 1.1
    fields = json.loads((tmp_path / "fields_quick.json").read_text())  # bench_fields: extra fields, keys, samplers
    assert len(fields["planning"]) == 3 and all(p["drawn_all_ranks"] > 0 for p in fields["planning"])
    assert "images + keypoints + angles + keys" in fields["reads"]["get_batch_s_per_sample"]
    views = json.loads((tmp_path / "augment_views_quick.json").read_text())  # views, sequence ops, mixing
    assert set(views["timings_s"]) == {"views", "sequence", "mix"} and all(r > 0 for r in views["ratios"].values())
    assert views["same_output"] == {"MixUp": True, "CutMix": True}  # the v2 reference computes what we compute


def test_suites_run_side_by_side_only_in_a_quick_run(capsys):
    """``--jobs 2`` (two suites at once: their figures would disturb each other) is refused for a full run."""
    with pytest.raises(SystemExit) as e:
        _bench_module("run_all").main(["--jobs", "2", "--only", "cold"])
    assert e.value.code == 2 and "--jobs must be 1 for full runs" in capsys.readouterr().err


def test_the_sequence_baseline_runs_on_the_padded_batch():
    """bench_augment_views' per-sample loop (the baseline of the sequence ops) gives a finite batch of the input's shape."""
    bench = _bench_module("bench_augment_views")
    out = bench.seq_fns(torch.device("cpu"), quick=True)["plain torch loop per sample"](0)
    assert out.shape == (64, 250, 16) and torch.isfinite(out).all()


def test_ceiling_check_flags_ratios_above_1_1_and_fails_full_runs_only(capsys):
    h = _bench_module("_harness")
    ok = h.check_ceiling("s", {"a": 0.8, "b": 1.1}, quick=False)
    assert ok["over"] == {} and ok["checked"] == 2 and h.ceiling_exit(ok) == 0
    assert "MEASUREMENT BUG" not in capsys.readouterr().err
    bad = h.check_ceiling("s", {"a": 0.8, "raw float": 3.42}, quick=False)
    assert bad["over"] == {"raw float": 3.42} and h.ceiling_exit(bad) == 1
    assert "MEASUREMENT BUG" in capsys.readouterr().err
    quick = h.check_ceiling("s", {"raw float": 3.42}, quick=True)
    assert quick["over"] == {"raw float": 3.42} and h.ceiling_exit(quick) == 0  # recorded, not failed


def test_docs_benchmarks_md_is_what_the_committed_results_render():
    """Every generated block of docs/benchmarks.md equals its rendering from benchmarks/results/:
    run ``python benchmarks/report.py`` after a benchmark run, and commit both."""
    report = _bench_module("report")
    doc = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    blocks = report.BLOCK.findall(doc)
    assert {"ceilings", "raw", "loader", "get_batch"} <= {b[1] for b in blocks}
    assert report.render(doc) == doc, "docs/benchmarks.md is stale: run python benchmarks/report.py"


def test_every_committed_ceiling_ratio_is_at_most_1_1():
    """A ratio above 1.1 of its ceiling is a measurement bug (the ceiling is the machine's best)."""
    rows = _bench_module("report").ceiling_rows(ROOT / "benchmarks" / "results")
    assert rows and [r for r in rows if r[2] > 1.1] == []


def test_report_renders_a_block_from_a_results_file(tmp_path):
    report = _bench_module("report")
    (tmp_path / "x.json").write_text(json.dumps({"machine": {"cpu_model": "CPU Z", "usable_cores": 3},
                                                 "ceiling_check": {"limit": 1.1, "checked": 2, "over": {}}}))
    (tmp_path / "x.md").write_text("# title\n\n## part\n| a |\n|---|\n| 1 |\n")
    doc = "intro\n<!-- begin generated: x -->\nold\n<!-- end generated: x -->\nafter\n"
    out = report.render(doc, tmp_path)
    assert "old" not in out and "CPU Z, 3 usable cores" in out and "### part" in out and "#### part" not in out and "# title" not in out
    assert "all 2 ratios at most 1.1" in out and out.startswith("intro\n") and out.endswith("after\n")


@pytest.mark.slow  # a few minutes on 2 cores: the default suite stays under its 10-minute budget
def test_gpu_checks_run_end_to_end_on_the_cpu(tmp_path):
    """bench_gpu.py is what a session with a GPU runs; its CPU smoke run keeps it working here (-m slow)."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--quick", "--device", "cpu",
                        "--skip-dali", "--limit-s", "3000", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "gpu_cpu_quick.json").read_text())["result"]
    assert [row["x_naive"] > 0 for row in res["h2d"]["rows"] if row["data"] == "flim"] == [True] * 4  # + host side alone
    assert [row["samples_per_s"] > 0 for row in res["h2d"]["rows"] if row["data"] == "images"] == [True] * 2
    assert len({row["model"] for row in res["train"]}) == 2 and all(row["x_resident"] > 0 for row in res["train"])
    assert {row["precision"] for row in res["precision"]} == {"fp32", "bf16"}
    assert len(res["diag"]) == 6 and res["diag"][0]["x_resident"] == 1.0  # the ResNet wait's variants (section_diag)
    assert all(r["host_wait_fraction"] is not None for r in res["diag"][1:])
    assert all(row["loss_finite"] and row["x_resident"] > 0 for row in res["precision"])
    assert res["images"]["padding_sampled"] is False
    assert res["jpeg"]["rows"][0]["images_per_s"] > 0
    md = (tmp_path / "gpu_cpu_quick.md").read_text()
    assert "## 4. Mixed-size JPEGs" in md and "## 5. JPEG decoding" in md and "## 6. Views" in md


def test_gpu_sections_are_checked_and_runs_of_several_calls_combine(tmp_path, capsys):
    bench = _bench_module("bench_gpu")
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--sections", "h2d,nope"])
    assert "unknown sections ['nope']" in capsys.readouterr().err
    run = {"machine": {"cpu_model": "CPU Z", "usable_cores": 16, "gpu": "GPU Y", "torch": "2.11"},
           "settings": {"mode": "full", "device": "cuda"}}
    (tmp_path / "a.json").write_text(json.dumps({**run, "result": {"views": "See views.", "dali": "old"}}))
    (tmp_path / "b.json").write_text(json.dumps({**run, "result": {"dali": "See dali_cuda.md."}}))
    assert bench.main(["--combine", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path)]) == 0
    md = (tmp_path / "gpu.md").read_text()
    assert "GPU: GPU Y" in md and "See views." in md and "See dali_cuda.md." in md and "old" not in md
    assert json.loads((tmp_path / "gpu.json").read_text())["result"]["dali"] == "See dali_cuda.md."
    # precision rows merge: a measured row replaces a placeholder of an earlier call, never the reverse
    row = {"model": "M", "channels_last": False, "compile": False}
    (tmp_path / "c.json").write_text(json.dumps({**run, "result": {"precision": [
        {**row, "precision": "fp32", "samples_per_s": 5.0}, {**row, "precision": "bf16", "not_run": "time budget"}]}}))
    (tmp_path / "d.json").write_text(json.dumps({**run, "result": {"precision": [
        {**row, "precision": "fp32", "not_run": "time budget"}, {**row, "precision": "bf16", "samples_per_s": 7.0}]}}))
    assert bench.main(["--combine", str(tmp_path / "c.json"), str(tmp_path / "d.json"), "--out", str(tmp_path)]) == 0
    merged = json.loads((tmp_path / "gpu.json").read_text())
    assert [r.get("samples_per_s") for r in merged["result"]["precision"]] == [5.0, 7.0]
    assert merged["sources"]["precision"] == [str(tmp_path / "c.json"), str(tmp_path / "d.json")]
