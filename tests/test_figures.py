"""Figures a user reads hold on the results they came from.

README.md and every docs/*.md page, docs/benchmarks.md's prose included: each measured figure (a number
with a decimal point or thousands separators, or with a unit of speed, ratio or share: "0.97", "1,284
MB/s", "1.6x", "12.7%") is a value of the results file that the nearest citing scope names (its
paragraph, list item or table, else the nearest paragraph before it in its section: a table's caption
or the section's intro), at the precision printed. Skipped by rule as no measurement: code blocks and
code spans, HTML comments, link targets, tuples such as shapes "(2, 256, 21, 21)", versions ("2.13.0",
"Python 3.11", "Lightning 2.6") and defaults ("(default 0.25)"). tests/figures.py states the rules in
full. The package's code and comments keep the older, weaker check: a figure with a unit appears in
some committed results file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures  # noqa: E402

ROOT = figures.ROOT

# Figures that are no measurement, with the pages and modules they appear in and why (under ten entries).
EXEMPT: dict[str, tuple[tuple[str, ...], str]] = {
    "4x": (("docs/loader.md",), "uint8 against float32: 1 byte against 4, arithmetic"),
    "25%": (("docs/loader.md", "fastdata/loaders/host.py"), "the ragged buffers' growth margin, a design constant"),
    "10%": (("docs/doctor.md",), "the doctor's input-bound threshold (INPUT_BOUND in fastdata/doctor), a design constant"),
    "2%": (("docs/tuning.md",), "guidance: a wait share below which input is not the bottleneck"),
    "1.1": (("docs/tuning.md",), "the limit above which a ceiling ratio is flagged, a design constant"),
    "1.1x": (("docs/doctor.md",), "the projected speedup below which the doctor prints no fix, a design constant"),
    "0.1": (("docs/backends.md",), "the uint8 resample's alignment tolerance in pixels, a design constant"),
    "## Projection: 1 TB on 1, 10 and 100 nodes": (
        ("docs/scale.md",), "a projection: arithmetic on the figures measured in the section before, which cites them"),
}


def _exempt(rel: str) -> frozenset[str]:
    return frozenset(k for k, (where, _) in EXEMPT.items() if rel in where)


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_figure_in_the_docs_is_a_value_of_the_results_file_it_cites():
    """Each page's figures against the results file of their nearest citation (``figures.check_page``): a
    figure with no committed results file goes, or the page says it is unmeasured."""
    problems = []
    for page in _pages():
        rel = page.relative_to(ROOT).as_posix()
        problems += [f"{rel}:{p}" for p in figures.check_page(page.read_text(encoding="utf-8"), _exempt(rel))]
    assert problems == []


def test_the_exemptions_are_few_and_each_still_used():
    assert len(EXEMPT) < 10
    for key, (where, reason) in EXEMPT.items():
        assert reason
        for rel in where:
            assert key in (ROOT / rel).read_text(encoding="utf-8"), f"{key!r} no longer in {rel}: drop it"


_RUN = "benchmarks/results/cold_large_s18.md"  # block 1,519 MB/s, shards 1,557, True 1,277; block 0.67 of its ceiling


@pytest.mark.parametrize("text, problem", [
    (f"`\"block\"` read 1,519 MB/s ({_RUN}).", None),
    ("`\"block\"` read 1,519 MB/s (benchmarks/results/cold_large_s18.json).", None),  # 1519.18...: rounds to it
    (f"`\"block\"` at 0.7 of the ceiling ({_RUN}).", None),  # 0.67, printed shorter
    (f"`\"block\"` read 1,519.2 MB/s ({_RUN}).", "not a value of cold_large_s18.md"),  # more digits than the file has
    (f"`\"block\"` read 1,523 MB/s ({_RUN}).", "not a value of cold_large"),  # invented
    ("`\"block\"` read 1,519 MB/s (benchmarks/results/cold_large_s14.md).", "not a value of cold_large_s14"),  # wrong file
    ("`\"block\"` read at 0.67 of the disk's best large reads.", "no results file cited"),  # a bare ratio, no citation
    ("`\"block\"` read 1.2x faster.", "no results file cited"),
    (f"Intro ({_RUN}).\n\n`\"block\"` at 0.67 of the ceiling.", None),  # the section intro cites
    (f"Intro ({_RUN}).\n\n# Other section\n\n`\"block\"` at 0.67.", "no results file cited"),  # not across a heading
    (f"Intro ({_RUN}).\n\nAt 0.67 (`cold_large_s14.md`).", "not a value of cold_large_s14"),  # the nearest citation decides
    (f"Caption ({_RUN}):\n\n| mode | x |\n|---|---:|\n| block | 0.67 |\n| shards | 0.68 |", None),
    (f"Caption ({_RUN}):\n\n| mode | x |\n|---|---:|\n| block | 0.76 |", "not a value of cold_large"),
    ("Shapes (2, 256, 21, 21), `--shard-size 512MB`, torch 2.13.0, Python 3.11, (default 0.25).", None),
    ("```\nfastdata bench shards/  # 1.37x\n```\n\n    indented 2.5x", None),  # code is skipped
    ("12.7% of its time (benchmarks/results/gpu.md)", None),  # "waited for input" column: 12.7
    ("1.9% of its time (benchmarks/results/gpu.md)", None),
    ("19.3% of its time (benchmarks/results/gpu.md)", "not a value of gpu"),
])
def test_the_figure_check_catches_invented_moved_and_uncited_figures(text, problem):
    problems = figures.check_page(text)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0], problems


def test_a_generated_block_cites_its_results_file():
    good = "<!-- begin generated: cold_large_s18 -->\n| a | 0.67 |\n<!-- end generated: cold_large_s18 -->\n"
    assert figures.check_page(good) == []
    bad = good.replace("0.67", "0.71")
    assert "not a value of cold_large" in figures.check_page(bad)[0]


def test_a_citation_resolves_to_committed_results_files_only():
    assert figures.cited_files("see `benchmarks/results/doctor*.md`") == (
        "doctor.md", "doctor_only.md", "doctor_rerun.md", "doctor_run3.md")
    assert figures.cited_files("`cold_s15.md` and `remote.md`") == ("cold_s15.md",)  # docs/remote.md exists: ambiguous
    assert figures.cited_files("benchmarks/results/nothing.md") == ()
    assert figures.cited_files("(`benchmarks/results/gpu_logs/call3_tests.log`)") == ("gpu_logs/call3_tests.log",)


_UNIT_FIGURE = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)(?:\s?[–-]\s?(\d[\d,]*(?:\.\d+)?))?"
                          r"(x(?=[\s).,;:])|\s?(?:×|%|[KMG]B/s|samples/s|images/s|files/s))")


def test_figures_in_the_package_code_and_comments_come_from_committed_results():
    """A speed figure (x, %, samples/s, images/s, files/s, MB/s, GB/s) in the package's code and comments
    appears in some committed results file, or is in EXEMPT. Small whole numbers (below 100) match too
    much to be checked, so they need EXEMPT."""
    results = ROOT / "benchmarks" / "results"
    corpus = "\n".join(p.read_text(encoding="utf-8") for p in results.iterdir() if p.suffix in (".json", ".md"))

    def in_results(number: str) -> bool:
        if "." not in number and int(number.replace(",", "")) < 100:
            return False
        return re.search(rf"(?<![\d.,]){re.escape(number)}(?!\d)", corpus) is not None

    files = [ROOT / "pyproject.toml", *sorted((ROOT / "fastdata").rglob("*.py")), *sorted((ROOT / "converters").rglob("*.py"))]
    unsupported = []
    for f in files:
        rel = f.relative_to(ROOT).as_posix()
        for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            for m in _UNIT_FIGURE.finditer(line):
                figure = m.group(0).strip()
                if figure in _exempt(rel):
                    continue
                if not all(in_results(x) for x in m.groups()[:2] if x):
                    unsupported.append(f"{rel}:{n}: {figure}")
    assert unsupported == []
