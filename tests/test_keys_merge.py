"""Sample keys everywhere (issue 18): ``fastdata merge`` keeps keys unique (in merged order, collisions
refused unless prefixed, inputs without keys never dropped silently), ``merge-parts`` keeps keys.bin,
and datasets on object storage (a moto S3 server on 127.0.0.1) carry and read their keys."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import bucket, edit_manifest, make_class_folder, opts

import fastdata
from fastdata.errors import CorruptShardError, UsageError
from fastdata.measure.verify import verify

SHARD = 4000  # 15 samples of 432 B + label -> 2 shards


def _src(root: Path, tag: str, per_class: int = 5, seed: int = 0) -> list[str]:
    """A class folder whose file names start with ``tag`` (so two sources' keys differ); its keys, sorted."""
    make_class_folder(root, per_class=per_class, seed=seed)
    for p in sorted(root.rglob("*.npy")):
        p.rename(p.with_name(tag + p.name))
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.npy"))


def _convert(src: Path, dst: Path, backend: str = "hdf5") -> Path:
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, shard_size=SHARD, workers=1)))
    return dst


def _pair(tmp_path: Path, backend: str = "hdf5", tag_b: str = "b") -> tuple[Path, Path, list[str], list[str]]:
    ka = _src(tmp_path / "src_a", "a", seed=1)
    kb = _src(tmp_path / "src_b", tag_b, per_class=3, seed=2)
    return _convert(tmp_path / "src_a", tmp_path / "a", backend), _convert(tmp_path / "src_b", tmp_path / "b", backend), ka, kb


def _all_keys(ds: fastdata.Dataset) -> list[str]:
    return ds.keys(np.arange(len(ds)))


# --- merge ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_merge_keeps_keys_in_merged_order(tmp_path, run_cli, backend):
    a, b, ka, kb = _pair(tmp_path, backend)
    code, out, err = run_cli("merge", a, b, tmp_path / "m", "--quiet")
    assert code == 0, err
    assert "sample keys kept" in out
    m = fastdata.open(tmp_path / "m", fields=["x", "key"])
    assert _all_keys(m) == ka + kb
    assert m.key(len(ka)) == kb[0] and m.key(-1) == kb[-1]
    assert m.index_of(kb[2]) == len(ka) + 2 and m.index_of(ka[4]) == 4
    with pytest.raises(KeyError):
        m.index_of("nope.npy")
    # the samples themselves follow their keys: sample keyed k holds the file k of its source
    batch = m.get_batch(np.arange(len(m)))
    for k, x in zip(batch["key"], batch["x"]):
        src = tmp_path / ("src_a" if Path(k).name.startswith("a") else "src_b") / k
        assert np.array_equal(x, np.load(src)), k
    man = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert man["keys"]["kind"] == "file" and man["keys"]["file"] == "keys.bin"
    assert man["keys"]["bytes"] == (tmp_path / "m" / "keys.bin").stat().st_size
    assert verify(tmp_path / "m").ok
    # subsets by key and a loader returning keys, over the merged dataset
    sub = m.subset([kb[0], ka[1]])
    assert _all_keys(sub) == [kb[0], ka[1]]
    with fastdata.loader(m, 4, shuffle=True, device="cpu", num_workers=1, fields=["x", "key"]) as ld:
        seen = [k for batch in ld for k in batch["key"]]
    assert sorted(seen) == sorted(ka + kb)


def test_merge_refuses_a_key_in_two_inputs_and_writes_nothing(tmp_path, run_cli):
    a, _, ka, _ = _pair(tmp_path)
    shutil.copytree(a, tmp_path / "copy")
    code, _, err = run_cli("merge", a, tmp_path / "copy", tmp_path / "m")
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert f"sample key {ka[0]!r} is sample 0 of {a} and sample 0 of {tmp_path / 'copy'}" in line
    assert "--prefix-keys" in line and "--key-prefix" in line and "--drop-keys" in line
    assert not (tmp_path / "m").exists()
    with pytest.raises(UsageError, match="keys must stay unique"):
        fastdata.merge([a, a], tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_merge_prefixes_keys_by_folder_name_or_given_prefixes(tmp_path, run_cli):
    a, _, ka, _ = _pair(tmp_path)
    shutil.copytree(a, tmp_path / "again")
    code, out, err = run_cli("merge", a, tmp_path / "again", tmp_path / "m", "--prefix-keys", "--quiet")
    assert code == 0, err
    assert "under each input's prefix" in out
    m = fastdata.open(tmp_path / "m")
    assert _all_keys(m) == [f"a/{k}" for k in ka] + [f"again/{k}" for k in ka]
    assert m.index_of(f"again/{ka[3]}") == len(ka) + 3
    inputs = m.manifest.source["inputs"]
    assert [i["key_prefix"] for i in inputs] == ["a", "again"]
    # one prefix per input, '' keeps an input's keys
    code, _, err = run_cli("merge", a, tmp_path / "again", tmp_path / "m2", "--key-prefix", "", "--key-prefix",
                           "v2/extra", "--quiet")
    assert code == 0, err
    assert _all_keys(fastdata.open(tmp_path / "m2")) == ka + [f"v2/extra/{k}" for k in ka]
    # prefixes that still collide are caught like any other collision
    code, _, err = run_cli("merge", a, tmp_path / "again", tmp_path / "m3", "--key-prefix", "x", "--key-prefix", "x")
    assert code == 2 and f"sample key 'x/{ka[0]}'" in err
    code, _, err = run_cli("merge", a, tmp_path / "again", tmp_path / "m3", "--key-prefix", "x")
    assert code == 2 and "1 key prefix(es) for 2 input(s)" in err
    code, _, err = run_cli("merge", a, tmp_path / "again", tmp_path / "m3", "--key-prefix", "x/", "--key-prefix", "y")
    assert code == 2 and "no leading or trailing '/'" in err
    code, _, err = run_cli("merge", a, tmp_path / "again", tmp_path / "m3", "--prefix-keys", "--drop-keys")
    assert code == 2 and "not allowed with" in err  # argparse: one key option at a time
    with pytest.raises(UsageError, match="contradict"):
        fastdata.merge([a, tmp_path / "again"], tmp_path / "m3", key_prefixes="names", drop_keys=True)
    # the same folder name twice: --prefix-keys cannot tell them apart
    (tmp_path / "other").mkdir()
    shutil.copytree(a, tmp_path / "other" / "a")
    code, _, err = run_cli("merge", a, tmp_path / "other" / "a", tmp_path / "m3", "--prefix-keys")
    assert code == 2 and "the same folder name 'a'" in err and "--key-prefix once per input" in err
    assert not (tmp_path / "m3").exists()


def _strip_keys(root: Path) -> None:
    """Make ``root`` what a fastdata before keys wrote (format version 2, no keys)."""
    (root / "keys.bin").unlink()

    def edit(m):
        m["version"] = 2
        m.pop("keys")

    edit_manifest(root, edit)


def test_merge_refuses_inputs_without_keys_beside_inputs_with_keys(tmp_path, run_cli):
    a, b, ka, kb = _pair(tmp_path)
    _strip_keys(b)
    code, _, err = run_cli("merge", a, b, tmp_path / "m")
    assert code == 2
    assert f"{b}: has no sample keys" in err and f"but {a} has" in err and "--drop-keys" in err
    assert not (tmp_path / "m").exists()
    code, out, err = run_cli("merge", a, b, tmp_path / "m", "--drop-keys", "--quiet")
    assert code == 0, err
    assert "sample keys dropped (--drop-keys)" in out
    m = fastdata.open(tmp_path / "m")
    assert m.manifest.keys is None and not (tmp_path / "m" / "keys.bin").exists()
    with pytest.raises(UsageError, match="no sample keys \\(merged with --drop-keys"):
        m.key(0)
    with pytest.raises(UsageError, match="no sample keys"):
        fastdata.open(tmp_path / "m", fields=["x", "key"])
    # inputs that all lack keys merge as before (nothing to drop), and cannot be prefixed
    _strip_keys(a)
    code, out, err = run_cli("merge", a, b, tmp_path / "m2", "--quiet")
    assert code == 0 and "no sample keys (the inputs have none)" in out
    code, _, err = run_cli("merge", a, b, tmp_path / "m3", "--prefix-keys")
    assert code == 2 and "no sample keys to prefix" in err


def test_merge_of_array_datasets_keyed_by_index(tmp_path, run_cli):
    for name, n in (("a", 5), ("b", 3)):
        (tmp_path / f"src_{name}").mkdir()
        np.save(tmp_path / f"src_{name}" / "x.npy", np.arange(n * 2, dtype=np.float32).reshape(n, 2))
        fastdata.convert(tmp_path / f"src_{name}" / "x.npy", tmp_path / name)
        assert fastdata.open(tmp_path / name).manifest.keys.kind == "index"
    code, _, err = run_cli("merge", tmp_path / "a", tmp_path / "b", tmp_path / "m")
    assert code == 2 and "sample key '0' is sample 0 of" in err  # row 0 of each: the same key
    code, _, err = run_cli("merge", tmp_path / "a", tmp_path / "b", tmp_path / "m", "--prefix-keys", "--quiet")
    assert code == 0, err
    m = fastdata.open(tmp_path / "m")
    assert _all_keys(m) == [f"a/{i}" for i in range(5)] + [f"b/{i}" for i in range(3)]
    assert m.index_of("b/1") == 6


def test_merged_keys_file_is_checksummed(tmp_path, run_cli):
    a, b, _, _ = _pair(tmp_path)
    assert run_cli("merge", a, b, tmp_path / "m", "--quiet")[0] == 0
    kb = tmp_path / "m" / "keys.bin"
    data = bytearray(kb.read_bytes())
    data[-1] ^= 0x20  # same size, other bytes: only the checksum can tell
    kb.write_bytes(bytes(data))
    report = verify(tmp_path / "m")
    assert not report.ok and report.bad_shards == ["keys.bin"]
    code, out, _ = run_cli("verify", tmp_path / "m", "--quiet")
    assert code == 1 and "keys.bin" in out


def test_merge_with_remapped_classes_keeps_keys(tmp_path, run_cli):
    ka = _src(tmp_path / "src_a", "a", seed=1)
    make_class_folder(tmp_path / "src_b", per_class=2, classes=("dog", "fox"), seed=2)
    kb = sorted(str(p.relative_to(tmp_path / "src_b")) for p in (tmp_path / "src_b").rglob("*.npy"))
    a, b = _convert(tmp_path / "src_a", tmp_path / "a", "lmdb"), _convert(tmp_path / "src_b", tmp_path / "b", "lmdb")
    code, _, err = run_cli("merge", a, b, tmp_path / "m", "--remap-classes", "--quiet")
    assert code == 0, err
    m = fastdata.open(tmp_path / "m", fields=["label", "key"])
    batch = m.get_batch(np.arange(len(m)))
    assert batch["key"] == ka + kb
    assert [m.classes[c] for c in batch["label"]] == [k.split("/")[0] for k in ka + kb]


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_a_merged_compressed_dataset_merges_again_with_remapped_classes(tmp_path, backend, run_cli):
    """Its shards are rewritten with the codec of the conversion behind the merge (a merge's own source names
    none: the rewrite raised a ValueError from the shard writer)."""
    cfg = fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, compression="lz4"))
    src = {n: make_class_folder(tmp_path / n, per_class=2, classes=c, shape=(2048,), seed=i)
           for i, (n, c) in enumerate([("a", ("cat", "dog")), ("b", ("dog", "eel")), ("c", ("ant", "cat"))])}
    for n in src:
        fastdata.convert(tmp_path / n, tmp_path / f"{n}.ds", cfg)
    fastdata.merge([tmp_path / "a.ds", tmp_path / "b.ds"], tmp_path / "ab", remap_classes=True, key_prefixes="names")
    fastdata.merge([tmp_path / "c.ds", tmp_path / "ab"], tmp_path / "cab", remap_classes=True, key_prefixes="names")
    m = fastdata.open(tmp_path / "cab")
    batch = m.get_batch(np.arange(len(m)))
    want = [(k.split("/")[0], a) for n in ("c", "a", "b") for k, a in src[n].items()]
    assert [m.classes[c] for c in batch["label"]] == [c for c, _ in want]
    assert np.array_equal(batch["x"], np.stack([a for _, a in want]))
    code, out, _ = run_cli("info", tmp_path / "cab")  # the codec, from the inputs' sources (a merge's names none)
    assert code == 0 and any(ln.startswith("compress  lz4 on x") for ln in out.splitlines())


# --- merge-parts ---------------------------------------------------------------------------------


def test_merge_parts_keeps_and_checks_the_keys_file(tmp_path, run_cli):
    _src(tmp_path / "src", "s", per_class=10)
    local = _convert(tmp_path / "src", tmp_path / "local")
    dst = tmp_path / "parts"
    for i in range(2):
        code, _, err = run_cli("convert", tmp_path / "src", dst, "--shard-size", SHARD, "--part", f"{i}/2", "--quiet",
                               "--workers", 1)
        assert code == 0, err
    (dst / "keys.bin").unlink()
    code, _, err = run_cli("merge-parts", dst)
    assert code == 1 and "keys.bin: missing, though the parts list it" in err
    assert not (dst / "manifest.json").exists()
    (dst / "keys.bin").write_bytes((local / "keys.bin").read_bytes()[:-1] + b"!")
    code, _, err = run_cli("merge-parts", dst)
    assert code == 1 and "keys.bin: is not the keys file the parts recorded" in err
    code, _, err = run_cli("convert", tmp_path / "src", dst, "--shard-size", SHARD, "--part", "1/2", "--quiet",
                           "--workers", 1, "--overwrite")
    assert code == 0, err
    code, _, err = run_cli("merge-parts", dst)
    assert code == 0, err
    assert (dst / "keys.bin").read_bytes() == (local / "keys.bin").read_bytes()
    assert _all_keys(fastdata.open(dst)) == _all_keys(fastdata.open(local))


# --- object storage ------------------------------------------------------------------------------


@pytest.fixture
def s3k(request):
    """The session's S3 server (tests/conftest.py), for tests that need s3fs and moto."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    return request.getfixturevalue("s3")


def test_keys_of_a_dataset_converted_to_s3(s3k, tmp_path, run_cli):
    keys = _src(tmp_path / "src", "s", per_class=10)
    local = _convert(tmp_path / "src", tmp_path / "local")
    url = f"s3://{bucket(s3k)}/ds"
    fastdata.convert(tmp_path / "src", url, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD, workers=1), remote=opts(s3k, tmp_path / "up")))
    names = sorted(p.rsplit("/", 1)[-1] for p in s3k.fs().ls(url[5:], refresh=True))
    assert "keys.bin" in names and "manifest.json" in names
    cache = tmp_path / "cache"
    ds = fastdata.open(url, fields=["x", "key"], remote=opts(s3k, cache))
    assert not any(cache.glob("*.bin"))  # keys are fetched on first use, not at open
    assert _all_keys(ds) == _all_keys(fastdata.open(local)) == keys
    assert ds.manifest.keys == fastdata.open(local).manifest.keys  # the same bytes and checksum
    algorithm, _, digest = str(ds.manifest.keys.checksum).partition(":")
    assert (cache / f"{algorithm}-{digest}.bin").read_bytes() == (local / "keys.bin").read_bytes()
    assert ds.index_of(keys[7]) == 7
    sub = ds.subset([keys[3], keys[0]])
    assert sub.get_batch([0, 1])["key"] == [keys[3], keys[0]]
    assert np.array_equal(sub.get_batch([0])["x"][0], np.load(tmp_path / "src" / keys[3]))
    # a loader over the URL, with forked reader processes: each maps the cached keys file itself
    with fastdata.loader(url, 8, device="cpu", num_workers=2, fields=["x", "key"], remote=opts(s3k, cache),
                         config=fastdata.LoaderConfig(mode="processes")) as ld:
        seen = [k for batch in ld for k in batch["key"]]
    assert sorted(seen) == keys
    report = verify(url, remote=opts(s3k, tmp_path / "vcache"))
    assert report.ok, report.problems
    ds.close()


def test_corrupted_remote_keys_file_is_caught_by_the_checksum(s3k, tmp_path):
    _src(tmp_path / "src", "s", per_class=4)
    url = f"s3://{bucket(s3k)}/ds"
    fastdata.convert(tmp_path / "src", url, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=SHARD, workers=1), remote=opts(s3k, tmp_path / "up")))
    fs = s3k.fs()
    where = url[5:] + "/keys.bin"
    data = bytearray(fs.cat_file(where))
    data[-2] ^= 0x01  # same size: only the checksum can tell
    fs.pipe_file(where, bytes(data))
    ds = fastdata.open(url, remote=opts(s3k, tmp_path / "cache"))
    assert len(ds.get_batch([0, 1])["x"]) == 2  # the samples are fine; only keys are refused
    with pytest.raises(CorruptShardError) as e:
        ds.key(0)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{url}/keys.bin: ") and "checksum" in msg
    assert not list((tmp_path / "cache").glob("*.bin"))  # never kept in the cache
    report = verify(url, remote=opts(s3k, tmp_path / "vcache"))
    assert not report.ok and report.bad_shards == ["keys.bin"]
    assert f"{url}/keys.bin" in str(report.problems[0])


def test_remote_keys_file_stays_pinned_while_shards_are_evicted(s3k, tmp_path):
    keys = _src(tmp_path / "src", "s", per_class=20)
    url = f"s3://{bucket(s3k)}/ds"
    fastdata.convert(tmp_path / "src", url, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=2000, workers=1), remote=opts(s3k, tmp_path / "up")))
    probe = fastdata.open(url, remote=opts(s3k, tmp_path / "probe"))
    biggest = max(s.bytes for s in probe.manifest.shards)
    assert len(probe.manifest.shards) >= 12
    limit = probe.manifest.keys.bytes + 5 * biggest  # the keys file and a few shards: most shards get evicted
    cache = tmp_path / "cache"
    ds = fastdata.open(url, fields=["x", "key"], remote=opts(s3k, cache, cache_limit=limit))
    assert ds.key(0) == keys[0]
    keys_file = ds.remote.keys_path()
    for s in ds.manifest.shards:  # one shard per batch, in order: every shard is downloaded once
        batch = ds.get_batch(np.arange(s.start, s.start + s.count))
        assert batch["key"] == keys[s.start : s.start + s.count]
        assert keys_file.is_file() and ds.remote.cache.held_bytes() <= limit
    assert ds.remote.stats()["downloads"] == len(ds.manifest.shards) + 1  # each shard once, and keys.bin
    assert len(list(cache.glob("*.h5"))) < len(ds.manifest.shards)  # shards were evicted; keys.bin was not
    assert ds.index_of(keys[-1]) == len(keys) - 1
    ds.close()
