"""``python -m fastdata.measure.doctor._boot SCRIPT ARGS...`` (or ``-m MODULE ARGS...``): the doctor's child process.

Installs the hooks (fastdata.measure.doctor._probe), runs the user's script unchanged as ``__main__`` until it
ends or the budget is spent, then writes what it measured into $FASTDATA_DOCTOR_DIR and, unless told
not to, measures the fastdata loader on a sample of the dataset (fastdata.measure.doctor.project).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from pathlib import Path

from fastdata.measure.doctor._probe import ENV_DIR, ENV_PROJECT, ENV_REPLAY, ENV_SECONDS, ENV_STEPS


def _number(name: str, kind: type) -> float | int | None:
    text = os.environ.get(name)
    return kind(text) if text else None


def main(argv: list[str]) -> int:
    from fastdata.measure.doctor import _probe

    if not argv or (argv[0] == "-m" and len(argv) < 2):
        print("usage: python -m fastdata.measure.doctor._boot SCRIPT [ARGS...] | -m MODULE [ARGS...]", file=sys.stderr)
        return 2
    out = Path(os.environ[ENV_DIR])
    steps, seconds = _number(ENV_STEPS, int), _number(ENV_SECONDS, float)
    project = os.environ.get(ENV_PROJECT, "1") == "1"
    rec = _probe.install(out, steps=int(steps) if steps else None, seconds=seconds,
                         replay=os.environ.get(ENV_REPLAY, "1") == "1", project=project)
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
        raw = rec.dump()
        (out / "raw.json").write_text(json.dumps(raw))
    if project and error is None:
        from fastdata.measure.doctor.project import project_loader

        result = project_loader(rec, out, rec.sampled)  # the sample the replay used, if it made one
        (out / "project.json").write_text(json.dumps(result))
    elif rec.sampled is not None and not isinstance(rec.sampled, str):
        rec.sampled.remove()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
