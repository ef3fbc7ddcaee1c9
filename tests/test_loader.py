"""fastdata.loader (torch backend): order, epochs, resume, DDP shares, ragged batches, errors, stats."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import fastdata
from conftest import free_port, gloo_group
from fastdata.errors import CorruptShardError, UsageError
from fastdata.loaders import LoaderConfig
from fastdata.reading.samplers import ORDER_RULE

N = 53  # prime: partial batches and uneven rank shares everywhere


def _make(tmp: Path, backend: str, n: int = N) -> Path:
    x = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3)
    np.save(tmp / "X.npy", x)
    np.save(tmp / "y.npy", np.arange(n, dtype=np.int64))
    dst = tmp / f"ds-{backend}"
    fastdata.convert(None, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, shard_size=300, workers=1)), labels=tmp / "y.npy", arrays={"x": tmp / "X.npy"})
    return dst


@pytest.fixture(scope="module", params=["hdf5", "lmdb"])
def ds_path(request, tmp_path_factory):
    return _make(tmp_path_factory.mktemp("loader"), request.param)


MODES = [("threads", 0), ("threads", 2), ("processes", 2)]


def ids_of(loader) -> list[list[int]]:
    return [b["label"].tolist() for b in loader]


@pytest.mark.parametrize("mode,workers", MODES)
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_once_per_epoch(ds_path, mode, workers, drop_last):
    ld = fastdata.loader(ds_path, 8, drop_last=drop_last, device="cpu", num_workers=workers,
                         config=LoaderConfig(mode=mode))
    for epoch in range(2):
        batches = ids_of(ld)
        assert len(batches) == len(ld) == (N // 8 if drop_last else -(-N // 8))
        flat = [i for b in batches for i in b]
        counts = Counter(flat)
        assert max(counts.values()) == 1
        assert len(flat) == (N - N % 8 if drop_last else N)
        assert all(len(b) == 8 for b in batches[:-1])
    ld.close()


def test_batches_hold_the_right_data(ds_path):
    ld = fastdata.loader(ds_path, 5, device="cpu", num_workers=2)
    for b in ld:
        assert b["x"].dtype == torch.float32 and b["x"].shape[1:] == (2, 3)
        expect = torch.arange(6, dtype=torch.float32)[None] + 6 * b["label"][:, None].float()
        assert torch.equal(b["x"].reshape(len(b["label"]), 6), expect)


def test_order_is_a_function_of_seed_and_epoch(ds_path):
    a = fastdata.loader(ds_path, 8, seed=1, device="cpu", num_workers=2)
    b = fastdata.loader(ds_path, 8, seed=1, device="cpu", num_workers=0)
    e0a, e1a = ids_of(a), ids_of(a)  # a complete pass moves to the next epoch
    b.set_epoch(1)
    assert ids_of(b) == e1a
    b.set_epoch(0)
    assert ids_of(b) == e0a
    assert e0a != e1a
    assert ids_of(fastdata.loader(ds_path, 8, seed=2, device="cpu")) != e0a


def test_storage_order_and_block_shuffle(ds_path):
    flat = [i for b in ids_of(fastdata.loader(ds_path, 8, shuffle=False, device="cpu")) for i in b]
    assert flat == list(range(N))
    ld = fastdata.loader(ds_path, 8, shuffle=fastdata.Block(4, window=2), device="cpu")
    flat = [i for b in ids_of(ld) for i in b]
    assert sorted(flat) == list(range(N)) and flat != list(range(N))
    assert flat == [i for b in ld.plan(0) for i in b.tolist()]  # the order is fastdata.reading.samplers's


@pytest.mark.parametrize("mode,workers", MODES)
def test_resume_mid_epoch_gives_exactly_the_rest(ds_path, mode, workers):
    cfg = LoaderConfig(mode=mode)
    full = fastdata.loader(ds_path, 8, seed=5, device="cpu", num_workers=workers, config=cfg)
    full.set_epoch(3)
    expected = ids_of(full)
    ld = fastdata.loader(ds_path, 8, seed=5, device="cpu", num_workers=workers, config=cfg)
    ld.set_epoch(3)
    seen = []
    for b in ld:
        seen.append(b["label"].tolist())
        if len(seen) == 3:
            state = ld.state_dict()
            break
    fresh = fastdata.loader(ds_path, 8, seed=5, device="cpu", num_workers=workers, config=cfg)
    fresh.load_state_dict(state)
    rest = ids_of(fresh)
    assert seen + rest == expected
    assert fresh.state_dict()["epoch"] == 4 and fresh.state_dict()["batches_done"] == 0
    for ld_ in (full, ld, fresh):
        ld_.close()


def test_the_shuffle_sizes_gone_from_loaderconfig_name_the_mode_to_pass():
    with pytest.raises(UsageError, match=r"shuffle=fastdata\.Block\(512\)"):
        LoaderConfig(block=512)
    with pytest.raises(UsageError, match=r"shuffle=fastdata\.Shards\(window=3\)"):
        LoaderConfig(shard_window=3)


def test_pin_memory_with_worker_processes_is_refused_not_dropped(ds_path):
    # the processes' shared-memory ring is not page-locked: an explicit pin_memory=True was silently not honoured
    with pytest.raises(UsageError, match=r"pin_memory=True\) cannot be honoured with mode='processes'"):
        fastdata.loader(ds_path, 8, device="cpu", num_workers=2, config=LoaderConfig(mode="processes", pin_memory=True))


def test_resume_state_must_match(ds_path):
    ld = fastdata.loader(ds_path, 8, device="cpu")
    state = ld.state_dict()
    other = fastdata.loader(ds_path, 16, device="cpu")
    with pytest.raises(UsageError, match="batch_size"):
        other.load_state_dict(state)


def test_resume_of_a_windowed_shuffle_needs_the_same_order_rule(ds_path):
    """A mid-epoch state of a Block shuffle records the order rule and the block's sizes: another
    window, another mode, or a state from before the rule existed, is refused instead of resuming another order."""
    block = fastdata.Block(4, window=2)
    ld = fastdata.loader(ds_path, 8, shuffle=block, seed=1, device="cpu")
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    ld.close()
    assert state["order"] == {"rule": ORDER_RULE, "block": 4, "window": 2}
    assert state["shuffle"] == "block"  # a state holds plain values (torch.load's weights_only)
    same = fastdata.loader(ds_path, 8, shuffle=fastdata.Block(4, window=2), seed=1, device="cpu")
    same.load_state_dict(state)  # accepted
    other = fastdata.loader(ds_path, 8, shuffle=fastdata.Block(4, window=3), seed=1, device="cpu")
    with pytest.raises(UsageError, match="window"):
        other.load_state_dict(state)
    shards = fastdata.loader(ds_path, 8, shuffle=fastdata.Shards(), seed=1, device="cpu")
    with pytest.raises(UsageError, match="shuffle='block'"):
        shards.load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "order"}
    with pytest.raises(UsageError, match=r"set_epoch\(1\)"):
        same.load_state_dict(older)
    older["batches_done"] = 0  # at an epoch boundary the order rule does not matter
    same.load_state_dict(older)
    for x in (same, other, shards):
        x.close()


def _ddp_worker(rank: int, world: int, port: int, path: str, drop_last: bool, out: str) -> None:
    with gloo_group(rank, world, port) as dist:
        ld = fastdata.loader(path, 4, drop_last=drop_last, seed=9, device="cpu", num_workers=2)
        batches = ids_of(ld)
        n = torch.tensor([len(batches)])
        dist.all_reduce(n, op=dist.ReduceOp.MAX)  # would hang if ranks disagreed on batch counts
        np.save(f"{out}-{rank}.npy", np.array([i for b in batches for i in b] + [-1, len(batches), len(ld)]))


@pytest.mark.parametrize("drop_last", [pytest.param(False, marks=pytest.mark.slow), True])  # two gloo processes each
def test_ddp_ranks_get_disjoint_equal_shares(ds_path, tmp_path, drop_last):
    world = 3
    torch.multiprocessing.spawn(_ddp_worker, args=(world, free_port(), str(ds_path), drop_last, str(tmp_path / "r")),
                                nprocs=world, join=True)
    shares, counts = [], []
    for r in range(world):
        a = np.load(tmp_path / f"r-{r}.npy").tolist()
        sep = a.index(-1)
        shares.append(a[:sep])
        counts.append(tuple(a[sep + 1 :]))
    assert len(set(counts)) == 1 and counts[0][0] == counts[0][1]
    per = N // world if drop_last else -(-N // world)
    assert all(len(s) == (per - per % 4 if drop_last else per) for s in shares)
    flat = [i for s in shares for i in s]
    if drop_last:
        assert len(flat) == len(set(flat))  # disjoint
    else:
        assert set(flat) == set(range(N))  # everything, with at most world-1 repeats for padding
        assert len(flat) - len(set(flat)) == per * world - N


def test_ragged_batches_are_padded_with_lengths(tmp_path):
    src = tmp_path / "seq"
    src.mkdir()
    for i in range(10):
        np.save(src / f"{i:02d}.npy", np.full((i % 4 + 1, 3), i, np.int16))
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)))
    ld = fastdata.loader(tmp_path / "ds", 4, shuffle=False, device="cpu")
    first = next(iter(ld))
    assert first["x_lengths"].tolist() == [1, 2, 3, 4]
    assert first["x"].shape == (4, 4, 3)
    assert first["x"][0, 0].tolist() == [0, 0, 0] and first["x"][3, 3].tolist() == [3, 3, 3]
    assert first["x"][1, 2:].abs().sum() == 0


@pytest.mark.parametrize("mode,workers", MODES)
def test_worker_error_names_shard_and_sample(tmp_path, mode, workers):
    path = _make(tmp_path, "lmdb")
    shard = sorted(path.glob("shard-*"))[1]
    blob = bytearray(shard.read_bytes())
    for pos in range(len(blob) - 4):
        if blob[pos : pos + 4] == b"FDR1":
            blob[pos + 4] ^= 0x7F  # break every record's field count
    shard.write_bytes(bytes(blob))
    ld = fastdata.loader(path, 64, shuffle=False, device="cpu", num_workers=workers, config=LoaderConfig(mode=mode))
    with pytest.raises(CorruptShardError, match=rf"{shard.name}.*sample \d+") as e:
        list(ld)
    where = "worker process" if mode == "processes" else "loader thread"
    assert where in str(e.value) or workers == 0
    ld.close()


def test_stats_report_throughput_and_wait(ds_path):
    ld = fastdata.loader(ds_path, 8, device="cpu", num_workers=2)
    list(ld)
    s = ld.stats()
    assert s["batches"] == len(ld) and s["samples"] == N
    assert s["samples_per_s"] > 0 and 0 <= s["wait_fraction"] <= 1.0 + 1e-6
    assert s["wait_ms_p95"] >= s["wait_ms_median"] >= 0


def test_cpu_batches_are_not_overwritten_while_held(ds_path):
    ld = fastdata.loader(ds_path, 8, shuffle=False, device="cpu", num_workers=2, config=LoaderConfig(prefetch=2))
    held = [b for b in ld]  # keep every batch: buffers must not be recycled under us
    flat = [i for b in held for i in b["label"].tolist()]
    assert flat == list(range(N))
    for b in held:
        assert torch.equal(b["x"][:, 0, 0], 6 * b["label"].float())


def test_bad_arguments(ds_path):
    with pytest.raises(UsageError):
        fastdata.loader(ds_path, 0)
    with pytest.raises(UsageError):
        fastdata.loader(ds_path, 4, shuffle="sometimes")
    with pytest.raises(UsageError, match="CUDA"):
        if torch.cuda.is_available():
            raise UsageError("CUDA present: nothing to check")
        fastdata.loader(ds_path, 4, device="cuda")
    with pytest.raises(UsageError):
        fastdata.loader(ds_path, 4, num_workers=-1)


@pytest.mark.skipif(getattr(torch, "accelerator", torch.cuda).is_available(), reason="pinning works on a GPU")
def test_pin_memory_without_a_gpu_is_refused_when_the_loader_is_built(ds_path):
    """pin_memory: true copied from a GPU config (user 004's YAML) onto a CPU machine: one UsageError when the
    loader is built, not torch's RuntimeError from deep inside the first batch's buffer allocation."""
    with pytest.raises(UsageError, match=r"pin_memory=True.*no GPU here"):
        fastdata.loader(ds_path, 4, device="cpu", config=LoaderConfig(pin_memory=True))


@pytest.mark.parametrize("phase", [0, 40])
def test_recycled_buffers_are_reused_only_when_nothing_uses_them(phase):
    from fastdata.loaders.host import Recycler

    r = Recycler()
    a = r.take((4, 5), torch.float32, phase)
    assert a.data_ptr() % 64 == phase and a.is_contiguous() and a.shape == (4, 5)
    r.lend(a)
    view, a_ptr = a[:2], a.data_ptr()
    del a
    # (pointers are read outside assert statements: pytest's assert rewriting keeps references)
    b = r.take((4, 5), torch.float32, phase)  # a slice of `a` is still held: `a` must not come back
    r.lend(b)
    arr, b_ptr = b.numpy(), b.data_ptr()
    del b
    c = r.take((4, 5), torch.float32, phase)  # a numpy view of `b` is held
    r.lend(c)
    c_ptr = c.data_ptr()
    del c
    assert len({a_ptr, b_ptr, c_ptr}) == 3
    del view, arr
    reused = {r.take((4, 5), torch.float32, phase).data_ptr() for _ in range(3)}
    assert reused == {a_ptr, b_ptr, c_ptr}  # all three free again, nothing new allocated


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_batch_buffers_are_reused(tmp_path, backend):
    """Large samples: the same few buffers serve every epoch, aligned like the shard's bytes, and
    batches stay right."""
    src = tmp_path / "big"
    src.mkdir()
    rng = np.random.default_rng(0)
    data = rng.standard_normal((24, 4, 64, 65), dtype=np.float32)  # 66,560-byte samples
    for i, a in enumerate(data):
        np.save(src / f"{i:03d}.npy", a)
    dst = tmp_path / backend
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend)))
    ld = fastdata.loader(dst, 8, shuffle=False, device="cpu", num_workers=2)
    procs = fastdata.loader(dst, 8, shuffle=False, device="cpu", num_workers=2, config=LoaderConfig(mode="processes"))
    # LMDB keeps each large record at one offset into its pages: buffers start at that phase (mod 64)
    phase = ld.dataset.readers[0].copy_phase("x")
    assert (phase != 0) == (backend == "lmdb")
    ptrs = set()
    for _ in range(4):
        for k, b in enumerate(ld):
            ptrs.add(b["x"].data_ptr())
            np.testing.assert_array_equal(b["x"].numpy(), data[8 * k : 8 * k + 8])
    assert len(ptrs) <= ld.config.prefetch + 3  # recycled, not one allocation per batch
    assert {p % 64 for p in ptrs} == {phase}
    for k, b in enumerate(procs):  # the worker processes' shared ring (not phased: no gain there, copy_phase_ab_run4)
        np.testing.assert_array_equal(b["x"].numpy(), data[8 * k : 8 * k + 8])
    ld.close()
    procs.close()


def test_the_gpu_of_a_torchrun_process_is_its_local_rank(monkeypatch):
    from fastdata.world import World

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert World.cuda_index(8) is None
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert World.cuda_index(8) == 3 and World.cuda_index(2) is None  # one visible GPU per process: not ours to pick
    monkeypatch.setenv("LOCAL_RANK", "x")
    assert World.cuda_index(8) is None
