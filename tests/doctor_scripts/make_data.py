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
    for i in range(n):
        (root / f"class{i % 2}").mkdir(parents=True, exist_ok=True)
        np.save(root / f"class{i % 2}" / f"{i:05d}.npy", rng.standard_normal((int(rng.integers(20, longest)), channels)).astype(np.float32))
    return root


def jpegs(root: Path, n: int = 64, side: int = 256) -> Path:
    from PIL import Image

    rng = np.random.default_rng(2)
    for i in range(n):
        d = root / f"class{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        base = rng.integers(0, 255, (side // 8, side // 8, 3), dtype=np.uint8)  # smooth enough to compress like a photo
        im = Image.fromarray(base).resize((side, side), Image.BICUBIC)
        im.save(d / f"{i:05d}.jpg", quality=90)
    return root


def clips(root: Path, classes: int = 10, per_class: int = 8, length: int = 256 * 64) -> Path:
    rng = np.random.default_rng(3)
    for c in range(classes):
        d = root / f"class{c:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            np.save(d / f"{k:04d}.npy", rng.standard_normal(length).astype(np.float32))
    return root
