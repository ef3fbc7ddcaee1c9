"""Fixtures and helpers: tiny source folders, arrays and datasets built in tmp_path; a CLI runner;
manifest edits; a gloo process group for DDP tests."""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest

import converters
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


def four_shard_dataset(tmp_path: Path, backend: str) -> tuple[Path, dict[str, np.ndarray]]:
    """tmp_path/ds: the 30 samples of make_class_folder(tmp_path / "src", per_class=10) in 4 shards,
    the first three of equal size. Returns (dataset path, {relative path: array})."""
    arrays = make_class_folder(tmp_path / "src", per_class=10)
    converters.convert(tmp_path / "src", tmp_path / "ds", converters.WriteOptions(backend=backend, shard_size=4000, workers=1))
    return tmp_path / "ds", arrays


def edit_manifest(root: Path, fn) -> None:
    """Rewrite root/manifest.json after ``fn`` has edited its parsed JSON in place."""
    m = json.loads((root / "manifest.json").read_text())
    fn(m)
    (root / "manifest.json").write_text(json.dumps(m))


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int):
    """In a spawned rank: a gloo process group on 127.0.0.1:port, destroyed on the way out; yields torch.distributed."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield dist
    finally:
        dist.destroy_process_group()
