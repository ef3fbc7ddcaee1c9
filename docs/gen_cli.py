"""Write docs/cli.md from the CLI's own --help texts (tests/test_docs.py checks it is current).

Usage: python docs/gen_cli.py
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "cli.md"


def render() -> str:
    from fastdata.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal width: fix it

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parts = [
        "# CLI reference",
        "",
        "Generated from `fastdata --help` by `python docs/gen_cli.py`; do not edit by hand.",
        "Exit codes: 0 success, 1 data or dataset error, 2 usage error. `fastdata --debug COMMAND` shows tracebacks.",
        "",
        "```text",
        parser.format_help().rstrip().replace(" ...", "").rstrip(),
        "```",
    ]
    for name, p in sub.choices.items():
        parts += ["", f"## fastdata {name}", "", "```text", p.format_help().rstrip(), "```"]
    return "\n".join(parts) + "\n"


def main() -> int:
    OUT.write_text(render(), encoding="utf-8")
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
