"""What the doctor's host-to-device patch costs a call that is not a copy to a GPU.

While the doctor watches, ``Tensor.to``, ``Tensor.cuda`` and ``Tensor.copy_`` are wrapped
(fastdata.measure.doctor._h2d). Here: the time per call of a few CPU-only calls, best of 7 runs of N calls,
without and with the wrapper, in this process. On a GPU machine it also times a pinned, non_blocking
copy of a 4 MB batch with and without it (the timed path: two CUDA events and the bookkeeping).
Usage: python benchmarks/bench_doctor_h2d.py [--quick]
"""

from __future__ import annotations

import argparse
import timeit
from typing import Any, Callable

import torch

from fastdata.measure.doctor import _h2d


def _per_call_us(fn: Callable[[], Any], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls (figures noisier)")
    number = 20000 if ap.parse_args().quick else 200000
    x, y = torch.zeros(4), torch.zeros(4)
    cases: dict[str, Callable[[], Any]] = {
        "x.to(torch.float32)": lambda: x.to(torch.float32), "x.to('cpu')": lambda: x.to("cpu"),
        "x.to(torch.float64)": lambda: x.to(torch.float64), "x.copy_(y)": lambda: x.copy_(y)}
    batch = None
    if torch.cuda.is_available():
        batch = torch.zeros(1 << 20).pin_memory()  # 4 MB

        def copy() -> None:
            batch.to("cuda", non_blocking=True)
            torch.cuda.synchronize()

        cases["pinned 4 MB .to('cuda', non_blocking=True) + sync"] = copy
    print(f"torch {torch.__version__}; per call, best of 7 runs")
    for name, fn in cases.items():
        n = number if "cuda" not in name else 500
        plain = _per_call_us(fn, n)
        acc = _h2d.install()
        try:
            acc.track(torch.zeros(1), 0, 0, counted=True)  # the loop has started
            if batch is not None:
                acc.track(batch, 0, 1, counted=True)  # its copies take the timed path
            patched = _per_call_us(fn, n)
        finally:
            _h2d.uninstall()
        print(f"{name:52s} plain {plain:8.3f} us   patched {patched:8.3f} us   overhead {patched - plain:+.3f} us")


if __name__ == "__main__":
    main()
