"""Issue 48: ``fastdata bench --naive SRC`` measures the naive per-file loader on ragged and mixed-size
``.npy`` samples too (padded to the batch's largest, with lengths, as fastdata's batches are),
instead of failing in torch.stack."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fastdata
from fastdata.demo import naive_collate


def test_naive_collate_pads_like_fastdata():
    xs = [torch.ones(3, 2), torch.full((5, 2), 2.0)]
    b = naive_collate([{"x": x, "label": k} for k, x in enumerate(xs)])
    assert b["x"].shape == (2, 5, 2) and b["x_lengths"].tolist() == [3, 5] and b["label"].tolist() == [0, 1]
    assert b["x"][0, 3:].abs().sum() == 0 and b["x"][1].eq(2).all()
    mixed = naive_collate([{"x": torch.ones(2, 3, 3), "label": 0}, {"x": torch.ones(3, 2, 3), "label": 1}])
    assert mixed["x"].shape == (2, 3, 3, 3) and mixed["x"][0, 2].sum() == 0 and mixed["x"][1, :, 2].sum() == 0
    same = naive_collate([{"x": torch.ones(4), "label": 0}, {"x": torch.zeros(4), "label": 1}])
    assert same["x"].shape == (2, 4) and "x_lengths" not in same  # fixed shapes: torch's default collate


def test_bench_naive_on_ragged_and_mixed_size_npy(tmp_path, run_cli):
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "src" / c).mkdir(parents=True)
    for i in range(12):
        np.save(tmp_path / "src" / "ab"[i % 2] / f"{i}.npy", rng.standard_normal((int(rng.integers(20, 60)), 16),
                                                                                dtype=np.float32))
    fastdata.convert(tmp_path / "src", tmp_path / "ds")
    code, out, err = run_cli("bench", tmp_path / "ds", "--naive", tmp_path / "src", "--batch-size", "4",
                             "--batches", "3", "--no-ceiling", "--json")
    assert code == 0, err
    assert "stack expects" not in err
    names = [r["name"] for r in json.loads(out)["results"]]
    assert "naive per-file loader" in names


def test_bench_naive_on_a_folder_without_npy_files_is_one_line_before_measuring(tmp_path, run_cli, monkeypatch):
    # was a torch traceback (RandomSampler: num_samples=0) after the whole measurement of fastdata.loader
    from fastdata.measure import bench

    np.save(tmp_path / "x.npy", np.zeros((4, 3), np.float32))
    fastdata.convert(tmp_path / "x.npy", tmp_path / "ds")
    (tmp_path / "jpegs").mkdir()
    (tmp_path / "jpegs" / "a.jpg").write_bytes(b"not a .npy")
    monkeypatch.setattr(bench, "measure", lambda *a, **k: pytest.fail("measured before checking --naive"))
    for src in (tmp_path / "jpegs", tmp_path / "missing"):
        code, out, err = run_cli("bench", tmp_path / "ds", "--naive", src, "--batches", "2", "--no-ceiling")
        assert code == 2 and out == "" and err == f"fastdata: error: {src}: no .npy files here: the naive loader reads a folder of per-sample .npy files\n"
