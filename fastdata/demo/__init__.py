"""``fastdata demo``: per-sample ``.npy`` files converted to HDF5 and LMDB, read back bit-identical, timed naively
(one ``np.load`` per file) against ``get_batch``, then a few training steps fed by each loader; and that baseline,
which every benchmark compares against: ``write_npy_folder`` and a torch DataLoader of one ``np.load`` a sample."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch

from fastdata._units import fmt_bytes
from fastdata.errors import UsageError

if TYPE_CHECKING:
    from fastdata.measure.bench import BenchResult
    from fastdata.write import Progress

__all__ = ["NaiveNpyFolder", "naive_collate", "naive_loader", "run", "write_npy_folder"]

def write_npy_folder(root: str | os.PathLike[str], n: int, shape: tuple[int, ...], *,
                     classes: tuple[str, ...] = ("c0", "c1", "c2", "c3"), learnable: bool = False,
                     seed: int = 0) -> list[Path]:
    """``n`` float32 samples of ``shape`` as ``root/<class>/<i>.npy`` (class ``i % len(classes)``; ``learnable``: a
    class-dependent scale, else standard normal); returns the files sorted, in the order they are read."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        c = i % len(classes)
        d = Path(root) / classes[c]
        d.mkdir(parents=True, exist_ok=True)
        x = rng.gamma(2.0, 1.0 + 0.5 * c, shape).astype(np.float32) if learnable else \
            rng.standard_normal(shape, dtype=np.float32)
        np.save(d / f"{i:06d}.npy", x)
    return sorted(Path(root).rglob("*.npy"))


class NaiveNpyFolder(torch.utils.data.Dataset):
    """The baseline we measure against, written the way our users write it: one ``np.load``
    per sample in ``__getitem__``, the label from the class folder."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.files = sorted(Path(root).rglob("*.npy"))
        if not self.files:
            raise UsageError(f"{root}: no .npy files here: the naive loader reads a folder of per-sample .npy files")
        classes = sorted({f.parent.name for f in self.files})
        self.labels = [classes.index(f.parent.name) for f in self.files]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.from_numpy(np.load(self.files[i])), "label": self.labels[i]}


def naive_collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """torch's default collate, samples of several shapes zero-padded to the batch's largest with ``x_lengths``
    (first-axis lengths): the pad-collate a user writes, and what fastdata's padded batches hold."""
    xs = [s["x"] for s in samples]
    if all(x.shape == xs[0].shape for x in xs):
        return torch.utils.data.default_collate(samples)
    if any(x.ndim != xs[0].ndim for x in xs):
        raise ValueError(f"samples of {sorted({x.ndim for x in xs})} dimensions cannot be batched together")
    out = xs[0].new_zeros((len(xs), *(max(x.shape[d] for x in xs) for d in range(xs[0].ndim))))
    for k, x in enumerate(xs):
        out[(k, *(slice(0, n) for n in x.shape))] = x
    return {"x": out, "x_lengths": torch.tensor([x.shape[0] for x in xs]),
            "label": torch.tensor([s["label"] for s in samples])}


def naive_loader(root: str | os.PathLike[str], batch_size: int = 64, workers: int = 2) -> torch.utils.data.DataLoader:
    """A torch DataLoader over :class:`NaiveNpyFolder` with the usual hand-picked flags (and
    :func:`naive_collate`, so ragged and mixed-size samples batch as fastdata's do)."""
    return torch.utils.data.DataLoader(
        NaiveNpyFolder(root), batch_size=batch_size, shuffle=True, num_workers=workers, collate_fn=naive_collate,
        pin_memory=torch.cuda.is_available(), persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None)


SHAPE = (2, 64, 21, 21)  # the FLIM-style arrays of our users, with a shorter time axis
CLASSES = ("class_a", "class_b", "class_c", "class_d")


def train_side_by_side(src: Path, shards: Path, batch: int, steps: int) -> list[str]:
    """A few training steps of a small FLIM-style 3-D CNN fed by the naive loader and by fastdata.loader."""
    from fastdata.demo.examples import FlimCNN, classification_loss
    from fastdata.loaders import loader
    from fastdata.train import fit

    rows, report = [], ""
    for name, make in (("naive DataLoader (2 workers)", lambda: naive_loader(src, batch, workers=2)),
                       ("fastdata.loader (hdf5)", lambda: loader(shards, batch))):
        torch.manual_seed(0)
        model = FlimCNN(num_classes=len(CLASSES), width=8)
        ld = make()
        res = fit(model, ld, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), classification_loss(),
                  epochs=100, max_steps=steps, log_every=0, on_log=lambda _msg: None)
        m = res.epochs[-1]
        rows.append((name, m.samples_per_s, m.wait_fraction, m.loss))
        report = res.report
        if hasattr(ld, "close"):
            ld.close()
    lines = ["", f"training: FlimCNN, {steps} steps of batch {batch}, precision {res.precision}:"]
    lines += ["  " + line.strip() for line in report.splitlines()[1:]]
    lines.append(f"  {'loader':<30}{'samples/s':>10}{'waited for input':>18}{'loss':>8}")
    for name, sps, wait, loss in rows:
        lines.append(f"  {name:<30}{sps:>10.0f}{100 * wait:>17.1f}%{loss:>8.3f}")
    return lines


def _rate(name: str, fn: Callable[[np.ndarray], Any], plan: list[np.ndarray], nbytes: float) -> BenchResult:
    """``fn`` over the batches of ``plan`` (the first a warm-up), by fastdata.measure.bench.measure."""
    from fastdata.measure.bench import measure

    return measure(name, lambda: map(fn, plan), bytes_per_sample=nbytes, warmup=1, one_pass=True)


def run(workdir: Path | None = None, samples: int = 512, batch: int = 64, batches: int = 20, train_steps: int = 6,
        progress: Progress | None = None) -> str:
    """Run the demo and return its report (what ``fastdata demo`` prints)."""
    from fastdata.converters import ConvertConfig
    from fastdata.converters.convert import convert
    from fastdata.reading.dataset import open as open_dataset
    from fastdata.write import WriteOptions

    own = workdir is None
    root = Path(tempfile.mkdtemp(prefix="fastdata-demo-")) if workdir is None else Path(workdir)
    lines = []
    try:
        src = root / "npy"
        t0 = time.perf_counter()
        files = write_npy_folder(src, samples, SHAPE, classes=CLASSES, learnable=True)
        lines.append(f"generated {samples} samples of float32{list(SHAPE)} in {src} ({time.perf_counter() - t0:.1f} s)")
        rng = np.random.default_rng(1)
        plan = [rng.integers(0, samples, batch) for _ in range(batches + 1)]
        nbytes = int(np.prod(SHAPE)) * 4
        rows = [_rate("naive np.load per file", lambda idx: np.stack([np.load(files[i]) for i in idx]), plan, nbytes)]
        for backend in ("hdf5", "lmdb"):
            dst = root / backend
            if dst.exists():
                shutil.rmtree(dst)
            report = convert(src, dst, ConvertConfig(write=WriteOptions(backend=backend)), progress=progress)
            lines.append("converted: " + report.summary())
            ds = open_dataset(dst)
            check = ds.get_batch(np.arange(samples))
            ok = all(np.array_equal(check["x"][i], np.load(f)) for i, f in enumerate(files))
            labels_ok = check["label"].tolist() == [CLASSES.index(f.parent.name) for f in files]
            if not (ok and labels_ok):
                raise RuntimeError(f"{dst}: read-back differs from the source")
            lines.append(f"read back {backend}: all {samples} samples bit-identical, labels match {ds.classes}")
            out: dict[str, np.ndarray] = {"x": np.empty((batch, *SHAPE), np.float32), "label": np.empty(batch, np.int64)}
            rows.append(_rate(f"{backend} get_batch", partial(ds.get_batch, out=out), plan, nbytes))
        lines.append("")
        lines.append(f"random batches of {batch}, {batches} batches, page cache warm:")
        lines.append(f"  {'reader':<26}{'samples/s':>12}{'MB/s':>10}{'vs naive':>10}")
        for r in rows:
            lines.append(f"  {r.name:<26}{r.samples_per_s:>12.0f}{r.mb_per_s:>10.0f}"
                         f"{r.samples_per_s / rows[0].samples_per_s:>9.1f}x")
        if train_steps:
            lines += train_side_by_side(src, root / "hdf5", min(batch, samples), train_steps)
        lines.append(f"(dataset size {fmt_bytes(samples * int(np.prod(SHAPE)) * 4)}; work folder {root}"
                     f"{', removed' if own else ''})")
        return "\n".join(lines)
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
