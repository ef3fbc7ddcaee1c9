"""Regenerate constraints-dev.txt, the locked versions of everything the ``dev`` extra installs.

Usage, from the repository root: ``python .ci/lock.py``. It makes a new virtual environment in a
temporary folder, installs ``torch==2.13.0 -e ".[dev]"`` there without constraints (so pip picks what
a fresh machine gets today), and writes ``pip freeze`` of it. Commit the result after the suite passes
with it (``bash .ci/run``).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "constraints-dev.txt"
HEADER = """\
# Locked test environment: every package that `pip install torch==2.13.0 -e ".[dev]"` brings in.
# Used by the README's test command and by .ci/run (pip ... -c constraints-dev.txt).
# Regenerate with: python .ci/lock.py   (tests/test_cli.py checks every dev requirement is pinned here)
"""


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="fastdata-lock-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        py = str(venv / "bin" / "python")
        subprocess.run([py, "-m", "pip", "install", "-q", "torch==2.13.0", "-e", ".[dev]"], cwd=ROOT, check=True)
        frozen = subprocess.run([py, "-m", "pip", "freeze", "--all", "--exclude-editable", "--exclude", "pip"],
                                check=True, capture_output=True, text=True).stdout  # --all: setuptools, wheel too
    # A local version label (torch's "+cpu") is dropped: "==2.13.0" matches 2.13.0+cpu, as the README pins it.
    lines = sorted({re.sub(r"\+[\w.]+$", "", line.strip()) for line in frozen.splitlines()
                    if "==" in line and not line.startswith("#")}, key=str.lower)
    OUT.write_text(HEADER + "\n".join(lines) + "\n")
    print(f"wrote {OUT.name}: {len(lines)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
