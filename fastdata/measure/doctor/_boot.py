"""``python -m fastdata.measure.doctor._boot SCRIPT ARGS...`` (or ``-m MODULE``): the doctor's child process,
which runs the script under the hooks until the budget is spent, then writes what it measured.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from pathlib import Path

from fastdata.measure.doctor import _probe


def main(argv: list[str]) -> int:
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
        raw = rec.dump()
        (out / "raw.json").write_text(json.dumps(raw))
    if cfg["project"] and error is None:
        from fastdata.measure.doctor.project import project_loader

        result = project_loader(rec, out, rec.sampled)  # the sample the replay used, if it made one
        (out / "project.json").write_text(json.dumps(result))
    elif rec.sampled is not None and not isinstance(rec.sampled, str):
        rec.sampled.remove()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
