"""fastdata.train.fit on the CPU: learning, exact resume, accumulation, clipping, fallbacks, metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import converters
import fastdata
from conftest import free_port, gloo_group
from fastdata import train
from fastdata.augment import RandomCrop
from fastdata.examples import classification_loss


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    """Two well-separated classes of 4x4 'images': a learnable task."""
    tmp = tmp_path_factory.mktemp("train")
    rng = np.random.default_rng(0)
    y = np.arange(96) % 2
    x = (rng.standard_normal((96, 1, 4, 4)) + 3.0 * y[:, None, None, None]).astype(np.float32)
    np.save(tmp / "X.npy", x)
    np.save(tmp / "y.npy", y.astype(np.int64))
    converters.convert(None, tmp / "ds", converters.WriteOptions(workers=1), arrays={"x": tmp / "X.npy"},
                       labels=tmp / "y.npy")
    return tmp / "ds"


def make_model(seed: int = 0, bn: bool = True) -> nn.Module:
    torch.manual_seed(seed)
    layers = [nn.Conv2d(1, 4, 3, padding=1)] + ([nn.BatchNorm2d(4)] if bn else []) + [
        nn.ReLU(), nn.Flatten(), nn.Linear(64, 2)]
    return nn.Sequential(*layers)


def test_loss_falls_and_metrics_are_sane(blobs):
    ld = fastdata.loader(blobs, 16, device="cpu", num_workers=0)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    logs: list[str] = []
    res = train.fit(model, ld, opt, classification_loss(), epochs=4, on_log=logs.append, log_every=0)
    losses = [m.loss for m in res.epochs]
    assert losses[-1] < 0.5 * losses[0]
    for m in res.epochs:
        assert m.steps == 6 and m.samples == 96 and m.samples_per_s > 0
        assert 0 <= m.wait_fraction <= 1 and m.wait_s >= 0 and m.compute_s > 0
        assert m.wait_s + m.compute_s <= m.seconds * 1.05
        assert m.skipped_steps == 0 and m.nonfinite_losses == 0 and m.peak_memory_bytes is None
    assert res.precision == "fp32" and res.steps == 24
    assert "device   cpu" in res.report and "precision fp32" in res.report
    assert any("waited for input" in line for line in logs)


def test_resume_after_stop_gives_the_same_weights(blobs, tmp_path):
    def run(**kw):
        model = make_model(1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        ld = fastdata.loader(blobs, 16, seed=3, device="cpu", num_workers=2)
        train.fit(model, ld, opt, classification_loss(), epochs=3, log_every=0, **kw)
        return model

    straight = run()
    ckpt = tmp_path / "ckpt.pt"
    run(checkpoint=ckpt, max_steps=8)  # stops mid-epoch 1 (6 steps per epoch)
    state = torch.load(ckpt, weights_only=True)
    assert state["epoch"] == 1 and state["step"] == 8 and state["loader"]["batches_done"] == 2
    resumed = run(checkpoint=ckpt, resume=ckpt)
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)
    assert not [p for p in tmp_path.iterdir() if p.name != "ckpt.pt"]  # no temp files left


def test_grad_accumulation_equals_a_bigger_batch(blobs):
    def run(batch, accum):
        model = make_model(2, bn=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ld = fastdata.loader(blobs, batch, shuffle=False, device="cpu")
        res = train.fit(model, ld, opt, classification_loss(), epochs=2, grad_accum=accum, log_every=0)
        return model, res

    big, rb = run(32, 1)
    small, rs = run(8, 4)
    assert rb.steps == rs.steps == 6
    for a, b in zip(big.parameters(), small.parameters()):
        assert torch.allclose(a, b, atol=1e-5)


def test_clipping_happens_after_unscale():
    p = nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    (scaler.scale((p * torch.tensor([3.0, 4.0, 0.0, 0.0])).sum())).backward()  # true grad norm 5
    skipped = train._optimizer_step(opt, scaler, [p], clip=1.0)
    assert int(skipped) == 0
    assert torch.allclose(p.detach(), -torch.tensor([0.6, 0.8, 0.0, 0.0]), atol=1e-6)  # clipped to norm 1


def test_non_finite_gradients_skip_the_step_and_are_counted():
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale((p * torch.tensor([float("inf"), 1.0])).sum()).backward()
    assert int(train._optimizer_step(opt, scaler, [p], clip=None)) == 1
    assert torch.equal(p.detach(), torch.ones(2)) and scaler.get_scale() < 8.0


def test_fp16_with_scaler_and_bf16_on_cpu(blobs):
    for precision in ("fp16", "bf16"):
        model = make_model(bn=False)
        ld = fastdata.loader(blobs, 16, device="cpu")
        res = train.fit(model, ld, torch.optim.SGD(model.parameters(), lr=0.05), classification_loss(), epochs=1,
                        precision=precision, clip_grad_norm=1.0, log_every=0)
        assert res.precision == precision and res.epochs[0].steps == 6
        assert ("GradScaler" in res.report) == (precision == "fp16")


def test_compile_failure_falls_back_to_eager(blobs, monkeypatch):
    def broken_compile(model, *a, **k):
        class Broken(nn.Module):
            def __init__(self):
                super().__init__()
                self._orig_mod = model

            def forward(self, x):
                raise RuntimeError("inductor exploded")

        return Broken()

    monkeypatch.setattr(torch, "compile", broken_compile)
    logs: list[str] = []
    model = make_model()
    res = train.fit(model, fastdata.loader(blobs, 16, device="cpu"), torch.optim.SGD(model.parameters(), lr=0.1),
                    classification_loss(), epochs=1, compile=True, on_log=logs.append, log_every=0)
    assert not res.compiled and res.epochs[0].steps == 6
    assert any("falling back to eager" in line and "inductor exploded" in line for line in logs)


def _ddp_fit(rank: int, world: int, port: int, path: str, out: str) -> None:
    with gloo_group(rank, world, port):
        model = nn.parallel.DistributedDataParallel(make_model(5, bn=False))
        ld = fastdata.loader(path, 8, device="cpu", num_workers=0)
        logs: list[str] = []
        res = train.fit(model, ld, torch.optim.SGD(model.parameters(), lr=0.1), classification_loss(), epochs=1,
                        grad_accum=2, on_log=logs.append, log_every=0)
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        torch.save({"params": flat, "logs": len(logs), "steps": res.steps}, f"{out}-{rank}.pt")


def test_ddp_ranks_stay_in_sync_and_only_rank0_logs(blobs, tmp_path):
    torch.multiprocessing.spawn(_ddp_fit, args=(2, free_port(), str(blobs), str(tmp_path / "r")), nprocs=2)
    r0, r1 = (torch.load(tmp_path / f"r-{r}.pt") for r in (0, 1))
    assert torch.equal(r0["params"], r1["params"])  # gradients were averaged across ranks
    assert r0["logs"] > 0 and r1["logs"] == 0
    assert r0["steps"] == r1["steps"] == 3  # 48 samples per rank, batch 8, accumulate 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_precision_on_gpu(blobs):
    model = make_model()
    ld = fastdata.loader(blobs, 16, device="cuda")
    res = train.fit(model, ld, torch.optim.SGD(model.parameters(), lr=0.1), classification_loss(), epochs=1)
    assert res.precision in ("bf16", "fp16")
    assert res.epochs[0].peak_memory_bytes > 0 and res.epochs[0].compute_s > 0


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    import random

    state = train._rng_state()
    draws = (torch.rand(3), np.random.rand(3), random.random())
    train.save_checkpoint(tmp_path / "rng.pt", {"rng": state})
    train._set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True)["rng"])
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(draws[0], again[0]) and np.array_equal(draws[1], again[1]) and draws[2] == again[2]


def test_batches_of_a_plain_dataloader_are_moved_to_the_device():
    x, y = torch.ones(2, 3), torch.tensor([1, 2])
    moved = train.to_device({"x": x, "pair": (x, [y]), "name": "a"}, torch.device("cpu"))
    assert moved["x"] is x and moved["pair"][0] is x and moved["pair"][1][0] is y and moved["name"] == "a"
    assert isinstance(moved["pair"], tuple) and isinstance(moved["pair"][1], list)
    meta = train.to_device({"x": x, "pair": (x, [y])}, torch.device("meta"))  # a device other than the batch's
    assert meta["x"].device.type == "meta" and meta["pair"][1][0].device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fit_takes_a_plain_dataloader_on_gpu(blobs):
    ds = fastdata.open(blobs)  # the samples, served by a plain DataLoader as users bring one
    batches = [ds.get_batch(np.arange(i, i + 16)) for i in range(0, 48, 16)]
    plain = torch.utils.data.DataLoader([{k: torch.from_numpy(v[j]) for k, v in b.items()}
                                         for b in batches for j in range(16)], batch_size=16, pin_memory=True)
    model = make_model()
    res = train.fit(model.cuda(), plain, torch.optim.SGD(model.parameters(), lr=0.1), classification_loss(), epochs=1)
    assert res.steps == 3 and res.epochs[0].samples == 48


def test_resume_with_another_precision_leaves_out_a_scaler_state_that_does_not_apply(blobs, tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    model = make_model(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ld = fastdata.loader(blobs, 16, device="cpu", num_workers=0)
    train.fit(model, ld, opt, classification_loss(), epochs=1, precision="bf16", checkpoint=ckpt, max_steps=2,
              log_every=0)
    assert torch.load(ckpt, weights_only=True)["scaler"] == {}  # bf16 trains without a scaler
    res = train.fit(model, ld, opt, classification_loss(), epochs=1, precision="fp16", resume=ckpt, log_every=0)
    assert res.precision == "fp16" and res.steps == 6


def test_cudnn_autotuning_only_when_batch_shapes_are_fixed(blobs, tmp_path):
    from PIL import Image

    src = tmp_path / "imgs" / "c"
    src.mkdir(parents=True)
    for i, (h, w) in enumerate([(20, 30), (24, 24), (30, 18)]):
        Image.fromarray(np.full((h, w, 3), 99, np.uint8)).save(src / f"{i}.jpg")
    converters.convert(tmp_path / "imgs", tmp_path / "enc", images=converters.ImageOptions(images="encoded"))
    seqs = tmp_path / "seqs"
    seqs.mkdir()
    for i, n in enumerate([3, 5]):
        np.save(seqs / f"{i}.npy", np.zeros((n, 2), np.float32))
    converters.convert(seqs, tmp_path / "rag")
    assert train._fixed_shapes(fastdata.loader(blobs, 4, device="cpu"))
    assert train._fixed_shapes([{"x": torch.zeros(1)}])  # a plain iterable: nothing to go by
    assert not train._fixed_shapes(fastdata.loader(tmp_path / "enc", 2, device="cpu"))  # sizes vary
    assert train._fixed_shapes(fastdata.loader(tmp_path / "enc", 2, device="cpu", augment=[RandomCrop(16)]))
    assert not train._fixed_shapes(fastdata.loader(tmp_path / "rag", 2, device="cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_resume_on_gpu(blobs, tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    model = make_model(1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ld = fastdata.loader(blobs, 16, device="cuda")
    train.fit(model, ld, opt, classification_loss(), epochs=2, checkpoint=ckpt, max_steps=8, log_every=0)
    res = train.fit(model, ld, opt, classification_loss(), epochs=2, checkpoint=ckpt, resume=ckpt, log_every=0)
    assert res.steps == 12 and all(p.is_cuda for p in model.parameters())
