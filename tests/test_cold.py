"""Larger than RAM: read-ahead by the plan never changes what is read; per-field compression
(``--compression lz4|zstd``) round-trips bit-exactly in both formats, stays readable by plain
h5py, is refused clearly by readers too old for it, and shows its ratio in ``fastdata info``."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import lmdb
import numpy as np
import pytest

import fastdata
import fastdata.write
from fastdata.write import WriteOptions
from fastdata import cli
from fastdata.errors import CorruptShardError, FormatError
from fastdata.loaders import LoaderConfig
from fastdata.reading.readahead import ReadAhead, drop_page_cache, merge_ranges
from fastdata.world import World

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
try:
    from _harness import resident_bytes  # a measurement's check that the page cache was emptied
finally:
    sys.path.pop(0)

N = 182  # two shards of 91 (1.5 MB): columns over 1 MiB are read from the file, not cached
SHAPE = (2, 32, 8, 8)  # 16 KiB a sample: compressed (at least codec.MIN_FIELD_BYTES)


def _arrays(tmp_path):
    rng = np.random.default_rng(0)
    t = np.arange(SHAPE[1], dtype=np.float32)[None, None, :, None, None]
    x = rng.poisson(80 * np.exp(-t / rng.uniform(3, 12, (N, SHAPE[0], 1, *SHAPE[2:])))).astype(np.float32)
    y = np.arange(N, dtype=np.int64)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    return x, y


def _convert(tmp_path, backend, compression):
    dst = tmp_path / f"{backend}-{compression}"
    fastdata.convert(None, dst, fastdata.ConvertConfig(write=WriteOptions(backend=backend, compression=compression, shard_size=1_500_000, workers=1)), arrays={"x": tmp_path / "x.npy", "label": tmp_path / "y.npy"})
    return dst


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cold")
    x, y = _arrays(tmp)
    paths = {(b, c): _convert(tmp, b, c) for b in ("hdf5", "lmdb") for c in (None, "lz4")}
    return x, y, paths


def _batches(ld):
    return [(b["label"].numpy().copy(), b["x"].numpy().copy()) for b in ld]


def _same(a, b):
    assert len(a) == len(b)
    for (la, xa), (lb, xb) in zip(a, b):
        assert np.array_equal(la, lb) and np.array_equal(xa, xb)


# --- compression ---------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
@pytest.mark.parametrize("codec", ["lz4", "zstd:3"])
def test_compressed_round_trip_is_bit_exact(tmp_path, backend, codec):
    x, y = _arrays(tmp_path)
    dst = _convert(tmp_path, backend, codec)
    with fastdata.open(dst) as ds:
        assert ds.manifest.version == 4
        assert {f.name: f.compression for f in ds.manifest.fields} == {"x": "blosc", "label": None}
        idx = np.random.default_rng(1).permutation(N)[:61]
        b = ds.get_batch(idx)
        assert np.array_equal(b["x"], x[idx]) and np.array_equal(b["label"], y[idx])
        assert np.array_equal(ds[N - 1]["x"], x[N - 1])
    used = sum(p.stat().st_blocks * 512 for p in dst.glob("shard-*"))  # (LMDB's zeroed tail is sparse)
    assert used < x.nbytes * 0.75  # Poisson counts compress (LMDB rounds each record up to whole pages)


def test_uncompressed_datasets_keep_format_version_3(data):
    _, _, paths = data
    with fastdata.open(paths["hdf5", None]) as ds:
        assert ds.manifest.version == 3 and all(f.compression is None for f in ds.manifest.fields)


def test_plain_h5py_reads_a_compressed_shard_after_importing_hdf5plugin(data):
    import h5py
    import hdf5plugin  # noqa: F401 - registers the Blosc filter with HDF5

    x, _, paths = data
    m = fastdata.open(paths["hdf5", "lz4"]).manifest
    for s in m.shards:
        with h5py.File(paths["hdf5", "lz4"] / s.file, "r") as f:
            assert np.array_equal(f["x"][...], x[s.start : s.start + s.count])


def test_a_reader_of_version_3_refuses_a_compressed_dataset(data, monkeypatch):
    from fastdata.format import manifest

    monkeypatch.setattr(manifest, "READ_VERSION", 3)
    with pytest.raises(FormatError, match=r"newer fastdata \(format version 4.*upgrade fastdata"):
        fastdata.open(data[2]["lmdb", "lz4"])


def test_a_compressed_field_in_a_version_3_manifest_or_an_unknown_codec_is_refused(data, tmp_path):
    import shutil

    dst = tmp_path / "copy"
    shutil.copytree(data[2]["hdf5", "lz4"], dst)
    obj = json.loads((dst / "manifest.json").read_text())
    obj["version"] = 3
    (dst / "manifest.json").write_text(json.dumps(obj))
    with pytest.raises(FormatError, match="needs format version 4"):
        fastdata.open(dst)
    obj["version"] = 4
    obj["fields"][0]["compression"] = "snappy9"
    (dst / "manifest.json").write_text(json.dumps(obj))
    with pytest.raises(FormatError, match="unknown compression 'snappy9'.*upgrade fastdata"):
        fastdata.open(dst)


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_a_damaged_compressed_sample_is_a_one_line_error_naming_it(tmp_path, backend):
    x, _ = _arrays(tmp_path)
    dst = _convert(tmp_path, backend, "lz4")
    with fastdata.open(dst) as ds:
        info = ds.manifest.shards[0]
        ranges = ds.byte_ranges([0])
    shard = dst / info.file
    raw = bytearray(shard.read_bytes())
    if backend == "hdf5":
        start = int(ranges[0][1][0])  # where sample 0's bytes lie
    else:
        env = lmdb.open(str(shard), subdir=False, readonly=True, lock=False)
        with env.begin() as txn:
            start = raw.find(txn.get(info.start.to_bytes(8, "big")))  # sample 0's record
        env.close()
    hs = 0 if backend == "hdf5" else 8 + 8 * 2  # an LMDB record starts with its own header
    raw[start + hs + 4 : start + hs + 8] = (12345).to_bytes(4, "little")  # the Blosc header's nbytes
    shard.write_bytes(bytes(raw))
    with fastdata.open(dst) as ds, pytest.raises(CorruptShardError, match=r"sample 0: field 'x'.*compressed sample"):
        ds.get_batch([0])


def test_info_shows_the_ratio(data, capsys):
    assert cli.main(["info", str(data[2]["hdf5", "lz4"])]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("compress"))
    assert "lz4 on x" in line and "x (" in line
    ratio = float(line.split(": ")[1].split("x")[0])
    assert ratio > 2
    assert cli.main(["info", str(data[2]["hdf5", None])]) == 0
    assert not any(ln.startswith("compress") for ln in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize("value,fmt", [("lz5", "hdf5"), ("lz4:12", "hdf5"), ("gzip", "lmdb"), ("zstd:x", "lmdb")])
def test_a_bad_compression_is_a_one_line_usage_error(tmp_path, capsys, value, fmt):
    _arrays(tmp_path)
    rc = cli.main(["convert", "--data", str(tmp_path / "x.npy"), "--no-labels", str(tmp_path / "out"),
                   "--format", fmt, "--compression", value])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and value.split(":")[0] in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("codec", ["zstd", "zstd:9", "lz4", "none"])
def test_converting_with_zstd_says_above_which_disk_speed_it_reads_slower(tmp_path, capsys, codec):
    """zstd decodes several times slower than lz4: the conversion says from what disk speed on reading
    it is slower than uncompressed on this machine's cores (the decode rates are measured, not quoted)."""
    _arrays(tmp_path)
    dst = tmp_path / "out"
    assert cli.main(["convert", "--data", str(tmp_path / "x.npy"), "--no-labels", str(dst), "--quiet",
                     "--compression", codec]) == 0
    err = capsys.readouterr().err
    if not codec.startswith("zstd"):
        assert "decodes" not in err
        return
    (note,) = [ln for ln in err.splitlines() if "decodes" in ln]
    assert note.startswith(f"fastdata: note: {codec} decodes ") and str(dst) in note
    threshold = int(note.split("more than about ")[1].split(" MB/s")[0].replace(",", ""))
    per_core = int(note.split(" decodes ")[1].split(" MB/s")[0].replace(",", ""))
    cores = int(note.split("with ")[1].split(" core")[0])
    assert threshold > 0 and abs(threshold - per_core * cores) <= cores  # (rounding)
    assert f"fastdata bench {dst} --cold" in note


@pytest.mark.slow  # the printed bench runs for its default time
def test_the_zstd_notes_bench_command_runs_as_printed(tmp_path, capsys):
    import shlex

    _arrays(tmp_path)
    assert cli.main(["convert", "--data", str(tmp_path / "x.npy"), "--no-labels", str(tmp_path / "out"), "--quiet",
                     "--compression", "zstd"]) == 0
    note = next(ln for ln in capsys.readouterr().err.splitlines() if "decodes" in ln)
    printed = shlex.split(note.split("`")[1])
    assert printed[0] == "fastdata" and cli.main(printed[1:]) == 0


# --- read-ahead ------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", [("hdf5", None), ("hdf5", "lz4"), ("lmdb", None), ("lmdb", "lz4")])
@pytest.mark.parametrize("shuffle", [True, False, "block", "shards"])
def test_read_ahead_never_changes_what_is_read(data, key, shuffle):
    path = data[2][key]
    for rank in (0, 1):  # DDP shares: each rank's batches equal with and without read-ahead
        got = []
        for ra in (1, 0):  # 1 byte: the smallest window (one batch beyond the readers), 0: off
            with fastdata.loader(path, 16, shuffle=shuffle, seed=3, device="cpu",
                                 config=LoaderConfig(readahead=ra)) as ld:
                ld._fixed_world = World(rank=rank, size=2)
                ld.set_epoch(2)
                got.append(_batches(ld))
        _same(*got)


@pytest.mark.parametrize("key", [("hdf5", "lz4"), ("lmdb", None)])
def test_resume_with_read_ahead_gives_exactly_the_rest(data, key):
    path = data[2][key]
    with fastdata.loader(path, 16, seed=5, device="cpu", config=LoaderConfig(readahead=0)) as full:
        full.set_epoch(1)
        expected = _batches(full)
    with fastdata.loader(path, 16, seed=5, device="cpu", config=LoaderConfig(readahead=1)) as ld:
        ld.set_epoch(1)
        seen = []
        for b in ld:
            seen.append((b["label"].numpy().copy(), b["x"].numpy().copy()))
            if len(seen) == 3:
                state = ld.state_dict()
                break
    with fastdata.loader(path, 16, seed=5, device="cpu", config=LoaderConfig(readahead=1)) as fresh:
        fresh.load_state_dict(state)
        _same(seen + _batches(fresh), expected)


@pytest.mark.parametrize("key", [("hdf5", None), ("hdf5", "lz4")])
def test_byte_ranges_cover_every_sample_of_large_fields(data, key):
    """HDF5 shards know where each sample lies."""
    with fastdata.open(data[2][key]) as ds:
        ranges = ds.byte_ranges(np.arange(N))
        assert sum(len(s) for _, s, _ in ranges) == N
        sizes = np.concatenate([n for _, _, n in ranges])
        assert (sizes >= 16).all() and ((sizes < 16384) if key[1] else (sizes >= 16384)).all()
        for path, starts, lengths in ranges:
            assert (starts + lengths <= path.stat().st_size).all()


def test_lmdb_shards_give_no_byte_ranges(data):
    """LMDB alone knows where its records lie: read-ahead gets no ranges to hint for its shards."""
    with fastdata.open(data[2]["lmdb", None]) as ds:
        assert ds.byte_ranges(np.arange(N)) == []


def test_merge_ranges():
    s, n = merge_ranges(np.array([100, 0, 50, 10_000_000]), np.array([10, 40, 20, 5]), gap=16)
    assert s.tolist() == [0, 100, 10_000_000] and n.tolist() == [70, 10, 5]  # gaps of 10 joined, of 30 not
    s, n = merge_ranges(np.array([100, 0, 50]), np.array([10, 40, 20]), gap=32)
    assert s.tolist() == [0] and n.tolist() == [110]
    s, n = merge_ranges(np.array([0, 100]), np.array([200, 10]), gap=0)  # contained
    assert s.tolist() == [0] and n.tolist() == [200]


class _Recorder:
    def __init__(self):
        self.batches: list[int] = []
        self.cond = threading.Condition()

    def __call__(self, batch):
        with self.cond:
            self.batches.append(int(batch[0]))
            self.cond.notify_all()
        return []

    def wait_for(self, n):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.batches) >= n, timeout=10)


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_the_loader_starts_a_read_ahead_only_where_there_are_byte_ranges_to_hint(data, backend):
    """LMDB shards give none (only LMDB knows where its records lie): no idle read-ahead thread for them."""
    with fastdata.loader(data[2][backend, None], 8, device="cpu") as ld:
        ra = ld._read_ahead([np.arange(8), np.arange(8, 16)], 0)
        assert (ra is not None) == (backend == "hdf5")
        if ra is not None:
            ra.close()


def test_read_ahead_stays_within_its_bound_and_follows_the_loader(tmp_path):
    plan = [np.array([k]) for k in range(20)]
    rec = _Recorder()
    ra = ReadAhead(rec, plan, first=3, lead=2, ahead_bytes=0)
    try:
        rec.wait_for(5)  # batches 3..5 (the readers' lead) and one more, and the batch after the last
        time.sleep(0.05)  # (nothing may follow: the bound holds while the loader stands still)
        # batches 3-6 hinted; each hinted batch also looks at the next one's ranges (where streams start)
        assert sorted(set(rec.batches)) == [3, 4, 5, 6, 7]
        ra.at(10)
        rec.wait_for(12)
        time.sleep(0.05)
        assert sorted(set(rec.batches)) == list(range(3, 15))
    finally:
        ra.close()


def test_a_pass_left_open_until_the_interpreter_exits_closes_without_an_error(monkeypatch):
    # a script holding a loader's iterator mid-epoch in a global (3 Episodic batches taken) printed "Exception
    # ignored ... AttributeError: 'NoneType' object has no attribute 'current_thread'" at exit: the pass's
    # finally closed its read-ahead after the interpreter had cleared readahead's globals; as that does:
    import fastdata.reading.readahead as readahead

    ra = ReadAhead(_Recorder(), [np.array([k]) for k in range(4)], first=0, lead=1, ahead_bytes=0)
    monkeypatch.setattr(readahead, "threading", None)
    ra.close()
    ra._thread.join(5)
    assert not ra._thread.is_alive()


def test_drop_page_cache_empties_it_for_a_file(tmp_path):
    f = tmp_path / "f.bin"
    f.write_bytes(np.random.default_rng(0).bytes(1 << 20))
    import os

    os.sync()
    f.read_bytes()
    drop_page_cache([f])
    assert resident_bytes([f]) < (1 << 20) // 2


@pytest.mark.parametrize("key", [("hdf5", "lz4"), ("lmdb", None)])
def test_read_ahead_with_worker_processes_reads_the_same(data, key):
    """Worker processes share the page cache: the hints start once the workers are forked (after the
    first batch), and the batches are those of the threads, bit for bit."""
    got = []
    for mode, ra in (("processes", 1), ("threads", 0)):
        with fastdata.loader(data[2][key], 16, seed=4, device="cpu", num_workers=2,
                             config=LoaderConfig(mode=mode, readahead=ra)) as ld:
            got.append(_batches(ld))
    _same(*got)


@pytest.mark.slow
def test_rss_stays_flat_over_20_cold_epochs(tmp_path):
    """The loader's anonymous memory does not grow epoch after epoch with the page cache emptied before each."""
    x = np.random.default_rng(0).poisson(20, (400, 2, 64, 21, 21)).astype(np.float32)  # 90 MB
    np.save(tmp_path / "x.npy", x)
    fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1, shard_size=16 << 20)), arrays={"x": tmp_path / "x.npy"})
    files = sorted((tmp_path / "ds").glob("shard-*"))

    def anon_kib() -> int:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("RssAnon:"))

    seen = []
    ld = fastdata.loader(tmp_path / "ds", 32, device="cpu")
    for _ in range(20):
        ld.close()  # unmaps the shards, so that the pages can be dropped
        drop_page_cache(files)
        for _b in ld:
            pass
        seen.append(anon_kib())
    ld.close()
    assert max(seen[2:]) - seen[1] < 16 << 10, seen  # KiB: no growth beyond noise after the first epochs


def test_long_ranges_are_hinted_in_pieces_the_kernel_reads_whole(tmp_path, monkeypatch):
    """Linux may read only 128 KiB (its default read-ahead) of one WILLNEED hint: longer ranges go in pieces."""
    from fastdata.reading import readahead

    f = tmp_path / "f.bin"
    f.write_bytes(bytes(1 << 20))
    calls = []
    monkeypatch.setattr(readahead.os, "posix_fadvise", lambda fd, off, n, advice: calls.append((off, n)))
    rec = _Recorder()

    def ranges(batch):
        rec(batch)
        return [(f, np.array([1000]), np.array([700 << 10]))]

    ra = ReadAhead(ranges, [np.array([0])], first=0, lead=0, ahead_bytes=0)
    rec.wait_for(1)
    ra.close()
    assert calls == [(1000 + (k << 17), 128 << 10) for k in range(5)] + [(1000 + (640 << 10), 60 << 10)]


def test_read_ahead_skips_the_hints_of_batches_found_in_the_page_cache(tmp_path, monkeypatch):
    """Warm: after WARM_STREAK batches found cached, a batch whose probe hits is not hinted. Cold: all are."""
    import os

    from fastdata.reading import readahead

    if not hasattr(os, "RWF_NOWAIT"):
        pytest.skip("no preadv2 RWF_NOWAIT on this platform: read-ahead always hints")
    f = tmp_path / "f.bin"
    f.write_bytes(np.random.default_rng(0).bytes(24 << 20))
    os.sync()
    plan = [np.array([k, k]) for k in range(24)]
    asked: list[int] = []  # samples each ranges() call was asked for

    def ranges(batch):
        asked.append(len(batch))
        return [(f, np.array([int(batch[0]) << 20]), np.array([1 << 20]))]

    def run(memo=None) -> tuple[int, int]:
        calls = []
        asked.clear()
        monkeypatch.setattr(readahead.os, "posix_fadvise", lambda fd, off, n, advice: calls.append(off))
        # hints only: a stream read of these consecutive ranges lets the kernel read several MB ahead of
        # it, and a later batch's probe may then find its pages cached (rightly skipped, but by timing:
        # it failed once so), which this test of the probes must not depend on
        monkeypatch.setattr(readahead._Streams, "continues", lambda self, *a, **k: False)
        ra = ReadAhead(ranges, plan, first=0, lead=len(plan), ahead_bytes=0, memo=memo)
        ra._thread.join(timeout=10)
        monkeypatch.undo()
        return ra.skipped, len({off >> 20 for off in calls}) + ra.streamed_bytes // (1 << 20)  # hinted or streamed

    f.read_bytes()  # warm
    skipped, hinted = run()
    assert (skipped, hinted) == (len(plan) - readahead.WARM_STREAK, readahead.WARM_STREAK)
    # once warm, one sample's ranges are worked out for the probe, not the whole batch's (a hinted batch also
    # works out the next batch's, to find the streams that start in it)
    w = readahead.WARM_STREAK
    assert asked == [2] * (2 * w + 1) + [1] * (len(plan) - w - 1)
    memo: dict[str, bool] = {}
    run(memo)
    assert memo == {"warm": True}
    assert run(memo) == (len(plan), 0) and asked == [1] * len(plan)  # a pass after a warm one starts warm
    drop_page_cache([f])
    if resident_bytes([f]) > (1 << 20):
        pytest.skip("the page cache could not be emptied for the test file")
    skipped, hinted = run()
    assert skipped == 0 and hinted == len(plan)
    drop_page_cache([f])
    skipped, hinted = run(memo)  # started warm, found cold: the first miss hints it, and every batch after
    assert skipped == 0 and hinted == len(plan) and memo == {"warm": False}


def _partly_cached(tmp_path, mb: int, first_mb: int, cached_mb: int, most_mb: int):
    """A file of ``mb`` MB with only ``cached_mb`` MB from ``first_mb`` on read into the page cache
    (skips where the probes cannot run, or the cache is not emptied: more than ``most_mb`` MB resident)."""
    import os

    if not hasattr(os, "RWF_NOWAIT"):
        pytest.skip("no preadv2 RWF_NOWAIT on this platform: read-ahead always hints")
    f = tmp_path / "f.bin"
    f.write_bytes(np.random.default_rng(mb).bytes(mb << 20))
    os.sync()
    drop_page_cache([f])
    with open(f, "rb") as fh:
        fh.seek(first_mb << 20)
        fh.read(cached_mb << 20)
    if resident_bytes([f]) > (most_mb << 20):
        pytest.skip("the page cache could not be emptied for the test file")
    return f


def test_read_ahead_counts_a_batch_as_cached_only_when_all_its_ranges_are(tmp_path, monkeypatch):
    """Before the warm streak every merged range of a batch is probed (its last byte): batches whose
    first range is cached (as a stream's kernel read-ahead leaves the start of the next batch's range)
    but whose other range is not are hinted, all of them, and the pass stays cold."""
    from fastdata.reading import readahead

    # the first 12 MB cached (and what the kernel reads ahead of them), not from 40 MB on
    f = _partly_cached(tmp_path, 64, 0, 12, 36)
    plan = [np.array([k]) for k in range(12)]

    def ranges(batch):  # a cached range and one that is not
        k = int(batch[0])
        return [(f, np.array([k << 20, (40 + k) << 20]), np.array([1 << 20, 1 << 20]))]

    monkeypatch.setattr(readahead._Streams, "continues", lambda self, *a, **k: False)
    memo: dict[str, bool] = {}
    ra = ReadAhead(ranges, plan, first=0, lead=len(plan), ahead_bytes=0, memo=memo)
    ra._thread.join(timeout=10)
    assert ra.skipped == 0 and ra.hinted_bytes == len(plan) * (2 << 20) and memo == {"warm": False}


def test_read_ahead_stays_cold_for_the_rest_of_a_pass_that_found_a_batch_not_cached(tmp_path, monkeypatch):
    """A cold pass is not taken for a warm one later: what a probe finds cached after a miss may be the
    read-ahead's own work (a stream's kernel read-ahead runs MBs past it). Here the first 4 batches are
    not cached and the 20 after them are: all 24 are hinted, none skipped (the streak of hits used to
    turn the pass warm after WARM_STREAK batches and skip the rest)."""
    from fastdata.reading import readahead

    f = _partly_cached(tmp_path, 24, 4, 20, 21)  # batches 4-23 cached, 0-3 not
    plan = [np.array([k]) for k in range(24)]
    hinted: list[int] = []
    monkeypatch.setattr(readahead.os, "posix_fadvise", lambda fd, off, n, advice: hinted.append(off >> 20))
    monkeypatch.setattr(readahead._Streams, "continues", lambda self, *a, **k: False)
    memo: dict[str, bool] = {}
    ra = ReadAhead(lambda b: [(f, np.array([int(b[0]) << 20]), np.array([1 << 20]))], plan, first=0,
                   lead=len(plan), ahead_bytes=0, memo=memo)
    ra._thread.join(timeout=10)
    assert ra.skipped == 0 and sorted(set(hinted)) == list(range(24)) and memo == {"warm": False}


def test_read_ahead_reads_sequential_streams_in_order_and_hints_the_rest(tmp_path, monkeypatch):
    """A range that continues an earlier range of the same file is read ahead with preads in order
    (its pages end up in the page cache); a range that starts elsewhere is hinted (WILLNEED)."""
    import os

    from fastdata.reading import readahead

    f = tmp_path / "f.bin"
    f.write_bytes(np.random.default_rng(0).bytes(16 << 20))
    os.sync()
    mb = 1 << 20
    # two streams: 0, 1, 2, 3 MiB ... and 8, 9, 10 MiB ..., side by side; then one random range.
    # A range that the plan's next batch continues starts a stream: read from there; the random one is hinted.
    plan = [np.array([k]) for k in range(5)]

    def ranges(batch):
        k = int(batch[0])
        if k == 4:
            return [(f, np.array([14 * mb]), np.array([mb]))]
        return [(f, np.array([k * mb, (8 + k) * mb]), np.array([mb, mb]))]

    drop_page_cache([f])
    if resident_bytes([f]) > mb:
        pytest.skip("the page cache could not be emptied for the test file")
    hinted: list[int] = []
    real = readahead.os.posix_fadvise

    def spy(fd, off, n, advice):
        hinted.append(off)
        return real(fd, off, n, advice)

    monkeypatch.setattr(readahead.os, "posix_fadvise", spy)
    opened: list[int] = []
    closed: list[int] = []
    real_open, real_close = readahead.os.open, readahead.os.close
    import threading

    def counted_open(*a, **k):
        fd = real_open(*a, **k)
        if threading.current_thread().name.startswith("fastdata-stream"):
            opened.append(fd)
        return fd

    monkeypatch.setattr(readahead.os, "open", counted_open)
    monkeypatch.setattr(readahead.os, "close", lambda fd: (closed.append(fd), real_close(fd))[1])
    ra = ReadAhead(ranges, plan, first=0, lead=len(plan), ahead_bytes=0)
    ra._thread.join(timeout=10)
    assert not ra._thread.is_alive()
    assert ra.streamed_bytes == 8 * mb  # batches 0-3 of both streams: the next batch shows where streams start
    assert sorted({o // mb for o in hinted}) == [14]  # the random range
    ra.close()
    monkeypatch.undo()
    # each stream is read in order on one file descriptor of its own (the kernel's read-ahead state),
    # however its ranges were queued; every descriptor opened was closed
    assert len(opened) == 2 and set(opened) <= set(closed)
    assert resident_bytes([f]) >= 6 * mb  # the streamed ranges were really read: cached now
