"""benchmarks/bench_augment_views.py (views, sequence ops, MixUp/CutMix against their baselines) completes,
writes its results, and its baselines compute what fastdata computes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_writes_every_section_and_the_references_match(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_augment_views as bench

    assert bench.main(["--quick", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "augment_views_quick.json").read_text())
    assert set(res["timings_s"]) == {"views", "sequence", "mix"}
    assert res["same_output"] == {"MixUp": True, "CutMix": True}
    assert all(r > 0 for r in res["ratios"].values())
    assert "Two views / one view" in (tmp_path / "augment_views_quick.md").read_text()
    # the per-sample loop baseline leaves padding at zero and keeps lengths within the batch
    fns = bench.seq_fns(torch.device("cpu"), quick=True)
    out = fns["plain torch loop per sample"](0)
    assert out.shape == (64, 250, 16) and torch.isfinite(out).all()
    sys.modules.pop("bench_augment_views", None)
