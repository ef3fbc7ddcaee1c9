"""fastdata.loader inside the trainers people use, with no workaround: Lightning (fit, limits,
checkpoint resume mid-epoch and at an epoch's end, DDP and ddp_spawn with the loader built in the
script and in the hooks), Accelerate (prepare, save_state/load_state, skip_first_batches) and
torchrun (a loader built before init_process_group). Also: the epoch rule with islice/zip/break,
the world read when a pass starts, pickling, and the examples in docs/integrations.md."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from conftest import free_port
from scenarios.kit import N, lightning_module, make_dataset, quiet_trainer

import fastdata
from fastdata.errors import UsageError
from fastdata.loaders import LoaderConfig
from fastdata.world import World

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = Path(__file__).resolve().parent / "scenarios"
MODES = [("threads", 2), ("processes", 2)]


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("integrations"))


def labels(loader) -> list[list[int]]:
    return [b["label"].tolist() for b in loader]


def epochs_direct(ds, epochs: int, seed: int = 3) -> list[list[list[int]]]:
    """What each epoch yields when the loader is iterated directly (set_epoch, full passes)."""
    ld = fastdata.loader(ds, 4, seed=seed, device="cpu", num_workers=0)
    out = []
    for e in range(epochs):
        ld.set_epoch(e)
        out.append(labels(ld))
    return out


def _plan(ld, world: World, epoch: int):
    from fastdata.reading.samplers import all_rank_batches

    return all_rank_batches(len(ld.dataset), world=world, batch_size=ld.batch_size, shuffle=ld.shuffle,
                            drop_last=ld.drop_last, seed=ld.seed, epoch=epoch, ranks=[world.rank])[0]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers, logging intervals, ...
        yield


# -- the epoch rule -------------------------------------------------------------------------------

@pytest.mark.parametrize("mode,workers", MODES)
def test_stopping_after_len_batches_still_moves_to_the_next_epoch(ds, mode, workers):
    """islice, zip and a break after len(loader) batches never ask for one more: each epoch is new."""
    expect = epochs_direct(ds, 4)
    ld = fastdata.loader(ds, 4, seed=3, device="cpu", num_workers=workers, config=LoaderConfig(mode=mode))
    got = [[b["label"].tolist() for b in itertools.islice(ld, len(ld))]]
    got.append([b["label"].tolist() for b, _ in zip(ld, range(len(ld)))])
    e2 = []
    for k, b in enumerate(ld):
        e2.append(b["label"].tolist())
        if k == len(ld) - 1:
            break
    got.append(e2)
    got.append(labels(ld))
    assert got == expect and len({str(e) for e in got}) == 4
    assert ld.state_dict()["epoch"] == 4 and ld.state_dict()["batches_done"] == 0
    ld.close()


def test_state_after_the_last_batch_resumes_at_the_next_epoch(ds):
    ld = fastdata.loader(ds, 4, seed=3, device="cpu")
    it = iter(ld)
    for _ in range(len(ld)):
        next(it)
    state = ld.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, 0)
    fresh = fastdata.loader(ds, 4, seed=3, device="cpu")
    fresh.load_state_dict(json.loads(json.dumps(state)))
    assert labels(fresh) == epochs_direct(ds, 2)[1]
    old = {**state, "epoch": 0, "batches_done": len(ld)}  # what fastdata saved there before this rule
    fresh.load_state_dict(old)
    assert labels(fresh) == epochs_direct(ds, 2)[1]


def test_set_epoch_wins_and_keeps_a_restored_position(ds):
    ld = fastdata.loader(ds, 4, seed=3, device="cpu")
    ld.load_state_dict({**ld.state_dict(), "epoch": 2, "batches_done": 3})
    ld.set_epoch(2)  # what Lightning does right after restoring: the position stays
    assert labels(ld) == epochs_direct(ds, 3)[2][3:]
    ld.load_state_dict({**ld.state_dict(), "epoch": 2, "batches_done": 3})
    ld.set_epoch(1)  # another epoch: from its start
    assert labels(ld) == epochs_direct(ds, 2)[1]


# -- Lightning --------------------------------------------------------------------------------------

def test_lightning_fit_sees_a_new_order_each_epoch_matching_direct_iteration(ds):
    record: list = []
    ld = fastdata.loader(ds, 4, seed=3, device="cpu", num_workers=2)
    quiet_trainer(max_epochs=3).fit(lightning_module(record), train_dataloaders=ld)
    expect = epochs_direct(ds, 3)
    assert record == [[e, b] for e in range(3) for b in expect[e]]
    assert expect[0] != expect[1] != expect[2]
    ld.close()


def test_lightning_limit_train_batches_sees_new_samples_each_epoch(ds):
    """Lightning stops half-way through each epoch and calls loader.sampler.set_epoch."""
    record: list = []
    ld = fastdata.loader(ds, 4, seed=3, device="cpu", num_workers=2)
    quiet_trainer(max_epochs=3, limit_train_batches=0.5).fit(lightning_module(record), train_dataloaders=ld)
    expect = epochs_direct(ds, 3)
    assert record == [[e, b] for e in range(3) for b in expect[e][:5]]
    ld.close()


@pytest.mark.parametrize("stop", [13, 10], ids=["mid-epoch", "end-of-epoch"])
def test_lightning_checkpoint_resume_equals_an_uninterrupted_run(ds, tmp_path, stop):
    """A step checkpoint mid-epoch 1, or on the last batch of epoch 0, resumes to the same samples in
    the same order as a run that was never stopped (the loader's state travels in the checkpoint)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    def loader():
        return fastdata.loader(ds, 4, seed=3, device="cpu", num_workers=2)

    straight: list = []
    quiet_trainer(max_epochs=3).fit(lightning_module(straight), train_dataloaders=loader())
    first: list = []
    ck = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=stop, save_top_k=-1)
    quiet_trainer(max_epochs=3, max_steps=stop, callbacks=[ck], enable_checkpointing=True).fit(
        lightning_module(first), train_dataloaders=loader())
    (ckpt,) = tmp_path.glob("*.ckpt")
    saved = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert (saved["epoch"], saved["batches_done"]) == divmod(stop, 10)
    rest: list = []
    quiet_trainer(max_epochs=3).fit(lightning_module(rest), train_dataloaders=loader(), ckpt_path=ckpt)
    assert len(first) == stop and first + rest == straight


def _run_lightning_ddp(ds, tmp_path, strategy: str, where: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    r = subprocess.run([sys.executable, str(SCENARIOS / "lightning_ddp.py"), str(ds), str(out), strategy, where],
                       capture_output=True, text=True, env=env, timeout=400, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{k}.json").read_text()) for k in (0, 1)]
    for k, r_ in enumerate(ranks):
        assert r_["world"] == 2 and r_["len"] == N // 2 // 4
        expect = [[e, b.tolist()] for e in range(2) for b in _plan(fastdata.loader(ds, 4, seed=11), World(k, 2), e)]
        assert r_["seen"] == expect  # the rank's share, a new order each epoch
    for e in range(2):
        shares = [[i for ep, b in r_["seen"] if ep == e for i in b] for r_ in ranks]
        assert len(shares[0]) == len(shares[1]) == N // 2 and sorted(shares[0] + shares[1]) == list(range(N))


def test_lightning_ddp_with_the_loader_built_in_the_script(ds, tmp_path):
    """strategy="ddp" on 2 CPU processes: Lightning re-runs the script; the loader is built before
    the process group exists and still gives each rank its own half."""
    _run_lightning_ddp(ds, tmp_path, "ddp", "script")


@pytest.mark.slow
@pytest.mark.parametrize("strategy,where", [("ddp", "hooks"), ("ddp_spawn", "script"), ("ddp_spawn", "hooks")])
def test_lightning_ddp_variants(ds, tmp_path, strategy, where):
    """ddp_spawn pickles the loader built in the script; hooks build it in train_dataloader()."""
    _run_lightning_ddp(ds, tmp_path, strategy, where)


# -- Accelerate -------------------------------------------------------------------------------------

def test_accelerate_prepare_save_load_state_and_skip_first_batches(ds, tmp_path):
    from accelerate import Accelerator

    def setup():
        acc = Accelerator(cpu=True)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ld = fastdata.loader(ds, 4, seed=3, device="cpu", num_workers=2)
        model, opt, prepared = acc.prepare(model, opt, ld)
        assert prepared is ld  # Accelerate passes a non-DataLoader through: fastdata splits by rank itself
        acc.register_for_checkpointing(ld)
        return acc, ld

    expect = epochs_direct(ds, 3)
    acc, ld = setup()
    seen = [labels(ld)]
    e1 = []
    for b in ld:
        e1.append(b["label"].tolist())
        if len(e1) == 4:
            acc.save_state(tmp_path / "ckpt")
            break
    assert seen[0] == expect[0] and e1 == expect[1][:4]
    ld.close()

    acc, ld = setup()
    acc.load_state(tmp_path / "ckpt")
    skipped = acc.skip_first_batches(ld, 4)  # Accelerate's documented resume: skip what the epoch already did
    rest = [b for b in skipped]
    assert [b["label"].tolist() for b in rest] == expect[1][4:]
    direct = next(iter(fastdata.loader(ds, 40, shuffle=False, device="cpu")))
    for b in rest:  # the same batches the loader itself would yield, not just the same labels
        assert b["x"].dtype == torch.float32 and torch.equal(b["x"], direct["x"][b["label"]])
    assert labels(ld) == expect[2]  # then the loader goes on with the next epoch
    ld.close()


# -- torchrun and the world -------------------------------------------------------------------------

def test_torchrun_with_the_loader_built_before_init_process_group(ds, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                        str(SCENARIOS / "torchrun_shares.py"), str(ds), str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{k}.json").read_text()) for k in (0, 1)]
    assert all(r_["len"] == 5 and r_["state"]["world_size"] == 2 for r_ in ranks)
    for e in range(2):
        a, b = ranks[0]["epochs"][e], ranks[1]["epochs"][e]
        assert len(a) == len(b) == N // 2 and not set(a) & set(b) and sorted(a + b) == list(range(N))
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1]


def test_world_size_without_a_process_group_is_an_error(ds, monkeypatch):
    ld = fastdata.loader(ds, 4, device="cpu")  # building is fine: nothing is read yet
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UsageError, match="WORLD_SIZE=2.*init_process_group"):
        next(iter(ld))
    with pytest.raises(UsageError, match="WORLD_SIZE=2"):
        len(ld)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert len(labels(ld)) == len(ld) == 10


def test_a_mid_epoch_state_from_another_world_size_is_refused_when_iteration_starts(ds, monkeypatch):
    ld = fastdata.loader(ds, 4, device="cpu")
    state = {**ld.state_dict(), "world_size": 2, "rank": 1, "batches_done": 2}
    ld.load_state_dict(state)  # may be loaded before the process group exists: checked at the pass
    with pytest.raises(UsageError, match="world_size=2.*1 process"):
        next(iter(ld))
    ld.load_state_dict(state)
    monkeypatch.setattr(World, "detect", classmethod(lambda cls: World(1, 2)))
    assert labels(ld) == [b.tolist() for b in _plan(ld, World(1, 2), 0)][2:]


# -- pickling ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode,workers", MODES + [("threads", 0)])
def test_loaders_pickle_mid_epoch_and_carry_on(ds, mode, workers):
    ld = fastdata.loader(ds, 4, seed=3, device="cpu", num_workers=workers, config=LoaderConfig(mode=mode))
    it = iter(ld)
    next(it)  # threads or worker processes running, handles open
    ld.load_state_dict({**ld.state_dict(), "epoch": 1, "batches_done": 2})
    copy = pickle.loads(pickle.dumps(ld))
    assert copy.state_dict() == ld.state_dict()
    assert labels(copy) == epochs_direct(ds, 2)[1][2:]
    assert labels(copy) == epochs_direct(ds, 3)[2]
    del it
    ld.close()
    copy.close()


def test_dali_loaders_pickle_and_refuse_skip_first_batches_clearly(ds):
    pytest.importorskip("nvidia.dali")
    ld = fastdata.loader(ds, 4, seed=3, device="cpu", backend="dali", num_workers=1)
    it = iter(ld)
    next(it)  # a pipeline running
    copy = pickle.loads(pickle.dumps(ld))
    del it
    assert labels(copy) == epochs_direct(ds, 1)[0] and labels(copy) == epochs_direct(ds, 2)[1]
    with pytest.raises(UsageError, match="dali backend.*load_state_dict"):
        copy.collate_fn(ld.dataset.get_batch([0, 1]))
    ld.close()
    copy.close()


def _shift(batch, rng):
    return {**batch, "x": batch["x"] + rng.random()}


def test_collate_fn_with_a_transform_is_refused_in_dataloader_workers(ds):
    """A DataLoader worker does not see which batch of the epoch it finishes, which seeds the draws: each
    batch got batch 0's draws (silently other data); with num_workers=0 the batches equal the loader's."""
    from torch.utils.data import DataLoader

    def make():
        return fastdata.loader(ds, 4, seed=3, device="cpu", num_workers=0, transform=_shift)

    direct = [b["x"] for b in make()]
    ld = make()
    same = DataLoader(ld.dataset, batch_sampler=ld.batch_sampler, collate_fn=ld.collate_fn)
    assert all(torch.equal(a, b["x"]) for a, b in zip(direct, same, strict=True))
    ld = make()
    workers = DataLoader(ld.dataset, batch_sampler=ld.batch_sampler, collate_fn=ld.collate_fn, num_workers=1)
    with pytest.raises(UsageError, match="worker process cannot tell which batch.*num_workers=0"):
        next(iter(workers))


# -- the examples in docs/integrations.md -----------------------------------------------------------

EXAMPLES = ROOT / "docs" / "examples"


def test_integrations_doc_shows_each_example_file_verbatim():
    text = (ROOT / "docs" / "integrations.md").read_text()
    for name in ("lightning_fit.py", "accelerate_resume.py", "torchrun_ddp.py"):
        code = (EXAMPLES / name).read_text()
        assert f"```python\n# docs/examples/{name}\n{code}```" in text, f"docs/integrations.md: update {name}"


def _example_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def test_lightning_example_runs(ds, tmp_path):
    r = subprocess.run([sys.executable, str(EXAMPLES / "lightning_fit.py"), str(ds)], capture_output=True,
                       text=True, env=_example_env(), timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "trained 3 epochs" in r.stdout


def test_accelerate_example_runs(ds, tmp_path):
    r = subprocess.run([sys.executable, str(EXAMPLES / "accelerate_resume.py"), str(ds), str(tmp_path / "ck")],
                       capture_output=True, text=True, env=_example_env(), timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed at epoch 1, batch 4" in r.stdout and "done" in r.stdout


def test_torchrun_example_runs(ds, tmp_path):
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
                        str(EXAMPLES / "torchrun_ddp.py"), str(ds)],
                       capture_output=True, text=True, env=_example_env(), timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 0 of 2: 20 samples per epoch" in r.stdout and "rank 1 of 2: 20 samples per epoch" in r.stdout


_GLOO_THREADS_LEFT = """
import os, runpy, sys
sys.argv = [sys.argv[1], sys.argv[2]]
runpy.run_path(sys.argv[0], run_name="__main__")
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print("left:", sorted(n for n in names if "gloo" in n or "tcpstore" in n))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread names from /proc")
def test_torchrun_example_ends_its_gloo_threads_before_exit(ds, tmp_path):
    """The example's process group really ends at destroy_process_group: gloo threads still alive when
    Python shuts down can abort the rank (docs/integrations.md, "Ending a DDP script"). One rank, no torchrun."""
    env = {**_example_env(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port())}
    r = subprocess.run([sys.executable, "-c", _GLOO_THREADS_LEFT, str(EXAMPLES / "torchrun_ddp.py"), str(ds)],
                       capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rank 0 of 1: 40 samples per epoch" in r.stdout and "left: []" in r.stdout, r.stdout
