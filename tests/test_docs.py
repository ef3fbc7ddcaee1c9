"""The docs match the code: the CLI reference is current, every documented option exists, links
resolve. (Every code block runs in tests/test_doc_snippets.py.)"""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

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


@pytest.mark.parametrize("doc", [d.name for d in DOCS])
def test_docs_link_to_files_that_exist(doc):
    path = next(d for d in DOCS if d.name == doc)
    for target in re.findall(r"\]\(([^)#]+)\)", path.read_text()):
        if "://" not in target:
            assert (path.parent / target).exists(), f"{doc} links to missing {target}"


def test_where_to_add_things_names_files_and_names_that_exist():
    """docs/architecture.md's "Where to add things": every `path.py` (from the repository or fastdata/)
    exists, and every `path.py::Name` is defined there."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Where to add things", 1)[1].split("\n## ", 1)[0]
    refs = re.findall(r"`([\w/]+\.py)(?:::(\w+))?", section)
    assert len(refs) >= 5, "the section names the files to touch"
    missing = []
    for rel, name in refs:
        path = next((p for p in (ROOT / rel, ROOT / "fastdata" / rel) if p.is_file()), None)
        if path is None:
            missing.append(rel)
        elif name and not re.search(rf"^\s*(class|def) {name}\b|^{name}\b\s*[:=]", path.read_text(), re.M):
            missing.append(f"{rel}::{name}")
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def test_the_documented_custom_hooks_run_on_the_batchs_device():
    """Custom hooks get the batch's values on its device (the GPU): a hook that builds a CPU tensor of several
    values (``* torch.tensor([-1.0, 1.0, -1.0])``, once in docs/augment.md) fails there. Each documented hook runs
    here on the meta device, which refuses CPU tensors of several values as CUDA does."""
    import torch

    hooks = re.findall(r"Custom\(on_hflip=(lambda [^\n]*?)\)(?:,|\n|\})", (ROOT / "docs" / "augment.md").read_text())
    assert hooks
    for hook in hooks:
        fn = eval(hook, {"torch": torch})
        values = torch.zeros(2, 3, device="meta")
        assert fn(values).device.type == "meta", hook
