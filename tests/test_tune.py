"""fastdata.measure.bench measurement and fastdata.measure.tune's search, cache and use by num_workers='auto'."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

import fastdata
from fastdata.errors import UsageError
from fastdata.measure import bench, tune


@pytest.fixture
def small_ds(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    np.save(tmp_path / "X.npy", np.random.default_rng(0).random((300, 8, 8), dtype=np.float32))
    fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)), arrays={"x": tmp_path / "X.npy"})
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


def test_an_empty_dataset_is_refused_in_one_line(tmp_path, run_cli):
    np.save(tmp_path / "X.npy", np.zeros((0, 8), np.float32))
    fastdata.convert(tmp_path / "X.npy", tmp_path / "empty")
    for args, what in ((("bench", "--no-ceiling"), "measure"), (("bench", "--cold"), "measure"), (("tune",), "tune")):
        code, _, err = run_cli(*args, tmp_path / "empty")
        assert code == 2 and err == f"fastdata: error: {tmp_path / 'empty'}: the dataset has no samples: nothing to {what}\n"
    with pytest.raises(UsageError, match="t: the pipeline yielded no batches"):
        bench.measure("t", lambda: [], bytes_per_sample=1.0)


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
    fastdata.convert(None, tmp_path / "other", arrays={"x": tmp_path / "Y.npy"})
    assert tune.settings_key(ds, 32, "cpu") != tune.settings_key(fastdata.open(tmp_path / "other"), 32, "cpu")
    assert tune.settings_key(ds, 32, "cpu") != tune.settings_key(ds, 64, "cpu")


def test_ceiling_rows_are_payload_bytes_not_stored_bytes(tmp_path):
    """LMDB stores a header with each record: the ceiling's rows are the 784 bytes the loader hands over."""
    np.save(tmp_path / "X.npy", np.zeros((64, 1, 28, 28), np.uint8))
    fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", workers=1)), arrays={"x": tmp_path / "X.npy"})
    ds = fastdata.open(tmp_path / "ds")
    assert bench.payload_bytes(ds) == 784 and bench.sample_bytes(ds) > 784
    c = bench.measure_ceiling(ds, 16, threads=2, max_seconds=0.2)
    assert c.settings["row_bytes"] == 784 and c.settings["kind"] == "memcpy gather"


def test_payload_of_ragged_samples_counts_their_rows(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    lengths = [3, 5, 10, 2]
    for i, n in enumerate(lengths):
        np.save(src / f"{i}.npy", np.ones((n, 4), np.float32))
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1), no_labels=True))
    assert bench.payload_bytes(fastdata.open(tmp_path / "ds")) == sum(lengths) * 16 / len(lengths)


def test_ceiling_is_the_best_thread_count_from_one_to_the_loaders(small_ds):
    c = bench.measure_ceiling(fastdata.open(small_ds), 32, threads=3, max_seconds=0.3)
    rates = c.settings["rates"]
    assert sorted(rates) == [1, 2, 3] and c.settings["threads"] in rates
    assert round(c.samples_per_s, 1) == max(rates.values()) and c.name.endswith("best of 1-3 threads")


def test_bench_cli_measures_the_ceiling_up_to_the_loaders_threads(small_ds, run_cli):
    code, out, _ = run_cli("bench", small_ds, "--batches", "3", "--seconds", "1", "--workers", "3", "--json")
    rows = json.loads(out)["results"]
    assert code == 0 and sorted(rows[-1]["settings"]["rates"]) == ["1", "2", "3"]
    code, out, _ = run_cli("bench", small_ds, "--batches", "3", "--seconds", "1", "--workers", "0", "--json")
    assert code == 0 and list(json.loads(out)["results"][-1]["settings"]["rates"]) == ["1"]


def test_bench_cli_warns_when_a_pipeline_beats_its_ceiling(small_ds, run_cli, monkeypatch):
    """A ratio above 1.1 of the ceiling means the ceiling was measured badly (a busy machine): said on stderr."""
    real = bench.measure_ceiling

    def slow_ceiling(*a, **kw):  # type: ignore[no-untyped-def]
        r = real(*a, **kw)
        r.samples_per_s = 1.0  # no pipeline is that slow
        return r

    monkeypatch.setattr(bench, "measure_ceiling", slow_ceiling)
    code, _, err = run_cli("bench", small_ds, "--batches", "3", "--seconds", "1", "--workers", "1")
    assert code == 0 and "fastdata.loader above 1.1 of the ceiling" in err and "quiet machine" in err
    code, _, err = run_cli("bench", small_ds, "--batches", "3", "--seconds", "1", "--workers", "1", "--no-ceiling")
    assert code == 0 and "above 1.1" not in err


def test_tune_cli_json_gives_null_when_the_winner_is_not_stored(run_cli, monkeypatch):
    # --no-store: stored_at was the string "None" in the JSON, not null
    won = {"mode": "threads", "num_workers": 1, "prefetch": 4, "batch_size": 8}
    for where in (None, "/c/tune.json"):
        res = tune.TuneResult(winner=won, rate=5.0, stored_at=None if where is None else Path(where))
        monkeypatch.setattr(tune, "tune", lambda *a, res=res, **k: res)
        code, out, _ = run_cli("tune", "ds", "--json", "--no-store")
        assert code == 0 and json.loads(out)["stored_at"] == where


@pytest.mark.parametrize("args", [("bench", "--batches", "0"), ("bench", "--batches", "-1"), ("bench", "--prefetch", "0"),
                                  ("tune", "--batch-sizes", "x"), ("tune", "--batch-sizes", "32,")])
def test_numbers_bench_and_tune_cannot_honour_are_usage_errors_before_measuring(small_ds, run_cli, args):
    # --batches 0 ended in an IndexError deep in numpy after the measurement, --prefetch 0 silently measured
    # the default prefetch, --batch-sizes x a ValueError traceback
    code, out, err = run_cli(args[0], small_ds, *args[1:])
    assert code == 2 and out == "" and f"argument {args[1]}: " in err and "Traceback" not in err


def double(batch, rng):  # a transform for --transform test_tune:double
    return batch


def test_the_loader_call_tune_prints_finds_the_stored_winner(small_ds, run_cli, caplog, monkeypatch):
    # tune printed "fastdata.loader(num_workers='auto') uses it" whatever the winner's batch size and transform:
    # a loader made as printed (the user's own batch size, no transform) silently got the default settings
    code, out, _ = run_cli("tune", small_ds, "--budget", "2s", "--batch-size", "32", "--batch-sizes", "16")
    call = out.split("(fastdata.loader(", 1)[1].rsplit(") uses it)", 1)[0]
    won = int(call.split(", ")[1])
    assert code == 0 and call == f"{str(small_ds)!r}, {won}, device='cpu', num_workers='auto'" and won in (16, 32)
    with caplog.at_level(logging.INFO, logger="fastdata.loader"):
        ld = eval(f"fastdata.loader({call})")
    assert "using tuned settings" in caplog.text and ld.batch_size == won
    won = {"mode": "processes", "num_workers": 2, "prefetch": 4, "batch_size": 8}
    monkeypatch.setattr(tune, "tune", lambda *a, **k: tune.TuneResult(winner=won, rate=5.0, stored_at=Path("/c/t.json")))
    code, out, _ = run_cli("tune", "ds", "--transform", "test_tune:double", "--device", "cuda")
    assert code == 0 and "(fastdata.loader('ds', 8, device='cuda', num_workers='auto', transform=test_tune.double) uses it)" in out


def test_auto_with_a_config_of_ones_own_takes_the_tuned_mode_and_prefetch_it_leaves_at_defaults(small_ds, caplog):
    # a LoaderConfig(channels_last=False) dropped the tuned mode and prefetch (threads, 4) while the log said
    # "using tuned settings {'mode': 'processes', ..., 'prefetch': 8}"
    ds = fastdata.open(small_ds)
    tune.store_tuned(ds, 8, "cpu", {"mode": "processes", "num_workers": 2, "prefetch": 8, "batch_size": 8}, 1.0)
    with caplog.at_level(logging.INFO, logger="fastdata.loader"):
        ld = fastdata.loader(ds, 8, device="cpu", num_workers="auto", config=fastdata.LoaderConfig(channels_last=False))
    assert (ld.workers, ld.config.mode, ld.config.prefetch, ld.config.channels_last) == (2, "processes", 8, False)
    assert "mode='processes', prefetch=8" in caplog.text
    mine = fastdata.loader(ds, 8, device="cpu", num_workers="auto", config=fastdata.LoaderConfig(prefetch=2))
    assert (mine.config.mode, mine.config.prefetch) == ("processes", 2)  # what the user set stays


def test_tune_with_device_auto_stores_what_the_loader_looks_up(small_ds, caplog):
    # --device auto (a documented choice) stored the winner under "auto", while the loader looks up the device's
    # type ("cpu", "cuda"): fastdata.loader(..., num_workers="auto") never found it and took the defaults
    res = tune.tune(small_ds, batch_size=16, budget_s=1, device="auto")
    with caplog.at_level(logging.INFO, logger="fastdata.loader"):
        ld = fastdata.loader(small_ds, 16, device="auto", num_workers="auto")
    assert "using tuned settings" in caplog.text and ld.workers == res.winner["num_workers"]


def test_tune_races_batch_size_and_also_the_batch_sizes(small_ds, run_cli, monkeypatch):
    # --batch-sizes is "also search these batch sizes", but --batch-size 16 --batch-sizes 8,32 raced 8 and 32 only
    raced = set()

    def fake(ds, s, **kw):  # type: ignore[no-untyped-def]
        raced.add(s["batch_size"])
        return bench.BenchResult("t", 1, 1, 1.0, float(s["batch_size"]), 1.0, 1.0, 1.0, 0.0)

    monkeypatch.setattr(tune, "measure_setting", fake)
    code, out, _ = run_cli("tune", small_ds, "--budget", "1s", "--batch-size", "16", "--batch-sizes", "8,32", "--no-store")
    assert code == 0 and raced == {8, 16, 32}
