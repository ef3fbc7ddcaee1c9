"""fastdata.train.fit on the CPU: learning, exact resume, accumulation, clipping, fallbacks, metrics."""

from __future__ import annotations

import contextlib
import io
import logging
from typing import Iterator

import numpy as np
import pytest
import torch
from conftest import free_port, gloo_group
from torch import nn

import fastdata
from fastdata import train
from fastdata.augment import RandomCrop
from fastdata.demo.examples import classification_loss
from fastdata.errors import UsageError


@pytest.fixture(scope="module")
def blobs(tmp_path_factory):
    """Two well-separated classes of 4x4 'images': a learnable task."""
    tmp = tmp_path_factory.mktemp("train")
    rng = np.random.default_rng(0)
    y = np.arange(96) % 2
    x = (rng.standard_normal((96, 1, 4, 4)) + 3.0 * y[:, None, None, None]).astype(np.float32)
    np.save(tmp / "X.npy", x)
    np.save(tmp / "y.npy", y.astype(np.int64))
    fastdata.convert(None, tmp / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)), labels=tmp / "y.npy", arrays={"x": tmp / "X.npy"})
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


def _fit_two_epochs(**kw) -> None:
    model = nn.Linear(3, 2)
    batches = [{"x": torch.randn(4, 3), "label": torch.tensor([0, 1, 0, 1])}] * 2
    train.fit(model, batches, torch.optim.SGD(model.parameters(), lr=0.1), classification_loss(), epochs=2, **kw)


def test_fit_shows_its_epoch_lines_on_stderr_only_where_logging_is_unconfigured(capsys):
    """A plain script (no logging set up) sees the per-epoch line; a program that configured logging decides;
    verbose=False shows nothing; fit leaves no handler behind."""
    root, ours = logging.getLogger(), logging.getLogger("fastdata.train")
    saved = root.handlers[:]
    root.handlers.clear()  # pytest's own capture handlers: as if nothing were configured
    try:
        _fit_two_epochs()
        err = capsys.readouterr().err
        assert "epoch 0: " in err and "epoch 1: " in err and "waited for input" in err and "device   cpu" in err
        assert not ours.handlers and ours.level == logging.NOTSET
        _fit_two_epochs(verbose=False)
        assert capsys.readouterr().err == ""
        configured = logging.StreamHandler(io.StringIO())
        root.addHandler(configured)  # root at WARNING: the program's choice hides INFO
        _fit_two_epochs()
        assert capsys.readouterr().err == "" and configured.stream.getvalue() == ""
    finally:
        root.handlers[:] = saved


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


@pytest.mark.parametrize("kw,match", [
    ({"clip_grad_norm": -1.0}, "clip_grad_norm must be a positive number"),  # reversed the gradients
    ({"clip_grad_norm": 0.0}, "clip_grad_norm must be a positive number"),  # zeroed them: no learning
    ({"max_steps": 0}, "max_steps must be a positive integer"),  # one step still ran
    ({"checkpoint_every": 2}, "checkpoint_every needs checkpoint="),  # no checkpoint was ever written
    ({"grad_accum": 1.5}, "grad_accum must be an integer of at least 1"),  # stepped once, at the epoch's end
    ({"epochs": 2.0}, "epochs must be an integer of at least 1"),  # range()'s TypeError
])
def test_fit_refuses_limits_it_cannot_honour(blobs, kw, match):
    model = make_model(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(UsageError, match=match):
        train.fit(model, fastdata.loader(blobs, 16, device="cpu", num_workers=0), opt, classification_loss(),
                  **{"epochs": 1, "log_every": 0, **kw})
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # nothing trained


def test_classification_loss_names_a_field_the_batch_lacks():
    """The quickstart's loss on a dataset whose input is not 'x' (images): a KeyError 'x' from inside fit."""
    loss = classification_loss("x", "label")
    with pytest.raises(UsageError, match=r"the batch has no field 'x' \(its fields: image, label\); name the fields"):
        loss(nn.Linear(2, 2), {"image": torch.zeros(1, 2), "label": torch.zeros(1, dtype=torch.long)})


def test_fit_refuses_a_checkpoint_path_it_cannot_write_before_training(blobs, tmp_path):
    """checkpoint= a folder (or a path under a file) raised IsADirectoryError (FileExistsError) at the first epoch's
    end, after that epoch had trained."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "notes").write_text("")
    for path, match in ((tmp_path / "runs", "is a folder; name a file in it"), (tmp_path / "notes" / "c.pt", "is a file")):
        model = make_model(1)
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(UsageError, match=match):
            train.fit(model, fastdata.loader(blobs, 16, device="cpu", num_workers=0),
                      torch.optim.SGD(model.parameters(), lr=0.05), classification_loss(), epochs=1, log_every=0,
                      checkpoint=path)
        assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))  # nothing trained
    model = make_model(1)  # as advised: a file in the folder
    train.fit(model, fastdata.loader(blobs, 16, device="cpu", num_workers=0), torch.optim.SGD(model.parameters(), lr=0.05),
              classification_loss(), epochs=1, log_every=0, checkpoint=tmp_path / "runs" / "ckpt.pt")
    assert (tmp_path / "runs" / "ckpt.pt").is_file()


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


def _ddp_fit_rank(rank: int, path: str, out: str) -> None:
    model = nn.parallel.DistributedDataParallel(make_model(5, bn=False))
    ld = fastdata.loader(path, 8, device="cpu", num_workers=0)
    logs: list[str] = []
    res = train.fit(model, ld, torch.optim.SGD(model.parameters(), lr=0.1), classification_loss(), epochs=1,
                    grad_accum=2, on_log=logs.append, log_every=0)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.save({"params": flat, "logs": len(logs), "steps": res.steps}, f"{out}-{rank}.pt")


def _ddp_fit(rank: int, world: int, port: int, path: str, out: str) -> None:
    with gloo_group(rank, world, port):
        _ddp_fit_rank(rank, path, out)  # the DDP model is freed before the group is destroyed


def test_ddp_ranks_stay_in_sync_and_only_rank0_logs(blobs, tmp_path):
    torch.multiprocessing.spawn(_ddp_fit, args=(2, free_port(), str(blobs), str(tmp_path / "r")), nprocs=2)
    r0, r1 = (torch.load(tmp_path / f"r-{r}.pt") for r in (0, 1))
    assert torch.equal(r0["params"], r1["params"])  # gradients were averaged across ranks
    assert r0["logs"] > 0 and r1["logs"] == 0
    assert r0["steps"] == r1["steps"] == 3  # 48 samples per rank, batch 8, accumulate 2


@pytest.mark.gpu  # needs CUDA: tests/conftest.py skips it without
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


@pytest.mark.gpu  # needs CUDA: tests/conftest.py skips it without
def test_fit_takes_a_plain_dataloader_on_gpu(blobs):
    ds = fastdata.open(blobs)  # the samples, served by a plain DataLoader as users bring one
    batches = [ds.get_batch(np.arange(i, i + 16)) for i in range(0, 48, 16)]
    plain = torch.utils.data.DataLoader([{k: torch.as_tensor(v[j]) for k, v in b.items()}
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
    fastdata.convert(tmp_path / "imgs", tmp_path / "enc", fastdata.ConvertConfig(images=fastdata.ImageOptions(images="encoded")))
    seqs = tmp_path / "seqs"
    seqs.mkdir()
    for i, n in enumerate([3, 5]):
        np.save(seqs / f"{i}.npy", np.zeros((n, 2), np.float32))
    fastdata.convert(seqs, tmp_path / "rag")
    assert train.fixed_shapes(fastdata.loader(blobs, 4, device="cpu"))
    assert train.fixed_shapes([{"x": torch.zeros(1)}])  # a plain iterable: nothing to go by
    assert not train.fixed_shapes(fastdata.loader(tmp_path / "enc", 2, device="cpu"))  # sizes vary
    assert train.fixed_shapes(fastdata.loader(tmp_path / "enc", 2, device="cpu", augment=[RandomCrop(16)]))
    assert not train.fixed_shapes(fastdata.loader(tmp_path / "rag", 2, device="cpu"))


@pytest.mark.gpu  # needs CUDA: tests/conftest.py skips it without
def test_resume_on_gpu(blobs, tmp_path):
    ckpt = tmp_path / "ckpt.pt"
    model = make_model(1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ld = fastdata.loader(blobs, 16, device="cuda")
    train.fit(model, ld, opt, classification_loss(), epochs=2, checkpoint=ckpt, max_steps=8, log_every=0)
    res = train.fit(model, ld, opt, classification_loss(), epochs=2, checkpoint=ckpt, resume=ckpt, log_every=0)
    assert res.steps == 12 and all(p.is_cuda for p in model.parameters())


# --- the pieces of fit, one at a time --------------------------------------------------------------------------


def test_precision_plan_for_cpu_cuda_and_bf16_support(monkeypatch):
    conv, mlp = make_model(), nn.Sequential(nn.Linear(4, 2))
    cpu = train.PrecisionPlan.choose(torch.device("cpu"), "auto", conv, True, True)
    assert (cpu.precision, cpu.autocast_dtype, cpu.scaler, cpu.cudnn_benchmark) == ("fp32", None, False, False)
    assert cpu.channels_last and not train.PrecisionPlan.choose(torch.device("cpu"), "auto", mlp, True, True).channels_last
    assert not train.PrecisionPlan.choose(torch.device("cpu"), "auto", conv, False, True).channels_last
    cuda = torch.device("cuda", 0)
    capability = {"major": 8}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (capability["major"], 0))
    ampere = train.PrecisionPlan.choose(cuda, "auto", conv, True, True)
    assert (ampere.precision, ampere.autocast_dtype, ampere.scaler, ampere.cudnn_benchmark) == (
        "bf16", torch.bfloat16, False, True)
    capability["major"] = 7  # Volta/Turing: no native bf16
    volta = train.PrecisionPlan.choose(cuda, "auto", conv, True, False)
    assert (volta.precision, volta.autocast_dtype, volta.scaler, volta.cudnn_benchmark) == (
        "fp16", torch.float16, True, False)
    forced = train.PrecisionPlan.choose(cuda, "tf32", conv, True, True)
    assert forced.precision == "tf32" and forced.autocast_dtype is None and not forced.scaler
    with pytest.raises(ValueError, match="precision must be auto, fp32, tf32, bf16 or fp16, not 'fp8'"):
        train.PrecisionPlan.choose(cuda, "fp8", conv, True, True)  # type: ignore[arg-type]


@contextlib.contextmanager
def restored_backend_flags() -> Iterator[None]:
    """Put torch's TF32 and cudnn.benchmark flags back as they were, by assignment.

    Not monkeypatch: ``torch.backends.cuda.matmul`` serves ``allow_tf32`` from ``__getattr__``, so
    pytest (>= 9) restores it by deleting an attribute that was never stored, and its teardown fails."""
    flags = [(torch.backends.cuda.matmul, "allow_tf32"), (torch.backends.cudnn, "allow_tf32"),
             (torch.backends.cudnn, "benchmark")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in flags]
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def test_restored_backend_flags_puts_every_flag_back():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    with restored_backend_flags():
        torch.backends.cuda.matmul.allow_tf32 = not before[0]
        torch.backends.cudnn.allow_tf32 = not before[1]
        torch.backends.cudnn.benchmark = not before[2]
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.benchmark) == before


def test_precision_plan_sets_tf32_and_cudnn_flags_only_for_cuda():
    with restored_backend_flags():
        _check_precision_plan_flags()


def _check_precision_plan_flags() -> None:
    torch.backends.cudnn.benchmark = False
    cuda, model = torch.device("cuda"), make_model()
    train.PrecisionPlan(cuda, "fp32", None, False, False, cudnn_benchmark=False).apply_flags()
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert not torch.backends.cudnn.benchmark  # shapes may vary: left as the user set it
    train.PrecisionPlan(cuda, "bf16", torch.bfloat16, False, False, cudnn_benchmark=True).apply_flags()
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 and torch.backends.cudnn.benchmark
    torch.backends.cuda.matmul.allow_tf32 = False
    train.PrecisionPlan.choose(torch.device("cpu"), "bf16", model, True, True).apply_flags()
    assert not torch.backends.cuda.matmul.allow_tf32  # the CPU plan touches no CUDA flag


def test_precision_plan_autocast_places_the_model_and_makes_the_scaler():
    model = make_model()
    bf16 = train.PrecisionPlan.choose(torch.device("cpu"), "bf16", model, True, True)
    bf16.place(model)
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(2, 1, 4, 4)
    with bf16.autocast():
        assert model[0](x).dtype == torch.bfloat16
    fp32 = train.PrecisionPlan.choose(torch.device("cpu"), "fp32", model, True, True)
    with fp32.autocast():
        assert model[0](x).dtype == torch.float32
    assert not bf16.make_scaler().is_enabled() and not fp32.make_scaler().is_enabled()
    assert train.PrecisionPlan.choose(torch.device("cpu"), "fp16", model, True, True).make_scaler().is_enabled()


class _StatefulLoader:
    """A loader stand-in with the state_dict protocol."""

    def __init__(self, pos: int = 0):
        self.pos = pos

    def state_dict(self):
        return {"pos": self.pos}

    def load_state_dict(self, state):
        self.pos = state["pos"]


def _stepped(seed: int):
    """A model, a momentum optimizer and an fp16 scaler, each with state after one step."""
    model = make_model(seed, bn=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=16.0, growth_interval=1)
    scaler.scale(model(torch.randn(2, 1, 4, 4)).sum()).backward()
    train._optimizer_step(opt, scaler, list(model.parameters()), None)
    return model, opt, scaler


def test_checkpoint_round_trip_restores_weights_optimizer_scaler_loader_and_rng(tmp_path):
    import random

    model, opt, scaler = _stepped(0)
    history = [train.EpochMetrics(0, 6, 96, 1.0, 96.0, 0.1, 0.8, 0.1, 0.5, 1, 0)]
    torch.manual_seed(123)
    state = train.checkpoint_state(model, opt, scaler, _StatefulLoader(7), epoch=1, step=8, precision="fp16",
                                   history=history)
    train.save_checkpoint(tmp_path / "c.pt", state)
    draws = (torch.rand(3), np.random.rand(3), random.random())

    model2, opt2, scaler2 = _stepped(1)  # different weights, momentum and scale
    scaler2.update(2.0)
    loader2 = _StatefulLoader()
    epoch, step, hist = train.restore_checkpoint(tmp_path / "c.pt", model2, opt2, scaler2, loader2)
    assert (epoch, step, hist, loader2.pos) == (1, 8, history, 7)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(draws[0], again[0]) and np.array_equal(draws[1], again[1]) and draws[2] == again[2]
    for a, b in zip(model.state_dict().values(), model2.state_dict().values()):
        assert torch.equal(a, b)
    m1 = [opt.state[p]["momentum_buffer"] for p in model.parameters()]
    m2 = [opt2.state[p]["momentum_buffer"] for p in model2.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(m1, m2))
    assert scaler2.get_scale() == scaler.get_scale() == 32.0  # grew once from 16


def test_restore_refuses_an_unknown_checkpoint_version(tmp_path):
    model, opt, scaler = _stepped(0)
    train.save_checkpoint(tmp_path / "c.pt", {"version": 99})
    with pytest.raises(ValueError, match=r"c\.pt: unknown checkpoint version 99"):
        train.restore_checkpoint(tmp_path / "c.pt", model, opt, scaler, None)


def test_resume_from_a_file_that_is_not_a_checkpoint_of_this_model_says_so(tmp_path):
    """A missing file, a text file, a truncated checkpoint and another model's checkpoint raised torch's own errors
    (FileNotFoundError; UnpicklingError advising weights_only=False; a zip reader's RuntimeError; load_state_dict's)."""
    model, opt, scaler = _stepped(0)
    with pytest.raises(UsageError, match=r"resume='.*nope\.pt': no such checkpoint file"):
        train.restore_checkpoint(tmp_path / "nope.pt", model, opt, scaler, None)
    (tmp_path / "notes.pt").write_text("not a checkpoint")
    good = tmp_path / "good.pt"
    train.save_checkpoint(good, train.checkpoint_state(model, opt, scaler, None, epoch=0, step=1, precision="fp32",
                                                       history=[]))
    (tmp_path / "cut.pt").write_bytes(good.read_bytes()[:200])
    for name in ("notes.pt", "cut.pt"):
        with pytest.raises(UsageError, match=rf"{name}: not a fastdata.train checkpoint \("):
            train.restore_checkpoint(tmp_path / name, model, opt, scaler, None)
    other = nn.Sequential(nn.Linear(3, 5))
    with pytest.raises(UsageError, match=r"good\.pt: the checkpoint's weights do not fit this model \("):
        train.restore_checkpoint(good, other, torch.optim.SGD(other.parameters(), lr=0.1), scaler, None)
    adam = torch.optim.AdamW(model.parameters())  # SGD's state loaded into it, then its step raised KeyError 'betas'
    with pytest.raises(UsageError, match=r"good\.pt: the checkpoint holds the state of a SGD optimizer, not of this AdamW"):
        train.restore_checkpoint(good, model, adam, scaler, None)


def test_scale_on_device_follows_get_scale_through_growth_and_backoff():
    """The contract skip detection relies on: GradScaler.scale(one) is the scale factor get_scale() reports.
    If a torch release changes what scale() returns, this fails (and so would the skip counts)."""
    p = nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([p], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0, growth_interval=1)
    for grad in ([1.0, 1.0], [float("nan"), 1.0], [2.0, 1.0], [float("inf"), 0.0]):
        scaler.scale((p * torch.tensor(grad)).sum()).backward()
        s = train.scale_on_device(scaler, "cpu")
        assert s.dtype == torch.float32 and s.shape == () and float(s) == scaler.get_scale()
        train._optimizer_step(opt, scaler, [p], None)
        assert float(train.scale_on_device(scaler, "cpu")) == scaler.get_scale()
    assert scaler.get_scale() == 64.0  # x2, /2, x2, /2


def test_skip_detection_counts_only_skipped_steps_also_with_a_fused_optimizer():
    for fused in (False, True):  # a fused optimizer is always called and skips on the scaler's found-inf flag
        p = nn.Parameter(torch.ones(2))
        opt = torch.optim.SGD([p], lr=1.0, fused=fused)
        scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=1)
        counts = []
        for grad in ([1.0, 1.0], [float("inf"), 1.0], [1.0, float("nan")], [1.0, 1.0]):
            scaler.scale((p * torch.tensor(grad)).sum()).backward()
            counts.append(int(train._optimizer_step(opt, scaler, [p], clip=None)))
        assert counts == [0, 1, 1, 0], fused  # the scale grew on the first step: growth is not a skip
        assert torch.equal(p.detach(), torch.tensor([-1.0, -1.0]))
    disabled = torch.amp.GradScaler("cpu", enabled=False)
    q = nn.Parameter(torch.ones(1))
    (q * float("inf")).sum().backward()
    assert int(train._optimizer_step(torch.optim.SGD([q], lr=1.0), disabled, [q], None)) == 0  # nothing to skip


def test_fit_counts_skipped_fp16_steps_and_non_finite_losses(blobs):
    calls = {"n": 0}
    base = classification_loss()

    def loss_fn(model, batch):
        calls["n"] += 1
        loss = base(model, batch)
        return loss * float("inf") if calls["n"] == 2 else loss

    model = make_model(bn=False)
    res = train.fit(model, fastdata.loader(blobs, 16, device="cpu"), torch.optim.SGD(model.parameters(), lr=0.05),
                    loss_fn, epochs=1, precision="fp16", log_every=0)
    m = res.epochs[0]
    assert (m.steps, m.skipped_steps, m.nonfinite_losses) == (6, 1, 1)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert np.isfinite(m.loss)  # the inf loss is counted apart, not summed


class _NoSyncModel(nn.Module):
    """Records whether each forward ran inside no_sync(), as DDP would skip the all-reduce."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)
        self.in_no_sync = False
        self.seen: list[bool] = []

    def forward(self, x):
        self.seen.append(self.in_no_sync)
        return self.lin(x)

    @contextlib.contextmanager
    def no_sync(self):
        self.in_no_sync = True
        try:
            yield
        finally:
            self.in_no_sync = False


def test_train_step_accumulates_with_no_sync_and_steps_every_grad_accum():
    model = _NoSyncModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plan = train.PrecisionPlan.choose(torch.device("cpu"), "fp32", model, True, True)
    step = train.TrainStep(train.ModelRunner(model, False, print), lambda m, b: m(b["x"]).sum(), opt,
                           plan.make_scaler(), plan, grad_accum=3)
    lasts = []
    for _ in range(4):
        loss, last = step.forward_backward({"x": torch.ones(1, 2)})
        assert loss.dtype == torch.float32 and not loss.requires_grad
        lasts.append(last)
        if last:
            assert int(step.optimizer_step()) == 0
            assert model.lin.weight.grad is None  # zeroed (set to None) after the step
    assert lasts == [False, False, True, False] and model.seen == [True, True, False, True]
    assert step.pending == 1 and model.lin.weight.grad is not None
    step.optimizer_step()  # a partial group still steps
    assert step.pending == 0


def test_model_runner_falls_back_to_eager_when_compile_itself_fails(monkeypatch):
    def refuse(model, *a, **k):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", refuse)
    logs: list[str] = []
    model = nn.Linear(2, 1)
    runner = train.ModelRunner(model, True, logs.append)
    assert not runner.compiled and runner.run is model
    assert logs == ["torch.compile failed (RuntimeError: no compiler here); training in eager mode"]
    with pytest.raises(ZeroDivisionError):  # an eager model's error is the user's, never swallowed
        runner.loss(lambda m, b: 1 / 0, {}, contextlib.nullcontext)


def test_epoch_meter_accounts_input_wait_and_compute_on_a_fake_clock(monkeypatch):
    now = {"t": 100.0}
    monkeypatch.setattr(train.time, "perf_counter", lambda: now["t"])

    def slow_batches():
        for wait in (0.5, 0.25):
            now["t"] += wait  # time spent inside next(): waiting for input
            yield {"x": torch.zeros(4, 2)}

    meter = train.EpochMeter(torch.device("cpu"))
    it = slow_batches()
    losses = iter([torch.tensor(2.0), torch.tensor(float("nan"))])
    while (batch := meter.fetch(it, torch.device("cpu"))) is not train._END:
        meter.add(next(losses), len(batch["x"]))
        now["t"] += 1.0  # the step
        meter.end_compute()
        meter.skipped += torch.tensor(1)
    now["t"] += 0.25  # after the last batch: the loader's StopIteration and the epoch's end
    m = meter.finish(epoch=3, steps=2)
    assert (m.epoch, m.steps, m.samples, m.skipped_steps, m.nonfinite_losses) == (3, 2, 8, 2, 1)
    assert (m.wait_s, m.compute_s, m.seconds) == (0.75, 2.0, 3.0)
    assert m.wait_fraction == 0.25 and m.samples_per_s == 8 / 3.0
    assert m.loss == 1.0 and m.peak_memory_bytes is None  # (2 + nan counted as 0) / 2 batches


def test_epoch_summary_names_wait_loss_skips_and_gpu_peak_only_when_measured():
    m = train.EpochMetrics(2, 6, 96, 2.0, 48.0, 0.5, 1.5, 0.25, 0.1234, 1, 0)
    line = train.epoch_summary(m)
    assert line == ("epoch 2: 48 samples/s, waited for input 25.0% (0.50 s of 2.00 s), loss 0.1234, "
                    "skipped steps 1")
    m.peak_memory_bytes = 3 * 2**20
    assert train.epoch_summary(m).endswith("skipped steps 1, peak memory 3 MiB")


def test_run_epoch_checkpoints_every_n_steps_and_stops_at_max_steps():
    model = nn.Linear(2, 1)
    plan = train.PrecisionPlan.choose(torch.device("cpu"), "fp32", model, True, True)
    step = train.TrainStep(train.ModelRunner(model, False, print), lambda m, b: m(b["x"]).sum(),
                           torch.optim.SGD(model.parameters(), lr=0.01), plan.make_scaler(), plan, grad_accum=2)
    batches = [{"x": torch.ones(3, 2)} for _ in range(7)]
    saves: list[tuple[int, int]] = []
    logs: list[str] = []
    m, global_step, stopped = train.run_epoch(batches, 4, 10, step, say=logs.append,
                                              save=lambda e, s: saves.append((e, s)), log_every=3,
                                              checkpoint_every=2)
    assert (m.steps, m.samples, global_step, stopped) == (4, 21, 14, False)  # 3 full groups + the leftover batch
    assert saves == [(4, 12)]  # at step 12 (14 was the leftover step at the end: fit saves the epoch end itself)
    assert [line.split(":")[0] for line in logs] == ["epoch 4 step 11", "epoch 4 step 13", "epoch 4"]
    m, global_step, stopped = train.run_epoch(batches, 5, 14, step, say=logs.append, save=lambda e, s: None,
                                              max_steps=16)
    assert (m.steps, m.samples, global_step, stopped) == (2, 12, 16, True)
    m, global_step, stopped = train.run_epoch([], 6, 16, step, say=logs.append, save=lambda e, s: None)
    assert (m.steps, m.samples, global_step, stopped) == (0, 0, 16, False) and np.isnan(m.loss)  # not a loss of 0
    assert logs[-1].startswith("epoch 6: no batches: the loader gave none")
