"""The source is read-only to us: conversions of a read-only source leave every file, its bytes
and its mtime, and every folder's mtime, unchanged. Tests run as root too, where chmod does not
stop writes, so any attempt to open a source path for writing also fails the test directly."""

from __future__ import annotations

import builtins
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import fastdata
from conftest import make_class_folder, tree_state

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _state(root: Path) -> tuple[dict, dict]:
    dirs = {str(p.relative_to(root)): p.stat().st_mtime_ns for p in [root, *root.rglob("*")] if p.is_dir()}
    return tree_state(root), dirs


def _make_read_only(root: Path) -> None:
    for p in [*root.rglob("*"), root]:  # the root last
        p.chmod(stat.S_IMODE(p.stat().st_mode) & ~0o222)


@pytest.fixture
def no_writes_under(monkeypatch):
    """Make opening any path under the given roots for writing raise, in this process and forked workers."""
    roots: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def guarded(path):
        p = os.path.realpath(os.fspath(path)) if isinstance(path, (str, bytes, os.PathLike)) else ""
        return any(p == r or p.startswith(r + os.sep) for r in roots)

    def open_(file, mode="r", *a, **k):
        if guarded(file) and any(c in mode for c in "wax+"):
            raise AssertionError(f"opened the source {file} for writing")
        return real_open(file, mode, *a, **k)

    def os_open(path, flags, *a, **k):
        if guarded(path) and flags & _WRITE_FLAGS:
            raise AssertionError(f"opened the source {path} for writing")
        return real_os_open(path, flags, *a, **k)

    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(os, "open", os_open)
    return lambda root: roots.append(os.path.realpath(root))


def _images(root: Path) -> None:
    import imagegen

    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            imagegen.jpeg(root / c / f"{i}.jpg", h=12, w=10 + i, seed=i)
            imagegen.png_rgb(root / c / f"{i}.png", h=8, w=9, seed=i)


@pytest.mark.parametrize("kind", ["npy-folder", "npz-folder", "arrays", "images"])
@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_conversion_leaves_a_read_only_source_untouched(tmp_path, no_writes_under, kind, backend):
    src = tmp_path / "src"
    kwargs: dict = {}
    images = None
    if kind == "npy-folder":
        make_class_folder(src)
        arg = src
    elif kind == "npz-folder":
        src.mkdir()
        for i in range(5):
            np.savez(src / f"{i}.npz", a=np.full((i + 1, 2), i, "<f4"), b=np.arange(3) + i)
        arg = src
    elif kind == "arrays":
        src.mkdir()
        np.save(src / "X.npy", np.arange(40, dtype="<f4").reshape(10, 4))
        np.save(src / "y.npy", np.arange(10, dtype="<i8"))
        arg, kwargs, images = src / "X.npy", {"labels": src / "y.npy"}, None
    else:
        _images(src)
        arg, kwargs, images = src, {}, fastdata.ImageOptions(images="raw", size=(8, 8))
    _make_read_only(src)
    before = _state(src)
    no_writes_under(src)
    try:
        write = fastdata.WriteOptions(backend=backend, workers=2, shard_size=200)
        report = fastdata.convert(arg, tmp_path / "ds", fastdata.ConvertConfig(write=write, images=images), **kwargs)
        assert report.shards > 1
        assert len(fastdata.open(tmp_path / "ds")) == report.samples
        write = fastdata.WriteOptions(backend=backend, workers=1, shard_size=200)
        fastdata.convert(arg, tmp_path / "ds", fastdata.ConvertConfig(write=write, images=images, overwrite=True),
                         **kwargs)
    finally:
        for p in [src, *src.rglob("*")]:
            p.chmod(stat.S_IMODE(p.stat().st_mode) | 0o200)
    assert _state(src) == before


def test_the_write_guard_itself_works(tmp_path, no_writes_under):
    (tmp_path / "src").mkdir()
    no_writes_under(tmp_path / "src")
    with pytest.raises(AssertionError, match="for writing"):
        open(tmp_path / "src" / "x", "w")
    with pytest.raises(AssertionError, match="for writing"):
        os.open(tmp_path / "src" / "x", os.O_WRONLY | os.O_CREAT)
    with open(tmp_path / "elsewhere", "w") as f:  # other paths are untouched
        f.write("ok")
