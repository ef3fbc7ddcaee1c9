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
