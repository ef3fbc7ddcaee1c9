"""fastdata.convert from Python: ConvertConfig checks itself, errors name parameters (the CLI names flags),
UsageError is a ValueError, the source table picks exactly one kind, and `import fastdata` stays light."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastdata
from fastdata.converters import SOURCES, Request, detect
from fastdata.errors import FastdataError, UsageError


def _npy_folder(root: Path, n: int = 6) -> Path:
    for i in range(n):
        (root / ("a", "b")[i % 2]).mkdir(parents=True, exist_ok=True)
        np.save(root / ("a", "b")[i % 2] / f"{i}.npy", np.full(3, i, "<f4"))
    return root


def test_convert_from_python_returns_what_it_wrote(tmp_path):
    src = _npy_folder(tmp_path / "src")
    config = fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", workers=1))
    report = fastdata.convert(src, tmp_path / "ds", config)
    assert (report.samples, report.shards, report.skipped) == (6, 1, [])
    assert report.bytes_out > 0 and report.fields == ["x", "label"]
    ds = fastdata.open(tmp_path / "ds")
    assert len(ds) == 6 and ds.classes == ["a", "b"]


def test_convert_config_is_frozen_and_checked():
    config = fastdata.ConvertConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.skip_bad = True  # type: ignore[misc]
    with pytest.raises(UsageError, match=r"^part \(3, 2\): expected \(I, N\)"):
        fastdata.ConvertConfig(part=(3, 2))
    with pytest.raises(UsageError, match="^write must be a WriteOptions"):
        fastdata.ConvertConfig(write={"backend": "lmdb"})  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="^meta_types maps column names to ColumnType"):
        fastdata.ConvertConfig(meta_types={"kp": "float32"})  # type: ignore[dict-item]


@pytest.mark.parametrize("make,message", [
    (lambda: fastdata.WriteOptions(shard_size=0), "shard_size must be positive"),
    (lambda: fastdata.WriteOptions(workers=0), "workers must be at least 1"),
    (lambda: fastdata.WriteOptions(ray_address="x:1"), "ray_address applies to engine=ray only"),
    (lambda: fastdata.ImageOptions(images="encoded", size=(8, 8)),
     r"images=encoded keeps the original files; size and max_side resize images and need images=raw or images=jpeg "
     r"\(a source without images takes no image options\)"),
])
def test_library_errors_name_parameters_and_are_value_errors(make, message):
    with pytest.raises(ValueError, match=message) as e:
        make()
    assert isinstance(e.value, UsageError) and "--" not in str(e.value)


def test_the_cli_says_the_same_errors_with_flags(tmp_path, run_cli):
    src = _npy_folder(tmp_path / "src")
    code, _, err = run_cli("convert", src, tmp_path / "ds", "--ray-address", "x:1")
    assert code == 2 and "--ray-address applies to --engine ray only" in err
    code, _, err = run_cli("convert", src, tmp_path / "ds", "--images", "raw")
    assert code == 2 and "image options (--images, --size, ...) given, but the folder holds no images" in err
    with pytest.raises(UsageError, match=r"image options \(images\) given, but the folder holds no images"):
        fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(images=fastdata.ImageOptions()))
    assert not (tmp_path / "ds").exists()


def test_argument_combinations_are_refused_naming_parameters(tmp_path):
    src = _npy_folder(tmp_path / "src")
    (tmp_path / "l.csv").write_text("a/0.npy,x\n")
    with pytest.raises(UsageError, match="^labels and no_labels contradict each other$"):
        fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(no_labels=True), labels=tmp_path / "l.csv")
    with pytest.raises(UsageError, match="^nothing to convert: give src, or arrays$"):
        fastdata.convert(None, tmp_path / "ds")
    with pytest.raises(UsageError, match="^config must be a ConvertConfig"):
        fastdata.convert(src, tmp_path / "ds", fastdata.WriteOptions())  # type: ignore[arg-type]


def test_every_source_kind_is_detected_by_exactly_one_entry(tmp_path):
    npy = _npy_folder(tmp_path / "npy")
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    (imgs / "0.png").write_bytes(b"")  # detection looks at names; scanning reads the files
    np.save(tmp_path / "X.npy", np.zeros((4, 2), "<f4"))
    (tmp_path / "meta.csv").write_text("path\n0.npy\n")
    cases = {"npy-folder": Request(npy), "image-folder": Request(imgs),
             "npy-arrays": Request(None, {"x": tmp_path / "X.npy"}),
             "table": Request(npy, {}, None, tmp_path / "meta.csv")}
    assert set(cases) <= set(SOURCES)
    for kind, req in cases.items():
        assert detect(req).name == kind
        assert [k.name for k in SOURCES.values() if k.detect(req)] == [kind]


def test_overlapping_kinds_are_a_bug_that_says_so(tmp_path, monkeypatch):
    class Greedy:
        name = "greedy"

        def detect(self, req):
            return True

        def scan(self, req, config, progress):  # pragma: no cover - never reached
            raise AssertionError

    monkeypatch.setitem(SOURCES, "greedy", Greedy())
    with pytest.raises(FastdataError, match="all claim .*detect\\(\\) must not overlap"):
        detect(Request(_npy_folder(tmp_path / "src")))


def test_import_fastdata_imports_neither_torch_nor_the_write_side():
    code = ("import sys, fastdata; bad = [m for m in ('torch', 'fastdata.converters', 'fastdata.write') "
            "if m in sys.modules]; print(bad); assert not bad; fastdata.ConvertConfig; "
            "assert 'torch' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_src_form_comes_from_the_source_table_alone(tmp_path, monkeypatch):
    """convert shapes the request from what the registered kinds say SRC is: a new kind of array file needs no
    change to converters/convert.py; two kinds saying what one SRC is are a bug that says so."""
    seen = []

    class Blob:
        name = "blob"

        def src_form(self, src):
            return "arrays" if src.suffix == ".blob" else None

        def detect(self, req):
            return req.src is not None and req.src.suffix == ".blob"

        def scan(self, req, config, progress):
            seen.append(req)
            raise UsageError(f"{req.src}: scanned")

    (tmp_path / "a.blob").write_bytes(b"")
    monkeypatch.setitem(SOURCES, "blob", Blob())
    with pytest.raises(UsageError, match="a.blob: scanned"):
        fastdata.convert(tmp_path / "a.blob", tmp_path / "ds", arrays={"x": "/inside"})
    assert seen[0].in_file == {"x": "/inside"} and seen[0].arrays == {} and not (tmp_path / "ds").exists()

    class Also(Blob):
        name = "also"

    monkeypatch.setitem(SOURCES, "also", Also())
    with pytest.raises(FastdataError, match="blob, also all say what .*a.blob is: their src_form\\(\\) must not overlap"):
        fastdata.convert(tmp_path / "a.blob", tmp_path / "ds")
