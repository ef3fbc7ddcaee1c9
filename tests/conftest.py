"""Fixtures and helpers: tiny source folders, arrays and datasets built in tmp_path; a CLI runner;
manifest edits; a gloo process group for DDP tests; an S3-compatible server on 127.0.0.1 (moto)."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import fastdata
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
    fastdata.convert(tmp_path / "src", tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, shard_size=4000, workers=1)))
    return tmp_path / "ds", arrays


def edit_manifest(root: Path, fn) -> None:
    """Rewrite root/manifest.json after ``fn`` has edited its parsed JSON in place."""
    m = json.loads((root / "manifest.json").read_text())
    fn(m)
    (root / "manifest.json").write_text(json.dumps(m))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: skipped without it. On a GPU, ``pytest -m gpu`` runs exactly them
    (benchmarks/gpu_kit.py does)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="module")
def _collect_dali_garbage():
    """After each test module, collect what DALI left in reference cycles, here, where its executor threads
    live: a later test that forks (multiprocessing, fork workers) would otherwise let the child's GC run a
    DALI pipeline's finalizer, which waits on threads the child does not have, and hang."""
    yield
    if "nvidia.dali" in sys.modules:
        gc.collect()


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
    """In a spawned rank: a gloo process group on 127.0.0.1:port, destroyed on the way out; yields torch.distributed.
    A DDP model made inside must be freed before the block ends (see docs/integrations.md, "Ending a DDP script")."""
    import torch.distributed as dist
    import torch.distributed.nn  # noqa: F401  imported later (by DDP), it keeps the group alive until exit

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


# --- an S3-compatible server on 127.0.0.1 (moto's standalone server) ---------------------------

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class S3Server:
    """moto's standalone S3 server in a subprocess on a fixed loopback port (so it can be killed and restarted)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, **CREDS}
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1)
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("moto server did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def fs(self):
        import s3fs  # (tests that use the server skip without s3fs: importorskip)

        return s3fs.S3FileSystem(client_kwargs={"endpoint_url": self.endpoint}, skip_instance_cache=True)


@pytest.fixture(scope="session")
def s3():
    """One S3 server for the whole session (test_remote.py, test_scale_remote.py): one endpoint, so
    fsspec's cached filesystems (keyed by their options, not by AWS_ENDPOINT_URL) never point at a
    server that is gone. The test credentials are in the environment while it runs."""
    pytest.importorskip("moto")
    pytest.importorskip("s3fs")
    old = {k: os.environ.get(k) for k in CREDS}
    os.environ.update(CREDS)
    server = S3Server(free_port())
    server.start()
    yield server
    server.kill()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


_buckets = iter(range(10**6))


def bucket(s3: S3Server) -> str:
    name = f"bkt-{os.getpid()}-{next(_buckets)}"
    s3.fs().mkdir(name)
    return name


def opts(s3: S3Server, cache: Path, **kw) -> fastdata.RemoteOptions:
    """RemoteOptions for the test server, caching under ``cache``."""
    kw.setdefault("timeout", 20.0)
    return fastdata.RemoteOptions(cache_dir=cache, storage_options={"client_kwargs": {"endpoint_url": s3.endpoint}}, **kw)
