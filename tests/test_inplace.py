"""fastdata index: datasets over existing HDF5, .npy and Zarr files, read in place."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import h5py
import hdf5plugin
import numpy as np
import pytest
import torch

import fastdata
from fastdata.errors import CorruptShardError, DataError, UsageError
from fastdata.format import inplace
from fastdata.loaders import LoaderConfig
from fastdata.measure.verify import verify
from fastdata.world import World

N = 90


def _arrays(n: int = N, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 2, 5, 3)).astype(np.float32), "y": np.arange(n, dtype=np.int64),
            "m": rng.integers(0, 255, (n, 4), dtype=np.uint8)}


@pytest.fixture(autouse=True, params=["chunks", "whole"])
def small_whole(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Each test twice: tiny columns read a chunk at a time, as large ones are, and read whole."""
    if request.param == "chunks":
        monkeypatch.setattr(inplace, "_WHOLE_COLUMN_BYTES", 0)


def _h5(path: str, a: dict[str, np.ndarray]) -> None:
    with h5py.File(path, "w") as f:
        f["x"] = a["x"]  # contiguous
        f.create_dataset("grp/y", data=a["y"], chunks=(16,))
        f.create_dataset("xgz", data=a["x"], chunks=(7, 2, 5, 3), compression="gzip", shuffle=True)
        f.create_dataset("xlz", data=a["x"], chunks=(11, 1, 5, 3), **hdf5plugin.LZ4())
        f.create_dataset("m", data=a["m"], chunks=(10, 4), compression="lzf")  # lzf: through h5py
        f.create_dataset("x4", data=a["x"], chunks=(8, 2, 5, 3), shuffle=True, **hdf5plugin.LZ4(nbytes=64))
        f.create_dataset("xz", data=a["x"], chunks=(13, 2, 5, 3), **hdf5plugin.Zstd())
        f.create_dataset("xb", data=a["x"], chunks=(6, 2, 5, 3), **hdf5plugin.Blosc(cname="lz4"))


H5_FIELDS = {"x": "/x", "y": "/grp/y", "xgz": "/xgz", "xlz": "xlz", "m": "/m", "x4": "/x4", "xz": "/xz", "xb": "/xb"}
FLOATS = ("x", "xgz", "xlz", "x4", "xz", "xb")


@pytest.fixture
def h5index(tmp_path):
    a = _arrays()
    _h5(str(tmp_path / "data.h5"), a)
    fastdata.index(tmp_path / "data.h5", tmp_path / "idx", H5_FIELDS)
    return tmp_path / "idx", a


def test_hdf5_fields_bit_exact(h5index):
    root, a = h5index
    ds = fastdata.open(root)
    idx = np.array([89, 3, 3, 0, 45, 44, 12, 60, 7])
    b = ds.get_batch(idx)
    for name in FLOATS:
        assert np.array_equal(b[name], a["x"][idx]) and b[name].dtype == np.float32, name
    fast = {n for n, c in ds.readers[0].columns.items() if getattr(c.handle(), "direct", None) is not None}
    assert fast == {"xgz", "x4", "xz", "xb", "y"}  # read with pread + our decode, no h5py per batch
    assert np.array_equal(b["y"], a["y"][idx]) and np.array_equal(b["m"], a["m"][idx])
    with h5py.File(root.parent / "data.h5") as f:  # and against h5py's own reads, every sample
        full = ds.get_batch(np.arange(N))
        for name, path in H5_FIELDS.items():
            assert np.array_equal(full[name], f[path][...]), name
    assert ds.keys([4, 7]) == ["4", "7"] and ds.index_of("12") == 12
    sub = ds.subset([5, 1])
    assert np.array_equal(sub.get_batch([0, 1])["y"], [5, 1])
    parts = ds.split({"a": 0.5, "b": 0.5}, seed=1)
    assert sorted(parts["a"].column("y").tolist() + parts["b"].column("y").tolist()) == list(range(N))


def test_glob_of_hdf5_files_and_ddp_shares(tmp_path):
    a = _arrays(100)
    for i, (s, e) in enumerate([(0, 30), (30, 70), (70, 100)]):
        _h5(str(tmp_path / f"f{i}.h5"), {k: v[s:e] for k, v in a.items()})
    root = tmp_path / "idx"
    fastdata.index(str(tmp_path / "f*.h5"), root, {"x": "/xgz", "y": "/grp/y"})
    ds = fastdata.open(root)
    assert len(ds) == 100 and len(ds.manifest.shards) == 3
    assert np.array_equal(ds.get_batch(np.arange(100))["x"], a["x"])
    assert np.array_equal(ds.get_batch([31, 29, 99])["y"], [31, 29, 99])  # rows across file boundaries
    for shuffle in (True, fastdata.Shards()):
        shares = []
        for rank in range(3):
            ld = fastdata.loader(root, 8, shuffle=shuffle, device="cpu", num_workers=1, seed=3)
            ld._fixed_world = World(rank=rank, size=3)
            shares.append(_rows(ld, ds))
            ld.close()
        assert len({len(s) for s in shares}) == 1
        flat = [i for s in shares for i in s]
        assert set(flat) == set(range(100)) and len(flat) == 102  # 2 wrapped to even the shares


def _rows(ld, ds) -> list[int]:
    """Which stored samples a loader delivered, found from their x values."""
    ref = ds.get_batch(np.arange(len(ds)))["x"].reshape(len(ds), -1)[:, 0]
    out = []
    for b in ld:
        out += [int(np.flatnonzero(ref == v)[0]) for v in b["x"].reshape(len(b["x"]), -1)[:, 0].tolist()]
    return out


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_resume_exact_with_shards_shuffle_over_chunks(h5index, mode):
    root, _ = h5index
    cfg = LoaderConfig(mode=mode)

    def ids(ld):
        return [b["y"].tolist() for b in ld]

    full = fastdata.loader(root, 8, shuffle=fastdata.Shards(), seed=2, device="cpu", num_workers=2, config=cfg,
                           fields=["y", "xgz"])
    expected = ids(full)
    assert sorted(i for b in expected for i in b) == list(range(N))
    ld = fastdata.loader(root, 8, shuffle=fastdata.Shards(), seed=2, device="cpu", num_workers=2, config=cfg,
                         fields=["y", "xgz"])
    seen = []
    for b in ld:
        seen.append(b["y"].tolist())
        if len(seen) == 4:
            state = ld.state_dict()
            break
    fresh = fastdata.loader(root, 8, shuffle=fastdata.Shards(), seed=2, device="cpu", num_workers=2, config=cfg,
                            fields=["y", "xgz"])
    fresh.load_state_dict({**state, "shuffle": "chunks"})  # a state of older fastdata, whose name for it was "chunks"
    assert seen + ids(fresh) == expected
    for x in (full, ld, fresh):
        x.close()


def test_shards_shuffle_reads_each_chunk_once(h5index):
    root, a = h5index
    ds = fastdata.open(root, fields=["xgz"])
    ld = fastdata.loader(ds, 5, shuffle=fastdata.Shards(), seed=1, device="cpu", num_workers=0)
    got = np.concatenate([b["xgz"].numpy() for b in ld])
    assert sorted(got[:, 0, 0, 0].tolist()) == sorted(a["x"][:, 0, 0, 0].tolist())
    col = ds.readers[0].columns["xgz"]
    assert col.decoded_bytes() == a["x"].nbytes  # read amplification 1: every chunk decoded once


def test_npy_and_zarr(tmp_path):
    zarr = pytest.importorskip("zarr")
    a = _arrays()
    np.save(tmp_path / "x.npy", a["x"])
    np.save(tmp_path / "y.npy", a["y"])
    fastdata.index(tmp_path / "x.npy", tmp_path / "inpy", {"x": "x.npy", "y": "y.npy"})
    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    g.create_array("x", shape=a["x"].shape, chunks=(16, 2, 5, 3), dtype="f4")[:] = a["x"]
    g.create_array("lab/y", shape=(N,), chunks=(32,), dtype="i8")[:] = a["y"]
    z2 = zarr.create_array(str(tmp_path / "v2.zarr"), shape=a["x"].shape, chunks=(10, 2, 5, 3), dtype="f4",
                           zarr_format=2)
    z2[:] = a["x"]
    fastdata.index(tmp_path / "g.zarr", tmp_path / "iz", {"x": "x", "y": "lab/y"})
    fastdata.index(tmp_path / "v2.zarr", tmp_path / "iz2")
    z3 = zarr.create_array(str(tmp_path / "v3.zarr"), shape=a["x"].shape, chunks=(10, 2, 5, 3), dtype="f4",
                           compressors=None)
    z3[:] = a["x"]
    zs = zarr.create_array(str(tmp_path / "sh.zarr"), shape=a["x"].shape, chunks=(5, 2, 5, 3), shards=(20, 2, 5, 3),
                           dtype="f4")
    zs[:] = a["x"]
    fastdata.index(tmp_path / "v3.zarr", tmp_path / "iz3")
    fastdata.index(tmp_path / "sh.zarr", tmp_path / "izs")
    idx = np.array([3, 88, 0, 41, 40])
    direct = {"iz": True, "iz2": True, "iz3": True, "izs": False}  # sharded: read through zarr
    for root, fast in direct.items():
        col = fastdata.open(tmp_path / root).readers[0].columns["x"]
        assert (col.handle().direct is not None) == fast, root
    for root in ("inpy", "iz", "iz2", "iz3", "izs"):
        b = fastdata.open(tmp_path / root).get_batch(idx)
        assert np.array_equal(b["x"], a["x"][idx]), root
        if "y" in b:
            assert np.array_equal(b["y"], a["y"][idx]), root
        ld = fastdata.loader(tmp_path / root, 16, device="cpu", num_workers=2)
        assert sum(len(b["x"]) for b in ld) == N
        ld.close()


def test_modified_source_is_refused(h5index):
    root, _ = h5index
    src = root.parent / "data.h5"
    ds = fastdata.open(root)
    ds.get_batch([1])
    with open(src, "ab") as f:  # grown (appended to) while a dataset reads it
        f.write(b"\0" * 100)
    with pytest.raises(CorruptShardError, match=r"data\.h5: changed since it was indexed"):
        fastdata.open(root)
    with pytest.raises(CorruptShardError, match=r"data\.h5: changed while open"):
        ds.get_batch([1])
    report = verify(root)
    assert not report.ok and "data.h5" in str(report.problems[0])
    ds.close()
    with pytest.raises(CorruptShardError, match="data.h5"):  # reopening its handles checks again
        ds.get_batch([1])


def test_touched_source_is_refused(h5index):
    root, _ = h5index
    src = root.parent / "data.h5"
    st = os.stat(src)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(CorruptShardError, match=r"data\.h5: changed since it was indexed \(modified"):
        fastdata.open(root)


def test_same_size_rewrite_caught_by_metadata_or_checksum(tmp_path):
    a = _arrays()
    np.save(tmp_path / "x.npy", a["x"])
    fastdata.index(tmp_path / "x.npy", tmp_path / "i", checksum=True)
    assert verify(tmp_path / "i", deep=True).ok
    st = os.stat(tmp_path / "x.npy")
    b = a["x"].copy()
    b[3] += 1
    np.save(tmp_path / "x.npy", b)
    os.utime(tmp_path / "x.npy", ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same time: only the content
    quick = verify(tmp_path / "i")  # a file this small is sampled whole (sample_checksum)
    assert not quick.ok and "blocks sampled across its content differ" in str(quick.problems[0])
    deep = verify(tmp_path / "i", deep=True)
    assert not deep.ok and "content checksum" in str(deep.problems[0])


def test_bad_paths_and_fields_give_one_line_errors(tmp_path):
    a = _arrays()
    _h5(str(tmp_path / "d.h5"), a)
    with h5py.File(tmp_path / "e.h5", "w") as f:
        f["x"] = a["x"][:10]
    cases = [
        (lambda: fastdata.index(tmp_path / "d.h5", tmp_path / "o", {"x": "/nope"}), DataError, r"d\.h5: no dataset '/nope'"),
        (lambda: fastdata.index(tmp_path / "d.h5", tmp_path / "o", {"x": "/grp"}), DataError, "is a group"),
        (lambda: fastdata.index(tmp_path / "d.h5", tmp_path / "o"), UsageError, "name the datasets"),
        (lambda: fastdata.index(tmp_path / "missing.h5", tmp_path / "o", {"x": "/x"}), UsageError, "missing.h5: no such"),
        (lambda: fastdata.index(str(tmp_path / "*.h5"), tmp_path / "o", {"x": "/x", "y": "/grp/y"}), DataError,
         r"e\.h5: no dataset '/grp/y'"),
        (lambda: fastdata.index(tmp_path / "e.h5", tmp_path / "o", {"x": "/x", "y": "/x"}), None, None),
    ]
    for fn, err, match in cases:
        if err is None:
            fn()
            continue
        with pytest.raises(err, match=match) as e:
            fn()
        assert "\n" not in str(e.value)
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["x"] = a["x"]
        f["y"] = a["y"][:50]
    with pytest.raises(DataError, match=r"f\.h5: /y: has 50 samples but .*f\.h5: /x has 90"):
        fastdata.index(tmp_path / "f.h5", tmp_path / "p", {"x": "/x", "y": "/y"})
    with pytest.raises(UsageError, match="not empty"):
        fastdata.index(tmp_path / "e.h5", tmp_path / "o", {"x": "/x"})


def test_shards_shuffle_takes_a_converted_datasets_shards_and_chunks_is_gone(tmp_path):
    from fastdata import ConvertConfig, WriteOptions, convert

    x = _arrays()["x"]
    np.save(tmp_path / "x.npy", x)
    convert(None, tmp_path / "conv", ConvertConfig(write=WriteOptions(shard_size=x[0].nbytes * 16)),
            arrays={"x": tmp_path / "x.npy"})
    with pytest.raises(UsageError, match=r"fastdata\.Shards\("):
        fastdata.loader(tmp_path / "conv", 4, shuffle="chunks", device="cpu")
    part = fastdata.open(tmp_path / "conv").split({"a": 0.5, "b": 0.5}, seed=1)["a"]  # a subset in stored order
    ld = fastdata.loader(part, 4, shuffle=fastdata.Shards(), device="cpu", num_workers=0)
    got = np.concatenate([b["x"].numpy() for b in ld])
    assert sorted(got[:, 0, 0, 0].tolist()) == sorted(part.get_batch(np.arange(len(part)))["x"][:, 0, 0, 0].tolist())


def test_cli_index_and_verify(tmp_path):
    a = _arrays()
    _h5(str(tmp_path / "d.h5"), a)
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    run = lambda *args: subprocess.run([sys.executable, "-m", "fastdata", *args], capture_output=True, text=True, env=env)  # noqa: E731
    r = run("index", str(tmp_path / "d.h5"), str(tmp_path / "i"), "--field", "x=/xgz", "--field", "y=/grp/y")
    assert r.returncode == 0, r.stderr
    r = run("verify", str(tmp_path / "i"))  # it said "1 shard(s) checked (size and checksum)" of the source file
    assert r.returncode == 0 and r.stdout.strip().endswith("OK: 1 source file(s) checked (stamp, metadata and sampled blocks)")
    r = run("verify", str(tmp_path / "i"), "--deep")
    assert r.returncode == 0 and "OK: 1 source file(s) checked (stamp, metadata and sampled blocks, and the full " \
        f"checksums recorded with --checksum), {N} of {N} samples read and decoded" in r.stdout, r.stdout
    r = run("bench", str(tmp_path / "i"), "--cold", "--seconds", "0.2")
    assert r.returncode == 2 and "an in-place index" in r.stderr
    r = run("index", str(tmp_path / "d.h5"), str(tmp_path / "j"), "--field", "x=/bad")
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "d.h5: no dataset '/bad'" in r.stderr


def test_index_overwrite_says_what_it_replaces_and_keeps_a_converted_dataset(tmp_path, run_cli):
    # its --help said "replace an existing fastdata dataset (or index) at DST"; a converted dataset was refused
    np.save(tmp_path / "x.npy", np.arange(12, dtype=np.float32).reshape(6, 2))
    fastdata.convert(tmp_path / "x.npy", tmp_path / "ds")
    before = sorted(p.name for p in (tmp_path / "ds").iterdir())
    code, _, err = run_cli("index", tmp_path / "x.npy", tmp_path / "ds", "--overwrite")
    assert code == 2 and "not an index fastdata would replace" in err
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == before
    code, out, _ = run_cli("index", "--help")
    assert code == 0 and "replace an existing index at DST" in " ".join(out.split()) and "fastdata dataset" not in out


def test_index_arguments_from_python_are_refused_in_one_line_before_dst_is_touched(h5index, tmp_path):
    # a list of paths for fields raised AttributeError ('list' object has no attribute 'items'); a refused field
    # name left an empty DST, or with overwrite=True removed the old index before the refusal
    idx, _ = h5index
    for bad in (["/x"], "/x", {"x": None}):
        with pytest.raises(UsageError, match=r"^fields is a dict of field name: path in SRC"):
            fastdata.index(tmp_path / "data.h5", tmp_path / "new", bad)  # type: ignore[arg-type]
    with pytest.raises(fastdata.errors.FormatError, match="a field is named 'key'"):
        fastdata.index(tmp_path / "data.h5", tmp_path / "new", {"key": "/grp/y", "x": "/x"})
    assert not (tmp_path / "new").exists()
    with pytest.raises(fastdata.errors.FormatError, match="a field is named 'key'"):
        fastdata.index(tmp_path / "data.h5", idx, {"key": "/grp/y", "x": "/x"}, overwrite=True)
    assert len(fastdata.open(idx)) == N  # the old index is still there


def test_a_bare_field_of_an_hdf5_file_says_to_give_its_path(h5index, tmp_path, run_cli):
    # --field x (NAME alone, which the help allows: SRC itself for .npy and Zarr) said "no dataset ''"
    code, _, err = run_cli("index", tmp_path / "data.h5", tmp_path / "new", "--field", "x", "--field", "y=/grp/y")
    assert code == 2 and err.strip().endswith("data.h5: field 'x' names no dataset; give its path in the HDF5 file, "
                                              "e.g. --field x=/images")
    assert not (tmp_path / "new").exists()
    code, _, err = run_cli("index", tmp_path / "data.h5", tmp_path / "new", "--field", f"x={H5_FIELDS['x']}",
                           "--field", "y=/grp/y")  # as advised, with the dataset's path
    assert code == 0, err


def test_dali_backend_reads_an_index_like_the_torch_backend(tmp_path):
    pytest.importorskip("nvidia.dali")
    rng = np.random.default_rng(2)
    img = rng.integers(0, 255, (37, 12, 16, 3), dtype=np.uint8)
    with h5py.File(tmp_path / "im.h5", "w") as f:
        f.create_dataset("img", data=img, chunks=(5, 12, 16, 3), compression="gzip")
        f["label"] = np.arange(37)
    fastdata.index(tmp_path / "im.h5", tmp_path / "i", {"image": "/img", "label": "/label"})
    kw = dict(shuffle=fastdata.Shards(), seed=3, device="cpu")
    t = [(b["image"].clone(), b["label"].clone()) for b in fastdata.loader(tmp_path / "i", 8, backend="torch", **kw)]
    d = [(b["image"].clone(), b["label"].clone()) for b in fastdata.loader(tmp_path / "i", 8, backend="dali", **kw)]
    assert len(t) == len(d) == 5
    for (ti, tl), (di, dl) in zip(t, d):
        assert torch.equal(ti, di) and torch.equal(tl, dl)


def test_an_index_is_neither_converted_into_nor_merged(h5index, tmp_path):
    from fastdata import WriteOptions, merge

    root, _ = h5index
    with pytest.raises(UsageError, match="written by fastdata index"):
        WriteOptions(backend="inplace")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="is an in-place index"):
        merge([root, root], tmp_path / "merged")


def test_shards_shuffle_on_splits_and_strict_ddp_shares(h5index):
    root, a = h5index
    parts = fastdata.open(root, fields=["y"]).split({"train": 0.7, "val": 0.3}, seed=4)
    seen = {}
    for name, part in parts.items():
        ld = fastdata.loader(part, 8, shuffle=fastdata.Shards(), device="cpu", num_workers=2, seed=1)
        seen[name] = [i for b in ld for i in b["y"].tolist()]
        ld.close()
        assert sorted(seen[name]) == sorted(part.column("y").tolist())
    assert not set(seen["train"]) & set(seen["val"]) and len(seen["train"]) + len(seen["val"]) == N
    with pytest.raises(UsageError, match="stored order"):
        fastdata.loader(fastdata.open(root).subset([5, 1]), 2, shuffle=fastdata.Shards(), device="cpu")
    shares = []
    for rank in range(4):  # drop_last: equal shares, strictly disjoint
        ld = fastdata.loader(root, 4, shuffle="shards", drop_last=True, device="cpu", num_workers=1, fields=["y"])
        ld._fixed_world = World(rank=rank, size=4)
        shares.append([i for b in ld for i in b["y"].tolist()])
        ld.close()
    flat = [i for s in shares for i in s]
    assert len({len(s) for s in shares}) == 1 and len(flat) == len(set(flat)) == 80  # 90 // 4 = 22, 5 whole batches


def _keep_time(path, edit):
    """``edit()`` changes the file (or store) at ``path``; its modification times are then put back."""
    paths = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    times = {p: os.stat(p).st_mtime_ns for p in paths}
    edit()
    for p, t in times.items():
        os.utime(p, ns=(t, t))


def test_a_same_layout_replacement_is_refused_at_open(tmp_path):
    """Same size, same layout (so the same metadata), same time: only the sampled content tells."""
    src = tmp_path / "c.h5"
    with h5py.File(src, "w") as f:
        f["x"] = _arrays(seed=0)["x"]  # contiguous
    fastdata.index(src, tmp_path / "i", {"x": "/x"})

    def replace():
        with h5py.File(src, "r+") as f:
            f["x"][...] = _arrays(seed=1)["x"]

    _keep_time(src, replace)
    with pytest.raises(CorruptShardError, match=r"c\.h5: changed since it was indexed \(the blocks sampled"):
        fastdata.open(tmp_path / "i")
    assert not verify(tmp_path / "i").ok


def test_swapped_zarr_chunk_files_are_refused_at_open(tmp_path):
    zarr = pytest.importorskip("zarr")
    a = _arrays()
    z = zarr.create_array(str(tmp_path / "s.zarr"), shape=a["x"].shape, chunks=(10, 2, 5, 3), dtype="f4",
                          compressors=None)
    z[:] = a["x"]
    fastdata.index(tmp_path / "s.zarr", tmp_path / "i")
    chunks = sorted(p for p in (tmp_path / "s.zarr").rglob("*") if p.is_file() and p.name != "zarr.json")
    one, two = chunks[0], chunks[1]
    assert one.stat().st_size == two.stat().st_size

    def swap():
        tmp = one.with_name("swap")
        one.rename(tmp)
        two.rename(one)
        tmp.rename(two)

    _keep_time(tmp_path / "s.zarr", swap)
    with pytest.raises(CorruptShardError, match=r"s\.zarr: changed since it was indexed \(the blocks sampled"):
        fastdata.open(tmp_path / "i")


def test_compact_virtual_and_external_hdf5_datasets_are_refused_as_such(tmp_path):
    """Their data lies at no offset of the file: the error says how it is stored, not 'never allocated'."""
    a = np.arange(40, dtype=np.float32).reshape(10, 4)
    with h5py.File(tmp_path / "src.h5", "w") as f:
        f["x"] = a
    layout = h5py.VirtualLayout(shape=(10, 4), dtype=np.float32)
    layout[:] = h5py.VirtualSource(str(tmp_path / "src.h5"), "x", shape=(10, 4))
    with h5py.File(tmp_path / "c.h5", "w") as f:
        plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        plist.set_layout(h5py.h5d.COMPACT)
        h5py.h5d.create(f.id, b"compact", h5py.h5t.NATIVE_FLOAT, h5py.h5s.create_simple((10, 4)), dcpl=plist)
        f["compact"][...] = a
        f.create_virtual_dataset("virtual", layout)
        f.create_dataset("external", shape=(10, 4), dtype=np.float32, external=[(str(tmp_path / "raw.bin"), 0, h5py.h5f.UNLIMITED)])
        f["external"][...] = a
    for name, kind in [("compact", "compact"), ("virtual", "virtual"), ("external", "in external files")]:
        with pytest.raises(DataError, match=rf"c\.h5: dataset '/?{name}' is stored {kind}.*fastdata convert"):
            fastdata.index(tmp_path / "c.h5", tmp_path / "o", {"x": "/" + name})


@pytest.mark.parametrize("edit, match", [
    (lambda src: src["parts"][0].update(y=src["parts"][0].pop("x")), "does not describe every field"),
    (lambda src: src["files"][0].update(blocks="zzz"), "malformed block checksums"),
])
def test_verify_refuses_an_index_description_that_open_refuses(tmp_path, edit, match):
    np.save(tmp_path / "a.npy", np.arange(20.0).reshape(10, 2))
    fastdata.index(tmp_path / "a.npy", tmp_path / "ix", checksum=True)
    path = tmp_path / "ix" / "manifest.json"
    m = json.loads(path.read_text())
    edit(m["source"])
    path.write_text(json.dumps(m))
    with pytest.raises(CorruptShardError, match=match):
        fastdata.open(tmp_path / "ix")[0]
    with pytest.raises(CorruptShardError, match=match):  # verify said the index was fine
        verify(tmp_path / "ix")
