"""The layering of docs/architecture.md, checked: imports follow the data flow, one way, with no cycle.

Every module of fastdata/ and converters/ has a layer. A module may import (at module level or
inside a function) only modules of its own layer or below; imports under ``if TYPE_CHECKING:`` are
exempt (they never run). A new module must be given a layer here: that is the moment to decide
where it sits in the data flow. docs/architecture.md's layer table is generated from LAYERS and
LAYER_ROLES (``python docs/gen_architecture.py``); a test fails when it is not current.

Also checked: sizes (no module over MAX_MODULE_LINES, no function over MAX_FUNCTION_LINES, but for
the few in SIZE_ALLOWED, each with its reason) and every public module's ``__all__`` (sorted,
names that exist).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fastdata", "converters")
IMPORT_NAMES = {"fastdata": "fastdata", "converters": "fastdata.converters"}  # pyproject's package-dir

# lowest first: spec -> file utilities -> format backends -> remote shards -> dataset -> epoch order -> augment
# -> loaders -> train -> tools. A prefix ending in "." covers a whole package.
LAYERS: list[tuple[str, ...]] = [
    ("fastdata.errors", "fastdata._units", "fastdata._version", "fastdata.seeds", "fastdata.world"),
    ("fastdata.format.spec",),
    ("fastdata.fileio", "fastdata.handles"),
    ("fastdata.format.",),
    ("fastdata.remote.",),  # where shard files come from when a dataset is a URL: fsspec + the local cache
    ("fastdata.reading.",),
    ("fastdata.augment.", "fastdata._compat"),
    ("fastdata.loaders.",),
    ("fastdata.train.",),
    # the write side, a peer of the read side (nothing that reads imports it): engine, then sources, then the API
    ("fastdata.write.",),
    ("fastdata.converters.",),
    ("fastdata", "fastdata.__main__", "fastdata.cli.", "fastdata.measure.", "fastdata.demo."),
]

# what lives in each layer (the same order as LAYERS): the last column of docs/architecture.md's table
LAYER_ROLES: list[str] = [
    "shared by all: errors, units, seeds, where the process runs (rank, usable CPUs)",
    "the format's types, constants, rules",
    "atomic files, positional reads, per-process handles",
    "the on-disk format's I/O: manifest, keys, the backend registry and interface, hdf5 and lmdb shards, "
    "local shard stores, in-place indexes",
    "shards of a URL dataset: fsspec, the node's shard cache, plan-aware prefetch",
    "reading shards: the dataset (subsets, splits, batch assembly, decoding, read-ahead), epoch order, samplers",
    "batched augmentation on the device, its targets, sequence ops, mixing, views; private torch uses",
    "batches of tensors: order, resume, stats (base), reading (host: threads, crop decoding; procs: processes and "
    "their ring), the device stage (torch_backend), DALI, tuned settings",
    "the AMP training core: the loop, its precision plan, epoch meter and checkpoints",
    "the write engine: shard plan and tasks, journal, destination and lock, local/Ray/parts engines, URL "
    "publishing, merge, in-place indexes",
    "conversion sources (.npy folders and arrays, image folders, tables, Python objects), registered in one "
    "table, and the conversion API (fastdata.convert, fastdata.merge, ConvertConfig)",
    "tools: the CLI, measuring (bench, tune, doctor, verify), the demo; nothing below uses them",
]

MAX_MODULE_LINES = 800  # issue 49: modules split by concern, not by a line cap
MAX_FUNCTION_LINES = 60
# modules ("path") and functions ("path::name") allowed over the limits, each with its reason; an entry
# that is no longer over fails the test, so the list only shrinks
SIZE_ALLOWED: dict[str, str] = {}
MAX_ALLOWED_MODULE_LINES = 800  # the most an allowed module may have
# modules users import from (docs, README): each declares a sorted __all__ of names it has
PUBLIC_MODULES = (
    "fastdata", "fastdata.augment", "fastdata.augment.mixing", "fastdata.augment.sequence", "fastdata.augment.targets",
    "fastdata.demo.examples", "fastdata.errors", "fastdata.format", "fastdata.format.interface", "fastdata.format.store",
    "fastdata.loaders", "fastdata.measure.bench", "fastdata.measure.doctor", "fastdata.measure.tune",
    "fastdata.reading.samplers", "fastdata.remote", "fastdata.train", "fastdata.world",
)
ALL_PENDING: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join([IMPORT_NAMES[parts[0]], *parts[1:]])] = path
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


def imports_of(module: str, path: Path, known: set[str], types: bool = False) -> set[str]:
    """The package modules ``module`` imports when it runs (module level and inside functions); with
    ``types``, also those it imports for type checking only."""
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
            if isinstance(child, ast.If) and _is_type_checking(child) and not types:
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


def graph(types: bool = False) -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: imports_of(m, p, known, types) for m, p in mods.items()}


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


@pytest.mark.parametrize("types", [False, True], ids=["run-time", "with-type-only"])
def test_no_import_cycle(types: bool) -> None:
    """No cycle, not even through imports made only for type checking (a sign of one concern in two modules)."""
    cycle = find_cycle(graph(types))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checks_can_fail() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    with pytest.raises(AssertionError, match="has no layer"):
        layer_of("fastdata.somewhere_new")
    assert layer_of("fastdata.format.hdf5") > layer_of("fastdata.format.spec")
    assert layer_of("fastdata.loaders.dali") > layer_of("fastdata.augment")


def test_fastdata_loader_is_the_factory_itself() -> None:
    import fastdata
    from fastdata.loaders import loader

    assert fastdata.loader is loader


@pytest.mark.slow  # ~18 s of mypy; the test command's own mypy run checks the package every time
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


# --- sizes ------------------------------------------------------------------------------------


def oversized(root: Path = ROOT) -> dict[str, int]:
    """Every module over MAX_MODULE_LINES ("path": lines) and function over MAX_FUNCTION_LINES
    ("path::name": lines, from ``def`` to its last line, docstring included)."""
    found: dict[str, int] = {}
    for path in _modules().values():
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        if (n := len(text.splitlines())) > MAX_MODULE_LINES:
            found[rel] = n
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    found[f"{rel}::{node.name}"] = max(n, found.get(f"{rel}::{node.name}", 0))
    return found


def test_modules_and_functions_stay_small() -> None:
    found = oversized()
    over = [f"{k}: {n} lines" for k, n in sorted(found.items()) if k not in SIZE_ALLOWED]
    assert not over, (f"over {MAX_MODULE_LINES} lines a module or {MAX_FUNCTION_LINES} a function (split it, or "
                      "add it to SIZE_ALLOWED with its reason):\n" + "\n".join(over))
    too_big = [k for k, n in found.items() if "::" not in k and n > MAX_ALLOWED_MODULE_LINES]
    assert not too_big, f"over {MAX_ALLOWED_MODULE_LINES} lines even for an allowed module: {too_big}"
    stale = sorted(set(SIZE_ALLOWED) - set(found))
    assert not stale, "no longer over the limits: remove from SIZE_ALLOWED: " + ", ".join(stale)
    assert all(reason.strip() for reason in SIZE_ALLOWED.values())


# --- __all__ ----------------------------------------------------------------------------------


def declared_all(path: Path) -> list[str] | None:
    """A module's ``__all__`` as written (a literal list or tuple at module level), or None."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
            return list(ast.literal_eval(node.value))
    return None


def test_every_declared_all_is_sorted() -> None:
    bad = [m for m, p in _modules().items() if (names := declared_all(p)) is not None and names != sorted(set(names))]
    assert not bad, "__all__ not sorted (or with a name twice) in: " + ", ".join(sorted(bad))


def test_public_modules_declare_what_they_export() -> None:
    import importlib

    mods = _modules()
    for m in PUBLIC_MODULES:
        names = declared_all(mods[m])
        assert names is not None, f"{m} (a public module) has no __all__"
        missing = [n for n in names if not hasattr(importlib.import_module(m), n)]
        assert not missing, f"{m}.__all__ names what it does not have: {missing}"
    assert not set(ALL_PENDING) & set(PUBLIC_MODULES)


def test_documented_imports_are_public_modules() -> None:
    """Every ``from fastdata.X import`` in docs/ and README.md is a module in PUBLIC_MODULES (or pending)."""
    import re

    texts = [p.read_text(encoding="utf-8") for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]]
    named = {m for t in texts for m in re.findall(r"from (fastdata[\w.]*) import", t)}
    unlisted = sorted(named - set(PUBLIC_MODULES) - set(ALL_PENDING) - {"fastdata.cli"})
    assert not unlisted, f"documented imports from modules not in PUBLIC_MODULES: {unlisted}"


# --- docs/architecture.md ---------------------------------------------------------------------


def test_layer_roles_match_layers() -> None:
    assert len(LAYER_ROLES) == len(LAYERS), "one LAYER_ROLES entry per layer"


def test_architecture_doc_is_current() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_architecture", ROOT / "docs" / "gen_architecture.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert gen.render(doc) == doc, "docs/architecture.md's layer table differs from LAYERS: run python docs/gen_architecture.py"


def test_the_size_check_can_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "fastdata"
    pkg.mkdir()
    (pkg / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1) + "def f():\n" + "    y = 1\n" * MAX_FUNCTION_LINES)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert oversized(tmp_path) == {"fastdata/big.py": MAX_MODULE_LINES + 2 + MAX_FUNCTION_LINES,
                                   "fastdata/big.py::f": MAX_FUNCTION_LINES + 1}
