"""Corrupt shards at load time: typed errors naming shard and sample, never a crash, never a hang.

Reads that could crash the process (SIGBUS) run in a subprocess, so a crash fails the test
instead of killing the test run.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap

import lmdb
import numpy as np
import pytest

import fastdata
from conftest import edit_manifest, four_shard_dataset, make_class_folder
from fastdata.errors import CorruptShardError

BACKENDS = ["hdf5", "lmdb"]


def _run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(params=BACKENDS)
def big(request, tmp_path):
    """One shard of 3000 samples x 2 KiB: big enough that HDF5 memory-maps the column."""
    np.save(tmp_path / "X.npy", np.arange(3000 * 512, dtype="<f4").reshape(3000, 512))
    fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=request.param, workers=1)), arrays={"x": tmp_path / "X.npy"})
    return tmp_path / "ds"


def test_shard_truncated_while_open_raises_instead_of_sigbus(big):
    if big.joinpath("shard-00000.h5").exists():
        reader = fastdata.open(big).readers[0]
        assert reader.handle().columns["x"].mapped is not None  # the memory-mapped path is what is tested
    r = _run(f"""
        import os, numpy as np, fastdata
        ds = fastdata.open({str(big)!r})
        shard = ds.root / ds.manifest.shards[0].file
        assert ds.get_batch([0, 2999])["x"][1, 0] == 2999 * 512   # handles (and maps) are open now
        os.truncate(shard, 4096)
        try:
            ds.get_batch(np.arange(2000, 2100))
        except fastdata.errors.CorruptShardError as e:
            print("typed:", e)
        """)
    assert r.returncode == 0, f"reader died (rc {r.returncode}): {r.stderr[-2000:]}"
    assert "typed:" in r.stdout and "shard-00000" in r.stdout and "sample 2000" in r.stdout
    assert "truncated or rewritten while open" in r.stdout


def _leaf_pages(blob: bytes, last: int) -> list[int]:
    return [pg for pg in range(2, last + 1) if struct.unpack_from("<H", blob, pg * 4096 + 10)[0] & 2]


def _corrupt_last_leaf(shard, strip_guard: bool) -> int:
    """Point every node of the last LMDB leaf page 64 KiB past its page: past the end of the file,
    unless the writer's zeroed tail guard is there. Returns the new file size."""
    env = lmdb.open(str(shard), subdir=False, readonly=True, lock=False)
    last = env.info()["last_pgno"]
    env.close()
    blob = bytearray(shard.read_bytes())
    assert len(blob) >= (last + 1) * 4096 + (192 << 10)  # the guard is there
    pg = _leaf_pages(blob, last)[-1]
    assert pg >= last - 1
    nodes = (struct.unpack_from("<H", blob, pg * 4096 + 12)[0] - 16) // 2
    for i in range(nodes):
        struct.pack_into("<H", blob, pg * 4096 + 16 + 2 * i, 0xFFF0)
    if strip_guard:
        blob = blob[: (last + 1) * 4096]
    shard.write_bytes(bytes(blob))
    return len(blob)


@pytest.mark.parametrize("strip_guard", [False, True])
def test_lmdb_in_page_offset_past_the_end(tmp_path, strip_guard):
    np.save(tmp_path / "X.npy", np.arange(3000 * 16, dtype="<f4").reshape(3000, 16))
    ds = tmp_path / "ds"
    fastdata.convert(None, ds, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", workers=1)), arrays={"x": tmp_path / "X.npy"})
    shard = ds / "shard-00000.lmdb"
    size = _corrupt_last_leaf(shard, strip_guard)
    edit_manifest(ds, lambda m: m["shards"][0].update(bytes=size))
    r = _run(f"""
        import numpy as np, fastdata
        try:
            fastdata.open({str(ds)!r}).get_batch(np.arange(3000))
        except fastdata.errors.CorruptShardError as e:
            print("typed:", e)
        """)
    if strip_guard:  # the control: without the guard this corruption is a real crash
        assert r.returncode == -7, (r.returncode, r.stdout, r.stderr[-500:])
    else:
        assert r.returncode == 0 and "typed:" in r.stdout and "sample" in r.stdout, (r.returncode, r.stderr[-2000:])


def test_lmdb_page_count_past_the_file_is_refused(tmp_path):
    make_class_folder(tmp_path / "src", per_class=3)
    fastdata.convert(tmp_path / "src", tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb")))
    shard = tmp_path / "ds" / "shard-00000.lmdb"
    blob = bytearray(shard.read_bytes())
    for meta in (0, 4096):  # both meta pages: mm_last_pg (after header, magic, version, address, mapsize, 2 dbs)
        struct.pack_into("<Q", blob, meta + 16 + 4 + 4 + 8 + 8 + 96, 100_000)
    shard.write_bytes(bytes(blob))
    with pytest.raises(CorruptShardError, match="shard-00000.lmdb.*100001 pages"):
        fastdata.open(tmp_path / "ds").get_batch([0])


@pytest.fixture(params=BACKENDS)
def four(request, tmp_path):
    """30 samples in 4 shards, the first three of equal size."""
    return four_shard_dataset(tmp_path, request.param)[0]


def test_swapped_shards_are_refused(four):
    s0, s1 = four / four.glob("shard-00000.*").__next__().name, four / four.glob("shard-00001.*").__next__().name
    assert s0.stat().st_size == s1.stat().st_size
    tmp = four / "swap"
    s0.rename(tmp)
    s1.rename(s0)
    tmp.rename(s1)
    edit_manifest(four, lambda m: (m["shards"][0].update(checksum=m["shards"][1]["checksum"])))  # even the checksums agree
    ds = fastdata.open(four)
    with pytest.raises(CorruptShardError, match=r"shard-00000\.\w+.*(holds samples \w+|record is missing)"):
        ds.get_batch([0])


def test_manifest_with_shifted_shard_boundaries(four):
    def shift(m):
        m["shards"][0]["count"] -= 1
        m["shards"][1]["start"] -= 1
        m["shards"][1]["count"] += 1

    edit_manifest(four, shift)
    ds = fastdata.open(four)
    with pytest.raises(CorruptShardError, match=r"shard-00000"):
        ds.get_batch([0])
    with pytest.raises(CorruptShardError, match=r"shard-00001"):
        ds.get_batch([10])


@pytest.mark.parametrize("edit", [
    lambda f: f.update(shape=[2, 6, 3, 4]),
    lambda f: f.update(dtype="<i4"),  # same item size: only a stored schema can tell
    lambda f: f.update(name="y"),
])
def test_manifest_schema_that_does_not_match_the_shards(four, edit):
    edit_manifest(four, lambda m: edit(m["fields"][0]))
    ds = fastdata.open(four)
    with pytest.raises(CorruptShardError, match=r"shard-0000\d\.(h5|lmdb)"):
        ds.get_batch([0, 29])


def test_shard_missing_after_open(four):
    ds = fastdata.open(four)
    (four / four.glob("shard-00002.*").__next__().name).unlink()
    with pytest.raises(CorruptShardError, match=r"shard-00002.*missing"):
        ds.get_batch([25])
    assert ds.get_batch([0])["x"].shape == (1, 2, 6, 3, 3)  # the other shards still read


def test_hdf5_corrupted_metadata_gives_corrupt_shard_error(tmp_path):
    """Every single-byte change outside the data area either raises CorruptShardError or changes nothing."""
    make_class_folder(tmp_path / "src", per_class=10)
    fastdata.convert(tmp_path / "src", tmp_path / "ref", fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=10**6, workers=1)))
    r = _run(f"""
        import shutil, h5py, numpy as np, fastdata
        from pathlib import Path
        ref = Path({str(tmp_path / 'ref')!r}); case = Path({str(tmp_path / 'case')!r})
        shard = "shard-00000.h5"
        good = fastdata.open(ref).get_batch(np.arange(30))
        with h5py.File(ref / shard) as f:
            data = [(f[k].id.get_offset(), f[k].id.get_offset() + f[k].id.get_storage_size()) for k in ("x", "label")]
        blob = (ref / shard).read_bytes()
        outcomes = {{}}
        for pos in range(0, len(blob), 7):
            if any(a <= pos < b for a, b in data):
                continue
            shutil.rmtree(case, ignore_errors=True); shutil.copytree(ref, case)
            b = bytearray(blob); b[pos] ^= 0x5A; (case / shard).write_bytes(bytes(b))
            try:
                got = fastdata.open(case).get_batch(np.arange(30))
                out = "same" if all(np.array_equal(got[k], good[k]) for k in good) else "DIFFERENT"
            except fastdata.errors.CorruptShardError:
                out = "typed"
            except Exception as e:
                out = "untyped " + type(e).__name__
            outcomes[out] = outcomes.get(out, 0) + 1
        print(outcomes)
        """)
    assert r.returncode == 0, r.stderr[-2000:]
    outcomes = eval(r.stdout)  # a dict literal printed by the child
    assert set(outcomes) <= {"same", "typed"}, outcomes
    assert outcomes.get("typed", 0) > 50, outcomes


@pytest.mark.parametrize("big,mode,workers", [("hdf5", "processes", 2), ("lmdb", "threads", 2)], indirect=["big"])
def test_loader_worker_error_after_truncation_propagates_without_hanging(big, mode, workers):
    r = _run(f"""
        import os, fastdata
        from fastdata.loaders import LoaderConfig
        ld = fastdata.loader({str(big)!r}, 100, shuffle=False, device="cpu", num_workers={workers},
                             config=LoaderConfig(mode={mode!r}))
        assert sum(len(b["x"]) for b in ld) == 3000          # workers have their handles open now
        ds = fastdata.open({str(big)!r})
        os.truncate(ds.root / ds.manifest.shards[0].file, 8192)
        try:
            for b in ld:
                pass
        except fastdata.errors.CorruptShardError as e:
            print("typed:", e)
        ld.close()
        """, timeout=120)
    assert r.returncode == 0, f"rc {r.returncode}: {r.stderr[-2000:]}"
    assert "typed:" in r.stdout and "shard-00000" in r.stdout and "sample" in r.stdout


def test_flipped_record_header_names_the_sample_in_every_read_path(tmp_path):
    """Small fixed records (getmulti), large fixed records and ragged records all check headers."""
    rng = np.random.default_rng(1)
    cases = {
        "small": {"x": np.zeros((20, 3), "<f4")},
        "large": {"x": np.zeros((20, 20000), "<f4")},
    }
    for name, arrays in cases.items():
        np.save(tmp_path / f"{name}.npy", arrays["x"])
        fastdata.convert(None, tmp_path / name, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", workers=1)), arrays={"x": tmp_path / f"{name}.npy"})
    src = tmp_path / "ragged-src"
    src.mkdir()
    for i in range(20):
        np.save(src / f"{i:02d}.npy", rng.standard_normal((i + 1, 2)).astype("<f4"))
    fastdata.convert(src, tmp_path / "ragged", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", workers=1)))
    for name in ("small", "large", "ragged"):
        shard = tmp_path / name / "shard-00000.lmdb"
        blob = bytearray(shard.read_bytes())
        inline = blob.find(struct.pack(">Q", 7) + b"FDR1")  # key, then the record, in a leaf page
        positions = [i for i in range(len(blob) - 4) if blob[i : i + 4] == b"FDR1"]
        assert len(positions) == 20
        pos = inline + 8 if inline >= 0 else positions[7]  # overflow pages are allocated in key order
        blob[pos + 8] ^= 0x01  # sample 7's first payload size
        shard.write_bytes(bytes(blob))
        ds = fastdata.open(tmp_path / name)
        with pytest.raises(CorruptShardError, match=r"shard-00000\.lmdb, sample 7: "):
            ds.get_batch(np.arange(20))
        ok = ds.get_batch(np.arange(8, 20))  # the rest of the shard still reads
        assert len(ok["x"]) == 12


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_damage_never_crashes_and_raises_only_typed_errors(tmp_path, backend):
    """200 copies of a shard, each with a few random bytes changed (half of them in the first 8 KiB,
    where the file's own structures are; never in LMDB's zeroed tail guard): reading each gives the data, other numbers (raw data has
    no per-sample checksum), or CorruptShardError; never a crash or another exception."""
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(40):
        np.savez(src / f"{i:03d}.npz", a=rng.standard_normal((int(rng.integers(1, 9)), 3)).astype("<f4"),
                 b=np.arange(6, dtype="<i8") + i)
    fastdata.convert(src, tmp_path / "ref", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=1), no_labels=True))
    r = _run(f"""
        import random, shutil, numpy as np, fastdata
        from pathlib import Path
        ref, case = Path({str(tmp_path / 'ref')!r}), Path({str(tmp_path / 'case')!r})
        shard = next(ref.glob("shard-*")).name
        blob = (ref / shard).read_bytes()
        used = len(blob)
        if shard.endswith(".lmdb"):  # damage the pages, not the zeroed tail guard
            import lmdb
            env = lmdb.open(str(ref / shard), subdir=False, readonly=True, lock=False)
            used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
            env.close()
        good = fastdata.open(ref).get_batch(np.arange(40))
        outcomes = {{}}
        for t in range(200):
            rnd = random.Random(t)
            b = bytearray(blob)
            for _ in range(rnd.choice([1, 1, 2, 4, 16])):
                b[rnd.randrange(used) if rnd.random() < 0.5 else rnd.randrange(min(used, 8192))] = rnd.randrange(256)
            shutil.rmtree(case, ignore_errors=True)
            shutil.copytree(ref, case)
            (case / shard).write_bytes(bytes(b))
            try:
                got = fastdata.open(case).get_batch(np.arange(40))
                out = "same" if all(np.array_equal(got[k], good[k]) for k in good) else "other numbers"
            except fastdata.errors.CorruptShardError:
                out = "typed"
            except Exception as e:
                out = "untyped " + type(e).__name__
            outcomes[out] = outcomes.get(out, 0) + 1
        print(outcomes)
        """)
    assert r.returncode == 0, f"a damaged shard crashed the reader (rc {r.returncode}): {r.stderr[-2000:]}"
    outcomes = eval(r.stdout)  # a dict literal printed by the child
    assert set(outcomes) <= {"same", "other numbers", "typed"}, outcomes
    assert outcomes.get("typed", 0) > 10, outcomes
