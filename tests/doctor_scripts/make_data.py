"""Small data for the doctor's test scripts, made in a temporary folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def volumes(root: Path, n: int = 64, side: int = 32) -> Path:
    rng = np.random.default_rng(0)
    for i in range(n):
        d = root / f"class{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / f"{i:05d}.npy", rng.standard_normal((side, side, side)).astype(np.float32))
    return root


def sequences(root: Path, n: int = 64, channels: int = 8, longest: int = 200) -> Path:
    rng = np.random.default_rng(1)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        np.save(root / f"{i:05d}.npy", rng.standard_normal((int(rng.integers(20, longest)), channels)).astype(np.float32))
    return root
