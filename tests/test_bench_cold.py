"""benchmarks/bench_cold.py --quick runs end to end in a temporary folder and writes its results;
``fastdata bench --cold`` measures a dataset cold. No timing is asserted (docs/benchmarks.md has the figures)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fastdata
import fastdata.write
from fastdata.write import WriteOptions
from fastdata import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a subprocess run of the benchmark in quick mode; .ci/run runs the slow set after the README's command
def test_quick_cold_benchmark_completes_and_writes_json_and_markdown(tmp_path, monkeypatch):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_cold.py"), "--quick", "--out", str(tmp_path),
                        "--dir", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads((tmp_path / "cold_quick.json").read_text())
    assert {"rows", "ceilings", "warm", "shuffle_quality", "rss", "targets"} <= set(data)
    assert data["ratio"]["hdf5_lz4"] > 1.5  # Poisson counts compress
    assert all(v["resident_before"] < 0.5 for v in data["rows"].values())  # the cache really was emptied
    # a quick run leaves the machine's page cache alone; every pass counts its memory stalls (/proc/vmstat)
    assert data["whole_page_cache_dropped"] is False and "MemFree" in data["memory_mib_before"]
    assert all(len(v["stalls_all"]) == len(v["all"]) and all(x >= 0 for x in v["stalls_all"])
               for v in [*data["rows"].values(), *data["ceilings"].values()])
    assert data["shuffle_quality"]["True"]["mixing"] > data["shuffle_quality"]["False"]["mixing"]
    ph = data["photos"]  # photos of mixed sizes: raw (ragged), raw at one size, JPEG; the pread ceiling
    assert {"raw, mixed sizes", f"raw, one size ({ph['one_side']}x{ph['one_side']})", "JPEG, mixed sizes (decoded)"} \
        <= set(ph["rows"]) and any(k.startswith("pread") for k in ph["rows"])
    assert all(v["resident_before"] < 0.5 for v in ph["rows"].values())
    assert ph["dataset_bytes"]["raw, mixed sizes"] > ph["dataset_bytes"]["JPEG, mixed sizes (decoded)"]
    assert data["ceiling_check"]["checked"] == 4  # the 3 targets against the disk, and the photos' against theirs
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the paired before/after run reads the rows from this JSON
    import pair_trees

    rows, _ = pair_trees.parse_cold(data)
    assert len(rows) > len(data["rows"]) + len(data["ceilings"]) and all(min(p) > 0 for _, p in rows.values())
    assert set(data["targets_per_round"]) <= set(data["targets"]) and len(data["targets_per_round"]) == 4
    assert set(data["targets_back_to_back"]) == set(data["targets_per_round"])
    assert all(len(v["all"]) == data["rounds"] and v["median"] > 0 for v in data["targets_back_to_back"].values())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("bench_cold_")] == []  # its work folder went


def test_fastdata_bench_cold_on_a_small_dataset(tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).poisson(9, (64, 4, 32, 32)).astype(np.float32))
    fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1)), arrays={"x": tmp_path / "x.npy"})
    assert cli.main(["bench", str(tmp_path / "ds"), "--cold", "--batches", "2", "--seconds", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    names = [r["name"] for r in out["results"]]
    assert out["cold"] and any("shuffle=True" in n for n in names) and any(n.startswith("pread") for n in names)
    assert any("streams in order" in n for n in names) and any("hinted 256 MiB ahead" in n for n in names)
    assert all(r["samples_per_s"] > 0 for r in out["results"])
    assert all(isinstance(r["memory_stalls"], int) and r["memory_stalls"] >= 0 for r in out["results"])
    assert cli.main(["bench", str(tmp_path / "ds"), "--cold", "--batches", "1", "--seconds", "1", "--no-ceiling"]) == 0
    assert "shuffle='block', cold" in capsys.readouterr().out


def test_pread_pass_reads_every_byte_once_in_each_pattern(tmp_path):
    from fastdata.measure.bench import pread_pass

    sizes = [5 << 20, 3 << 20, 123457]
    paths = []
    for i, n in enumerate(sizes):
        paths.append(tmp_path / f"f{i}")
        paths[-1].write_bytes(bytes(n))
    for kw in ({"shuffled": True}, {"shuffled": False}, {"shuffled": False, "streams": True},
               {"sink": "ahead"}, {"sink": "ahead", "copiers": 1}, {"sink": "ahead", "ahead_bytes": 1}):
        for threads in (1, 3, 16):
            assert pread_pass(paths, 1 << 20, threads, **kw)["bytes"] == sum(sizes), (kw, threads)
    with pytest.raises(ValueError, match="sink"):
        pread_pass(paths, 1 << 20, 2, streams=True, sink="ahead")  # hints are for random reads


def test_pread_pass_hinted_random_reads_hint_each_request_once_within_the_bound(tmp_path, monkeypatch):
    """Random reads with a deep queue (sink="ahead" without streams): each request is hinted once and
    read once, into the buffers, and the hints run at most ``ahead_bytes`` ahead of the reads."""
    import os
    import threading

    from fastdata.measure import bench

    f = tmp_path / "f"
    f.write_bytes(np.random.default_rng(1).bytes((12 << 20) + 5))
    events: list[tuple[str, int]] = []
    lock = threading.Lock()
    real_read = os.preadv

    def note(kind, off):
        with lock:
            events.append((kind, off))

    monkeypatch.setattr(bench.os, "posix_fadvise", lambda fd, off, n, advice: note("hint", off))
    monkeypatch.setattr(bench.os, "preadv", lambda fd, bufs, off, *a: (note("read", off), real_read(fd, bufs, off, *a))[1])
    assert bench.pread_pass([f], 1 << 20, 8, sink="ahead", ahead_bytes=3 << 20)["bytes"] == (12 << 20) + 5
    offs = sorted(range(0, (12 << 20) + 5, 1 << 20))
    assert sorted(o for k, o in events if k == "hint") == offs and sorted(o for k, o in events if k == "read") == offs
    lead = 0
    for k, _ in events:  # hints ahead of finished reads: at most 3 (the bound) plus the 2 reads in flight
        lead += 1 if k == "hint" else -1
        assert lead <= 3 + 2


def test_fastdata_bench_cold_says_when_passes_waited_for_memory(tmp_path, capsys, monkeypatch):
    """Passes during which allocations on the machine stalled for reclaim or compaction (the page cache
    full of other files) are counted in a note: their figures include making room, not the disk alone."""
    import fastdata.measure.bench

    np.save(tmp_path / "x.npy", np.random.default_rng(0).poisson(9, (32, 4, 32, 32)).astype(np.float32))
    fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1)), arrays={"x": tmp_path / "x.npy"})
    args = ["bench", str(tmp_path / "ds"), "--cold", "--batches", "1", "--seconds", "1", "--no-ceiling"]
    monkeypatch.setattr(fastdata.measure.bench, "memory_stalls", lambda: 5)  # no stall during the passes: no note
    assert cli.main(args) == 0
    assert "waited for memory" not in capsys.readouterr().out
    counts = iter(range(0, 1000, 7))  # every reading of /proc/vmstat finds 7 more stalls
    monkeypatch.setattr(fastdata.measure.bench, "memory_stalls", lambda: next(counts))
    assert cli.main(args) == 0
    assert "note: during 2 of 2 passes, allocations on this machine waited for memory" in capsys.readouterr().out


def test_the_large_read_ceiling_is_the_best_read_of_1_mib_or_more(monkeypatch):
    """bench_cold's large-read ceiling: any read of 1 MiB or more, random ones too; not the sample-size
    reads hinted "256 MiB" ahead."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_cold

    ceil = {"pread 4 MiB, 16 threads, random": {"mb_per_s": 3.0}, "pread 1 MiB, 16 streams in order": {"mb_per_s": 2.0},
            f"pread 903168 B, {bench_cold.HINTED}": {"mb_per_s": 9.0},
            "pread 903168 B, 64 threads, random": {"mb_per_s": 7.0}}
    assert bench_cold.best_large(ceil)["mb_per_s"] == 3.0
    del ceil["pread 4 MiB, 16 threads, random"]
    assert bench_cold.best_large(ceil)["mb_per_s"] == 2.0


def _bench_cold():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_cold

    return bench_cold


def test_per_round_ratios_pair_the_passes_of_each_round():
    """A target's second figure is the median of each round's ratio, not the ratio of the two medians:
    a disk that is slow for a whole round slows both sides of that round alike."""
    b = _bench_cold()
    runs = {"loader": [{"samples_per_s": 10.0}, {"samples_per_s": 40.0}, {"samples_per_s": 9.0}],
            "ceiling": [{"mb_per_s": 10.0}, {"mb_per_s": 80.0}, {"mb_per_s": 10.0}]}
    assert b.per_round(runs, "loader", "ceiling", nbytes=2_000_000) == pytest.approx(1.8)  # 2.0, 1.0, 1.8


def test_back_to_back_pairs_run_each_pair_adjacent_in_both_orders():
    """The two passes of a pair run right after each other, in either order, every round; the ratio is
    always the pair's first name over its second, whichever ran first."""
    b = _bench_cold()
    calls: list[str] = []

    def fn(name, value):
        return lambda: (calls.append(name), {"samples_per_s": value} if name == "L" else {"mb_per_s": value})[1]

    out = b.back_to_back({"L": fn("L", 5.0), "C": fn("C", 20.0), "M": fn("M", 3.0), "D": fn("D", 1.0)},
                         {"t": ("L", "C"), "u": ("M", "D")}, rounds=8, nbytes=2_000_000)
    pairs = [tuple(calls[i : i + 2]) for i in range(0, len(calls), 2)]
    assert len(pairs) == 16 and all(set(p) in ({"L", "C"}, {"M", "D"}) for p in pairs)
    assert ("L", "C") in pairs and ("C", "L") in pairs  # both orders occur
    assert out["t"]["median"] == pytest.approx(0.5) and out["t"]["all"] == [0.5] * 8  # 10 MB/s over 20
    assert out["u"]["median"] == pytest.approx(3.0)


