"""Training checkpoints with exact resume: weights, optimizer, scaler, the loader's position, RNG states and
metric history, as tensors and plain values only (they load with ``weights_only=True``), written atomically."""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fastdata.fileio import write_atomic
from fastdata.train.meter import EpochMetrics

_CKPT_VERSION = 1


def _unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "_orig_mod", model)  # torch.compile
    return getattr(model, "module", model)  # DistributedDataParallel


def _rng_state() -> dict[str, Any]:
    """RNG states as tensors and plain lists, so checkpoints load with ``weights_only=True`` (no pickle)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    version, internal, gauss_py = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(np.asarray(keys).astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
        "python": [version, list(internal), gauss_py],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``_rng_state`` saved (torch, numpy, python, and CUDA when both sides have it)."""
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_py = state["python"]
    random.setstate((version, tuple(internal), gauss_py))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Write a checkpoint atomically: temp file in the same folder, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, lambda f: torch.save(payload, f))


def checkpoint_state(model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, loader: Any,
                     *, epoch: int, step: int, precision: str, history: Sequence[EpochMetrics]) -> dict[str, Any]:
    """Everything exact resume needs (weights, optimizer, scaler, loader position, RNG states, metric
    history), as tensors and plain values only, so that it loads with ``weights_only=True``."""
    return {
        "version": _CKPT_VERSION, "model": _unwrap(model).state_dict(), "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(), "loader": loader.state_dict() if hasattr(loader, "state_dict") else None,
        "epoch": epoch, "step": step, "rng": _rng_state(), "precision": precision,
        "history": [asdict(m) for m in history]}


def restore_checkpoint(path: str | os.PathLike[str], model: nn.Module, optimizer: torch.optim.Optimizer,
                       scaler: torch.amp.GradScaler, loader: Any) -> tuple[int, int, list[EpochMetrics]]:
    """Load a ``checkpoint_state`` into the objects of this run and the RNGs; returns (epoch, step, history).
    A scaler state saved under another precision (empty) is left out."""
    # onto the CPU: RNG states must stay there; model and optimizer copy into their own devices
    state = torch.load(path, map_location="cpu", weights_only=True)  # never unpickle code
    if state.get("version") != _CKPT_VERSION:
        raise ValueError(f"{path}: unknown checkpoint version {state.get('version')!r}")
    _unwrap(model).load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if state["scaler"]:  # empty when saved without a scaler (another precision)
        scaler.load_state_dict(state["scaler"])
    if state.get("loader") is not None and hasattr(loader, "load_state_dict"):
        loader.load_state_dict(state["loader"])
    history = [EpochMetrics(**m) for m in state.get("history", [])]
    _set_rng_state(state["rng"])
    return state["epoch"], state["step"], history


__all__ = ["checkpoint_state", "restore_checkpoint", "save_checkpoint"]
