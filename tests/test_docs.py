"""The docs match the code: the CLI reference is current, every documented option exists,
and the quickstart's code runs."""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from fastdata.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


def _options(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


def test_cli_reference_is_generated_from_the_current_help():
    spec = importlib.util.spec_from_file_location("gen_cli", ROOT / "docs" / "gen_cli.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)  # type: ignore[union-attr]
    assert (ROOT / "docs" / "cli.md").read_text() == gen.render(), "run: python docs/gen_cli.py"


def test_every_documented_option_exists():
    parsers = _parsers()
    missing = []
    for doc in DOCS:
        for line in doc.read_text().splitlines():
            for m in re.finditer(r"fastdata (\w[\w-]*)([^`|]*)", line):
                cmd, rest = m.group(1), m.group(2)
                if cmd not in parsers:
                    continue
                for opt in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                    if opt not in _options(parsers[cmd]) | _options(parsers[""]):
                        missing.append(f"{doc.name}: fastdata {cmd} {opt}")
    assert not missing, missing


def test_quickstart_code_runs(tmp_path, monkeypatch):
    """The quickstart's shell step converts a small class folder; then its Python blocks run as written."""
    text = (ROOT / "docs" / "quickstart.md").read_text()
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "train" / c).mkdir(parents=True)
        for i in range(12):
            np.save(tmp_path / "train" / c / f"{i}.npy", rng.gamma(2.0, 1.0, (2, 16, 5, 5)).astype(np.float32))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "cache"))
    assert "fastdata convert train/ shards/train/" in text
    r = subprocess.run([sys.executable, "-m", "fastdata", "convert", "train/", "shards/train/", "--quiet"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 2
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "quickstart.md", "exec"), namespace)  # noqa: S102 - our own documentation
    assert namespace["result"].epochs and namespace["result"].epochs[-1].samples == 24


@pytest.mark.parametrize("doc", [d.name for d in DOCS])
def test_docs_link_to_files_that_exist(doc):
    path = next(d for d in DOCS if d.name == doc)
    for target in re.findall(r"\]\(([^)#]+)\)", path.read_text()):
        if "://" not in target:
            assert (path.parent / target).exists(), f"{doc} links to missing {target}"
