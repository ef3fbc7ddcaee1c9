"""Conversion on many machines into object storage: ``--engine ray`` and ``--part I/N`` + ``merge-parts``
to an ``s3://`` URL, against moto's S3 server on 127.0.0.1 (as in test_remote.py) and a local Ray (as in
test_scale.py). Every result is downloaded and compared byte for byte with a one-machine conversion
to a URL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from conftest import CREDS, S3Server, make_class_folder  # noqa: E402
from test_remote import arrays_source, bucket, opts  # noqa: E402
import fastdata  # noqa: E402
import fastdata.write  # noqa: E402
from fastdata.errors import DataError, FastdataError, UsageError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARD = 4000  # 30 samples of 432 B + label -> 4 shards


@pytest.fixture(scope="module")
def ray_cluster(s3):
    """A local Ray (2 CPUs, loopback only), started after the S3 credentials are in the environment, so
    its workers have them as a cluster's nodes would; stopped at the end of the module."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray = pytest.importorskip("ray")
    ctx = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ctx.address_info["address"]
    ray.shutdown()


def objects(s3: S3Server, url: str) -> dict[str, bytes]:
    """Every object under the prefix, by name, downloaded."""
    fs = s3.fs()
    prefix = url[len("s3://"):]
    return {p.rsplit("/", 1)[-1]: fs.cat_file(p) for p in sorted(fs.ls(prefix, refresh=True))}


def same_remote(a: dict[str, bytes], b: dict[str, bytes]) -> None:
    """Two downloaded datasets: the same objects with the same bytes, the manifest included (it records
    no timing, so there is nothing to leave out)."""
    assert sorted(a) == sorted(b)
    assert "manifest.json" in a and not any(n.startswith(".fastdata") for n in a), sorted(a)
    assert json.loads(a["manifest.json"]) == json.loads(b["manifest.json"])  # a readable diff first
    for name in a:
        assert a[name] == b[name], name


def staged_files(cache: Path) -> list[Path]:
    """Shard files left in the upload staging folders (there should be none after a conversion)."""
    up = cache / "uploads"
    return [p for p in up.rglob("*") if p.is_file() and "shard-" in p.name] if up.exists() else []


def cli_env(s3: S3Server, cache: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, **CREDS, "AWS_ENDPOINT_URL": s3.endpoint, "FASTDATA_REMOTE_CACHE": str(cache),
            "PYTHONPATH": str(ROOT), **extra}


# --- Ray into a URL ------------------------------------------------------------------------


def test_ray_engine_to_s3_equals_local_engine_to_s3(s3, ray_cluster, tmp_path):
    src = arrays_source(tmp_path, 40)
    ro = opts(s3, tmp_path / "cache")
    one, ray = f"s3://{bucket(s3)}/one", f"s3://{bucket(s3)}/ray"

    def convert(url: str, **kw):
        return fastdata.convert(None, url, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=2000, **kw), remote=ro), labels=src / "y.npy", arrays={"x": src / "X.npy"})

    convert(one, workers=1)
    report = convert(ray, engine="ray")
    assert report.engine == "ray" and report.dst == ray and report.shards >= 4
    same_remote(objects(s3, one), objects(s3, ray))
    assert staged_files(tmp_path / "cache") == []  # workers deleted their local copies after uploading
    ds = fastdata.open(ray, remote=opts(s3, tmp_path / "read"))
    x = ds.get_batch(list(range(len(ds))))["x"]
    assert len(ds) == 40 and (x[:, 0] == range(40)).all()


def test_ray_upload_that_keeps_failing_leaves_no_manifest_and_resume_finishes(s3, ray_cluster, tmp_path, monkeypatch):
    src = tmp_path / "src"
    make_class_folder(src, per_class=10)  # 4 shards, and per-sample keys (keys.bin goes up before the manifest)
    ro = opts(s3, tmp_path / "cache")
    one, url = f"s3://{bucket(s3)}/one", f"s3://{bucket(s3)}/ray"
    fastdata.convert(src, one, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD, workers=1), remote=ro))
    monkeypatch.setenv("FASTDATA_FAULT", "eio:upload:2")  # every attempt at uploading shard 2 fails
    with pytest.raises(FastdataError) as e:  # one task at a time: shards 0 and 1 are up before
        fastdata.convert(src, url, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD, engine="ray", workers=1), remote=ro))
    msg = str(e.value)
    assert "shard shard-00002.h5" in msg and f"{url}/shard-00002.h5" in msg and "Input/output error" in msg
    assert "resume=True" in msg and "\n" not in msg
    names = set(objects(s3, url))
    assert "manifest.json" not in names and "keys.bin" not in names
    assert {"shard-00000.h5", "shard-00001.h5", ".fastdata-journal"} <= names
    with pytest.raises(fastdata.errors.IncompleteDatasetError):
        fastdata.open(url, remote=opts(s3, tmp_path / "read"))
    monkeypatch.delenv("FASTDATA_FAULT")
    # another machine (another staging place) finishes it, with the Ray engine again
    report = fastdata.convert(src, url, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD, engine="ray"), resume=True, remote=opts(s3, tmp_path / "elsewhere")))
    assert report.kept == 2
    same_remote(objects(s3, one), objects(s3, url))
    assert staged_files(tmp_path / "cache") == [] and staged_files(tmp_path / "elsewhere") == []


def test_parts_run_on_ray_into_s3_merge_to_the_one_machine_result(s3, ray_cluster, tmp_path):
    """--part with --engine ray: each part's shards uploaded by Ray workers, its record by the driver."""
    src = arrays_source(tmp_path, 40)
    ro = opts(s3, tmp_path / "cache")
    one, url = f"s3://{bucket(s3)}/one", f"s3://{bucket(s3)}/parts"

    def convert(dst: str, engine: str = "local", part=None):
        return fastdata.convert(None, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=2000, engine=engine, workers=1), part=part, remote=ro), labels=src / "y.npy", arrays={"x": src / "X.npy"})

    convert(one)
    for i in range(2):
        assert convert(url, "ray", (i, 2)).engine == "ray"
    fastdata.write.merge_parts(url, remote=ro)
    same_remote(objects(s3, one), objects(s3, url))
    assert staged_files(tmp_path / "cache") == []


# --- --part I/N into a URL, then merge-parts ----------------------------------------------


def _parts(s3: S3Server, src: Path, url: str, n: int, cache: Path, which=None, backend: str = "hdf5") -> None:
    """``fastdata convert --part I/N`` for each I, all at once, as separate processes (as on a cluster)."""
    procs = [subprocess.Popen([sys.executable, "-m", "fastdata", "convert", src, url, "--shard-size", str(SHARD),
                               "--format", backend, "--part", f"{i}/{n}", "--workers", "1", "--quiet"],
                              cwd=ROOT, env=cli_env(s3, cache / f"node{i}"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for i in (range(n) if which is None else which)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert f"merge-parts {url}" in out


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_three_parts_to_s3_then_merge_parts_equals_one_machine(s3, tmp_path, run_cli, monkeypatch, backend):
    src = tmp_path / "src"
    make_class_folder(src, per_class=10)
    one, url = f"s3://{bucket(s3)}/one", f"s3://{bucket(s3)}/parts"
    fastdata.convert(src, one, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, shard_size=SHARD, workers=1), remote=opts(s3, tmp_path / "cache")))
    _parts(s3, src, url, 3, tmp_path / "cache", backend=backend)
    names = set(objects(s3, url))
    assert "manifest.json" not in names and {f".fastdata-part-0000{i}-of-00003.json" for i in range(3)} <= names
    assert not any(n.startswith(".fastdata-journal") for n in names)  # each part removed its journal
    with pytest.raises(fastdata.errors.IncompleteDatasetError, match=f"run fastdata merge-parts {url}"):
        fastdata.open(url, remote=opts(s3, tmp_path / "read"))  # parts alone are not a dataset
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)  # the CLI has no endpoint flag; botocore reads this
    code, out, err = run_cli("merge-parts", url)
    assert code == 0, err
    assert f"merged 3 part(s) into {url}" in out
    same_remote(objects(s3, one), objects(s3, url))  # also: no part records or journals left
    for i in range(3):
        assert staged_files(tmp_path / "cache" / f"node{i}") == []


def test_merge_parts_on_s3_refuses_missing_duplicated_and_damaged_parts(s3, tmp_path, run_cli, monkeypatch):
    src = tmp_path / "src"
    make_class_folder(src, per_class=10)
    url = f"s3://{bucket(s3)}/parts"
    ro = opts(s3, tmp_path / "cache")

    def part(i: int, n: int, **kw):
        return fastdata.convert(src, url, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD, workers=1),
                                                                 part=(i, n), remote=ro, **kw))

    part(0, 3)
    part(2, 3)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    code, _, err = run_cli("merge-parts", url)
    assert code == 2 and "1 of 3 part(s) missing or unfinished: 1/3" in err and "--part I/3" in err
    assert "manifest.json" not in objects(s3, url)
    with pytest.raises(UsageError, match=r"split in 3 parts, not 2; use the same N"):
        part(1, 2)  # refused before anything is written
    with pytest.raises(UsageError, match=r"part 2/3 is already converted; pass overwrite=True"):
        part(2, 3)
    before = {k: v for k, v in objects(s3, url).items() if "part-00000" in k or k == "shard-00000.h5"}
    part(2, 3, overwrite=True)  # converts that part again (docs/scale.md), not touching part 0's files
    assert {k: v for k, v in objects(s3, url).items() if "part-00000" in k or k == "shard-00000.h5"} == before and before
    part(1, 3)
    fs = s3.fs()
    victim = f"{url[5:]}/shard-00003.h5"
    data = fs.cat_file(victim)
    fs.rm_file(victim)
    with pytest.raises(DataError, match=rf"{url}/shard-00003.h5: missing, though part 2/3 recorded it"):
        fastdata.write.merge_parts(url, remote=ro)
    fs.pipe_file(victim, data[:-10])
    with pytest.raises(DataError, match=rf"{url}/shard-00003.h5: is {len(data) - 10} bytes, part 2/3 recorded"):
        fastdata.write.merge_parts(url, remote=ro)
    fs.pipe_file(victim, data)
    keys = fs.cat_file(f"{url[5:]}/keys.bin")  # the parts uploaded the sample keys too
    fs.rm_file(f"{url[5:]}/keys.bin")
    with pytest.raises(DataError, match=rf"{url}/keys.bin: missing, though the parts list it"):
        fastdata.write.merge_parts(url, remote=ro)
    fs.pipe_file(f"{url[5:]}/keys.bin", keys)
    report = fastdata.write.merge_parts(url, remote=ro)
    assert (report.parts, report.shards, report.samples) == (3, 4, 30)
    with pytest.raises(UsageError, match="already holds a finished dataset"):
        fastdata.write.merge_parts(url, remote=ro)
    with pytest.raises(UsageError, match="remote options apply to URL destinations only"):
        fastdata.write.merge_parts(tmp_path, remote=ro)


def test_part_upload_failure_leaves_no_record_and_resume_finishes(s3, tmp_path, run_cli, monkeypatch):
    src = tmp_path / "src"
    make_class_folder(src, per_class=10)
    one, url = f"s3://{bucket(s3)}/one", f"s3://{bucket(s3)}/parts"
    ro = opts(s3, tmp_path / "cache")
    fastdata.convert(src, one, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD, workers=1), remote=ro))
    _parts(s3, src, url, 2, tmp_path / "cache", which=[1])
    failed = subprocess.run([sys.executable, "-m", "fastdata", "convert", src, url, "--shard-size", str(SHARD),
                             "--part", "0/2", "--workers", "1", "--quiet"], cwd=ROOT, capture_output=True, text=True,
                            env=cli_env(s3, tmp_path / "cache", FASTDATA_FAULT="eio:upload:1"), timeout=120)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert f"uploaded to {url}" in failed.stderr and "--resume" in failed.stderr, failed.stderr
    names = set(objects(s3, url))
    assert ".fastdata-part-00000-of-00002.json" not in names and "manifest.json" not in names
    assert {"shard-00000.h5", ".fastdata-journal-part-00000-of-00002"} <= names
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("FASTDATA_REMOTE_CACHE", str(tmp_path / "elsewhere"))
    code, _, err = run_cli("merge-parts", url)
    assert code == 2 and "missing or unfinished: 0/2" in err
    code, _, err = run_cli("convert", src, url, "--shard-size", SHARD, "--part", "0/2", "--quiet")
    assert code == 2 and "was interrupted; pass --resume" in err
    code, out, err = run_cli("convert", src, url, "--shard-size", SHARD, "--part", "0/2", "--quiet", "--resume")
    assert code == 0, err
    assert "kept 1 finished shard" in out
    code, _, err = run_cli("merge-parts", url)
    assert code == 0, err
    same_remote(objects(s3, one), objects(s3, url))


def test_metadata_table_source_to_s3_whole_and_in_parts(s3, tmp_path):
    """A metadata table as the source (fields from its columns, keys from its paths) uploads too, whole
    or in parts (it used to stay in the local staging folder)."""
    src = tmp_path / "src"
    src.mkdir()
    rows = ["path,score"]
    for i in range(8):
        np.save(src / f"s{i}.npy", np.full((2,), i, np.float32))
        rows.append(f"s{i}.npy,{i / 2}")
    (src / "meta.csv").write_text("\n".join(rows) + "\n")
    one, url = f"s3://{bucket(s3)}/one", f"s3://{bucket(s3)}/parts"
    ro = opts(s3, tmp_path / "cache")

    def convert(dst: str, **kw):
        return fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=40, workers=1),
                                                                 remote=ro, **kw), meta=src / "meta.csv")

    report = convert(one)
    assert report.dst == one and report.shards >= 2
    assert {"manifest.json", "keys.bin"} <= set(objects(s3, one))
    convert(url, part=(1, 2))
    convert(url, part=(0, 2))
    assert fastdata.write.merge_parts(url, remote=ro).samples == 8
    same_remote(objects(s3, one), objects(s3, url))
