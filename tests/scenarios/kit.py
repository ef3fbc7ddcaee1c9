"""Shared by the integration tests and the scenario scripts they launch (torchrun, Lightning DDP):
a small labelled dataset and a Lightning module that records which samples each step trained on."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import fastdata

N = 40  # samples; with batch 4: 10 batches per epoch


def make_dataset(root: Path, backend: str = "hdf5", n: int = N, shard_size: int | None = None) -> Path:
    """root/ds-<backend>: ``n`` samples, x = label * 0.1 + noise (3 floats), label = sample index."""
    root.mkdir(parents=True, exist_ok=True)
    x = (np.arange(n, dtype=np.float32)[:, None] * 0.1 + np.random.default_rng(0).standard_normal((n, 3))).astype("f4")
    np.save(root / "X.npy", x)
    np.save(root / "y.npy", np.arange(n, dtype=np.int64))
    dst = root / f"ds-{backend}"
    opts = fastdata.WriteOptions(backend=backend, workers=1, **({"shard_size": shard_size} if shard_size else {}))
    fastdata.convert(None, dst, fastdata.ConvertConfig(write=opts), labels=root / "y.npy", arrays={"x": root / "X.npy"})
    return dst


def lightning_module(record: list | None = None, data: str | None = None, out: str | None = None):
    """A tiny regression model; ``training_step`` appends [epoch, labels of the batch] to ``record``.
    With ``data``, ``train_dataloader()`` builds the fastdata loader (the hook way); with ``out``, each
    rank writes OUT/rank-<r>.json at the end of training."""
    from scenarios.recorder import Recorder

    return Recorder(record, data, out)


def quiet_trainer(**kw):
    import lightning.pytorch as pl

    base = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                enable_checkpointing=False)
    return pl.Trainer(**{**base, **kw})

