"""The write side refuses, before anything is written, what its own reader would refuse or what it
could not write whole: tables wider than the field limit (quickly, before their cells are parsed),
file names that are not UTF-8, integer labels beyond int64, NaN/inf labels (unless allowed), and
shard sizes beyond the limit. Each refusal is one line naming the file (and row)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import fastdata
from fastdata._units import MAX_SIZE, parse_size
from fastdata.format.spec import MAX_FIELDS


@pytest.fixture
def flat(tmp_path):
    """tmp_path/src: four .npy samples 0.npy .. 3.npy, no class folders."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        np.save(src / f"{i}.npy", np.full(3, i, "f4"))
    return src


def _refused(run_cli, dst, *args, code=1):
    got, _, err = run_cli("convert", *args[:1], dst, "--quiet", *args[1:])
    assert got == code, err
    assert err.count("\n") == 1 and err.startswith("fastdata: error: ") and "Traceback" not in err, err
    assert not dst.exists()  # nothing written, not even the folder
    return err


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_table_of_more_columns_than_the_reader_takes_is_refused(flat, tmp_path, run_cli, kind):
    cols = [f"c{j}" for j in range(MAX_FIELDS + 45)]
    rows = [{"path": f"{i}.npy", **{c: j for j, c in enumerate(cols)}} for i in range(4)]
    table = tmp_path / f"wide.{kind}"
    if kind == "csv":
        table.write_text("\n".join([",".join(["path", *cols])] + [",".join(map(str, r.values())) for r in rows]) + "\n")
    else:
        table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    err = _refused(run_cli, tmp_path / "ds", flat, "--meta", table)
    assert str(table) in err and f"over the limit of {MAX_FIELDS}" in err


def test_fields_over_the_limit_are_refused_before_writing(flat, tmp_path, run_cli):
    """A table within the column limit whose fields (its columns and the samples' own) are not."""
    cols = [f"c{j}" for j in range(MAX_FIELDS)]  # + the samples' field x: one field too many
    table = tmp_path / "t.csv"
    table.write_text("\n".join([",".join(["path", *cols])] + [",".join([f"{i}.npy", *["1"] * len(cols)]) for i in range(4)]))
    err = _refused(run_cli, tmp_path / "ds", flat, "--meta", table)
    assert f"would make {MAX_FIELDS + 1} fields, over the limit of {MAX_FIELDS}" in err and str(table) in err


def test_a_table_of_a_million_columns_is_refused_from_its_header(flat, tmp_path, run_cli):
    """Refused from the header row: the cells of the other rows are never parsed (they are not even valid)."""
    table = tmp_path / "huge.csv"
    table.write_text(",".join(["path", *(f"c{j}" for j in range(1_000_000))]) + "\n0.npy,1\n")
    err = _refused(run_cli, tmp_path / "ds", flat, "--meta", table)
    assert "1000001 columns, over the limit" in err


def test_a_file_name_that_is_not_utf8_is_refused_at_scan(flat, tmp_path, run_cli):
    bad = os.path.join(os.fsencode(flat), b"x\xff.npy")
    with open(bad, "wb") as f:
        np.save(f, np.zeros(3, "f4"))
    err = _refused(run_cli, tmp_path / "ds", flat)
    assert f"{flat}/x\\xff.npy: the file name is not valid UTF-8" in err


def test_a_sample_key_that_is_not_utf8_is_refused_before_writing(flat, tmp_path):
    """Any source: a key (here from a JSON Lines table, a lone surrogate) that cannot be written as UTF-8."""
    name = os.fsdecode(b"x\xff.npy")  # the str Python gives a file named with the byte 0xff
    with open(os.path.join(os.fsencode(flat), b"x\xff.npy"), "wb") as f:
        np.save(f, np.zeros(3, "f4"))
    table = flat / "t.jsonl"
    table.write_text("".join(json.dumps({"path": p, "w": 1.0}) + "\n" for p in ["0.npy", name]))
    with pytest.raises(fastdata.errors.DataError, match="is not valid UTF-8"):
        fastdata.convert(table, tmp_path / "ds")
    assert not (tmp_path / "ds").exists()


def test_an_integer_label_beyond_int64_is_refused(flat, tmp_path, run_cli):
    labels = tmp_path / "labels.csv"
    labels.write_text("0.npy,1\n1.npy,99999999999999999999\n2.npy,2\n3.npy,3\n")
    err = _refused(run_cli, tmp_path / "ds", flat, "--labels", labels)
    assert f"{labels}: label '99999999999999999999' of '1.npy' does not fit a 64-bit integer" in err


@pytest.mark.parametrize("text,shown", [("nan", "nan"), ("1e400", "inf"), ("-inf", "-inf")])
def test_non_finite_labels_are_refused_unless_allowed(flat, tmp_path, run_cli, text, shown):
    labels = tmp_path / "labels.csv"
    labels.write_text(f"0.npy,0.5\n1.npy,1.5\n2.npy,{text}\n3.npy,3\n")
    err = _refused(run_cli, tmp_path / "ds", flat, "--labels", labels)
    assert f"{labels}: the row for '2.npy': label {shown} is not a finite number; pass --allow-nan" in err
    code, _, err = run_cli("convert", flat, tmp_path / "ds", "--quiet", "--labels", labels, "--allow-nan")
    assert code == 0, err
    assert np.isnan(fastdata.open(tmp_path / "ds")[2]["label"]) == (shown == "nan")


def test_non_finite_labels_in_a_labels_array_are_refused_unless_allowed(tmp_path, run_cli):
    np.save(tmp_path / "x.npy", np.zeros((5, 3), "f4"))
    np.save(tmp_path / "y.npy", np.array([[0, 1], [1, 1], [2, 1], [3, np.nan], [4, 1]], "f4"))
    err = _refused(run_cli, tmp_path / "ds", tmp_path / "x.npy", "--labels", tmp_path / "y.npy")
    assert f"{tmp_path / 'y.npy'}: row 3: label [3.0, nan] is not a finite number" in err
    with pytest.raises(fastdata.errors.DataError, match="allow_nan=True"):
        fastdata.convert(tmp_path / "x.npy", tmp_path / "ds", labels=tmp_path / "y.npy")
    fastdata.convert(tmp_path / "x.npy", tmp_path / "ds", fastdata.ConvertConfig(allow_nan=True), labels=tmp_path / "y.npy")
    assert np.isnan(fastdata.open(tmp_path / "ds")[3]["label"][1])


def test_sizes_accept_petabytes_and_refuse_absurd_values(flat, tmp_path, run_cli):
    assert parse_size("1PB") == 10**15 and parse_size("2PiB") == 2 << 50
    assert parse_size("1.5GB") == 1_500_000_000
    code, _, err = run_cli("convert", flat, tmp_path / "ds", "--quiet", "--shard-size", "1PB", "--no-labels")
    assert code == 0, err
    assert len(fastdata.open(tmp_path / "ds").manifest.shards) == 1
    for absurd in ("99999999999999999999999999GB", "2000PB", "9" * 60):
        code, _, err = run_cli("convert", flat, tmp_path / "ds2", "--shard-size", absurd)
        assert code == 2 and not (tmp_path / "ds2").exists()
        assert err.splitlines()[-1] == (f"fastdata convert: error: argument --shard-size: size too large: {absurd!r} is "
                                        f"over the limit of 1 EiB ({MAX_SIZE} bytes)"), err
    with pytest.raises(fastdata.errors.UsageError, match="over the limit of 1 EiB"):
        fastdata.WriteOptions(shard_size=MAX_SIZE + 1)


@pytest.mark.parametrize("text,shown", [("nan", "nan"), ("1e400", "inf"), ("-inf", "-inf")])
def test_non_finite_labels_in_a_tables_label_column_are_refused_unless_allowed(flat, tmp_path, run_cli, text, shown):
    table = tmp_path / "meta.csv"
    table.write_text(f"path,label\n0.npy,0.5\n1.npy,1.5\n2.npy,{text}\n3.npy,3\n")
    err = _refused(run_cli, tmp_path / "ds", flat, "--meta", table)
    assert f"{table}: the row for '2.npy', column 'label': label {shown} is not a finite number; pass --allow-nan" in err
    code, _, err = run_cli("convert", flat, tmp_path / "ds", "--quiet", "--meta", table, "--allow-nan")
    assert code == 0, err
    assert np.isnan(fastdata.open(tmp_path / "ds")[2]["label"]) == (shown == "nan")


def test_a_non_finite_label_in_a_ragged_label_column_names_its_row(flat, tmp_path):
    table = tmp_path / "meta.jsonl"
    labels = [[0.0], [1.0, 2.0], [3.0, float("inf"), 4.0], []]
    table.write_text("".join(json.dumps({"path": f"{i}.npy", "label": v}) + "\n" for i, v in enumerate(labels)))
    with pytest.raises(fastdata.errors.DataError, match=r"meta\.jsonl: the row for '2\.npy', column 'label': label "
                       r"\[3\.0, inf, 4\.0\] is not a finite number; pass allow_nan=True"):
        fastdata.convert(flat, tmp_path / "ds", meta=table)
    assert not (tmp_path / "ds").exists()
