"""Small data for the doctor's test scripts, made in a temporary folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


# -- the five users of /work/shared/context, small: each with the targets file its script reads ----------
def flim(root: Path, n: int = 32, bins: int = 64) -> Path:
    """FLIM decays (2, bins, 21, 21) float32 per sample, flat, and targets.csv: path, tau1, tau2, fraction."""
    rng = np.random.default_rng(4)
    root.mkdir(parents=True, exist_ok=True)
    rows = ["path,tau1,tau2,fraction"]
    for i in range(n):
        np.save(root / f"{i:04d}.npy", rng.random((2, bins, 21, 21), dtype=np.float32))
        rows.append(f"{i:04d}.npy,{rng.uniform(0.2, 1.0):.4f},{rng.uniform(1.5, 4.0):.4f},{rng.uniform(0, 1):.4f}")
    (root / "targets.csv").write_text("\n".join(rows) + "\n")
    return root


def _photo(rng: np.random.Generator, h: int, w: int) -> Any:
    from PIL import Image

    base = rng.integers(0, 255, (max(h // 16, 2), max(w // 16, 2), 3), dtype=np.uint8)
    return Image.fromarray(base).resize((w, h), Image.BICUBIC)


def pose(root: Path, classes: int = 6, per_class: int = 6, points: int = 15) -> Path:
    """JPEGs of 300-800 px in category folders and ann.json: a list of {"path", "keypoints": 15 x [x, y]}."""
    import json

    rng = np.random.default_rng(5)
    records = []
    for c in range(classes):
        (root / f"cat{c}").mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            h, w = (int(v) for v in rng.integers(300, 800, 2))
            rel = f"cat{c}/{k:03d}.jpg"
            _photo(rng, h, w).save(root / rel, quality=85)
            kp = np.stack([rng.uniform(0, w - 1, points), rng.uniform(0, h - 1, points)], 1).round(2)
            records.append({"path": rel, "keypoints": kp.tolist()})
    (root / "ann.json").write_text(json.dumps(records))
    return root


def faces(root: Path, n: int = 32, side: int = 80) -> Path:
    """Face crops (side x side JPEG), flat, and meta.csv: path, yaw, pitch, roll, landmarks (68 x [x, y])."""
    import json

    rng = np.random.default_rng(6)
    root.mkdir(parents=True, exist_ok=True)
    rows = ["path,yaw,pitch,roll,landmarks"]
    for i in range(n):
        _photo(rng, side, side).save(root / f"{i:04d}.jpg", quality=90)
        lm = rng.uniform(8, side - 9, (68, 2)).round(2).tolist()
        yaw, pitch, roll = (round(float(v), 3) for v in rng.uniform(-60, 60, 3))
        rows.append(f'{i:04d}.jpg,{yaw},{pitch},{roll},"{json.dumps(lm)}"')
    (root / "meta.csv").write_text("\n".join(rows) + "\n")
    return root


def recordings(root: Path, n: int = 96, channels: int = 16) -> Path:
    """Sequences (50-400, 16) float32 as .npy, flat, and labels.csv: path, label."""
    rng = np.random.default_rng(7)
    root.mkdir(parents=True, exist_ok=True)
    rows = ["path,label"]
    for i in range(n):
        np.save(root / f"{i:05d}.npy", rng.standard_normal((int(rng.integers(50, 400)), channels)).astype(np.float32))
        rows.append(f"{i:05d}.npy,{int(rng.integers(0, 4))}")
    (root / "labels.csv").write_text("\n".join(rows) + "\n")
    return root


def photos(root: Path, n: int = 48, side: int = 384) -> Path:
    """Unlabelled photos (JPEG), flat: the self-supervised user's."""
    rng = np.random.default_rng(8)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        _photo(rng, side, side).save(root / f"{i:04d}.jpg", quality=90)
    return root
