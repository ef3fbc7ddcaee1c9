"""Issue 48: progress that a user sees: no blank lines on a terminal that reports 0 columns, and a
plain line every few seconds where the output is not a terminal (a log file)."""

from __future__ import annotations

import os
import pty
import re
import select
import sys

import numpy as np

from fastdata.cli import Bar


def _read_all(fd: int) -> str:
    out = b""
    while select.select([fd], [], [], 0.2)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out.decode(errors="replace")


def test_a_terminal_of_zero_columns_still_shows_the_count(monkeypatch):
    master, slave = pty.openpty()  # a new pseudo-terminal reports 0 columns, 0 rows
    assert os.get_terminal_size(slave).columns == 0
    with os.fdopen(slave, "w", closefd=True) as tty:
        monkeypatch.setattr(sys, "stderr", tty)
        bar = Bar(enabled=True)
        bar.start(10, 1000, desc="converting")
        bar.update(10, 1000)
        bar.close()
        tty.flush()
        text = _read_all(master)
    os.close(master)
    lines = [ln for ln in re.split(r"[\r\n]+", text) if ln.strip()]
    assert lines and "10/10" in lines[-1] and "converting" in lines[-1]


def test_convert_into_a_log_file_says_how_far_it_got(tmp_path, run_cli, monkeypatch):
    monkeypatch.setattr(Bar, "PLAIN_EVERY", 0.0)  # a line on every update, not every few seconds
    src = tmp_path / "src"
    for c in ("a", "b"):
        (src / c).mkdir(parents=True)
    for i in range(6):
        np.save(src / "ab"[i % 2] / f"{i}.npy", np.zeros(4, np.float32))
    code, out, err = run_cli("convert", src, tmp_path / "ds")  # stderr is no terminal here
    assert code == 0, err
    lines = [ln for ln in err.splitlines() if re.match(r"\w[\w ]*: \d+/6 samples \(\d+%\), \d+ samples/s", ln)]
    assert lines and lines[-1].startswith("converting: 6/6 samples (100%)"), err
    code, _, err = run_cli("verify", tmp_path / "ds")
    assert code == 0 and re.search(r": 6/6 samples \(100%\)", err), err
    code, _, err = run_cli("convert", src, tmp_path / "ds2", "--quiet")
    assert code == 0 and err == ""


def test_index_says_how_far_it_got(tmp_path, run_cli, monkeypatch):
    monkeypatch.setattr(Bar, "PLAIN_EVERY", 0.0)
    np.save(tmp_path / "x.npy", np.zeros((8, 3), np.float32))
    code, _, err = run_cli("index", tmp_path / "x.npy", tmp_path / "idx", "--checksum")
    assert code == 0, err
    assert re.search(r"^indexing: 1/1 files \(100%\)", err, re.M) and re.search(r"^checksumming: 1/1 files", err, re.M), err
