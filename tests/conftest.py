"""Fixtures: tiny source folders and arrays built in tmp_path; a CLI runner."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

from fastdata import cli

SHAPE = (2, 6, 3, 3)


def make_class_folder(root: Path, per_class: int = 4, classes=("cat", "dog", "eel"), shape=SHAPE, dtype="f4", seed=0) -> dict[str, np.ndarray]:
    """root/<class>/<i>.npy; returns {relative path: array}."""
    rng = np.random.default_rng(seed)
    out = {}
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            a = rng.standard_normal(shape).astype(dtype)
            rel = f"{c}/{i:03d}.npy"
            np.save(root / rel, a)
            out[rel] = a
    return out


@pytest.fixture
def class_folder(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    src = tmp_path / "src"
    return src, make_class_folder(src)


@pytest.fixture
def run_cli():
    """Run ``fastdata ARGS`` in-process; returns (exit code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main([str(a) for a in args])
            except SystemExit as e:  # argparse usage errors
                code = e.code if isinstance(e.code, int) else 2
        return code, out.getvalue(), err.getvalue()

    return run


def tree_state(root: Path) -> dict[str, tuple[bytes, int]]:
    """Bytes and mtime of every file under root: to prove a source is untouched."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(root.rglob("*")) if p.is_file()}
