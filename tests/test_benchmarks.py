"""CI runs the benchmark suites in --quick mode: each completes and writes its outputs.
No timing is asserted here; speed claims live in benchmarks/ and docs/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _suites() -> list[str]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run_all

        return list(run_all.SUITES)
    finally:
        sys.path.pop(0)


def test_quick_suite_completes_and_writes_json_markdown_and_plots(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--quick", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for suite in _suites():
        data = json.loads((tmp_path / f"{suite}_quick.json").read_text())
        assert data, suite
        assert (tmp_path / f"{suite}_quick.md").read_text().strip(), suite
        png = tmp_path / f"{suite}_quick.png"
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", suite


def test_gpu_checks_run_end_to_end_on_the_cpu(tmp_path):
    """bench_gpu.py is what a session with a GPU runs; its CPU smoke run keeps it working here."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--quick", "--device", "cpu",
                        "--skip-dali", "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "gpu_cpu_quick.json").read_text())["result"]
    assert [row["x_naive"] > 0 for row in res["h2d"]["rows"]] == [True] * 3
    assert {row["precision"] for row in res["precision"]} == {"fp32", "bf16"}
    assert all(row["loss_finite"] for row in res["precision"])
    assert res["images"]["padding_sampled"] is False
    assert "## 4. Mixed-size JPEGs" in (tmp_path / "gpu_cpu_quick.md").read_text()


def test_fields_benchmark_runs_quick(tmp_path):
    """benchmarks/bench_fields.py (extra fields, keys, sampled epochs) completes and writes its results."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fields.py"), "--quick", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((tmp_path / "fields_quick.json").read_text())
    assert len(res["planning"]) == 3 and all(p["drawn_all_ranks"] > 0 for p in res["planning"])
    assert "images + keypoints + angles + keys" in res["reads"]["get_batch_s_per_sample"]
