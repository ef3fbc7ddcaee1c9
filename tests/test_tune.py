"""fastdata.bench measurement and fastdata.tune's search, cache and use by num_workers='auto'."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import converters
import fastdata
from fastdata import bench, tune


@pytest.fixture
def small_ds(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    np.save(tmp_path / "X.npy", np.random.default_rng(0).random((300, 8, 8), dtype=np.float32))
    converters.convert(None, tmp_path / "ds", converters.WriteOptions(workers=1), arrays={"x": tmp_path / "X.npy"})
    return tmp_path / "ds"


def test_measure_counts_steady_batches_only(small_ds):
    ds = fastdata.open(small_ds)
    ld = fastdata.loader(ds, 32, device="cpu", num_workers=1)
    seen = []
    r = bench.measure("t", lambda: ld, bytes_per_sample=bench.sample_bytes(ds), max_batches=25, warmup=2,
                      on_batch=lambda n, t: seen.append(n))
    assert r.batches == 25 and r.samples > 0 and r.first_batch_s > 0
    assert r.samples_per_s > 0 and r.batch_ms_p95 >= r.batch_ms_median > 0
    assert seen[:2] == [0, 0] and seen[-1] == r.samples  # warm-up batches are not counted; epochs wrap
    ceiling = bench.measure_ceiling(ds, 32, threads=2, max_seconds=0.2)
    assert ceiling.samples_per_s > 0 and ceiling.mb_per_s > 0


def test_candidates_cover_modes_workers_prefetch_and_batch():
    c = tune.candidates(2, [32, 64])
    assert {x["mode"] for x in c} == {"threads", "processes"}
    assert {x["num_workers"] for x in c if x["mode"] == "threads"} == {0, 1, 2, 3, 4}
    assert {x["prefetch"] for x in c} >= {2, 4, 8} and {x["batch_size"] for x in c} == {32, 64}


def test_tune_stores_winner_and_auto_uses_it(small_ds, tmp_path, caplog):
    trials = []
    res = tune.tune(small_ds, batch_size=32, budget_s=4, on_trial=lambda s, r, k: trials.append((s, k)))
    assert res.winner in tune.candidates(len(os.sched_getaffinity(0)), [32])
    assert res.rate > 0 and res.stored_at is not None
    assert res.stored_at.parent == tmp_path / "cache"
    assert not any(p.name.startswith("tuned") for p in small_ds.iterdir())  # never in the dataset
    first_round = [s for s, k in trials if k == 0]
    later = [s for s, k in trials if k > 0]
    assert len(first_round) > len({str(s) for s in later})  # halving dropped candidates
    ds = fastdata.open(small_ds)
    assert tune.load_tuned(ds, 32, "cpu") == res.winner
    with caplog.at_level(logging.INFO, logger="fastdata.loader"):
        ld = fastdata.loader(ds, 32, device="cpu")
    assert ld.workers == res.winner["num_workers"] and ld.config.mode == res.winner["mode"]
    assert "tuned settings" in caplog.text
    with caplog.at_level(logging.INFO, logger="fastdata.loader"):
        other = fastdata.loader(ds, 16, device="cpu")  # another batch size: not tuned
    assert "default" in caplog.text and other.workers >= 1
    assert fastdata.loader(ds, 32, device="cpu", num_workers=0).workers == 0  # explicit wins


def test_cache_key_changes_with_dataset_content(small_ds, tmp_path):
    ds = fastdata.open(small_ds)
    np.save(tmp_path / "Y.npy", np.zeros((10, 2), np.float32))
    converters.convert(None, tmp_path / "other", arrays={"x": tmp_path / "Y.npy"})
    assert tune.settings_key(ds, 32, "cpu") != tune.settings_key(fastdata.open(tmp_path / "other"), 32, "cpu")
    assert tune.settings_key(ds, 32, "cpu") != tune.settings_key(ds, 64, "cpu")
