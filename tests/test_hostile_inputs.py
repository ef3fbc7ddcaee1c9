"""Hostile input to what was added since the first hostile-input tests: metadata tables, URLs,
sampler and split arguments, --meta-type, merge and merge-parts. Each gets one error line naming
the file, row and column (or the argument), exit code 1 (bad data) or 2 (usage), and no manifest."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

import fastdata
from fastdata.errors import FastdataError, UsageError
from fastdata.reading.samplers import Episodic, Weighted

QUICK = settings(max_examples=25, deadline=None, database=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
ARGS = ("--quiet", "--workers", "1")


def refused(run_cli, *args: object, code: int, words: tuple[str, ...] = (), dst: Path | None = None) -> str:
    """Run the CLI; check the exit code, one error line holding ``words``, no traceback, no manifest."""
    got, _, err = run_cli(*args)
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert got == code, err
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    if dst is not None:
        assert not (dst / "manifest.json").exists()
    return lines[0]


def one_line(e: pytest.ExceptionInfo[BaseException], *words: str) -> None:
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


# --- metadata tables ---------------------------------------------------------------------------


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """Four .npy samples directly in SRC (no class folders), and masks outside SRC."""
    root = tmp_path / "src"
    root.mkdir()
    (tmp_path / "masks").mkdir()
    for i in range(4):
        np.save(root / f"s{i}.npy", np.full((3,), i, np.float32))
        Image.fromarray(np.full((4, 4), i, np.uint8)).save(tmp_path / "masks" / f"m{i}.png")
    return root


def corrupt_files(src: Path, rows: range = range(4)) -> None:
    """``in/bad{i}.png`` and ``in/bad{i}.npy`` under SRC: a file signature, then junk."""
    (src / "in").mkdir(exist_ok=True)
    for i in rows:
        (src / "in" / f"bad{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
        (src / "in" / f"bad{i}.npy").write_bytes(b"\x93NUMPY\x01\x00junk")


def _csv(*cols: str, rows: list[tuple[object, ...]]) -> str:
    return ",".join(("path",) + cols) + "\n" + "".join(
        ",".join([f"s{i}.npy"] + [str(c) for c in r]) + "\n" for i, r in enumerate(rows))


BAD_TABLES = [  # (name, table text, extra args, exit code, words in the error line)
    ("file column: every path outside SRC", _csv("mask", rows=[(f"../masks/m{i}.png",) for i in range(4)]), (),
     1, ("meta.csv: row 1 (line 2), column 'mask'", "leads out of", "3 more bad")),
    ("file column: every file missing", _csv("mask", rows=[(f"in/none{i}.png",) for i in range(4)]), (),
     1, ("row 1 (line 2), column 'mask'", "not found")),
    ("file column: every image corrupt", _csv("mask", rows=[(f"in/bad{i}.png",) for i in range(4)]), (),
     1, ("row 1 (line 2), column 'mask'", "bad0.png")),
    ("file column: every .npy corrupt", _csv("arr", rows=[(f"in/bad{i}.npy",) for i in range(4)]), (),
     1, ("row 1 (line 2), column 'arr'", "bad0.npy")),
    ("empty table", "", (), 1, ("meta.csv", "empty table")),
    ("header only", "path,a\n", (), 1, ("meta.csv", "no rows")),
    ("no path column", "a,b\n1,2\n", (), 1, ("meta.csv", "no 'path' column")),
    ("short row", "path,a\ns0.npy\n", (), 1, ("meta.csv: row 1 (line 2)", "1 cells, the header has 2")),
    ("duplicate header", "path,a,a\ns0.npy,1,2\n", (), 1, ("duplicate column names",)),
    ("column name not a field name", _csv("1abc", rows=[(i,) for i in range(4)]), (), 1, ("'1abc'", "rename")),
    ("column clashes with a field", _csv("x", rows=[(i,) for i in range(4)]), (), 1, ("'x'", "clashes")),
    ("int column, one text cell", _csv("n", rows=[(1,), (2,), (3,), ("abc",)]), (),
     1, ("row 4 (line 5), column 'n'", "'abc' is not an integer")),
    ("int too big for int64", _csv("n", rows=[(1,), (2,), (3,), (10**20,)]), (),
     1, ("row 4 (line 5), column 'n'", "does not fit")),
    ("float too big for float32", _csv("f", rows=[(0.5,), (1e300,), (2.5,), (3.5,)]), (),
     1, ("row 2 (line 3), column 'f'", "does not fit float32")),
    ("forced ragged, wrong row width", _csv("box", rows=[('"[[1, 2], [3, 4]]"',)] * 3 + [('"[[1, 2, 3]]"',)]),
     ("--meta-type", "box=float32:n,2"), 1, ("row 4 (line 5), column 'box'", "rows of the column are [2]")),
    ("forced int list, a fraction", _csv("v", rows=[('"[1, 2]"',)] * 3 + [('"[1, 2.5]"',)]),
     ("--meta-type", "v=int32:2"), 1, ("row 4 (line 5), column 'v'", "non-integers")),
    ("list column, unequal nested lists", _csv("kp", rows=[('"[[1, 2], [3, 4]]"',)] * 3 + [('"[[1, 2], [3]]"',)]),
     (), 1, ("row 4 (line 5), column 'kp'", "unequal lengths")),
    ("list column of words", _csv("kp", rows=[('"[1, 2]"',)] * 3 + [('"[""a"", ""b""]"',)]), (),
     1, ("row 4 (line 5), column 'kp'", "non-numbers")),
    ("forced bool, not a bool", _csv("flag", rows=[("true",), ("false",), ("maybe",), ("true",)]),
     ("--meta-type", "flag=bool"), 1, ("row 3 (line 4), column 'flag'", "not true/false")),
    ("forced shape, wrong size", _csv("kp", rows=[('"[1, 2, 3, 4]"',)] * 3 + [('"[1, 2, 3]"',)]),
     ("--meta-type", "kp=float32:2,2"), 1, ("row 4 (line 5), column 'kp'", "needs 4")),
    ("forced int8, too big", _csv("n", rows=[(1,), (300,), (3,), (4,)]), ("--meta-type", "n=int8"),
     1, ("row 2 (line 3), column 'n'", "does not fit int8")),
    ("huge CSV cell", _csv("note", rows=[("x" * 200_000,)] + [("y",)] * 3), (),
     1, ("meta.csv", "line 2", "JSON Lines or Parquet")),
    ("--meta-type names no column", _csv("n", rows=[(i,) for i in range(4)]), ("--meta-type", "m=int32"),
     2, ("--meta-type names 'm'", "not a column")),
    ("--meta-type malformed", _csv("n", rows=[(i,) for i in range(4)]), ("--meta-type", "n=int33"),
     2, ("--meta-type 'n=int33'", "expected NAME=DTYPE")),
    ("--meta-type str with a shape", _csv("n", rows=[(i,) for i in range(4)]), ("--meta-type", "n=str:3"),
     2, ("a str column has no shape",)),
    ("--meta-type bad shape", _csv("n", rows=[(i,) for i in range(4)]), ("--meta-type", "n=int32:2,x"),
     2, ("bad shape '2,x'",)),
    ("--labels with a table", _csv("n", rows=[(i,) for i in range(4)]), ("--labels", "meta.csv"),
     2, ("--labels does not apply with a metadata table",)),
]


@pytest.mark.parametrize("name,text,extra,code,words", BAD_TABLES, ids=[t[0] for t in BAD_TABLES])
def test_bad_csv_table(src, tmp_path, run_cli, monkeypatch, name, text, extra, code, words):
    (tmp_path / "meta.csv").write_text(text)
    if "in/bad" in text:
        corrupt_files(src)
    monkeypatch.chdir(tmp_path)  # the table named relatively, as a user types it
    refused(run_cli, "convert", src, tmp_path / "ds", "--meta", "meta.csv", *ARGS, *extra,
            code=code, words=words, dst=tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_every_row_bad_with_skip_bad_says_no_usable_rows(src, tmp_path, run_cli):
    (tmp_path / "meta.csv").write_text(_csv("mask", rows=[(f"../masks/m{i}.png",) for i in range(4)]))
    refused(run_cli, "convert", src, tmp_path / "ds", "--meta", tmp_path / "meta.csv", "--skip-bad", *ARGS,
            code=1, words=("meta.csv", "no usable rows (all 4 are bad)"), dst=tmp_path / "ds")


def test_one_bad_file_cell_is_skipped_with_skip_bad(src, tmp_path, run_cli):
    corrupt_files(src, range(3, 4))
    (src / "in" / "bad3.png").unlink()
    for i in range(3):
        np.save(src / "in" / f"ok{i}.npy", np.zeros((2, 2), np.float32))
    (tmp_path / "meta.csv").write_text(_csv("arr", rows=[(f"in/ok{i}.npy",) for i in range(3)] + [("in/bad3.npy",)]))
    code, out, err = run_cli("convert", src, tmp_path / "ds", "--meta", tmp_path / "meta.csv", "--skip-bad", *ARGS)
    assert code == 0, err
    assert len(fastdata.open(tmp_path / "ds")) == 3 and "skipped 1 bad file(s)" in out


def test_rows_are_named_by_the_line_they_start_on(src, tmp_path, run_cli):
    """A quoted cell spanning lines and a blank line: the error names the row and its real line."""
    text = 'path,note,n\ns0.npy,"two\nlines",1\n\ns1.npy,x,2\ns2.npy,y,zz\ns3.npy,z,4\n'
    (tmp_path / "meta.csv").write_text(text)
    refused(run_cli, "convert", src, tmp_path / "ds", "--meta", tmp_path / "meta.csv", *ARGS, code=1,
            words=("row 3 (line 6), column 'n'", "'zz' is not an integer"), dst=tmp_path / "ds")
    (tmp_path / "meta.csv").write_text(text.replace("zz", "3"))
    code, _, err = run_cli("convert", src, tmp_path / "ds", "--meta", tmp_path / "meta.csv", *ARGS)
    assert code == 0, err
    assert fastdata.open(tmp_path / "ds").get_batch([0])["note"] == ["two\nlines"]  # the newline kept


def test_a_table_of_paths_alone_converts(src, tmp_path):
    (tmp_path / "meta.csv").write_text("path\n" + "".join(f"s{i}.npy\n" for i in range(4)))
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)), meta=tmp_path / "meta.csv")
    assert [f.name for f in fastdata.open(tmp_path / "ds").manifest.fields] == ["x"]


JSONL_BAD = [
    ("not JSON", '{"path": "s0.npy"}\n{oops\n', ("meta.jsonl: line 2", "not JSON")),
    ("not an object", '{"path": "s0.npy"}\n[1, 2]\n', ("meta.jsonl: line 2", "JSON object")),
    ("path not a string", '\n{"path": 5, "a": 1}\n', ("meta.jsonl: row 1 (line 2), column 'path'", "5 is not a path")),
]


@pytest.mark.parametrize("name,text,words", JSONL_BAD, ids=[t[0] for t in JSONL_BAD])
def test_bad_jsonl_table(src, tmp_path, run_cli, name, text, words):
    (tmp_path / "meta.jsonl").write_text(text)
    refused(run_cli, "convert", src, tmp_path / "ds", "--meta", tmp_path / "meta.jsonl", *ARGS,
            code=1, words=words, dst=tmp_path / "ds")


def test_huge_cells_in_json_lines_convert(src, tmp_path):
    """A 1 MB text cell and a 100,000-number list are data, not an attack: they convert and read back."""
    rows = [{"path": f"s{i}.npy", "note": "é" * (1 << 19) if i == 0 else "x", "v": list(range(100_000))}
            for i in range(4)]
    (tmp_path / "meta.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)), meta=tmp_path / "meta.jsonl")
    b = fastdata.open(tmp_path / "ds").get_batch([0])
    assert len(b["note"][0]) == 1 << 19 and b["v"].shape == (1, 100_000)


pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

PARQUET_BAD = [
    ("not Parquet", None, 1, ("meta.parquet", "unreadable Parquet table")),
    ("no rows", {"path": pa.array([], pa.string()), "a": pa.array([], pa.int64())}, 1, ("no rows",)),
    ("path column of numbers", {"path": [1, 2, 3, 4]}, 1, ("row 1, column 'path'", "1 is not a path")),
    ("file column: every path outside SRC", {"path": [f"s{i}.npy" for i in range(4)],
                                            "mask": [f"../masks/m{i}.png" for i in range(4)]},
     1, ("meta.parquet: row 1, column 'mask'", "leads out of")),
    ("struct column", {"path": [f"s{i}.npy" for i in range(4)], "s": [{"a": i} for i in range(4)]},
     1, ("row 1, column 's'",)),
    ("list column with a null inside", {"path": [f"s{i}.npy" for i in range(4)],
                                       "kp": [[1.0, 2.0], [1.0, None], [3.0, 4.0], [5.0, 6.0]]},
     1, ("row 2, column 'kp'",)),
]


@pytest.mark.parametrize("name,cols,code,words", PARQUET_BAD, ids=[t[0] for t in PARQUET_BAD])
def test_bad_parquet_table(src, tmp_path, run_cli, name, cols, code, words):
    path = tmp_path / "meta.parquet"
    if cols is None:
        path.write_bytes(b"PAR1" + b"\0" * 64)
    else:
        pq.write_table(pa.table(cols), path)
    refused(run_cli, "convert", src, tmp_path / "ds", "--meta", path, *ARGS, code=code, words=words,
            dst=tmp_path / "ds")


@given(cells=st.lists(st.lists(st.one_of(
    st.text(alphabet=st.sampled_from('ab1.-e",[] \\\n\té'), max_size=12),
    st.integers(-(2**70), 2**70).map(str), st.floats().map(str),
    st.sampled_from(["true", "[1, 2]", "[[1], [2, 3]]", "in/bad0.png", "../x.npy", "s1.npy", "", "nan"])),
    min_size=2, max_size=2), min_size=4, max_size=4))
@QUICK
def test_fuzzed_csv_cells_convert_or_fail_cleanly(src, tmp_path, cells):
    """Any cells: a finished dataset, or a typed one-line error and no manifest."""
    import csv
    import io
    import shutil

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["path", "a", "b"])
    for i, row in enumerate(cells):
        w.writerow([f"s{i}.npy", *row])
    (tmp_path / "meta.csv").write_text(buf.getvalue())
    dst = tmp_path / "fuzz-ds"
    shutil.rmtree(dst, ignore_errors=True)
    try:
        fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1), skip_bad=True), meta=tmp_path / "meta.csv")
    except FastdataError as e:
        assert "\n" not in str(e) and not (dst / "manifest.json").exists()
    else:
        assert len(fastdata.open(dst)) >= 1


@given(text=st.text(max_size=30))
@settings(max_examples=200, deadline=None, database=None, derandomize=True)
def test_fuzzed_meta_type_parses_or_is_a_usage_error(text):
    try:
        name, t = fastdata.converters.parse_meta_type(text)
    except UsageError as e:
        assert "\n" not in str(e) and "--meta-type" in str(e)
    else:
        assert name and (t.shape is None or all(d is None or d >= 0 for d in t.shape))


# --- class folders with a table (item 7) ---------------------------------------------------------


@pytest.fixture
def faces(tmp_path: Path) -> Path:
    root = tmp_path / "faces"
    rows = ["path,angles"]
    for c in ("frontal", "profile"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((6, 6, 3), i * 40, np.uint8)).save(root / c / f"{i}.png")
            rows.append(f'{c}/{i}.png,"[{i}, {i + 1}]"')
    (tmp_path / "angles.csv").write_text("\n".join(rows) + "\n")
    return root


def test_class_folders_still_label_with_a_table(faces, tmp_path, run_cli):
    code, out, err = run_cli("convert", faces, tmp_path / "ds", "--meta", tmp_path / "angles.csv", *ARGS)
    assert code == 0, err
    assert "fields image, image_shape, image_codec, label (2 classes), angles" in out
    ds = fastdata.open(tmp_path / "ds", fields=["label", "angles", "key"])
    assert ds.classes == ["frontal", "profile"]
    assert [f.name for f in ds.manifest.fields] == ["image", "image_shape", "image_codec", "label", "angles"]
    labels = {k: int(v) for k, v in zip(ds.column("key"), ds.column("label"))}
    assert labels == {f"{c}/{i}.png": k for k, c in enumerate(("frontal", "profile")) for i in range(3)}
    seen = np.concatenate([b["label"].numpy() for b in fastdata.loader(ds, 3, sampler=Weighted("balanced"))])
    assert len(seen) == 6 and set(seen.tolist()) <= {0, 1}


def test_no_labels_or_a_label_column_turns_folder_labels_off(faces, tmp_path, run_cli):
    code, out, err = run_cli("convert", faces, tmp_path / "a", "--meta", tmp_path / "angles.csv", "--no-labels", *ARGS)
    assert code == 0 and "fields image, image_shape, image_codec, angles\n" in out and fastdata.open(tmp_path / "a").classes is None, err
    text = (tmp_path / "angles.csv").read_text().splitlines()
    (tmp_path / "own.csv").write_text("\n".join([text[0] + ",label"] + [r + (",up" if "0.png" in r else ",down")
                                                                        for r in text[1:]]) + "\n")
    code, out, err = run_cli("convert", faces, tmp_path / "b", "--meta", tmp_path / "own.csv", *ARGS)
    assert code == 0 and "label (2 classes)" in out, err
    assert fastdata.open(tmp_path / "b").classes == ["down", "up"]  # the table's, not the folders'


def test_one_folder_is_a_layout_not_a_class(faces, tmp_path, run_cli):
    text = (tmp_path / "angles.csv").read_text().replace("frontal/", "profile/f")
    for i in range(3):
        (faces / "frontal" / f"{i}.png").rename(faces / "profile" / f"f{i}.png")
    (tmp_path / "one.csv").write_text(text)
    code, out, err = run_cli("convert", faces, tmp_path / "ds", "--meta", tmp_path / "one.csv", *ARGS)
    assert code == 0 and "fields image, image_shape, image_codec, angles\n" in out, err


def test_a_table_as_src_labels_by_its_class_folders(faces, tmp_path, run_cli):
    (faces / "angles.csv").write_text((tmp_path / "angles.csv").read_text())
    code, out, err = run_cli("convert", faces / "angles.csv", tmp_path / "ds", *ARGS)
    assert code == 0 and "label (2 classes)" in out, err
    assert fastdata.open(tmp_path / "ds").classes == ["frontal", "profile"]


def test_table_paths_both_flat_and_in_folders_are_refused(faces, tmp_path, run_cli):
    Image.fromarray(np.zeros((6, 6, 3), np.uint8)).save(faces / "loose.png")
    with open(tmp_path / "angles.csv", "a") as f:
        f.write('loose.png,"[0, 0]"\n')
    refused(run_cli, "convert", faces, tmp_path / "ds", "--meta", tmp_path / "angles.csv", *ARGS, code=1,
            words=("'loose.png' lies directly in", "--no-labels", "'label' column"), dst=tmp_path / "ds")
    code, _, err = run_cli("convert", faces, tmp_path / "ds", "--meta", tmp_path / "angles.csv", "--no-labels", *ARGS)
    assert code == 0, err


# --- labels files and argument typos -------------------------------------------------------------


def test_npy_labels_for_a_folder_source_say_what_fits(src, tmp_path, run_cli):
    np.save(tmp_path / "y.npy", np.arange(4))
    refused(run_cli, "convert", src, tmp_path / "ds", "--labels", tmp_path / "y.npy", *ARGS, code=2,
            words=("y.npy", "a folder source takes --labels as a CSV of relative_path,label",
                   ".npy of labels goes with a single-array source"), dst=tmp_path / "ds")


def test_a_mistyped_flag_shows_the_subcommands_usage(src, tmp_path, run_cli):
    code, _, err = run_cli("convert", src, tmp_path / "ds", "--shardsize", "1")
    assert code == 2 and err.startswith("usage: fastdata convert") and "--shard-size SIZE" in err
    assert "unrecognized arguments: --shardsize 1 (did you mean --shard-size?)" in err
    code, _, err = run_cli("verify", tmp_path, "--deeep")
    assert code == 2 and err.startswith("usage: fastdata verify") and "did you mean --deep?" in err
    code, _, err = run_cli("--bogus", "info", tmp_path)
    assert code == 2 and err.startswith("usage: fastdata [-h]")


# --- folders that are not datasets: the error names the fix that works ----------------------------


def test_a_source_folder_is_not_taken_for_an_interrupted_conversion(src, tmp_path, run_cli):
    for cmd in ("info", "verify"):
        refused(run_cli, cmd, src, code=1, words=("this is a source folder, not a fastdata dataset",
                                                 f"fastdata convert {src} DST"))
    with pytest.raises(fastdata.errors.FormatError, match="source folder") as e:
        fastdata.open(src)
    assert "--resume" not in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(fastdata.errors.FormatError, match="source folder"):
        fastdata.loader(str(src), 2)
    images = tmp_path / "imgs"
    (images / "cat").mkdir(parents=True)
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(images / "cat" / "a.jpg")
    refused(run_cli, "info", images, code=1, words=("this is a source folder",))
    refused(run_cli, "info", images / "cat" / "a.jpg", code=1, words=("a source file, not a fastdata dataset",))
    refused(run_cli, "info", tmp_path / "nope", code=1, words=("nope: no such folder",))


def test_unmerged_parts_say_merge_parts(src, tmp_path, run_cli):
    for i in range(2):
        code, out, err = run_cli("convert", src, tmp_path / "parts", "--part", f"{i}/2", *ARGS)
        assert code == 0, err
    line = refused(run_cli, "info", tmp_path / "parts", code=1, words=(f"fastdata merge-parts {tmp_path / 'parts'}",))
    assert "--resume" not in line
    code, _, err = run_cli("merge-parts", tmp_path / "parts")
    assert code == 0, err
    assert len(fastdata.open(tmp_path / "parts")) == 4


def test_only_a_journal_gets_the_resume_advice(tmp_path, run_cli):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / ".fastdata-journal").write_text("{}\n")
    refused(run_cli, "info", tmp_path / "half", code=1, words=("incomplete dataset", "--resume"))
    (tmp_path / "killed").mkdir()
    (tmp_path / "killed" / ".fastdata.lock").write_text("")  # killed before its journal was written
    refused(run_cli, "info", tmp_path / "killed", code=1, words=("incomplete dataset", "convert again with --overwrite"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("hi")
    line = refused(run_cli, "info", tmp_path / "other", code=1, words=("not a fastdata dataset",))
    assert "--resume" not in line and "source folder" not in line


# --- URLs ----------------------------------------------------------------------------------------


def test_urls_malformed_or_of_unknown_scheme(src, tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused(run_cli, "convert", src, "s3:/bucket/ds", *ARGS, code=2, words=("s3:/bucket/ds", "URL missing a slash"))
    assert not (tmp_path / "s3:").exists()  # no local folder named like a URL
    refused(run_cli, "convert", src, "foo://bucket/ds", *ARGS, code=2, words=("unknown URL scheme 'foo'",))
    refused(run_cli, "convert", "s3://bucket/src", tmp_path / "ds", *ARGS, code=2,
            words=("sources must be local",))
    refused(run_cli, "info", "foo://a/b", code=2, words=("unknown URL scheme 'foo'",))
    refused(run_cli, "merge", src, "gs:/x", code=2, words=("URL missing a slash",))
    refused(run_cli, "merge", src, "foo://x/y", code=2, words=("object-storage URLs are not supported",))
    refused(run_cli, "merge-parts", "s3:/x", code=2, words=("URL missing a slash",))


def test_urls_without_a_bucket_or_host(src, tmp_path, run_cli):
    for args in [("convert", src, "s3://", *ARGS), ("convert", src, "s3:///ds", *ARGS), ("info", "s3:///x"),
                 ("info", "gs://"), ("merge-parts", "s3://"), ("verify", "s3:///x")]:
        refused(run_cli, *args, code=2, words=("no bucket or host after",))


def test_an_ftp_url_that_cannot_connect_is_one_line(src, tmp_path):
    """The URL's own host reaches the filesystem (it used to be dropped: 'missing ... host'), and a
    refused connection is one line, with no 'Exception ignored' from a half-made filesystem."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    r = subprocess.run([sys.executable, "-m", "fastdata", "convert", str(src), f"ftp://127.0.0.1:{port}/ds"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"fastdata: error: ftp://127.0.0.1:{port}/ds: cannot connect: "
                                             "Connection refused"], r.stderr


# --- merge and merge-parts -----------------------------------------------------------------------


@pytest.fixture
def two(src, tmp_path: Path) -> tuple[Path, Path]:
    fastdata.convert(src, tmp_path / "a", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)))
    other = tmp_path / "src2"
    other.mkdir()
    for i in range(2):
        np.save(other / f"t{i}.npy", np.zeros((5,), np.float32))
    fastdata.convert(other, tmp_path / "b", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)))
    return tmp_path / "a", tmp_path / "b"


def test_merge_inputs(two, src, tmp_path, run_cli):
    a, b = two
    out = tmp_path / "m"
    refused(run_cli, "merge", tmp_path / "nope", a, out, code=1, words=("nope", "no such folder"), dst=out)
    refused(run_cli, "merge", src / "s0.npy", a, out, code=1, words=("s0.npy: a source file", "fastdata convert"), dst=out)
    refused(run_cli, "merge", src, a, out, code=1, words=("this is a source folder",), dst=out)
    refused(run_cli, "merge", a, b, out, code=2, words=(str(b), "field 'x'", "same schema"), dst=out)
    refused(run_cli, "merge", a, code=2, words=("merge needs at least one input and DST",))
    refused(run_cli, "merge", a, a, code=2, words=(str(a), "the destination is inside the source"))
    refused(run_cli, "merge", b, a, code=2, words=(str(a), "already exists; pass --overwrite"))
    refused(run_cli, "merge", a, out, "--method", "teleport", code=2, words=("--method",))
    assert not out.exists()


def test_merge_parts_inputs(src, tmp_path, run_cli):
    parts = tmp_path / "parts"
    refused(run_cli, "merge-parts", tmp_path / "nope", code=2, words=("nope", "no such folder"))
    refused(run_cli, "merge-parts", src, code=2, words=("no part records", "--part I/N"))
    code, _, err = run_cli("convert", src, parts, "--part", "0/2", *ARGS)
    assert code == 0, err
    refused(run_cli, "merge-parts", parts, code=2, words=("1 of 2 part(s) missing or unfinished: 1/2",), dst=parts)
    code, _, err = run_cli("convert", src, parts, "--part", "1/2", *ARGS)
    assert code == 0, err
    record = next(parts.glob(".fastdata-part-00001-of-*.json"))
    good = record.read_bytes()
    record.write_bytes(good[: len(good) // 2])  # a torn record
    refused(run_cli, "merge-parts", parts, code=1, words=(record.name, "unreadable part record"), dst=parts)
    record.write_text(json.dumps({"fastdata_part": 1}))
    refused(run_cli, "merge-parts", parts, code=1, words=(record.name, "not a part record"), dst=parts)
    record.write_bytes(good)
    other = tmp_path / "other"
    other.mkdir()
    for i in range(4):
        np.save(other / f"s{i}.npy", np.ones((3,), np.float32))
    code, _, err = run_cli("convert", other, tmp_path / "mixed", "--part", "1/2", *ARGS)
    assert code == 0, err
    code, _, err = run_cli("convert", src, tmp_path / "mixed", "--part", "0/2", *ARGS)
    assert code == 2 and "holds part 1/2 of another conversion (different source)" in err, err  # before writing
    code, _, err = run_cli("convert", src, tmp_path / "mixed", "--part", "0/2", *ARGS, "--overwrite")
    assert code == 0, err  # --overwrite is not refused: merge-parts then is
    refused(run_cli, "merge-parts", tmp_path / "mixed", code=2, words=("part 1/2 comes from another conversion",
                                                                     "different source"), dst=tmp_path / "mixed")
    code, _, err = run_cli("merge-parts", parts)
    assert code == 0, err


# --- samplers and splits -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> fastdata.Dataset:
    root = tmp_path_factory.mktemp("labelled")
    for c in ("a", "b", "c"):
        (root / "src" / c).mkdir(parents=True)
        for i in range(4):
            np.save(root / "src" / c / f"{i}.npy", np.full((2,), i, np.float32))
    fastdata.convert(root / "src", root / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)))
    return fastdata.open(root / "ds", fields=["x", "label", "key"])


BAD_SPLITS = [
    ({"a": "x"}, {}, "fraction of part 'a'"), ([0.5, 0.5], {}, "dict of part name: fraction"),
    ({"a": None}, {}, "fraction of part 'a'"), ({"a": True}, {}, "fraction of part 'a'"),
    ({}, {}, "dict of part name"), ({"a": -0.1}, {}, "positive"), ({"a": 0.9, "b": 0.9}, {}, "sum to at most 1"),
    ({"a": float("nan")}, {}, "positive"), ({"a": 0.5}, {"seed": "x"}, "seed"), ({"a": 0.5}, {"seed": -1}, "seed"),
    ({"a": 0.5}, {"seed": 1.5}, "seed"), ({"a": 0.5}, {"stratify": "nope"}, "no field 'nope'"),
    ({"a": 0.5}, {"stratify": "x"}, "one value per sample"),
]


@pytest.mark.parametrize("fractions,kw,words", BAD_SPLITS)
def test_bad_split_arguments(labelled, fractions, kw, words):
    with pytest.raises(UsageError) as e:
        labelled.split(fractions, **kw)
    one_line(e, words)


BAD_SUBSETS = [([0.5], "not an array of float64"), ([[0]], "1-D"), ([99], "out of range"), (["nope"], "nope"),
               ([0, 0], "twice"), (None, "1-D"), ([True], "mask needs 12")]


@pytest.mark.parametrize("selection,words", BAD_SUBSETS)
def test_bad_subset_arguments(labelled, selection, words):
    with pytest.raises(UsageError) as e:
        labelled.subset(selection)
    one_line(e, words)


BAD_SAMPLERS = [
    (Weighted(["a"] * 12), 3, "weights must be numbers"), (Weighted({"a": 1}), 3, "weights must be numbers"),
    (Weighted(np.ones((12, 1))), 3, "one weight per sample"), (Weighted("balance"), 3, "'balanced'"),
    (Weighted("balanced", by="nope"), 3, "'nope', which is not a field"),
    (Weighted([1.0] * 11 + [float("nan")]), 3, "weight 11 is not a finite number"),
    (Weighted([0.0] * 12), 3, "every weight is zero"), (Weighted([-1.0] + [1.0] * 11), 3, "weight 0 is negative"),
    (Weighted("balanced", num_samples=0), 3, "num_samples"), (Weighted("balanced", replacement="no"), 3, "replacement"),
    (Weighted("balanced", num_samples=13, replacement=False), 3, "13 draws without replacement"),
    (Weighted("balanced", by="x"), 3, "holds shape"),
    (Episodic(0, 1), None, "n_way must be a positive integer"), (Episodic(True, 1), None, "n_way"),
    (Episodic(2, 1, -1), None, "n_query must be an integer >= 0"), (Episodic(4, 1), None, "needs 4 classes"),
    (Episodic(2, 1), 5, "batch_size is 5"), (Episodic(2, 1, episodes_per_epoch=0), None, "episodes_per_epoch"),
    (Episodic(2, 1, by="nope"), None, "'nope', which is not a field"),
    ("balanced", 3, "sampler must be a fastdata sampler"),
]


@pytest.mark.parametrize("sampler,batch,words", BAD_SAMPLERS)
def test_bad_sampler_arguments(labelled, sampler, batch, words):
    with pytest.raises(UsageError) as e:
        fastdata.loader(labelled, batch, sampler=sampler)
    one_line(e, words)


@pytest.mark.parametrize("gives", [None, 1, [[0.5]], [[0], [1, [2]]], [[99]]])
def test_a_custom_sampler_giving_junk_is_refused(labelled, gives):
    with pytest.raises(UsageError) as e:
        list(fastdata.loader(labelled, 2, sampler=lambda n, world, seed, epoch: gives))
    one_line(e, "sampler")


def test_numpy_integers_are_fine_for_episodic(labelled):
    batches = list(fastdata.loader(labelled, None, sampler=Episodic(np.int64(3), np.int32(1))))
    assert batches and all(len(b["label"]) == 3 and len(set(b["label"].tolist())) == 3 for b in batches)


@given(fractions=st.dictionaries(st.sampled_from(["train", "val", "test"]), st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 3), st.booleans(), st.none(), st.text(max_size=3)),
    max_size=3), seed=st.one_of(st.integers(-2, 2**40), st.floats(), st.text(max_size=2)))
@settings(max_examples=60, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_split_arguments(labelled, fractions, seed):
    try:
        parts = labelled.split(fractions, seed=seed)
    except UsageError as e:
        assert "\n" not in str(e)
    else:
        assert sum(len(p) for p in parts.values()) <= len(labelled)
        assert len(set().union(*(set(p.column("key").tolist()) for p in parts.values()))) == sum(map(len, parts.values()))

