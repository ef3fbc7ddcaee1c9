"""``transform=``: the user's function on each host batch, run in the readers (threads or worker
processes) with a generator drawn from (seed, epoch, rank, batch); ``PerSample`` for a function of one
sample. The same batches whoever reads them, errors naming batch and reader, exact resume, pickling
(spawn-started workers, ddp_spawn) and a DDP run with two ranks."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import free_port
from scenarios.kit import N, make_dataset

import fastdata
from fastdata.errors import LoaderWorkerError, UsageError
from fastdata.loaders import LoaderConfig, PerSample
from fastdata.seeds import Stream, numpy_rng
from fastdata.world import World

ROOT = Path(__file__).resolve().parents[1]
READERS = [("threads", 0), ("threads", 2), ("processes", 2)]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("transform"))


def noisy(batch, rng):
    """Module level, so it pickles: in place on the reader's buffer, plus a new field."""
    batch["x"] += rng.standard_normal(batch["x"].shape).astype(np.float32)
    batch["pid_even"] = np.full(len(batch["label"]), 1, np.int64)
    return batch


def flip_sample(sample, rng):
    """Per sample: returns a new row for x (written back) and a new per-sample field (stacked)."""
    return {"x": sample["x"][::-1].copy(), "twice": np.array(2 * sample["label"]), "coin": rng.integers(0, 2, 3)}


def fail_on_seven(batch, rng):
    if 7 in batch["label"].tolist():
        raise ValueError("no sevens here")


def expected(ds, fn, seed=0, epochs=1, world=None, shuffle=True):
    """What the loader must yield: the plan read with get_batch, then ``fn`` with the batch's generator."""
    from fastdata.reading.samplers import all_rank_batches

    world = world or World(0, 1)
    d = fastdata.open(ds)
    out = []
    for e in range(epochs):
        plan = all_rank_batches(len(d), world=world, batch_size=4, shuffle=shuffle, drop_last=False, seed=seed, epoch=e,
                                ranks=[world.rank])[0]
        for k, idx in enumerate(plan):
            b = fn(d.get_batch(idx), numpy_rng(seed, e, Stream.TRANSFORM, world.rank, k))
            out.append({n: torch.from_numpy(np.ascontiguousarray(v)) for n, v in b.items()})
    d.close()
    return out


def _take(ld, epochs=1):
    got = []
    for _ in range(epochs):
        got += [{k: v.clone() for k, v in b.items()} for b in ld]
    return got


def _equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert sorted(x) == sorted(y)
        for k in x:
            assert torch.equal(x[k], y[k]), k


@pytest.mark.parametrize("mode,workers", READERS)
def test_every_reader_gives_the_batches_of_the_function_and_its_seeded_generator(ds, mode, workers):
    with fastdata.loader(ds, 4, seed=5, device="cpu", num_workers=workers, config=LoaderConfig(mode=mode),
                         transform=noisy) as ld:
        got = _take(ld, epochs=2)
    _equal(got, expected(ds, noisy, seed=5, epochs=2))


@pytest.mark.parametrize("mode,workers", [("threads", 2), ("processes", 2)])
def test_per_sample_writes_rows_back_and_stacks_new_fields(ds, mode, workers):
    fn = PerSample(flip_sample)
    with fastdata.loader(ds, 4, device="cpu", num_workers=workers, config=LoaderConfig(mode=mode), transform=fn) as ld:
        got = _take(ld)
    _equal(got, expected(ds, fn))
    b = got[0]
    assert b["twice"].tolist() == (2 * b["label"]).tolist() and b["coin"].shape == (4, 3)


def test_per_sample_refuses_rows_of_different_shapes(ds):
    def ragged(sample, rng):
        return {"y": np.zeros(int(sample["label"]) % 2 + 1)}

    with pytest.raises(ValueError, match="field 'y'.*different shapes"):
        PerSample(ragged)(fastdata.open(ds).get_batch([0, 1]), np.random.default_rng(0))


@pytest.mark.parametrize("mode,workers", READERS)
def test_a_transform_error_names_the_batch_and_the_reader_and_keeps_the_original(ds, mode, workers):
    ld = fastdata.loader(ds, 4, shuffle=False, device="cpu", num_workers=workers, config=LoaderConfig(mode=mode),
                         transform=fail_on_seven)
    with pytest.raises(LoaderWorkerError, match=r"batch 1, in the transform: transform fail_on_seven raised "
                                                r"ValueError: no sevens here") as e:
        list(ld)
    reader = {"processes": r"worker process 1 \(pid \d+\)", "threads": "loader thread '"}[mode]
    assert workers == 0 or re.search(reader, str(e.value))
    assert isinstance(e.value.__cause__, ValueError)  # the user's exception, with its traceback from the worker
    if mode == "processes":
        assert "fail_on_seven" in str(e.value.__cause__.__cause__)
    assert next(iter(ld))["label"].tolist() == [0, 1, 2, 3]  # the next pass reads again
    ld.close()


@pytest.mark.parametrize("mode,workers", [("threads", 2), ("processes", 2)])
def test_resume_mid_epoch_with_a_transform_is_exact(ds, mode, workers):
    cfg = LoaderConfig(mode=mode)
    whole = fastdata.loader(ds, 4, seed=1, device="cpu", num_workers=workers, config=cfg, transform=noisy)
    ref = _take(whole, epochs=2)
    whole.close()
    first = fastdata.loader(ds, 4, seed=1, device="cpu", num_workers=workers, config=cfg, transform=noisy)
    it = iter(first)
    head = [{k: v.clone() for k, v in next(it).items()} for _ in range(3)]
    state = first.state_dict()
    first.close()
    second = fastdata.loader(ds, 4, seed=1, device="cpu", num_workers=workers, config=cfg, transform=noisy)
    second.load_state_dict(state)
    rest = _take(second, epochs=2)
    second.close()
    _equal(head + rest, ref)


def test_loaders_with_a_transform_pickle_and_a_lambda_is_refused_clearly(ds):
    ld = fastdata.loader(ds, 4, device="cpu", num_workers=2, config=LoaderConfig(mode="processes"), transform=noisy)
    again = pickle.loads(pickle.dumps(ld))
    _equal(_take(again), _take(ld))
    ld.close(), again.close()
    lam = fastdata.loader(ds, 4, device="cpu", num_workers=0, transform=lambda b, r: b)
    with pytest.raises(UsageError, match="cannot be pickled.*module level"):
        pickle.dumps(lam)
    with pytest.raises(UsageError, match="transform must be a function"):
        fastdata.loader(ds, 4, device="cpu", transform=3)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="DALI"):
        fastdata.loader(ds, 4, device="cpu", backend="dali", transform=noisy)


def test_a_transform_returning_no_dict_is_an_error(ds):
    with fastdata.loader(ds, 4, device="cpu", num_workers=0, transform=lambda b, r: [b]) as ld:
        with pytest.raises(LoaderWorkerError, match="must return the batch"):
            next(iter(ld))


SPAWNED = """
import json, pickle, sys
sys.path[:0] = [{root!r}, {tests!r}]
import torch

def rank(r, port, pkl, out):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=r, world_size=2)
    with open(pkl, "rb") as f:
        ld = pickle.load(f)  # built before the process group, pickled into this rank (as ddp_spawn does)
    got = [(b["label"].tolist(), b["x"].tolist()) for b in ld]
    ld.close()
    with open(f"{{out}}-{{r}}.json", "w") as f:
        json.dump(got, f)
    dist.destroy_process_group()

if __name__ == "__main__":
    import multiprocessing as mp
    mp.set_start_method({method!r})  # with spawn, the ranks' workers are spawned too: the transform crosses again
    import fastdata
    from fastdata.loaders import LoaderConfig
    from test_transform import noisy
    ld = fastdata.loader({ds!r}, 4, seed=2, device="cpu", num_workers=2, config=LoaderConfig(mode="processes"),
                         transform=noisy)
    with open({pkl!r}, "wb") as f:
        pickle.dump(ld, f)
    torch.multiprocessing.start_processes(rank, args=({port}, {pkl!r}, {out!r}), nprocs=2, start_method={method!r})
"""


@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_ddp_ranks_given_a_pickled_loader_read_disjoint_halves_with_their_own_draws(ds, tmp_path, method):
    """Two gloo ranks, each given the pickled loader (as Lightning's ddp_spawn does); with spawn, the
    ranks and their workers are all started by spawn, so the transform crosses pickled twice (slow:
    seven interpreters import torch)."""
    script = tmp_path / "ddp.py"
    script.write_text(SPAWNED.format(root=str(ROOT), tests=str(ROOT / "tests"), ds=str(ds), port=free_port(),
                                     pkl=str(tmp_path / "ld.pkl"), out=str(tmp_path / "rank"), method=method))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for r, got in enumerate(ranks):
        want = expected(ds, noisy, seed=2, world=World(r, 2))
        assert [labels for labels, _ in got] == [b["label"].tolist() for b in want]
        np.testing.assert_array_equal(np.array([x for _, x in got], dtype=np.float32),
                                      np.stack([b["x"].numpy() for b in want]))
    assert sorted(i for got in ranks for labels, _ in got for i in labels) == list(range(N))


def test_tune_races_worker_processes_only_with_a_transform_and_says_why(tmp_path, monkeypatch):
    """The race itself with fixed rates (measuring is timing, not behaviour); one real trial with the transform."""
    from fastdata.measure import tune
    from fastdata.measure.bench import BenchResult

    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    path = make_dataset(tmp_path, n=64)
    fn = PerSample(flip_sample)
    ds = fastdata.open(path)
    real = tune.measure_setting(ds, {"mode": "processes", "num_workers": 1, "prefetch": 2, "batch_size": 4},
                                max_seconds=0.1, transform=fn)
    assert real.samples_per_s > 0

    def fake(ds, s, *, device, max_seconds, transform):
        assert transform is fn or s["mode"] == "threads"  # every trial of a race with a transform runs it
        rate = 1000.0 * s["num_workers"] if s["mode"] == "processes" else 500.0 + s["num_workers"]
        return BenchResult("t", 1, 1, 1.0, rate, 1.0, 1.0, 1.0, 0.1, s)

    monkeypatch.setattr(tune, "measure_setting", fake)
    monkeypatch.setattr(tune, "_warm_up", lambda *a, **k: None)
    res = tune.tune(path, batch_size=4, budget_s=60, transform=fn)
    assert res.winner["mode"] == "processes"
    assert res.reason.startswith("processes: ") and "against" in res.reason and "holds the GIL" in res.reason
    assert tune.load_tuned(ds, 4, "cpu", fn) == res.winner  # stored for loaders given this transform...
    assert tune.load_tuned(ds, 4, "cpu") is None  # ...not for loaders without it
    ld = fastdata.loader(ds, 4, device="cpu", transform=fn)  # num_workers="auto" takes the stored settings
    assert (ld.workers, ld.config.mode) == (res.winner["num_workers"], "processes")
    ld.close()
    raced = []
    monkeypatch.setattr(tune, "measure_setting", lambda ds, s, **k: (raced.append(s["mode"]), fake(ds, s, **k))[1])
    plain = tune.tune(path, batch_size=4, budget_s=60, store=False)
    assert set(raced) == {"threads"} and "no transform was given" in plain.reason


def doubled(batch, rng):
    """Replaces x by a new array (its own region takes it back) and adds a field (the slot's spare region)."""
    return {**batch, "x": batch["x"] * 2, "extra": np.ones((len(batch["label"]), 5), np.float32)}


def test_arrays_a_transform_makes_land_in_the_slot_after_the_first_batches(ds):
    with fastdata.loader(ds, 4, device="cpu", num_workers=2, config=LoaderConfig(mode="processes"),
                         transform=doubled) as ld:
        first = _take(ld)
        copied = ld.stats()["ring_copied"]
        assert copied <= ld.stats()["ring_slots"]  # at most each slot's first batch: then its spare region fits
        again = _take(ld)
        assert ld.stats()["ring_copied"] == copied
        b = next(iter(ld))
        assert b["extra"].untyped_storage().data_ptr() == b["label"].untyped_storage().data_ptr()  # in the slot
    _equal(first, expected(ds, doubled))
    _equal(again, expected(ds, doubled, epochs=2)[len(first):])


_RELEASE = __import__("threading").Event()  # lets a hung reader thread go once the test has seen the timeout


def hang_on_seven(batch, rng):
    if 7 in batch["label"].tolist():
        _RELEASE.wait(60)


def interrupt_on_seven(batch, rng):
    if 7 in batch["label"].tolist():
        raise KeyboardInterrupt


def object_field(batch, rng):
    batch["objects"] = np.array([{"a": 1}] * len(batch["label"]), dtype=object)


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_a_transform_that_hangs_past_the_timeout_names_the_batch(ds, mode):
    _RELEASE.clear()
    ld = fastdata.loader(ds, 4, shuffle=False, device="cpu", num_workers=2,
                         config=LoaderConfig(mode=mode, timeout=1.0), transform=hang_on_seven)
    hung = {"threads": r"batch 1 was not read within timeout=1.0 s: its read or transform hangs",
            "processes": r"worker process 1 \(pid \d+\) did not finish batch 1 within timeout=1.0 s.*it was killed"}
    with pytest.raises(LoaderWorkerError, match=hung[mode]):
        list(ld)
    _RELEASE.set()
    assert next(iter(ld))["label"].tolist() == [0, 1, 2, 3]  # the next pass reads again
    ld.close()
    for bad in (dict(num_workers=0), dict(num_workers=2, backend="dali")):  # a timeout nothing would honour
        with pytest.raises(UsageError, match="timeout"):
            fastdata.loader(ds, 4, device="cpu", config=LoaderConfig(timeout=1.0), **bad)


def test_a_keyboard_interrupt_in_a_worker_transform_is_reported_as_such(ds):
    with fastdata.loader(ds, 4, shuffle=False, device="cpu", num_workers=2, config=LoaderConfig(mode="processes"),
                         transform=interrupt_on_seven) as ld:
        with pytest.raises(LoaderWorkerError, match=r"batch 1, in the transform: interrupted \(KeyboardInterrupt\)"):
            list(ld)


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_a_transform_result_torch_cannot_take_is_a_loader_worker_error(ds, mode):
    with fastdata.loader(ds, 4, shuffle=False, device="cpu", num_workers=2, config=LoaderConfig(mode=mode),
                         transform=object_field) as ld:
        with pytest.raises(LoaderWorkerError, match=r"batch 0, in the transform: transform object_field returned field .objects. as an array of dtype object"):
            list(ld)
