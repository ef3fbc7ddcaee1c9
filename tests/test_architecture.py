"""The layering of docs/architecture.md, checked: imports follow the data flow, one way, with no cycle.

Every module of fastdata/ and converters/ has a layer. A module may import (at module level or
inside a function) only modules of its own layer or below; imports under ``if TYPE_CHECKING:`` are
exempt (they never run). A new module must be given a layer here: that is the moment to decide
where it sits in the data flow.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fastdata", "converters")

# lowest first: spec -> file utilities -> format backends -> remote shards -> dataset -> sampling/world -> augment
# -> loaders -> train -> tools. A prefix ending in "." covers a whole package.
LAYERS: list[tuple[str, ...]] = [
    ("fastdata.errors", "fastdata._units", "fastdata._version", "fastdata.seeds"),  # seeds imports only numpy
    ("fastdata.format.spec",),
    ("fastdata.fileio", "fastdata.handles", "fastdata.batching"),
    ("fastdata.format.",),
    ("fastdata.remote.",),  # where shard files come from when a dataset is a URL: fsspec + the local cache
    ("fastdata.decode", "fastdata.cropdecode", "fastdata.dataset", "fastdata.readahead", "converters."),
    ("fastdata.world", "fastdata.sampling", "fastdata.samplers", "fastdata.tuned"),
    ("fastdata.targets", "fastdata.augment", "fastdata.augment.", "fastdata._compat", "fastdata.seqaug", "fastdata.mixing", "fastdata.views"),
    ("fastdata.loaders.",),
    ("fastdata.train",),
    ("fastdata", "fastdata.__main__", "fastdata.bench", "fastdata.tune", "fastdata.verify", "fastdata.cli",
     "fastdata.cli_bench", "fastdata.cli_cold", "fastdata.demo", "fastdata.examples", "fastdata.doctor."),
]


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (length of the matching entry, layer): the longest match wins
    for i, entries in enumerate(LAYERS):
        for e in entries:
            hit = module == e or (e.endswith(".") and (module + ".").startswith(e))
            if hit and (best is None or len(e) > best[0]):
                best = (len(e), i)
    if best is None:
        raise AssertionError(f"module {module} has no layer: add it to LAYERS in tests/test_architecture.py")
    return best[1]


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``module`` imports when it runs (module level and inside functions)."""
    is_pkg = path.name == "__init__.py"
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    found: set[str] = set()

    def resolve(name: str) -> None:
        # the deepest known module that `name` names (from a.b import c: a.b.c if c is a module, else a.b)
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                for a in child.names:
                    if a.name.split(".")[0] in PACKAGES:
                        resolve(a.name)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    prefix = ".".join(base[: len(base) - child.level + 1])
                    target = f"{prefix}.{child.module}" if child.module else prefix
                else:
                    target = child.module or ""
                if target.split(".")[0] in PACKAGES:
                    for a in child.names:
                        resolve(f"{target}.{a.name}")
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def test_every_module_has_a_layer() -> None:
    for m in graph():
        layer_of(m)


def test_imports_go_one_way() -> None:
    bad = [f"{m} (layer {layer_of(m)}) imports {d} (layer {layer_of(d)})"
           for m, deps in graph().items() for d in sorted(deps)
           if layer_of(d) > layer_of(m) and not m.startswith(d + ".")]  # a package's own __init__ runs first anyway
    assert not bad, "imports against the data flow:\n" + "\n".join(bad)


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """A cycle of imports, as a list of modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(g.get(m, ())):
            if m.startswith(d + "."):
                continue  # a submodule naming its own package: Python has run the package already
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (c := dfs(d)):
                return c
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state and (c := dfs(m)):
            return c
    return None


def test_no_import_cycle() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checks_can_fail() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    with pytest.raises(AssertionError, match="has no layer"):
        layer_of("fastdata.somewhere_new")
    assert layer_of("fastdata.format.hdf5") > layer_of("fastdata.format.spec")
    assert layer_of("fastdata.loaders.dali") > layer_of("fastdata.augment")


def test_loader_signature_matches_the_factory() -> None:
    import fastdata
    from fastdata.loaders import loader

    assert inspect.signature(fastdata.loader) == inspect.signature(loader)
    assert "batch_size" in inspect.signature(fastdata.loader).parameters


def test_type_check_catches_a_wrong_loader_argument(tmp_path: Path) -> None:
    """mypy (run on the package by the test command) sees fastdata.loader's real signature."""
    import subprocess
    import sys

    good = tmp_path / "good.py"
    good.write_text("import fastdata\nld = fastdata.loader('ds/', 64, shuffle='block', num_workers=2)\n")
    bad = tmp_path / "bad.py"
    bad.write_text("import fastdata\nld = fastdata.loader('ds/', batch_size='64', shufle=True)\n")
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--follow-imports=silent",
           "--cache-dir", str(tmp_path / "cache")]
    ok = subprocess.run(cmd + [str(good)], capture_output=True, text=True, cwd=ROOT)
    assert ok.returncode == 0, ok.stdout
    wrong = subprocess.run(cmd + [str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert wrong.returncode == 1, wrong.stdout
    assert "batch_size" in wrong.stdout and "shufle" in wrong.stdout


def test_import_fastdata_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, fastdata, fastdata.format; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"
