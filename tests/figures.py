"""Finds the measured figures of a markdown page and checks each against the results file its scope cites.

A figure is a number with a decimal point ("0.97"), with thousands separators ("1,284") or with a unit of
speed, ratio or share ("1.6x", "12%", "519 MB/s", "40 ms"). Skipped by rule, as no measurement: fenced and
indented code blocks, inline code spans, HTML comments, link targets, tuples of whole numbers such as
shapes "(2, 256, 21, 21)", versions (dotted "2.13.0", or right after a package's name: "Python 3.11",
"torch (2.13 here)", "Lightning 2.6"), defaults ("(default 0.25)", "89.5 M by default") and headings.

A citation names one committed file of benchmarks/results: a path ``results/NAME.md``, ``.json`` or
``.log`` (``*`` allowed: ``doctor*.md`` names each match), or a file name alone in backticks
(`` `cold_s15.md` ``) where no page of docs/ has that name; a generated block of docs/benchmarks.md
(``<!-- begin generated: NAME -->``) cites NAME.json and NAME.md for every line in it. A figure's scope is
its paragraph (list item, table), else the nearest paragraph before it in its section (a table's caption,
the section's intro) that cites: the nearest citation decides. The figure must be a value of one of the
files cited there: equal at the precision printed, or a longer value that rounds to it ("1,284" for
1284.3, "0.7" for 0.67), or for a percentage a fraction that does (12.7% for 0.1268).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_UNIT = r"\s?(?:x(?![\w-])|×|%|[KMG]i?B/s|(?:samples|images|files|batches|steps)/s|ms\b|µs\b)"
_FIGURE = re.compile(rf"(?<![\w.,/])(?:[-–−]\s?)?({_NUM})(?!\.\d|,\d)({_UNIT})?(?!\w)")
_PACKAGE = re.compile(r"(?:\b(?:python|torch|numpy|h5py|lmdb|dali|cuda|pil|pillow|simplejpeg|lightning|accelerate|"
                      r"ray|torchvision|kornia|liblmdb|version)|\bv)\s?\(?$", re.I)
_DEFAULT = re.compile(r"\bdefault\s?\(?$", re.I)
_BY_DEFAULT = re.compile(r"^[^\w(]*(?:\w+\s)?by default\b")
_CITE = re.compile(r"results/([\w*./-]+?\.(?:md|json|log))\b")
_BARE = re.compile(r"`([\w-]+)\.(?:md|json)`")  # `cold_s15.md`: a results file when no docs page has that name
_GENERATED = re.compile(r"<!-- (begin|end) generated: (\w+) -->")
_SKIP_SPANS = [re.compile(p) for p in (r"`[^`]*`", r"<!--.*?-->", r"\]\([^)]*\)", r"https?://\S+",
                                       r"\(\d+(?:,\s?\d+)+\)")]


@dataclass
class Figure:
    line: int
    text: str  # as printed, e.g. "1,284 MB/s"
    number: str  # the number alone, e.g. "1,284"
    percent: bool
    cited: tuple[str, ...]  # the results files (in benchmarks/results) of the nearest scope that cites any
    section: str  # the heading line above it ("" before the first)


def cited_files(text: str) -> tuple[str, ...]:
    """The results files (paths in benchmarks/results) that a piece of text cites."""
    files = [p.relative_to(RESULTS).as_posix() for m in _CITE.finditer(text) for p in sorted(RESULTS.glob(m.group(1)))]
    files += [name for m in _BARE.finditer(text)
              if (RESULTS / (name := m.group(0).strip("`"))).exists() and not (ROOT / "docs" / name).exists()]
    return tuple(dict.fromkeys(files))


def _strip(text: str) -> str:
    for pattern in _SKIP_SPANS:
        text = pattern.sub(lambda m: " " * len(m.group(0)), text)
    return text


def figures_in(line: str) -> list[tuple[str, str, bool]]:
    """(as printed, number, is a percentage) of each figure in one line of prose."""
    out = []
    clean = _strip(line)  # idempotent: page_figures strips whole paragraphs first
    for m in _FIGURE.finditer(clean):
        number, unit = m.group(1), (m.group(2) or "").strip()
        if not unit and "." not in number and "," not in number:
            continue
        before, after = clean[: m.start()], clean[m.end():]
        if (not unit and _PACKAGE.search(before)) or _DEFAULT.search(before) or _BY_DEFAULT.search(after):
            continue
        out.append((m.group(0).strip(" -–−"), number, unit == "%"))
    return out


@dataclass
class _Unit:
    first: int  # line number of the first line
    lines: list[str]
    kind: str  # "para", "table", "list", "heading", "code"


def _units(text: str) -> list[_Unit]:
    """The page cut into paragraphs, tables, list items, headings and code blocks, in order."""
    units: list[_Unit] = []
    fence = False
    prev_blank = True
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            if not fence:
                units.append(_Unit(n, [], "code"))
            fence = not fence
            prev_blank = False
            continue
        if fence:
            continue
        if not stripped:
            prev_blank = True
            continue
        kind = ("heading" if line.startswith("#") else "table" if stripped.startswith("|")
                else "list" if re.match(r"\s*(?:[-*+]|\d+\.)\s", line) else "para")
        if line.startswith("    ") and (prev_blank or units[-1].kind == "code") and kind != "list":
            kind = "code"
        last = units[-1] if units else None
        starts = (prev_blank or last is None or kind in ("heading", "list") or last.kind == "heading"
                  or (kind == "table") != (last.kind == "table") or (kind == "code") != (last.kind == "code"))
        if starts:
            units.append(_Unit(n, [line], kind))
        else:
            last.lines.append(line)
        prev_blank = False
    return units


def page_figures(text: str) -> list[Figure]:
    """Every figure of a markdown page with the runs its nearest citing scope names."""
    units = _units(text)
    generated: dict[int, str] = {}  # line -> run of the generated block holding it
    block = None
    for n, line in enumerate(text.splitlines(), 1):
        m = _GENERATED.search(line)
        if m:
            block = m.group(2) if m.group(1) == "begin" else None
        elif block:
            generated[n] = block
    out: list[Figure] = []
    section: list[_Unit] = []  # the units of the current section so far
    heading = ""
    for u in units:
        if u.kind == "heading":
            section, heading = [], u.lines[0].strip()
            continue
        section.append(u)
        if u.kind == "code":
            continue
        nearest = next((files for s in reversed(section) if (files := cited_files("\n".join(s.lines)))), ())
        for k, line in enumerate(_strip("\n".join(u.lines)).split("\n")):  # code spans may wrap lines
            n = u.first + k
            runs = _generated_runs(generated[n], line, text) if n in generated else nearest
            for printed, number, percent in figures_in(line):
                out.append(Figure(n, printed, number, percent, runs, heading))
    return out


def _generated_runs(block: str, line: str, text: str) -> tuple[str, ...]:
    """A generated block cites the run of its name (its .json and .md); one gathered from several runs
    (``ceilings``) the run named in the row's first cell, or for a line that is no row every run its rows name."""
    if (RESULTS / f"{block}.json").exists():
        return (f"{block}.json", f"{block}.md")
    cell = line.split("|")[1].strip() if line.startswith("|") else ""
    if (RESULTS / f"{cell}.json").exists():
        return (f"{cell}.json", f"{cell}.md")
    body = text.split(f"<!-- begin generated: {block} -->")[1].split(f"<!-- end generated: {block} -->")[0]
    runs = sorted({c for r in body.splitlines() if r.startswith("|") if (RESULTS / f"{(c := r.split('|')[1].strip())}.json").exists()})
    return tuple(f"{run}{suffix}" for run in runs for suffix in (".json", ".md"))


@lru_cache(maxsize=None)
def file_values(name: str) -> tuple[tuple[Decimal, int], ...]:
    """Every number in a results file with its count of decimals."""
    values = set()
    for m in re.finditer(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?:[eE]([-+]?\d+))?",
                         (RESULTS / name).read_text(encoding="utf-8")):
        whole, frac, exp = m.group(1).replace(",", ""), m.group(2) or "", m.group(3)
        value = Decimal(f"{whole}.{frac}" if frac else whole)
        places = len(frac)
        if exp:
            value = value.scaleb(int(exp))
            places = max(0, places - int(exp))
        values.add((value, places))
    return tuple(values)


def rounds_to(value: Decimal, places: int, number: str) -> bool:
    """Whether a results value of ``places`` decimals is the printed number at its precision."""
    target = Decimal(number.replace(",", ""))
    printed = len(number.partition(".")[2])
    if places < printed:
        return value == target
    half = Decimal(5).scaleb(-printed - 1)
    return abs(value - target) <= half


def in_file(figure: Figure, name: str) -> bool:
    """Whether the figure is a value of the results file ``name`` at its printed precision."""
    for value, places in file_values(name):
        if rounds_to(value, places, figure.number):
            return True
        if figure.percent and rounds_to(value * 100, places - 2, figure.number):
            return True
    return False


def check_page(text: str, exempt: frozenset[str] = frozenset()) -> list[str]:
    """'line: figure: problem' for each figure that is not a value of the results its scope cites;
    ``exempt`` holds figures as printed, or heading lines whose section is skipped whole."""
    problems = []
    for f in page_figures(text):
        if f.text in exempt or f.section in exempt:
            continue
        if not f.cited:
            problems.append(f"{f.line}: {f.text}: no results file cited in its paragraph, table caption or section intro")
        elif not any(in_file(f, name) for name in f.cited):
            problems.append(f"{f.line}: {f.text}: not a value of {', '.join(f.cited)}")
    return problems
