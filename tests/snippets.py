"""The code blocks of README.md and docs/*.md, read from the Markdown for tests/test_doc_snippets.py.

A block is a fenced block or a 4-space indented one. How the runner treats it:

- ```` ```python ````: executed; the Python blocks of a page share one namespace, in page order.
  One whose first line is ``# docs/examples/NAME.py`` is that file, shown verbatim: tests/test_integrations.py
  runs the file and checks the copy.
- ```` ```text ````, ```` ```json ````, ```` ```csv ````, ```` ```jsonl ````: output, file contents or a
  diagram; not code.
- any other block (a bare fence, an indented block): shell. Every line that is not blank or a ``#``
  comment must be a ``fastdata ...`` command, which is run (a ``  # comment`` after it is dropped),
  or a ``python benchmarks/...`` command: a benchmark (minutes), which tests/test_benchmarks.py runs
  in its quick mode instead.

A comment on the line before a block changes that: ``<!-- snippet: skip WHY -->`` (not run, and the
reason is required), ``<!-- snippet: slow WHY -->`` (run by a test marked slow, on the page's fresh data,
not in the default suite), ``<!-- snippet: gpu -->`` (run only with CUDA), ``<!-- snippet: dali -->`` (only with
CUDA and NVIDIA DALI), ``<!-- snippet: alternatives -->``
(each command is an alternative to the others: see tests/test_doc_snippets.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
TEXT = {"text", "json", "csv", "jsonl"}
MARKER = re.compile(r"^<!--\s*snippet:\s*(?P<kind>[a-z]+)\s*(?P<why>.*?)\s*-->$")
KINDS = {"skip", "slow", "gpu", "dali", "alternatives"}
EXAMPLE = re.compile(r"^# (docs/examples/\S+\.py)$")


@dataclass(frozen=True)
class Block:
    page: str  # the file's name relative to the repository root
    line: int  # 1-based line of the block's first code line
    lang: str  # "python", "text", ..., or "shell"
    code: str
    marker: str = ""  # "", or one of KINDS
    why: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def commands(self) -> list[tuple[int, str]]:
        """A shell block's command lines (line number, text without a trailing comment)."""
        out = []
        for k, raw in enumerate(self.code.splitlines()):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            out.append((self.line + k, re.split(r"\s+#\s", line, maxsplit=1)[0].strip()))
        return out


def blocks(path: Path, name: str | None = None) -> list[Block]:
    """Every code block of one Markdown page, in order, with the marker on the line before it; ``name``:
    the page's name in messages (default: its path in the repository)."""
    lines = path.read_text().splitlines()
    name = name or str(path.relative_to(ROOT))
    out: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^```\s*([\w-]*)\s*$", line)
        if fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
            if end is None:
                raise ValueError(f"{name}:{i + 1}: a fenced block that never closes")
            out.append(_block(name, lines, i, i + 1, "\n".join(lines[i + 1:end]) + "\n", fence.group(1) or "shell"))
            i = end + 1
            continue
        if line.startswith("    ") and line.strip() and (i == 0 or not lines[i - 1].strip()):
            end = i
            while end < len(lines) and (lines[end].startswith("    ") or not lines[end].strip()):
                end += 1
            while not lines[end - 1].strip():
                end -= 1
            code = "\n".join(x[4:] for x in lines[i:end]) + "\n"
            out.append(_block(name, lines, i, i, code, "shell"))
            i = end
            continue
        i += 1
    return out


def _block(page: str, lines: list[str], opening: int, first: int, code: str, lang: str) -> Block:
    before = next((lines[j].strip() for j in range(opening - 1, -1, -1) if lines[j].strip()), "")
    m = MARKER.match(before)
    if before.startswith("<!--") and "snippet" in before and not m:
        raise ValueError(f"{page}:{opening}: cannot read the snippet marker {before!r}")
    return Block(page, first + 1, lang, code, m.group("kind") if m else "", m.group("why") if m else "")


def example_file(block: Block) -> str | None:
    """``docs/examples/NAME.py`` for a Python block that is a copy of that file, else None."""
    m = EXAMPLE.match(block.code.split("\n", 1)[0])
    return m.group(1) if m and block.lang == "python" else None


def is_benchmark(command: str) -> bool:
    return command.startswith("python benchmarks/")


def argv(command: str) -> list[str]:
    """A ``fastdata ...`` command line as the CLI's arguments (without ``fastdata``)."""
    words = shlex.split(command)
    if not words or words[0] != "fastdata":
        raise ValueError(f"not a fastdata command: {command!r}")
    return words[1:]
