"""The fastdata command: info, demo, exit codes of the real process, README and CI agreeing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def test_info_describes_the_dataset(tmp_path, class_folder, run_cli):
    src, _ = class_folder
    assert run_cli("convert", src, tmp_path / "ds", "--shard-size", "2KB")[0] == 0
    code, out, _ = run_cli("info", tmp_path / "ds")
    assert code == 0
    assert "samples   12" in out and "hdf5" in out
    assert "x            float32   (2, 6, 3, 3)" in out
    assert "classes   3: 0=cat, 1=dog, 2=eel" in out
    assert "shard-00000.h5  samples 0..3" in out and "shard-00002.h5  samples 8..11" in out
    code, out, _ = run_cli("info", tmp_path / "ds", "--json")
    assert code == 0 and '"num_samples": 12' in out


def test_info_on_incomplete_dataset(tmp_path, run_cli):
    (tmp_path / "half").mkdir()
    code, _, err = run_cli("info", tmp_path / "half")
    assert code == 1 and "an empty folder, not a fastdata dataset" in err and "--resume" not in err
    (tmp_path / "half" / ".fastdata-journal").write_text("{}\n")  # an interrupted conversion: resumable
    code, _, err = run_cli("info", tmp_path / "half")
    assert code == 1 and "incomplete dataset" in err and "--resume" in err and "Traceback" not in err


def test_convert_prints_one_summary_line(tmp_path, class_folder, run_cli):
    src, _ = class_folder
    code, out, err = run_cli("convert", src, tmp_path / "ds", "--format", "lmdb", "--quiet")
    assert code == 0
    assert out.count("\n") == 1
    assert "12 samples -> 1 lmdb shard(s)" in out and ("MB/s" in out or "KB/s" in out)


def test_real_process_exit_codes(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    np.save(src / "a.npy", np.zeros(3))
    (src / "b.npy").write_bytes(b"junk")

    def run(*args):
        return subprocess.run([sys.executable, "-m", "fastdata", *map(str, args)], capture_output=True, text=True)

    r = run("convert", src, tmp_path / "ds")
    assert r.returncode == 1 and "b.npy" in r.stderr and "Traceback" not in r.stderr
    r = run("convert", tmp_path / "missing", tmp_path / "ds")
    assert r.returncode == 2
    r = run("convert", src, tmp_path / "ds", "--skip-bad")
    assert r.returncode == 0 and "skipped 1 bad file(s)" in r.stdout
    r = run("--debug", "convert", src, tmp_path / "ds")
    assert r.returncode != 0 and "Traceback" in r.stderr and "UsageError" in r.stderr


def test_demo_runs_end_to_end(tmp_path, run_cli):
    code, out, err = run_cli("demo", "--samples", "24", "--dir", tmp_path / "demo")
    assert code == 0, err
    assert out.count("bit-identical") == 2
    assert "naive np.load per file" in out and "lmdb get_batch" in out


def test_readme_and_ci_run_the_same_test_command():
    readme = (ROOT / "README.md").read_text().splitlines()
    ci = (ROOT / ".ci" / "run").read_text()
    commands = [line.strip() for line in readme[:20] if line.startswith("    python -m pip install")]
    assert len(commands) == 2, "README's first lines give the two commands"
    assert "torch==2.13.0" in commands[0] and "torch==2.13.0" in commands[1]
    assert commands[1] in ci
    assert "-c constraints-dev.txt" in commands[1], "the test command installs the locked versions"
    assert "python3 -m venv" in ci and "mktemp" in ci, ".ci/run makes a new virtual environment for every run"


def test_every_dev_requirement_is_pinned_in_the_lock():
    """constraints-dev.txt pins each package of the dev extra (and torch) to one version that the extra allows."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins: dict[str, str] = {}
    for line in (ROOT / "constraints-dev.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version and ";" not in version, f"not an exact pin: {line!r}"
            pins[canonicalize_name(name)] = version.strip()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["optional-dependencies"]["dev"] + project["dependencies"]]
    unpinned = [str(r) for r in wanted if canonicalize_name(r.name) not in pins]
    assert not unpinned, f"not in constraints-dev.txt (run: python .ci/lock.py): {unpinned}"
    outside = [f"{r} (locked {pins[canonicalize_name(r.name)]})" for r in wanted
               if not r.specifier.contains(pins[canonicalize_name(r.name)], prereleases=True)]
    assert not outside, f"locked versions outside pyproject's ranges: {outside}"
    assert pins["torch"] == "2.13.0"


def test_convert_and_index_parse_name_path_alike(tmp_path, run_cli):
    """--field NAME=PATH of convert and index: one parser, one error line quoting the argument and what is
    expected; a field named twice is refused by both (convert used to keep the last one silently)."""
    (tmp_path / "src").mkdir()
    cases = [("x", "no '=PATH'"), ("=a", "no NAME before '='"), ("x=", "no PATH after '='")]
    for command, example in (("convert", "e.g. label=labels.npy"), ("index", "e.g. x=/images")):
        for args, problem in [*cases, ("x=a --field x=b", "field 'x' is already given (x=a)")]:
            if command == "index" and args == "x":
                continue  # index takes a bare NAME: the field is SRC itself
            code, out, err = run_cli(command, tmp_path / "src", tmp_path / "dst", "--field", *args.split())
            last = err.strip().splitlines()[-1]
            assert code == 2 and out == "" and "Traceback" not in err, (command, args, err)
            assert last.startswith(f"fastdata {command}: error: argument --field: '{args.split()[-1]}': {problem}; "
                                   "expected NAME=PATH"), (command, last)
            assert example in last and not (tmp_path / "dst").exists()


def test_name_path_fields_reach_the_commands_as_a_dict():
    from fastdata.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["index", "s", "d", "--field", "x=/a=b", "--field", "y"])
    assert args.fields == {"x": "/a=b", "y": ""}  # the first '=' splits; a bare NAME is SRC itself
    assert parser.parse_args(["index", "s", "d"]).fields is None
    args = parser.parse_args(["convert", "s", "d", "--field", "x=X.npy", "--field", "label=/labels"])
    assert args.field == {"x": "X.npy", "label": "/labels"}
