"""The baseline every benchmark compares against: per-sample ``.npy`` files read one ``np.load`` each
by a torch DataLoader (``naive_loader``), and ``write_npy_folder``, which writes such files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch


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


__all__ = ["NaiveNpyFolder", "naive_collate", "naive_loader", "write_npy_folder"]
