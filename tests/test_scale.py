"""Conversion on many machines: the Ray engine (one local Ray for the whole session, loopback only),
``--part I/N`` + ``merge-parts``, and ``fastdata merge``. Every result is compared byte for byte with
a one-machine conversion."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import make_class_folder
from crashkit import ROOT, cli, same_dataset

import fastdata
import fastdata.write
from fastdata.errors import FastdataError, UsageError

SHARD = 4000  # 30 samples of 432 B + label -> 4 shards


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray for all the Ray tests (they all live in this module, so this is once per session):
    2 CPUs, loopback only, no dashboard. Stopped before other modules run, so their forked workers
    never inherit Ray's threads. Yields its address."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # bind to 127.0.0.1, not the host's address
    ray = pytest.importorskip("ray")
    ctx = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    assert ctx.address_info["node_ip_address"] == "127.0.0.1"
    yield ctx.address_info["address"]
    ray.shutdown()


@pytest.fixture
def src(tmp_path: Path) -> Path:
    make_class_folder(tmp_path / "src", per_class=10)
    return tmp_path / "src"


def _local(src: Path, dst: Path, backend: str = "hdf5") -> Path:
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, shard_size=SHARD, workers=1)))
    return dst


# --- Ray engine ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_ray_engine_equals_local_engine(ray_cluster, src, tmp_path, backend):
    local = _local(src, tmp_path / "local", backend)
    opts = fastdata.WriteOptions(backend=backend, shard_size=SHARD, engine="ray")
    report = fastdata.convert(src, tmp_path / "ray", fastdata.ConvertConfig(write=opts))
    assert report.shards == 4 and report.engine == "ray"
    same_dataset(local, tmp_path / "ray")  # shards and manifest: the manifest records no timing


def test_ray_task_killed_mid_shard_is_retried_and_output_identical(ray_cluster, src, tmp_path):
    """A real ``fastdata convert --engine ray`` driver; the Ray worker writing shard 1 is SIGKILLed
    halfway through the shard. Ray runs the task again; the dataset is the local engine's."""
    local = _local(src, tmp_path / "local")
    ready = tmp_path / "ready"
    env = {**os.environ, "FASTDATA_FAULT": "pause1:mid_shard:1", "FASTDATA_FAULT_READY": str(ready)}
    proc = subprocess.Popen([sys.executable, "-m", "fastdata", "convert", src, tmp_path / "ray", "--shard-size",
                             str(SHARD), "--engine", "ray", "--ray-address", ray_cluster, "--quiet"],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the shard task never reached mid_shard"
            time.sleep(0.05)
        worker = int(ready.read_text())
        assert worker != proc.pid  # the shard is written in a Ray worker, not in the driver
        assert (tmp_path / "ray" / ".shard-00001.h5.partial").exists()  # killed with a half-written shard
        os.kill(worker, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "(Ray)" in out
    same_dataset(local, tmp_path / "ray")


def test_ray_task_that_keeps_failing_names_the_shard_and_keeps_finished_shards(ray_cluster, src, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTDATA_FAULT", "eio:mid_shard:2")  # every attempt at shard 2 hits an I/O error
    opts = fastdata.WriteOptions(shard_size=SHARD, engine="ray", workers=1)  # one at a time: 0, 1 finish first
    dst = tmp_path / "ray"
    with pytest.raises(FastdataError) as e:
        fastdata.convert(src, dst, fastdata.ConvertConfig(write=opts))
    msg = str(e.value)
    assert "shard shard-00002.h5 (samples" in msg and "Input/output error" in msg
    assert "resume=True" in msg and "\n" not in msg
    assert {"shard-00000.h5", "shard-00001.h5"} <= {p.name for p in dst.iterdir()}
    assert not (dst / "manifest.json").exists()
    monkeypatch.delenv("FASTDATA_FAULT")
    report = fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD), resume=True))
    assert report.kept == 2
    same_dataset(_local(src, tmp_path / "local"), dst)


def test_ray_engine_without_ray_installed_says_how_to_get_it(src, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as without the extra
    with pytest.raises(UsageError, match=r"engine=ray needs Ray: pip install 'fastdata\[ray\]'"):
        fastdata.convert(src, tmp_path / "d", fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD, engine="ray")))
    assert not (tmp_path / "d").exists()


def test_ray_options_are_checked(run_cli, src, tmp_path):
    code, _, err = run_cli("convert", src, tmp_path / "d", "--ray-address", "127.0.0.1:1")
    assert code == 2 and "--ray-address applies to --engine ray only" in err


def test_a_ray_address_nothing_listens_at_is_refused_at_once(src, tmp_path):
    """ray.init retries an address without a cluster without end (minutes of log lines, no error): refused in a line."""
    pytest.importorskip("ray")
    import socket

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # its own process: this module's tests share one Ray, to which this process may already be connected
    p = cli("convert", src, tmp_path / "d", "--engine", "ray", "--ray-address", f"127.0.0.1:{port}")
    assert p.returncode == 2 and f"cannot reach the Ray cluster at 127.0.0.1:{port}: Connection refused" in p.stderr
    assert not (tmp_path / "d").exists()


def test_url_shard_tasks_need_their_upload_settings(tmp_path, monkeypatch):
    """A shard task never writes a URL as a local folder: without the UrlSpec it carries (the Ray engine
    into s3://, tests/test_scale_remote.py) it is refused, saying so; a spec for another URL too."""
    from fastdata.write.shard_task import UrlSpec, publisher_for

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"s3://bucket/ds: a shard task for s3:// needs the upload settings"):
        publisher_for("s3://bucket/ds")
    with pytest.raises(UsageError, match=r"s3://bucket/ds: the shard task's upload settings name another URL"):
        publisher_for("s3://bucket/ds", UrlSpec("s3://bucket/other"))
    assert publisher_for("s3://bucket/ds/", UrlSpec("s3://bucket/ds")).where("shard-00000.h5") == \
        "s3://bucket/ds/shard-00000.h5"
    with pytest.raises(UsageError, match="remote options apply to URL destinations only"):
        fastdata.write.merge_parts(tmp_path, remote=fastdata.RemoteOptions())
    assert not (tmp_path / "s3:").exists() and not Path("s3:").exists()


# --- --part I/N + merge-parts --------------------------------------------------------------


def _parts(src: Path, dst: Path, n: int, which=None, backend: str = "hdf5") -> None:
    """Run ``fastdata convert --part I/N`` for each I (all at once, as separate processes)."""
    procs = [subprocess.Popen([sys.executable, "-m", "fastdata", "convert", src, dst, "--shard-size", str(SHARD),
                               "--format", backend, "--part", f"{i}/{n}", "--quiet"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in (range(n) if which is None else which)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "merge-parts" in out


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_three_parts_then_merge_parts_equals_one_machine(src, tmp_path, run_cli, backend):
    local = _local(src, tmp_path / "local", backend)
    _parts(src, tmp_path / "parts", 3, backend=backend)
    assert not (tmp_path / "parts" / "manifest.json").exists()
    with pytest.raises(fastdata.errors.IncompleteDatasetError):
        fastdata.open(tmp_path / "parts")  # parts alone are not a dataset
    code, out, err = run_cli("merge-parts", tmp_path / "parts")
    assert code == 0, err
    assert "merged 3 part(s)" in out
    same_dataset(local, tmp_path / "parts")  # also: no part records, journals or locks left


def test_merge_parts_refuses_a_missing_part(src, tmp_path, run_cli):
    _parts(src, tmp_path / "parts", 3, which=[0, 2])
    code, _, err = run_cli("merge-parts", tmp_path / "parts")
    assert code == 2
    assert "1 of 3 part(s) missing or unfinished: 1/3" in err and "--part I/3" in err
    assert not (tmp_path / "parts" / "manifest.json").exists()
    _parts(src, tmp_path / "parts", 3, which=[1])  # the missing part, later: now it merges
    assert run_cli("merge-parts", tmp_path / "parts")[0] == 0
    same_dataset(_local(src, tmp_path / "local"), tmp_path / "parts")


def test_merge_parts_refuses_duplicated_parts(src, tmp_path, run_cli):
    _parts(src, tmp_path / "parts", 3)
    _parts(src, tmp_path / "other", 2, which=[0])
    # a part of the same conversion split another way, copied in: its shards overlap part 0/3's
    shutil.copy(tmp_path / "other" / ".fastdata-part-00000-of-00002.json", tmp_path / "parts")
    code, _, err = run_cli("merge-parts", tmp_path / "parts")
    assert code == 2 and "split in 2 and 3 parts: duplicated parts" in err
    assert not (tmp_path / "parts" / "manifest.json").exists()
    # and a part run with another N is refused before it writes anything
    code, _, err = run_cli("convert", src, tmp_path / "other", "--shard-size", SHARD, "--part", "1/3", "--quiet")
    assert code == 2 and "split in 2 parts, not 3" in err


def test_merge_parts_refuses_a_part_whose_shard_is_gone_and_a_part_of_another_conversion(src, tmp_path, run_cli):
    _parts(src, tmp_path / "parts", 3)
    (tmp_path / "parts" / "shard-00003.h5").unlink()
    code, _, err = run_cli("merge-parts", tmp_path / "parts")
    assert code == 1 and "shard-00003.h5: missing, though part 2/3 recorded it" in err
    code, _, err = run_cli("convert", src, tmp_path / "parts", "--shard-size", SHARD, "--part", "2/3", "--quiet")
    assert code == 2 and "already converted; pass --overwrite" in err
    # part 2 again, with other options: merge-parts sees it belongs to another conversion
    code, _, err = run_cli("convert", src, tmp_path / "parts", "--shard-size", SHARD, "--part", "2/3", "--quiet",
                           "--overwrite", "--format", "lmdb")
    assert code == 0, err
    code, _, err = run_cli("merge-parts", tmp_path / "parts")
    assert code == 2 and "another conversion" in err


def test_a_part_of_another_conversion_is_refused_before_it_replaces_a_finished_parts_shards(src, tmp_path, run_cli):
    # part 1/2 run with another --shard-size (a typo in one array task): its plan names shard-00001.h5, which
    # part 0/2 had written, and it replaced it; merge-parts refused only later, part 0's work lost
    dst = tmp_path / "parts"
    _parts(src, dst, 2, which=[0])
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in dst.iterdir() if p.is_file()}
    code, _, err = run_cli("convert", src, dst, "--shard-size", 2 * SHARD, "--part", "1/2", "--quiet")
    assert code == 2 and "holds part 0/2 of another conversion (different options)" in err, err
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in dst.iterdir() if p.is_file()} == before
    _parts(src, dst, 2, which=[1])  # the same options: it merges
    assert run_cli("merge-parts", dst)[0] == 0
    same_dataset(_local(src, tmp_path / "local"), dst)


def test_part_argument_is_checked(src, tmp_path, run_cli):
    for bad, why in (("3/3", "I counts from 0 to N-1 = 2"), ("1-3", "expected I/N"), ("0/0", "N must be 1")):
        code, _, err = run_cli("convert", src, tmp_path / "p", "--part", bad)
        assert code == 2 and why in err, err
    assert not (tmp_path / "p").exists()


def test_interrupted_part_resumes_without_touching_other_parts(src, tmp_path, run_cli):
    dst = tmp_path / "parts"
    _parts(src, dst, 2, which=[0])
    before = {p.name: p.stat().st_mtime_ns for p in dst.iterdir()}
    failed = cli("convert", src, dst, "--shard-size", SHARD, "--part", "1/2", "--quiet",
                 env={"FASTDATA_FAULT": "eio:between_shards:3"})
    assert failed.returncode == 1 and "--resume" in failed.stderr
    assert all((dst / n).stat().st_mtime_ns == t for n, t in before.items())  # part 0 untouched
    code, _, err = run_cli("convert", src, dst, "--shard-size", SHARD, "--part", "1/2", "--quiet")
    assert code == 2 and "was interrupted; pass --resume" in err
    code, _, err = run_cli("convert", src, dst, "--shard-size", SHARD, "--part", "1/2", "--quiet", "--resume",
                           "--workers", 1)
    assert code == 0, err
    assert run_cli("merge-parts", dst)[0] == 0
    same_dataset(_local(src, tmp_path / "local"), dst)


# --- merge ---------------------------------------------------------------------------------


def _dataset(tmp_path: Path, name: str, backend: str, classes=("cat", "dog", "eel"), per_class=5, seed=0):
    arrays = make_class_folder(tmp_path / f"src_{name}", per_class=per_class, classes=classes, seed=seed)
    fastdata.convert(tmp_path / f"src_{name}", tmp_path / name, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, shard_size=SHARD, workers=1)))
    return tmp_path / name, arrays


def _expected(*parts: tuple[dict[str, np.ndarray], list[str]]) -> list[tuple[np.ndarray, str]]:
    """(array, class name) per sample, in merged order (each dataset's files sorted by path)."""
    return [(a[rel], rel.split("/")[0]) for a, _ in parts for rel in sorted(a)]


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_merge_reads_back_every_sample_with_its_label_and_links_shards(tmp_path, run_cli, backend):
    a, arr_a = _dataset(tmp_path, "a", backend, seed=1)
    b, arr_b = _dataset(tmp_path, "b", backend, per_class=3, seed=2)
    code, _, err = run_cli("merge", a, b, tmp_path / "m", "--quiet")
    assert code == 2 and "sample key 'cat/000.npy' is sample 0 of" in err  # same layout: keys collide
    code, out, err = run_cli("merge", a, b, tmp_path / "m", "--quiet", "--prefix-keys")
    assert code == 0, err
    assert "hard-linked" in out and "0 copied" in out
    m = fastdata.open(tmp_path / "m")
    want = _expected((arr_a, []), (arr_b, []))
    assert len(m) == len(want) == 24
    batch = m.get_batch(np.arange(len(m)))
    for i, (x, cls) in enumerate(want):
        assert np.array_equal(batch["x"][i], x), i
        assert m.classes[batch["label"][i]] == cls, i
    for s in m.manifest.shards:  # the same files as the inputs', not copies
        assert (tmp_path / "m" / s.file).stat().st_nlink == 2
    assert run_cli("verify", tmp_path / "m", "--deep", "--quiet")[0] == 0
    # merging a merged dataset again composes (its shards keep where they were written)
    code, _, err = run_cli("merge", b, tmp_path / "m", tmp_path / "m2", "--quiet", "--prefix-keys")
    assert code == 0, err
    m2 = fastdata.open(tmp_path / "m2")
    x2 = m2.get_batch(np.arange(len(m2)))["x"]
    assert np.array_equal(x2, np.concatenate([np.stack([x for x, _ in _expected((arr_b, []))]), batch["x"]]))


def test_merge_refuses_other_schemas_formats_and_classes(tmp_path, run_cli):
    a, _ = _dataset(tmp_path, "a", "hdf5")
    make_class_folder(tmp_path / "src_s", per_class=2, shape=(2, 6, 3, 4))
    fastdata.convert(tmp_path / "src_s", tmp_path / "s", fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD)))
    code, _, err = run_cli("merge", a, tmp_path / "s", tmp_path / "m")
    assert code == 2 and "field 'x' is float32 (2, 6, 3, 4)" in err and "merge datasets with the same schema" in err
    lm, _ = _dataset(tmp_path, "lm", "lmdb")
    code, _, err = run_cli("merge", a, lm, tmp_path / "m")
    assert code == 2 and "is lmdb but" in err
    b, _ = _dataset(tmp_path, "b", "hdf5", classes=("cat", "dog", "fox"))
    code, _, err = run_cli("merge", a, b, tmp_path / "m")
    assert code == 2 and "'fox' (not in the first)" in err and "lacks 'eel'" in err and "--remap-classes" in err
    assert not (tmp_path / "m").exists()
    code, _, err = run_cli("merge", a, a, "--overwrite")
    assert code == 2 and "inside the source" in err  # DST may never be one of the inputs


def test_merge_from_python_refuses_one_path_for_the_list_of_inputs(tmp_path):
    # merge("a", dst) took the string for a list of one-letter folders and said "/: this is a source folder"
    a, _ = _dataset(tmp_path, "a", "hdf5")
    for one in (str(a), a):
        with pytest.raises(UsageError, match=r"^inputs is one path \('.*a'\); give a list of dataset folders"):
            fastdata.merge(one, tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_merge_remap_classes_rewrites_labels(tmp_path, run_cli):
    a, arr_a = _dataset(tmp_path, "a", "lmdb", seed=1)
    b, arr_b = _dataset(tmp_path, "b", "lmdb", classes=("dog", "fox"), per_class=4, seed=2)
    code, out, err = run_cli("merge", a, b, tmp_path / "m", "--remap-classes", "--quiet", "--prefix-keys")
    assert code == 0, err
    assert "rewritten" in out and " 0 rewritten" not in out
    m = fastdata.open(tmp_path / "m")
    assert m.classes == ["cat", "dog", "eel", "fox"]
    batch = m.get_batch(np.arange(len(m)))
    for i, (x, cls) in enumerate(_expected((arr_a, []), (arr_b, []))):
        assert np.array_equal(batch["x"][i], x) and m.classes[batch["label"][i]] == cls, i
    assert fastdata.open(b).get_batch([0])["label"][0] == 0  # the input keeps its own labels


def test_merge_copies_where_links_are_refused_and_says_so(tmp_path, run_cli, monkeypatch):
    a, _ = _dataset(tmp_path, "a", "hdf5")
    b, _ = _dataset(tmp_path, "b", "hdf5", seed=3)

    def no_link(src, dst, **kw):
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "link", no_link)
    code, _, err = run_cli("merge", a, b, tmp_path / "m", "--method", "link", "--prefix-keys")
    assert code == 1 and "Invalid cross-device link" in err
    assert not (tmp_path / "m").exists()
    code, out, err = run_cli("merge", a, b, tmp_path / "m", "--quiet", "--prefix-keys")
    assert code == 0, err
    assert "0 hard-linked, 4 copied" in out and "copied because hard links were refused" in out
    assert "Invalid cross-device link" in out
    assert all(p.stat().st_nlink == 1 for p in (tmp_path / "m").iterdir())
    assert run_cli("verify", tmp_path / "m", "--quiet")[0] == 0


def test_merge_manifest_needs_a_reader_that_knows_origins(tmp_path, run_cli):
    a, _ = _dataset(tmp_path, "a", "hdf5")
    # the same input twice is fine, its keys told apart by a prefix per input (docs/scale.md)
    assert run_cli("merge", a, a.parent / "a", tmp_path / "m", "--quiet", "--key-prefix", "1", "--key-prefix", "2")[0] == 0
    m = fastdata.format.read_manifest(tmp_path / "m")
    assert m.version >= fastdata.format.ORIGIN_VERSION  # (conversions now write version 3: keys)
    assert [s.origin for s in m.shards][len(m.shards) // 2:] == [s.start for s in m.shards][: len(m.shards) // 2]
    with pytest.raises(UsageError):
        fastdata.merge([], tmp_path / "x")


@pytest.mark.slow
def test_scale_benchmark_quick_run_completes(tmp_path):
    """benchmarks/bench_scale.py --quick (0.1 GB): every engine runs, outputs are byte-identical (the script
    exits non-zero otherwise) and the table is written. No timing is asserted."""
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_scale.py"), "--quick", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads((tmp_path / "scale_quick.json").read_text())
    assert {row["engine"] for row in data["rows"]} >= {"local, 2 workers (with nice 0 cluster)",
                                                      "ray, warm cluster, workers at nice 0"}
    assert "| engine |" in (tmp_path / "scale_quick.md").read_text()
