"""Training input-wait: a small FLIM-style 3-D CNN fed by the naive DataLoader and by fastdata.loader.

Data: 2,000 per-sample .npy files of float32 (2, 256, 21, 21) in 4 class folders, converted to
HDF5 shards. For each model (the scaled-down FlimCNN, and a tiny model whose step is cheap, so
the input pipeline decides the speed), each loader trains a warm-up run of 3 steps, then a
timed run of 3 + ``--steps`` steps with ``fastdata.train.fit`` (``_harness.timed_fit``); we report samples/s and the fraction of
the time the step waited for input. Usage: python benchmarks/bench_train.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

import fastdata  # noqa: E402
from fastdata.demo import naive_loader, write_npy_folder  # noqa: E402
from fastdata.demo.examples import FlimCNN  # noqa: E402

SHAPE = (2, 256, 21, 21)
BATCH = 64


class Tiny(nn.Module):
    """A cheap step: pool hard first, then a linear layer (the input pipeline dominates)."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool3d((8, 3, 3))
        self.fc = nn.Linear(2 * 8 * 3 * 3, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(torch.log1p(x.clamp_min(0))).flatten(1))


def measure(make_loader, make_model, steps: int) -> dict:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = make_model()
    ld = make_loader()
    m = _harness.timed_fit(model, ld, steps).epochs[-1]
    if hasattr(ld, "close"):
        ld.close()
    return {"samples_per_s": m.samples_per_s, "wait_fraction": m.wait_fraction, "steps": m.steps,
            "wait_s": m.wait_s, "compute_s": m.compute_s, "seconds": m.seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small dataset, few steps (CI smoke run)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per configuration")
    p.add_argument("--out", default=str(_harness.DEFAULT_RESULTS_DIR))
    a = p.parse_args(argv)
    n, steps, batch = (128, 2, 16) if a.quick else (2000, 20, BATCH)  # quick: a smoke run, figures meaningless
    steps = a.steps or steps
    work = Path(tempfile.mkdtemp(prefix="fastdata-bench-train-"))
    try:
        src = work / "npy"
        write_npy_folder(src, n, SHAPE, learnable=True)
        fastdata.convert(src, work / "hdf5", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="hdf5")))
        os.sync()
        loaders = {"naive DataLoader (np.load per file, 2 workers)": lambda: naive_loader(src, batch, workers=2),
                   "fastdata.loader (hdf5, defaults)": lambda: fastdata.loader(work / "hdf5", batch, device="cpu")}
        width = 2 if a.quick else 8
        models = {f"FlimCNN(width={width})": lambda: FlimCNN(4, width=width), "tiny (input-bound)": Tiny}
        results: dict = {}
        rows = []
        for mname, make_model in models.items():
            for lname, make_loader in loaders.items():
                r = measure(make_loader, make_model, steps)
                results[f"{mname} | {lname}"] = r
                rows.append([mname, lname, f"{r['samples_per_s']:,.0f}", f"{100 * r['wait_fraction']:.1f}%",
                             f"{r['wait_s']:.2f}", f"{r['compute_s']:.2f}"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    machine = _harness.machine_info()
    table = _harness.markdown_table(["model", "loader", "samples/s", "waited for input", "wait s", "compute s"], rows)
    text = "\n".join([f"# Training input-wait, float32{list(SHAPE)}, batch {batch}, fp32 on the CPU", "",
                      f"Machine: {machine['cpu_model']}, {machine['usable_cores']} cores, torch {machine['torch']}. "
                      f"{n} samples; {3 + steps} timed steps after a 3-step warm-up run, per row.", "", table])
    print(text)
    _harness.write_results("train_quick" if a.quick else "train", {"results": results, "machine": machine,
                                                                      "samples": n, "steps": steps}, text, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
