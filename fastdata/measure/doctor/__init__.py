"""``fastdata doctor``: is a training script input-bound, why, and what would fastdata change? Measured.

``run(["python", "train.py", ...])`` runs the script unchanged in a child process under the hooks for a
bounded budget; ``watch()`` measures the loops of this process. Both give the report (docs/doctor.md).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from fastdata.errors import UsageError
from fastdata.measure.doctor import _probe
from fastdata.measure.doctor.html import page
from fastdata.measure.doctor.report import analyse, render

__all__ = ["Watch", "run", "watch"]


def _interpreter(command: Sequence[str]) -> tuple[str, list[str]]:
    if not command:
        raise UsageError("fastdata doctor: give the command to run after --, e.g. -- python train.py ARGS")
    if re.search(r"python[\d.]*(\.exe)?$", os.path.basename(command[0])) and list(command[1:]) not in ([], ["-m"]):
        return command[0], list(command[1:])
    if command[0].endswith(".py"):
        return sys.executable, list(command)
    raise UsageError(f"fastdata doctor runs Python training scripts: give 'python SCRIPT ARGS' or "
                     f"'python -m MODULE ARGS', not {' '.join(command)!r}")


def run(command: Sequence[str], *, steps: int | None = None, seconds: float | None = 60.0,
        json_path: str | os.PathLike[str] | None = None, html_path: str | os.PathLike[str] | None = None,
        replay: bool = True, project: bool = True, quiet: bool = False) -> dict[str, Any]:
    """Run ``command`` (``python train.py ARGS``) under the doctor for ``steps`` batches, or within about
    ``seconds`` in all (start to verdict); print the report (unless ``quiet``), write the JSON/HTML files,
    return it."""
    if steps is not None and steps < 1:
        raise UsageError("--steps must be at least 1")
    if seconds is not None and seconds <= 0:
        raise UsageError("--seconds must be positive")
    python, rest = _interpreter(command)
    if rest and rest[0] not in ("-m",) and not Path(rest[0]).is_file():
        raise UsageError(f"{rest[0]}: no such script")
    with tempfile.TemporaryDirectory(prefix="fastdata-doctor-") as tmp:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[3])  # the folder holding fastdata/
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env[_probe.ENV] = json.dumps({"dir": tmp, "steps": steps, "seconds": None if steps else seconds,
                                      "replay": replay, "project": project, "start": time.time()})
        proc = subprocess.run([python, "-m", "fastdata.measure.doctor._boot", *rest], env=env)
        if not (Path(tmp) / "raw.json").exists():
            raise UsageError(f"the script stopped before the doctor could record anything (exit code "
                             f"{proc.returncode}); run it alone to see why")
        report = analyse(Path(tmp), list(command))
    report["exit_code"] = proc.returncode
    return _emit(report, json_path, html_path, quiet)


def _emit(report: dict[str, Any], json_path: Any, html_path: Any, quiet: bool) -> dict[str, Any]:
    text = render(report)
    if not quiet:
        print(text, end="")
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=1) + "\n")
    if html_path:
        Path(html_path).write_text(page(report, text))
    return report


@dataclass
class Watch:
    """Filled in when the ``watch()`` block ends: ``report`` is the dict ``fastdata doctor --json`` writes."""

    report: dict[str, Any] = field(default_factory=dict)


@contextmanager
def watch(json_path: str | os.PathLike[str] | None = None, html_path: str | os.PathLike[str] | None = None, *,
          project: bool = True, quiet: bool = False) -> Iterator[Watch]:
    """Measure every loader iterated inside the block (this process and the workers it forks); at the
    end print the report and, with ``project``, time fastdata.loader on a sample of the dataset."""
    result = Watch()
    with tempfile.TemporaryDirectory(prefix="fastdata-doctor-") as tmp:
        rec = _probe.install(Path(tmp), replay=False)
        try:
            yield result
        finally:
            _probe.uninstall()
            (Path(tmp) / "raw.json").write_text(json.dumps(rec.dump()))
        if project:
            from fastdata.measure.doctor.project import project_loader

            (Path(tmp) / "project.json").write_text(json.dumps(project_loader(rec, Path(tmp))))
        result.report = _emit(analyse(Path(tmp), ["<watch>"]), json_path, html_path, quiet)
