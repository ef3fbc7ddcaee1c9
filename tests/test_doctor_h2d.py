"""fastdata doctor's host-to-device figure: the accounting, with a fake clock (no CUDA needed), the report's
keys, line and advice, and on a machine with CUDA a real loop (skipped elsewhere)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import fastdata.measure.doctor
from fastdata.measure.doctor import _h2d, _probe, report
from fastdata.measure.doctor.report import analyse, render

GB = 1e9


class FakeMark:
    def __init__(self, t: float) -> None:
        self.t = t


class FakeClock:
    """Time moves only when a (fake) copy runs: 1 s per GB. ``settled`` says whether marks read as done."""

    def __init__(self, settled: bool = True) -> None:
        self.now, self.settled, self.waits, self.marks = 0.0, settled, 0, 0

    def available(self) -> bool:
        return True

    def mark(self, device: torch.device) -> FakeMark:
        assert device.type == "cuda"
        self.marks += 1
        return FakeMark(self.now)

    def ready(self, mark: FakeMark) -> bool:
        return self.settled

    def wait(self, mark: FakeMark) -> None:
        self.waits += 1

    def seconds(self, start: FakeMark, end: FakeMark) -> float:
        return end.t - start.t


def _fake_to(clock: FakeClock, moved: list[tuple[Any, ...]]) -> Any:
    """A stand-in for Tensor.to that 'copies' to CUDA without CUDA (the clock advances by the bytes)."""
    real = torch._C.TensorBase.to

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if _h2d.cuda_target(args, kwargs) is None:
            return real(self, *args, **kwargs)
        clock.now += self.numel() * self.element_size() / GB
        moved.append((args, kwargs))
        return self.clone()

    return to


def test_accountant_counts_bytes_pinned_and_non_blocking() -> None:
    clock = FakeClock(settled=False)
    pinned_ids: set[int] = set()
    acc = _h2d.Accountant(clock, is_pinned=lambda t: id(t) in pinned_ids)
    x, y = torch.zeros(8, 4), torch.zeros(8, dtype=torch.int64)  # 128 + 64 bytes
    pinned_ids.add(id(x))
    acc.track(torch.ones(2), 7, 0, counted=False)  # a warm-up batch: its copies are left out
    acc.track({"x": x, "y": [y]}, 7, 1, counted=True)
    cuda = torch.device("cuda", 0)

    def copy(t: torch.Tensor, nb: bool) -> Any:
        def do() -> str:
            clock.now += t.numel() * t.element_size() / GB
            return "copied"
        return acc.copy(t, cuda, nb, do)

    assert copy(x, True) == "copied" and copy(y, False) == "copied"
    copy(torch.zeros(3), False)  # not from a batch: counted apart, not timed
    acc.depth = 1
    copy(x, True)  # inside a loader's next(): the loader's own
    acc.depth = 0
    b = acc.loaders[7]
    assert (b.copies, b.bytes, b.pinned, b.non_blocking, b.batches) == (2, 192, 1, 1, 1)
    assert b.timed == 0 and clock.waits == 0  # nothing resolved yet, and nothing waited for during the loop
    acc.finish()
    assert b.timed == 2 and b.timed_bytes == 192 and clock.waits == 2
    assert b.seconds == pytest.approx(192 / GB)
    assert (acc.other.copies, acc.other.bytes, acc.other.timed) == (1, 12, 0)
    assert (acc.inside.copies, acc.inside.bytes) == (1, 128)
    assert clock.marks == 4  # two events per timed copy, none for the others


def test_copies_before_the_first_batch_and_after_eviction_are_not_the_loops() -> None:
    acc = _h2d.Accountant(FakeClock())
    model = torch.zeros(5)
    acc.copy(model, torch.device("cuda"), False, lambda: None)  # model.to("cuda") while setting up
    assert acc.other.copies == 0 and not acc.loaders
    first = torch.zeros(2)
    acc.track(first, 1, 0, counted=True)
    for n in range(1, _h2d.MAX_TRACKED + 1):
        acc.track(torch.zeros(2), 1, n, counted=True)
    acc.copy(first, torch.device("cuda"), False, lambda: None)  # its batch is long gone: not a batch copy
    assert 1 not in acc.loaders and acc.other.copies == 1
    # a storage freed and its address taken by another tensor is not the batch's (numpy's buffer outlives
    # the first tensor's storage, and the second's storage starts at the same address)
    buf = np.zeros(64, np.float32)
    acc.track(torch.from_numpy(buf), 2, 99, counted=True)
    again = torch.from_numpy(buf)
    assert again.data_ptr() == buf.ctypes.data  # the batch's address, not its storage
    acc.copy(again, torch.device("cuda"), False, lambda: None)
    assert 2 not in acc.loaders


def test_patched_loop_counts_only_cpu_to_cuda_and_gives_the_methods_back(tmp_path: Path) -> None:
    clock, moved = FakeClock(), list[tuple[Any, ...]]()
    assert not {"to", "cuda", "copy_"} & set(torch.Tensor.__dict__)
    fake = torch.Tensor.to = _fake_to(clock, moved)  # type: ignore[method-assign]
    try:
        ds = TensorDataset(torch.zeros(24, 3), torch.arange(24))
        rec = _probe.install(tmp_path, replay=False, clock=clock)
        try:
            torch.zeros(10).to("cuda")  # before the first batch (the model): not counted
            for x, y in DataLoader(ds, batch_size=4):
                x.to("cpu")
                x.to(torch.device("cpu"), non_blocking=True)
                x.to(torch.float64)
                y.to(dtype=torch.float32)
                x.to("cuda:0", non_blocking=True)
                y.to(torch.device("cuda"))
            assert clock.waits == 0
        finally:
            _probe.uninstall()
        assert clock.waits <= 1  # resolved as the loop went (query()); only the last copy is waited for at the end
        assert torch.Tensor.__dict__["to"] is fake and "cuda" not in torch.Tensor.__dict__
        assert "copy_" not in torch.Tensor.__dict__
    finally:
        del torch.Tensor.to
    assert "to" not in torch.Tensor.__dict__
    assert len(moved) == 1 + 2 * 6  # the fake copy ran for every CUDA call: the script's calls go through
    h = rec.h2d
    assert h is not None and h["cuda"] is True
    (b,) = h["loaders"].values()
    warm = _probe.WARMUP
    assert b["copies"] == 2 * (6 - warm) and b["batches"] == 6 - warm
    assert b["bytes"] == (6 - warm) * (4 * 3 * 4 + 4 * 8)
    assert b["non_blocking"] == 6 - warm and b["pinned"] == 0 and b["timed"] == b["copies"]
    assert b["seconds"] == pytest.approx(b["bytes"] / GB)
    assert h["other"]["copies"] == 0 and h["inside_loader"]["copies"] == 0
    (tmp_path / "raw.json").write_text(json.dumps(rec.dump()))
    r = analyse(tmp_path, ["<test>"])
    assert r["h2d"]["copies"] == b["copies"] and r["h2d"]["bytes"] == b["bytes"]
    assert r["h2d"]["pinned_fraction"] == 0 and r["h2d"]["non_blocking_fraction"] == 0.5
    assert r["h2d"]["advice"] == "pageable: pass pin_memory=True to the DataLoader and non_blocking=True to .to()"
    assert "host->device: " in render(r) and "pageable: pass pin_memory=True" in render(r)


class FakeCudaTensor:
    """A destination on a CUDA device, as much as Tensor.copy_'s wrapper looks at."""

    is_cuda = True
    device = torch.device("cuda", 1)


def test_copies_inside_the_loaders_next_are_the_loaders(tmp_path: Path) -> None:
    """A collate_fn that moves the batch (as fastdata.loader(device="cuda") does inside its next()): counted
    apart, never as the loop's copies, and the report says why there is no figure."""
    clock, moved = FakeClock(), list[tuple[Any, ...]]()
    torch.Tensor.to = _fake_to(clock, moved)  # type: ignore[method-assign]
    try:
        ds = TensorDataset(torch.zeros(24, 3))

        def to_gpu(samples: list[tuple[torch.Tensor]]) -> torch.Tensor:
            return torch.stack([s[0] for s in samples]).to("cuda")

        rec = _probe.install(tmp_path, replay=False, clock=clock)
        try:
            for _ in DataLoader(ds, batch_size=4, collate_fn=to_gpu):
                pass
        finally:
            _probe.uninstall()
    finally:
        del torch.Tensor.to
    (tmp_path / "raw.json").write_text(json.dumps(rec.dump()))
    r = analyse(tmp_path, ["<test>"])
    assert r["h2d"] is None and r["h2d_inside_loader"] == {"copies": 6, "bytes": 6 * 48} and len(moved) == 6
    assert "inside the loader's next()" in r["h2d_reason"]
    assert "host->device not measured (the batches reach the GPU inside" in render(r)


def test_tensor_cuda_and_copy_are_counted() -> None:
    calls: list[tuple[Any, ...]] = []

    def orig(self: Any, *args: Any, **kwargs: Any) -> str:
        calls.append(args)
        return "done"

    acc = _h2d.install(FakeClock())
    try:
        x = torch.zeros(4)
        acc.track(x, 3, 0, counted=True)
        assert _h2d._wrap_cuda(orig)(x, 0, True) == "done"  # x.cuda(0, True): non_blocking positional
        assert _h2d._wrap_copy(orig)(FakeCudaTensor(), x) == "done"  # cuda_dst.copy_(x)
        assert _h2d._wrap_copy(orig)(torch.zeros(4), x) == "done"  # a CPU destination: not counted
        assert torch.zeros(4).copy_(x).sum() == 0  # torch's own copy_, patched, still copies
    finally:
        _h2d.uninstall()
    b = acc.loaders[3]
    assert (b.copies, b.non_blocking, b.bytes, b.timed) == (2, 1, 32, 2) and len(calls) == 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="the copy succeeds where CUDA works")
def test_without_cuda_the_scripts_own_error_comes_through() -> None:
    class NoCuda(FakeClock):
        def available(self) -> bool:
            return False

    acc = _h2d.install(NoCuda())
    try:
        x = torch.zeros(4)
        acc.track(x, 3, 0, counted=True)
        with pytest.raises((AssertionError, RuntimeError)) as e:
            x.to("cuda")
    finally:
        _h2d.uninstall()
    if not torch.cuda.is_available():
        assert "CUDA" in str(e.value)
    assert not acc.loaders and acc.dump()["cuda"] is False


def test_traced_by_torch_compile_the_copy_is_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    acc = _h2d.Accountant(clock)
    x = torch.zeros(4)
    acc.track(x, 1, 0, counted=True)
    monkeypatch.setattr(_h2d, "_compiling", lambda: True)
    assert acc.copy(x, torch.device("cuda"), True, lambda: "plain") == "plain"
    assert not acc.loaders and clock.marks == 0


class _AccountantSeen(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        return int(_h2d._acc is None)


def test_forked_workers_take_the_shortest_way() -> None:
    """A forked DataLoader worker inherits the wrapped methods but not the accountant (it copies nothing to a GPU)."""
    acc = _h2d.install(FakeClock())
    try:
        got = [int(b) for b in DataLoader(_AccountantSeen(), batch_size=1, num_workers=1,
                                          multiprocessing_context="fork")]
        assert _h2d._acc is acc  # the training process keeps it
    finally:
        _h2d.uninstall()
    assert got == [1, 1]


def test_figures_and_advice() -> None:
    main = {"key": 5, "kind": "torch", "settings": {"pin_memory": False}}
    bucket = {"copies": 4, "bytes": 4_000_000, "pinned": 0, "non_blocking": 0, "batches": 2, "last_batch": 9,
              "timed": 4, "timed_bytes": 4_000_000, "seconds": 0.002}
    raw = {"cuda": True, "loaders": {"5": bucket}, "inside_loader": {"copies": 0, "bytes": 0},
           "other": {"copies": 1, "bytes": 8}}
    f = report.h2d_figures(raw, main, step_s=0.01)
    h = f["h2d"]
    assert f["h2d_reason"] is None and f["h2d_other"] == {"copies": 1, "bytes": 8}
    assert h["gb_per_s"] == pytest.approx(2.0) and h["per_batch_s"] == pytest.approx(0.001)
    assert h["step_fraction"] == pytest.approx(0.1) and h["pinned_fraction"] == 0
    assert h["advice"] == "pageable: pass pin_memory=True to the DataLoader and non_blocking=True to .to()"
    text = report.h2d_line(f)
    assert text is not None and text.startswith("host->device: 2.00 GB/s, 1.00 ms a batch (10.0% of the step)")
    assert text.endswith("pass pin_memory=True to the DataLoader and non_blocking=True to .to()")
    pinned = dict(bucket, pinned=4, non_blocking=4)
    assert report.h2d_figures(dict(raw, loaders={"5": pinned}), main, 0.01)["h2d"]["advice"] is None
    blocking = dict(bucket, pinned=4, non_blocking=1)
    assert report.h2d_figures(dict(raw, loaders={"5": blocking}), main, 0.01)["h2d"]["advice"].startswith("blocking")
    half_timed = dict(bucket, timed=2, timed_bytes=2_000_000, seconds=0.001)  # untimed copies count at the mean
    assert report.h2d_figures(dict(raw, loaders={"5": half_timed}), main, 0.01)["h2d"]["per_batch_s"] == \
        pytest.approx(0.001)


def test_no_measurement_says_why() -> None:
    main = {"key": 5, "kind": "fastdata", "settings": {"device": "cuda"}}
    none = {"copies": 0, "bytes": 0}
    f = report.h2d_figures({"cuda": False, "loaders": {}, "inside_loader": none, "other": none}, main, 0.01)
    assert f == {"h2d": None, "h2d_reason": report.NO_CUDA}
    assert report.h2d_line(f) == "host->device not measured (no CUDA)"
    inside = {"cuda": True, "loaders": {}, "inside_loader": {"copies": 6, "bytes": 3_000_000}, "other": none}
    f = report.h2d_figures(inside, main, 0.01)
    assert f["h2d"] is None and "fastdata.loader(device='cuda') copies its batches" in f["h2d_reason"]
    assert f["h2d_inside_loader"] == {"copies": 6, "bytes": 3_000_000}
    f = report.h2d_figures(dict(inside, inside_loader=none), dict(main, kind="torch"), 0.01)
    assert f["h2d_reason"] == "the loop copied none of the loader's batches to a CUDA device"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report of a machine without CUDA")
def test_report_without_cuda_says_not_measured(tmp_path: Path) -> None:
    ds = TensorDataset(torch.zeros(32, 2), torch.arange(32))
    with fastdata.measure.doctor.watch(project=False, quiet=True) as w:
        for x, _ in DataLoader(ds, batch_size=4):
            x.to(torch.float64)
    assert w.report["h2d"] is None and w.report["h2d_reason"] == "no CUDA device"
    assert "host->device not measured (no CUDA)" in render(w.report)


@pytest.mark.gpu
def test_real_copies_on_a_gpu() -> None:
    ds = TensorDataset(torch.randn(64, 3, 16, 16), torch.arange(64))
    model = torch.nn.Linear(3 * 16 * 16, 4).cuda()
    with fastdata.measure.doctor.watch(project=False, quiet=True) as w:
        for x, y in DataLoader(ds, batch_size=8, pin_memory=True):
            x, y = x.to("cuda", non_blocking=True), y.cuda(non_blocking=True)
            model(x.flatten(1)).sum().backward()
    h = w.report["h2d"]
    assert h is not None, w.report["h2d_reason"]
    assert h["copies"] == 2 * (8 - _probe.WARMUP) and h["bytes"] == (8 - _probe.WARMUP) * 8 * (3 * 16 * 16 * 4 + 8)
    assert h["seconds"] > 0 and h["gb_per_s"] > 0
    assert h["pinned_fraction"] == 1.0 and h["non_blocking_fraction"] == 1.0 and h["advice"] is None
    assert "host->device:" in render(w.report)
    assert not {"to", "cuda", "copy_"} & set(torch.Tensor.__dict__)
