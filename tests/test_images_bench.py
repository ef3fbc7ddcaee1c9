"""The image benchmark's --quick mode runs end to end (so it never calls APIs that no longer exist)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a subprocess run of the benchmark in quick mode; .ci/run runs the slow set after the README's command
def test_quick_image_benchmark_runs(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_images.py"), "--quick", "--out", str(tmp_path / "out"),
         "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "images_quick.json").read_text())
    methods = [m["method"] for m in result["result"]["methods"]]
    assert methods[0].startswith("naive") and len(methods) >= 7
    assert all(m["samples_per_s"] > 0 for m in result["result"]["methods"])
    assert set(result["result"]["conversions"]) == {"raw", "encoded", "jpeg"}
    assert [t["mode"] for t in result["targets"]] == ["raw", "encoded"]
    assert result["result"]["psnr_db"]["jpeg"] > 30  # raw and encoded were checked pixel-exact by the run itself
    assert not any((tmp_path / "work").iterdir())  # generated data removed
