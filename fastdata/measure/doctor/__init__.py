"""``fastdata doctor``: is a training script input-bound, why, and what would fastdata change? Measured.
``run()`` runs a script unchanged in a child process for a bounded budget; ``watch()`` this process's loops."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from fastdata.errors import UsageError
from fastdata.measure.doctor import _probe
from fastdata.measure.doctor.project import project_loader
from fastdata.measure.doctor.report import analyse, page, render

__all__ = ["Watch", "run", "watch"]

_CHILD = "import sys; from fastdata.measure.doctor import _child; sys.exit(_child(sys.argv[1:]))"


def run(command: Sequence[str], *, steps: int | None = None, seconds: float | None = 60.0,
        json_path: str | os.PathLike[str] | None = None, html_path: str | os.PathLike[str] | None = None,
        replay: bool = True, project: bool = True, quiet: bool = False) -> dict[str, Any]:
    """Run ``command`` (``python train.py ARGS``) under the doctor for ``steps`` batches, or about ``seconds`` in all;
    print the report (unless ``quiet``), write the JSON/HTML files, and return it."""
    if steps is not None and steps < 1:
        raise UsageError("--steps must be at least 1")
    if seconds is not None and seconds <= 0:
        raise UsageError("--seconds must be positive")
    if not command:
        raise UsageError("fastdata doctor: give the command to run after --, e.g. -- python train.py ARGS")
    if re.search(r"python[\d.]*(\.exe)?$", os.path.basename(command[0])) and list(command[1:]) not in ([], ["-m"]):
        python, rest = command[0], list(command[1:])
    elif command[0].endswith(".py"):
        python, rest = sys.executable, list(command)
    else:
        raise UsageError(f"fastdata doctor runs Python training scripts: give 'python SCRIPT ARGS' or "
                         f"'python -m MODULE ARGS', not {' '.join(command)!r}")
    if rest and rest[0] != "-m" and not Path(rest[0]).is_file():
        raise UsageError(f"{rest[0]}: no such script")
    with tempfile.TemporaryDirectory(prefix="fastdata-doctor-") as tmp:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[3])  # the folder holding fastdata/
        env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env[_probe.ENV] = json.dumps({"dir": tmp, "steps": steps, "seconds": None if steps else seconds,
                                      "replay": replay, "project": project, "start": time.time()})
        proc = subprocess.run([python, "-c", _CHILD, *rest], env=env)
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
        _write(rec, Path(tmp), project)
        result.report = _emit(analyse(Path(tmp), ["<watch>"]), json_path, html_path, quiet)


def _child(argv: list[str]) -> int:
    """The doctor's child process (:data:`_CHILD`): runs ``SCRIPT ARGS`` (or ``-m MODULE ARGS``) under the hooks
    until the budget is spent, then writes what it measured."""
    cfg = json.loads(os.environ[_probe.ENV])
    out = Path(cfg["dir"])
    rec = _probe.install(out, steps=cfg["steps"], seconds=cfg["seconds"], replay=cfg["replay"],
                         project=cfg["project"], start=cfg["start"])
    code, error = 0, None
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
    except _probe.BudgetReached:
        pass
    except SystemExit as e:  # the script's own exit
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        rec.stop_reason = f"script exited ({code})"
    except BaseException as e:  # the script failed: say so in the report, and exit as it would have
        error = "".join(traceback.format_exception_only(type(e), e)).strip()
        traceback.print_exc()
        rec.stop_reason, code = f"script failed: {error}", 1
    finally:
        _probe.uninstall()
    _write(rec, out, cfg["project"] and error is None)
    return code


def _write(rec: _probe.Recorder, out: Path, project: bool) -> None:
    """What ``rec`` measured (raw.json) and, with ``project``, fastdata.loader timed on a sample of the dataset
    (project.json: the sample the replay used, if it made one)."""
    (out / "raw.json").write_text(json.dumps(rec.dump()))
    if project:
        (out / "project.json").write_text(json.dumps(project_loader(rec, out, rec.sampled)))
    elif rec.sampled is not None and not isinstance(rec.sampled, str):
        rec.sampled.remove()
