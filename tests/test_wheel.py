"""The built wheel claims one import name, ``fastdata``: the repository's converters/ folder installs as
fastdata.converters (pyproject's package-dir), never as a top-level ``converters`` another project may own."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_has_one_top_level_package(tmp_path):
    src = tmp_path / "src"  # a copy: setuptools' build/ folder would otherwise land (and go stale) in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("fastdata", "converters"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path), str(src)], capture_output=True, text=True, cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("fastdata-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"fastdata"}, tops
    assert "fastdata/converters/registry.py" in names and "fastdata/write/engine.py" in names
    packages = {str(p.relative_to(ROOT)) for p in (ROOT / "fastdata").rglob("__init__.py")}
    assert packages <= set(names), f"packages missing from pyproject's list: {sorted(packages - set(names))}"
    (info,) = [n for n in names if n.endswith(".dist-info/top_level.txt")] or [None]
    if info is not None:
        assert zipfile.ZipFile(wheel).read(info).decode().split() == ["fastdata"]
