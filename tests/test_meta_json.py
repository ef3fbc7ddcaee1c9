"""Issue 48: the most common annotation files convert as they are: ``--meta`` takes a JSON array of
records or a JSON object of records keyed by path, and a labels CSV may call its path column
path, file, filename or name (or any two columns, named with ``--labels-columns``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import fastdata
from fastdata.converters import ConvertConfig
from fastdata.errors import DataError


def _samples(root: Path, n: int = 4) -> list[dict]:
    root.mkdir(parents=True)
    recs = []
    for i in range(n):
        np.save(root / f"s{i}.npy", np.full((3,), i, np.float32))
        recs.append({"path": f"s{i}.npy", "score": i / 4, "tag": f"t{i}", "label": i % 2})
    return recs


def _check(ds_path: Path, n: int = 4) -> None:
    ds = fastdata.open(ds_path)
    b = ds.get_batch(list(range(n)))
    assert b["score"].tolist() == [i / 4 for i in range(n)]
    assert b["tag"] == [f"t{i}" for i in range(n)] and b["label"].tolist() == [i % 2 for i in range(n)]
    assert b["x"][:, 0].tolist() == list(range(n))


def test_meta_json_array_of_records(tmp_path, run_cli):
    recs = _samples(tmp_path / "src")
    (tmp_path / "ann.json").write_text(json.dumps(recs))
    code, _, err = run_cli("convert", tmp_path / "src", tmp_path / "ds", "--meta", tmp_path / "ann.json", "--quiet")
    assert code == 0, err
    _check(tmp_path / "ds")


def test_meta_json_object_keyed_by_path(tmp_path):
    recs = _samples(tmp_path / "src")
    (tmp_path / "ann.json").write_text(json.dumps({r["path"]: {k: v for k, v in r.items() if k != "path"} for r in recs}))
    fastdata.convert(tmp_path / "src", tmp_path / "ds", meta=tmp_path / "ann.json")
    _check(tmp_path / "ds")


@pytest.mark.parametrize("text,expect", [
    ('{"a": 1}', "entry 'a' is a int; a JSON table is an array of records"),
    ('[{"path": "s0.npy"}, 3]', "item 2 is not an object"),
    ('{"s0.npy": {"path": "s1.npy"}}', "entry 's0.npy' has path 's1.npy'"),
    ("[", "not JSON"),
])
def test_meta_json_that_is_no_table_is_one_line_error(tmp_path, text, expect):
    _samples(tmp_path / "src")
    (tmp_path / "ann.json").write_text(text)
    with pytest.raises(DataError, match=expect):
        fastdata.convert(tmp_path / "src", tmp_path / "ds", meta=tmp_path / "ann.json")
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("header", ["filename", "name", "file", "path"])
def test_labels_csv_path_column_names(tmp_path, header):
    _samples(tmp_path / "src")
    (tmp_path / "labels.csv").write_text(f"{header},label\n" + "".join(f"s{i}.npy,c{i % 2}\n" for i in range(4)))
    fastdata.convert(tmp_path / "src", tmp_path / "ds", labels=tmp_path / "labels.csv")
    ds = fastdata.open(tmp_path / "ds")
    assert ds.get_batch([0, 1, 2, 3])["label"].tolist() == [0, 1, 0, 1] and ds.manifest.classes == ["c0", "c1"]


def test_labels_columns_picks_two_columns_of_a_wider_file(tmp_path, run_cli):
    _samples(tmp_path / "src")
    (tmp_path / "labels.csv").write_text("id,image,split,cls\n" + "".join(f"{i},s{i}.npy,train,{3 - i}\n" for i in range(4)))
    code, _, err = run_cli("convert", tmp_path / "src", tmp_path / "ds0", "--labels", tmp_path / "labels.csv", "--quiet")
    assert code != 0 and "--labels-columns PATH,LABEL" in err
    code, _, err = run_cli("convert", tmp_path / "src", tmp_path / "ds", "--labels", tmp_path / "labels.csv",
                           "--labels-columns", "image,cls", "--quiet")
    assert code == 0, err
    assert fastdata.open(tmp_path / "ds").get_batch([0, 3])["label"].tolist() == [3, 0]
    recs = [{"image": f"s{i}.npy", "cls": i} for i in range(4)]
    (tmp_path / "labels.json").write_text(json.dumps(recs))
    cfg = ConvertConfig(labels_columns=("image", "cls"))
    fastdata.convert(tmp_path / "src", tmp_path / "ds2", cfg, labels=tmp_path / "labels.json")
    assert fastdata.open(tmp_path / "ds2").get_batch([1])["label"].tolist() == [1]


def test_a_json_table_as_the_whole_source(tmp_path, run_cli):
    recs = _samples(tmp_path / "src")
    (tmp_path / "src" / "ann.json").write_text(json.dumps(recs))
    code, _, err = run_cli("convert", tmp_path / "src" / "ann.json", tmp_path / "ds", "--quiet")
    assert code == 0, err
    _check(tmp_path / "ds")
