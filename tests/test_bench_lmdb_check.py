"""benchmarks/bench_lmdb_check.py (the cost of the per-read LMDB header check) completes and writes its results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_writes_both_pairs_and_the_check_alone(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_lmdb_check

    assert bench_lmdb_check.main(["--quick", "--out", str(tmp_path), "--workdir", str(tmp_path)]) == 0
    times = json.loads((tmp_path / "lmdb_check_quick.json").read_text())["times"]
    for records in ("196 KB fixed records", "~100 KB ragged records"):
        for what in ("header checked on every read", "no per-read check", "the comparison alone"):
            assert times[f"{records}: {what}"]["runs"] >= 1
    assert "cost per record" in (tmp_path / "lmdb_check_quick.md").read_text()
    sys.modules.pop("bench_lmdb_check", None)
