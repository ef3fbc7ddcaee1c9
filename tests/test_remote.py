"""Datasets on object storage, against a real S3-compatible server on 127.0.0.1 (moto's standalone
server in a subprocess) through s3fs over HTTP: round trips, the shared bounded cache, faults,
stale locks, DDP. Nothing inside fastdata is patched."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs")
pytest.importorskip("moto")

from conftest import CREDS, S3Server, bucket, free_port, gloo_group, make_class_folder, opts  # noqa: E402
import fastdata  # noqa: E402
from fastdata.errors import CorruptShardError, FastdataError, IncompleteDatasetError, UsageError  # noqa: E402
from fastdata.fileio import file_checksum  # noqa: E402
from fastdata.remote.store import cache_name  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
def arrays_source(tmp: Path, n: int, row: int = 64) -> Path:
    """X.npy whose sample i is filled with i (so a batch names its samples), labels y = i."""
    x = np.repeat(np.arange(n, dtype=np.float32)[:, None], row, axis=1)
    np.save(tmp / "X.npy", x)
    np.save(tmp / "y.npy", np.arange(n, dtype=np.int64))
    return tmp


def convert_arrays(tmp: Path, dst, n: int, shard_size: int, row: int = 64, backend: str = "hdf5", **kw):
    src = arrays_source(tmp, n, row)
    config = fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, shard_size=shard_size, workers=1), **kw)
    return fastdata.convert(None, dst, config, arrays={"x": src / "X.npy"}, labels=src / "y.npy")


def cached_files(cache: Path) -> list[Path]:
    """The whole shards in a cache, named by the manifest's checksum: <algorithm>-<digest><ext>."""
    return [p for p in cache.iterdir() if re.fullmatch(r"(xxh3_128-[0-9a-f]{32}|sha256-[0-9a-f]{64})\.[a-z0-9]+", p.name)]


# --- round trip ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_round_trip_convert_to_s3_open_bit_exact(s3, tmp_path, backend):
    arrays = make_class_folder(tmp_path / "src", per_class=10)
    url = f"s3://{bucket(s3)}/ds"
    ro = opts(s3, tmp_path / "cache")
    report = fastdata.convert(tmp_path / "src", url, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, shard_size=4000, workers=1), remote=ro))
    assert report.dst == url and report.shards >= 3
    names = sorted(p.rsplit("/", 1)[-1] for p in s3.fs().ls(url[5:], refresh=True))
    assert "manifest.json" in names and ".fastdata-journal" not in names
    assert not (tmp_path / "cache" / "uploads").exists() or not any((tmp_path / "cache" / "uploads").iterdir())
    fastdata.convert(tmp_path / "src", tmp_path / "local", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, shard_size=4000, workers=1)))
    local = fastdata.open(tmp_path / "local")
    ds = fastdata.open(url, remote=ro)
    assert len(ds) == len(local) == len(arrays) and ds.manifest.to_json()["shards"] == local.manifest.to_json()["shards"]
    a, b = ds.get_batch(np.arange(len(ds))), local.get_batch(np.arange(len(ds)))
    for k in b:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k])
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i]["x"], local[i]["x"])
    assert ds.remote.stats()["downloads"] == len(ds.manifest.shards)


def test_url_is_never_a_local_path(s3, tmp_path, monkeypatch, run_cli):
    monkeypatch.chdir(tmp_path)
    arrays_source(tmp_path, 10)
    with pytest.raises(UsageError, match="unknown URL scheme 'zz'"):
        fastdata.convert(None, "zz://bucket/ds", arrays={"x": tmp_path / "X.npy"})
    with pytest.raises(UsageError, match="unknown URL scheme"):
        fastdata.open("zz://bucket/ds")
    with pytest.raises(UsageError, match="needs gcsfs"):  # a known scheme whose package is not installed here
        fastdata.open("gs://bucket/ds", remote=fastdata.RemoteOptions(cache_dir=tmp_path / "c0"))
    with pytest.raises(UsageError, match="only the destination may be a URL"):
        fastdata.convert("s3://bucket/src", tmp_path / "out")
    with pytest.raises(UsageError, match="apply to URLs"):
        fastdata.open(tmp_path, remote=fastdata.RemoteOptions())
    code, _, err = run_cli("convert", "--data", "X.npy", "zz://bucket/ds")
    assert code == 2 and "zz" in err and "Traceback" not in err
    assert sorted(os.listdir(tmp_path)) == ["X.npy", "y.npy"]  # no folder named 'zz:' or 's3:'
    with pytest.raises(FastdataError, match="no fastdata dataset there"):
        fastdata.open(f"s3://{bucket(s3)}/nothing", remote=opts(s3, tmp_path / "c"))


def test_cli_convert_info_verify_bench_on_s3(s3, tmp_path, monkeypatch, run_cli):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)  # botocore reads it: the CLI has no endpoint flag
    monkeypatch.setenv("FASTDATA_REMOTE_CACHE", str(tmp_path / "cache"))
    arrays_source(tmp_path, 40)
    url = f"s3://{bucket(s3)}/cli"
    code, out, err = run_cli("convert", "--data", tmp_path / "X.npy", "--labels", tmp_path / "y.npy", url,
                             "--shard-size", "4KB", "--quiet", "--workers", "1")
    assert code == 0, err
    assert url in out
    code, out, err = run_cli("info", url)
    assert code == 0 and "samples   40" in out, err
    code, out, err = run_cli("verify", url, "--deep", "--quiet")
    assert code == 0 and "OK" in out, err
    code, out, err = run_cli("convert", "--data", tmp_path / "X.npy", url, "--quiet")
    assert code == 2 and "already exists" in err
    code, out, err = run_cli("bench", url, "--batches", "3", "--no-ceiling", "--workers", "1", "--batch-size", "8")
    assert code == 0, err
    victim = url[5:] + "/shard-00001.h5"
    fs = s3.fs()
    data = bytearray(fs.cat_file(victim))
    data[-100] ^= 0xFF
    fs.pipe_file(victim, bytes(data))
    monkeypatch.setenv("FASTDATA_REMOTE_CACHE", str(tmp_path / "cache2"))  # not the copy cached before
    code, out, err = run_cli("verify", url, "--quiet")
    assert code == 1 and "BAD" in out and "shard-00001.h5" in out and "checksum" in out, (out, err)


# --- the shared, bounded cache ------------------------------------------------------------

_READER = textwrap.dedent("""
    import json, sys, numpy as np, fastdata
    url, cache, endpoint = sys.argv[1:4]
    ro = fastdata.RemoteOptions(cache_dir=cache, storage_options={"client_kwargs": {"endpoint_url": endpoint}},
                                timeout=30)
    ds = fastdata.open(url, remote=ro)
    x = ds.get_batch(np.arange(len(ds)))["x"]
    ok = bool((x == np.arange(len(ds), dtype=np.float32)[:, None]).all())
    print(json.dumps({"ok": ok, **ds.remote.stats()}))
""")


def test_remote_dataset_pickles_and_releases_its_cache_files_when_dropped(s3, tmp_path):
    """Issue 13's lifecycle on a URL: a dataset pickles without threads or locks, and one dropped
    without close() (its idle pins and reader handles still held) leaves no cache file open."""
    import gc
    import pickle

    url = f"s3://{bucket(s3)}/life"
    convert_arrays(tmp_path, url, 100, shard_size=2_000, remote=opts(s3, tmp_path / "up"))
    cache = tmp_path / "cache"

    def open_cache_files() -> int:
        fd_dir = Path("/proc/self/fd")
        targets = []
        for fd in fd_dir.iterdir():
            try:
                targets.append(os.readlink(fd))
            except OSError:
                continue
        return sum(1 for t in targets if t.startswith(str(cache)))

    ds = fastdata.open(url, remote=opts(s3, cache))
    x = ds.get_batch(np.arange(len(ds)))["x"]
    assert np.array_equal(x[:, 0], np.arange(100, dtype=np.float32))
    assert open_cache_files() > 0  # idle pins kept for the next batch
    copy = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(copy.get_batch([5, 99])["x"][:, 0], [5, 99])
    copy.close()
    del ds, copy
    gc.collect()
    assert open_cache_files() == 0


def test_two_processes_share_one_cache_and_download_each_shard_once(s3, tmp_path):
    url = f"s3://{bucket(s3)}/shared"
    convert_arrays(tmp_path, url, 400, shard_size=20_000, remote=opts(s3, tmp_path / "up"))
    shards = len(fastdata.open(url, remote=opts(s3, tmp_path / "probe")).manifest.shards)
    assert shards >= 5
    env = {**os.environ, **CREDS, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _READER, url, str(tmp_path / "cache"), s3.endpoint],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) for _ in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    assert all(r["ok"] for r in results)
    assert sum(r["downloads"] for r in results) == shards
    assert len(cached_files(tmp_path / "cache")) == shards


def test_cache_limit_respected_over_epochs_on_a_dataset_3x_the_cache(s3, tmp_path):
    n = 900
    url = f"s3://{bucket(s3)}/big"
    convert_arrays(tmp_path, url, n, shard_size=8_000, row=64, remote=opts(s3, tmp_path / "up"))
    probe = fastdata.open(url, remote=opts(s3, tmp_path / "probe"))
    total = sum(s.bytes for s in probe.manifest.shards)
    biggest = max(s.bytes for s in probe.manifest.shards)
    limit = total // 3
    assert limit >= 5 * biggest  # room for the shard window, the readers and the prefetch
    ro = opts(s3, tmp_path / "cache", cache_limit=limit, prefetch_shards=1)
    ld = fastdata.loader(url, 16, shuffle="shards", remote=ro, device="cpu", num_workers=2)
    peak = 0
    stop = threading.Event()

    def watch() -> None:  # what the cache directory holds, sampled while the loader runs
        nonlocal peak
        import fcntl

        # listed under the cache's eviction lock, as reservations are made: else an eviction and the
        # next reservation between two steps of the listing would count both files
        evict_lock = os.open(tmp_path / "cache" / ".evict.lock", os.O_RDWR | os.O_CREAT, 0o644)
        while not stop.is_set():
            sizes = {}  # by inode: a download renamed while we list it is counted once
            fcntl.flock(evict_lock, fcntl.LOCK_EX)
            try:
                for p in (tmp_path / "cache").iterdir():
                    if re.fullmatch(r"(xxh3_128|sha256)-[0-9a-f]+\.[a-z0-9]+(\.\d+\.part)?", p.name):  # shards, downloads
                        try:
                            st = p.stat()
                        except FileNotFoundError:
                            continue
                        sizes[st.st_ino] = st.st_size
            finally:
                fcntl.flock(evict_lock, fcntl.LOCK_UN)
            held = sum(sizes.values())
            peak = max(peak, held)
            time.sleep(0.005)

    t = threading.Thread(target=watch)
    t.start()
    try:
        downloads = []
        for epoch in range(3):
            seen = []
            for batch in ld:
                seen += batch["x"][:, 0].long().tolist()
                assert ld.dataset.remote.cache.held_bytes() <= limit
            assert sorted(seen) == list(range(n)), f"epoch {epoch} did not yield every sample once"
            downloads.append(ld.dataset.remote.stats()["downloads"])
    finally:
        stop.set()
        t.join()
        ld.close()
    assert 0 < peak <= limit
    assert downloads[-1] > len(probe.manifest.shards)  # it did evict and fetch again: the cache is smaller


def test_shard_shuffle_is_a_pure_function_and_local_to_a_few_shards():
    from fastdata.reading.samplers import epoch_order

    counts = [10, 7, 10, 3, 10, 10]
    a = epoch_order(50, shuffle="shards", seed=3, epoch=1, shard_counts=counts)
    assert np.array_equal(a, epoch_order(50, shuffle="shards", seed=3, epoch=1, shard_counts=counts))
    assert sorted(a.tolist()) == list(range(50))
    assert not np.array_equal(a, epoch_order(50, shuffle="shards", seed=3, epoch=2, shard_counts=counts))
    starts = np.cumsum([0] + counts[:-1])
    shard = np.searchsorted(starts, a, side="right") - 1
    pos = 0
    for _ in range(3):  # each window holds the samples of exactly two shards
        seg = shard[pos:]
        first_two = []
        for s in seg:
            if s not in first_two:
                if len(first_two) == 2:
                    break
                first_two.append(s)
        perm_size = sum(counts[s] for s in first_two)
        assert set(shard[pos:pos + perm_size].tolist()) == set(first_two)
        pos += perm_size
    with pytest.raises(ValueError):
        epoch_order(50, shuffle="shards", seed=0, epoch=0)


# --- faults -------------------------------------------------------------------------------


def test_server_killed_mid_download_then_restarted(tmp_path):
    """A private server (killing the shared one would break other tests): kill it while a shard is
    being downloaded, restart it with the same objects; the read either succeeds bit-exact after
    retrying or fails with one clear error within the time bound, and nothing corrupt is cached."""
    os.environ.update(CREDS)
    server = S3Server(free_port())
    server.start()
    try:
        src = arrays_source(tmp_path, 64, row=160_000)  # 640 KB per sample: slow enough to catch mid-download
        fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=12 << 20, workers=1)), labels=src / "y.npy", arrays={"x": src / "X.npy"})
        files = sorted(os.listdir(tmp_path / "ds"))

        def upload() -> None:
            fs = server.fs()
            fs.mkdir("crash")
            for f in files:
                fs.put_file(str(tmp_path / "ds" / f), f"crash/ds/{f}")

        upload()
        ro = opts(server, tmp_path / "cache", timeout=15.0)
        ds = fastdata.open("s3://crash/ds", remote=ro)
        outcome: dict[str, object] = {}

        def read() -> None:
            t0 = time.monotonic()
            try:
                outcome["x"] = ds.get_batch(np.arange(len(ds)))["x"]
            except FastdataError as e:
                outcome["error"] = e
            outcome["seconds"] = time.monotonic() - t0

        t = threading.Thread(target=read)
        t.start()
        deadline = time.monotonic() + 30
        while not list((tmp_path / "cache").glob("*.part")) and time.monotonic() < deadline and t.is_alive():
            time.sleep(0.001)
        assert list((tmp_path / "cache").glob("*.part")), "the download finished before the kill"
        server.kill()
        time.sleep(1.0)
        server.start()
        upload()
        t.join(timeout=120)
        assert not t.is_alive()
        if "error" in outcome:
            msg = str(outcome["error"])
            assert "s3://crash/ds/shard-" in msg and "Traceback" not in msg
            assert outcome["seconds"] < 15.0 * len(files) + 30
        else:
            x = outcome["x"]
            assert np.array_equal(x[:, 0], np.arange(64, dtype=np.float32)) and (x == x[:, :1]).all()
        for p in cached_files(tmp_path / "cache"):  # whatever is cached is whole and checked
            algorithm, _, digest = p.name.split(".")[0].partition("-")
            assert file_checksum(p, algorithm) == f"{algorithm}:{digest}"
        assert not list((tmp_path / "cache").glob("*.part"))
    finally:
        server.kill()


class Proxy:
    """A TCP relay on 127.0.0.1 in front of the S3 server: ``kill()`` drops every connection and stops
    listening (the endpoint is gone mid-transfer), ``start()`` listens again on the same port."""

    def __init__(self, target: int) -> None:
        import socket

        self.socket_mod = socket
        self.target = target
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.conns: list = []
        self.listener = None

    def start(self) -> None:
        sock = self.socket_mod.socket()
        sock.setsockopt(self.socket_mod.SOL_SOCKET, self.socket_mod.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self.listener = sock
        threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def _accept(self, sock) -> None:
        while True:
            try:
                client, _ = sock.accept()
            except OSError:
                return
            upstream = self.socket_mod.create_connection(("127.0.0.1", self.target))
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a, b) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def kill(self) -> None:
        if self.listener is not None:
            self.listener.close()
            self.listener = None
        for c in self.conns:
            try:
                c.shutdown(self.socket_mod.SHUT_RDWR)
                c.close()
            except OSError:
                pass
        self.conns = []


def test_endpoint_gone_mid_download_then_back_succeeds_after_retry(s3, tmp_path):
    """The S3 endpoint vanishes mid-download (every connection reset, nothing listening) and comes
    back 1.5 s later with the same objects: the download is retried and the read is bit-exact."""
    b = bucket(s3)
    src = arrays_source(tmp_path, 48, row=160_000)  # 640 KB per sample
    fastdata.convert(None, f"s3://{b}/ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=12 << 20, workers=1), remote=opts(s3, tmp_path / "up")), labels=src / "y.npy", arrays={"x": src / "X.npy"})
    proxy = Proxy(s3.port)
    proxy.start()
    try:
        ro = fastdata.RemoteOptions(cache_dir=tmp_path / "cache", timeout=30.0,
                                    storage_options={"client_kwargs": {"endpoint_url": proxy.endpoint}})
        ds = fastdata.open(f"s3://{b}/ds", remote=ro)
        outcome: dict[str, object] = {}

        def read() -> None:
            try:
                outcome["x"] = ds.get_batch(np.arange(len(ds)))["x"]
            except FastdataError as e:
                outcome["error"] = e

        t = threading.Thread(target=read)
        t.start()
        deadline = time.monotonic() + 30
        while not list((tmp_path / "cache").glob("*.part")) and time.monotonic() < deadline and t.is_alive():
            time.sleep(0.001)
        assert list((tmp_path / "cache").glob("*.part")), "the download finished before the endpoint went away"
        proxy.kill()
        time.sleep(1.5)
        proxy.start()
        t.join(timeout=90)
        assert not t.is_alive()
        assert "error" not in outcome, outcome.get("error")
        x = outcome["x"]
        assert np.array_equal(x[:, 0], np.arange(48, dtype=np.float32)) and (x == x[:, :1]).all()
        assert not list((tmp_path / "cache").glob("*.part"))
    finally:
        proxy.kill()


def test_corrupted_object_is_caught_by_the_checksum(s3, tmp_path, caplog):
    b = bucket(s3)
    url = f"s3://{b}/bad"
    convert_arrays(tmp_path, url, 100, shard_size=10_000, remote=opts(s3, tmp_path / "up"))
    fs = s3.fs()
    victim = f"{b}/bad/shard-00001.h5"
    data = bytearray(fs.cat_file(victim))
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    fs.pipe_file(victim, bytes(data))
    ds = fastdata.open(url, remote=opts(s3, tmp_path / "cache"))
    ds.get_batch([0])  # shard 0 is fine
    start = ds.manifest.shards[1].start
    with caplog.at_level(logging.WARNING, logger="fastdata.remote"):
        with pytest.raises(CorruptShardError, match=r"s3://.*/bad/shard-00001.h5.*checksum"):
            ds.get_batch([start])
    warned = [r.getMessage() for r in caplog.records if "does not match the manifest" in r.getMessage()]
    expected = ds.manifest.shards[1].checksum
    assert warned and all(f"(checksum xxh3_128:" in w and f", expected {expected})" in w for w in warned), warned
    name = cache_name(ds.manifest.shards[1])
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(name)]  # never cached, never read


def test_cache_too_small_for_a_shard_is_a_clear_error(s3, tmp_path):
    from fastdata.errors import CacheFullError

    url = f"s3://{bucket(s3)}/small"
    convert_arrays(tmp_path, url, 100, shard_size=10_000, remote=opts(s3, tmp_path / "up"))
    with pytest.raises(CacheFullError, match=r"small/shard-\d+\.h5: the shard is .* larger than the cache limit"):
        fastdata.open(url, remote=opts(s3, tmp_path / "cache", cache_limit="2KB"))


def test_cached_shard_truncated_while_another_reader_pins_it_is_downloaded_again(s3, tmp_path):
    """A cached file of the wrong size is downloaded again (docs/remote.md) also while another dataset pins it:
    the pin kept it from being removed, so the reader spun until its timeout (logging a warning each turn), then
    blamed the cache limit."""
    import fcntl

    url = f"s3://{bucket(s3)}/trunc"
    convert_arrays(tmp_path, url, 100, shard_size=10_000, remote=opts(s3, tmp_path / "up"))
    first = fastdata.open(url, remote=opts(s3, tmp_path / "cache"))
    first.get_batch([0])  # shard 0 cached, and pinned by `first` (its recently read shards stay pinned)
    cached = tmp_path / "cache" / cache_name(first.manifest.shards[0])
    fd = os.open(cached, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):  # the premise: someone pins it
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    os.truncate(cached, cached.stat().st_size // 2)
    second = fastdata.open(url, remote=opts(s3, tmp_path / "cache", timeout=5.0))
    count = second.manifest.shards[0].count
    assert np.array_equal(second.get_batch(np.arange(count))["x"][:, 0], np.arange(count, dtype=np.float32))
    assert second.remote.stats()["downloads"] == 1
    second.close()
    first.close()


@pytest.mark.parametrize("backend", ["hdf5", "lmdb"])
def test_a_damaged_cached_copy_is_named_by_its_url_and_the_advice_to_delete_it_works(s3, tmp_path, backend):
    """A cached copy of the right size with damaged bytes: the error named only the cache's hash-named file,
    which the user cannot tie to the dataset. It names the URL's shard and the cached copy, and says to delete
    the copy; doing so, as printed, downloads it again."""
    url = f"s3://{bucket(s3)}/damaged-{backend}"
    convert_arrays(tmp_path, url, 100, shard_size=10_000, backend=backend, remote=opts(s3, tmp_path / "up"))
    ds = fastdata.open(url, remote=opts(s3, tmp_path / "cache"))
    ds.get_batch([0])
    ds.close()
    cached = tmp_path / "cache" / cache_name(ds.manifest.shards[0])
    with open(cached, "r+b") as f:
        f.write(bytes(64))
    ds = fastdata.open(url, remote=opts(s3, tmp_path / "cache"))
    with pytest.raises(CorruptShardError) as e:
        ds.get_batch([0])
    said = str(e.value)
    assert said.startswith(f"shard {url}/{ds.manifest.shards[0].file} (cached copy {cached}: delete it to download it again)")
    ds.close()
    Path(re.search(r"cached copy (\S+):", said).group(1)).unlink()
    ds = fastdata.open(url, remote=opts(s3, tmp_path / "cache"))
    count = ds.manifest.shards[0].count
    assert np.array_equal(ds.get_batch(np.arange(count))["x"][:, 0], np.arange(count, dtype=np.float32))
    ds.close()


def test_cache_on_a_full_disk_is_a_cache_full_error(s3, tmp_path):
    """docs/remote.md: a full cache disk is a CacheFullError naming the shard (it was an OSError from
    writing the download's lock file, which fails first on a disk with no byte free). Needs root (mount)."""
    from fastdata.errors import CacheFullError

    url = f"s3://{bucket(s3)}/fulldisk"
    convert_arrays(tmp_path, url, 100, shard_size=10_000, remote=opts(s3, tmp_path / "up"))
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        with open(disk / "filler", "wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(bytes(4096))
        ds = fastdata.open(url, remote=opts(s3, disk / "cache"))
        with pytest.raises(CacheFullError, match=r"fulldisk/shard-00000\.h5: the cache disk is full \(.*/disk/cache\)"):
            ds.get_batch([0])
        ds.close()
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_missing_shard_is_one_error_naming_url_and_shard(s3, tmp_path):
    b = bucket(s3)
    url = f"s3://{b}/gone"
    convert_arrays(tmp_path, url, 100, shard_size=10_000, remote=opts(s3, tmp_path / "up"))
    s3.fs().rm_file(f"{b}/gone/shard-00002.h5")
    ds = fastdata.open(url, remote=opts(s3, tmp_path / "cache", timeout=5.0))
    t0 = time.monotonic()
    with pytest.raises(FastdataError, match=r"gone/shard-00002.h5.*no such object"):
        ds.get_batch([ds.manifest.shards[2].start])
    assert time.monotonic() - t0 < 5.0  # permanent: no retrying until the bound


_KILLED = textwrap.dedent("""
    import sys, numpy as np, fastdata
    url, cache, endpoint = sys.argv[1:4]
    ro = fastdata.RemoteOptions(cache_dir=cache, storage_options={"client_kwargs": {"endpoint_url": endpoint}})
    ds = fastdata.open(url, remote=ro)
    while True:
        ds.get_batch(np.arange(len(ds)))
        ds.close()
        for p in __import__("pathlib").Path(cache).glob("*.h5"):
            p.unlink()
""")


def test_stale_lock_from_a_sigkilled_process_does_not_block(s3, tmp_path):
    url = f"s3://{bucket(s3)}/stale"
    convert_arrays(tmp_path, url, 40, shard_size=4 << 20, row=40_000, remote=opts(s3, tmp_path / "up"))
    cache = tmp_path / "cache"
    env = {**os.environ, **CREDS, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", _KILLED, url, str(cache), s3.endpoint], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (list(cache.glob("*.part")) and list(cache.glob("*.lock"))) and time.monotonic() < deadline:
            assert p.poll() is None, p.stderr.read().decode() if p.stderr else ""
            time.sleep(0.001)
        assert list(cache.glob("*.part")), "never caught the child mid-download"
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    left = [q for q in cache.iterdir() if q.name.endswith((".lock", ".part"))]
    assert any(q.name.endswith(".part") for q in left)  # the dead process's leftovers are there,
    locks = [json.loads(q.read_text()) for q in left if q.name.endswith(".lock") and not q.name.startswith(".")]
    assert any(lk["pid"] == p.pid for lk in locks)  # and its download lock names it (pid and host)
    t0 = time.monotonic()
    ds = fastdata.open(url, remote=opts(s3, cache, timeout=10.0))
    x = ds.get_batch(np.arange(len(ds)))["x"]
    assert np.array_equal(x[:, 0], np.arange(40, dtype=np.float32))
    assert time.monotonic() - t0 < 10.0
    assert not list(cache.glob("*.part")) and not [q for q in cache.glob("*.lock") if not q.name.startswith(".")]


# --- writing: resume against the remote copy ---------------------------------------------


def test_interrupted_conversion_to_s3_resumes_from_the_remote_copy(s3, tmp_path, monkeypatch):
    url = f"s3://{bucket(s3)}/resume"
    src = arrays_source(tmp_path, 200)

    def convert(cache: Path, **kw):
        config = fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=8_000, workers=1), remote=opts(s3, cache), **kw)
        return fastdata.convert(None, url, config, arrays={"x": src / "X.npy"}, labels=src / "y.npy")

    monkeypatch.setenv("FASTDATA_FAULT", "eio:between_shards:2")
    with pytest.raises(FastdataError, match="uploaded to s3://.*resume=True"):
        convert(tmp_path / "up")
    names = [p.rsplit("/", 1)[-1] for p in s3.fs().ls(url[5:], refresh=True)]
    assert ".fastdata-journal" in names and "manifest.json" not in names
    with pytest.raises(IncompleteDatasetError, match="--resume"):
        fastdata.open(url, remote=opts(s3, tmp_path / "c"))
    monkeypatch.delenv("FASTDATA_FAULT")
    with pytest.raises(UsageError, match="interrupted conversion; pass resume=True"):
        convert(tmp_path / "up")
    report = convert(tmp_path / "elsewhere", resume=True)  # another machine: only the remote copy to go on
    assert report.kept >= 1 and report.dst == url
    ds = fastdata.open(url, remote=opts(s3, tmp_path / "c2"))
    x = ds.get_batch(np.arange(200))["x"]
    assert np.array_equal(x[:, 0], np.arange(200, dtype=np.float32))
    names = [p.rsplit("/", 1)[-1] for p in s3.fs().ls(url[5:], refresh=True)]
    assert ".fastdata-journal" not in names
    with pytest.raises(UsageError, match="nothing to resume"):
        convert(tmp_path / "up", resume=True)


def test_refused_resume_to_a_url_names_the_url_not_the_staging_folder(s3, tmp_path, monkeypatch):
    """--resume of a URL conversion with other options, or over a damaged remote journal, is refused naming the URL
    (it named the local staging folder, ~/.cache/fastdata/remote/uploads/<hash>, which the user never chose)."""
    url = f"s3://{bucket(s3)}/refused"
    src = arrays_source(tmp_path, 200)

    def convert(shard_size: int, **kw):
        config = fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=shard_size, workers=1),
                                        remote=opts(s3, tmp_path / "up"), **kw)
        return fastdata.convert(None, url, config, arrays={"x": src / "X.npy"})

    monkeypatch.setenv("FASTDATA_FAULT", "eio:between_shards:2")
    with pytest.raises(FastdataError, match="resume=True"):
        convert(8_000)
    monkeypatch.delenv("FASTDATA_FAULT")
    with pytest.raises(UsageError, match=rf"^{url}: resume=True refused: .*it used shard_size=8000, this run shard_size=9000"):
        convert(9_000, resume=True)
    fs = s3.fs()
    journal = f"{url[5:]}/.fastdata-journal"
    fs.pipe_file(journal, b"{damaged\n" + fs.cat_file(journal).split(b"\n", 1)[1])
    with pytest.raises(UsageError, match=rf"^{url}/.fastdata-journal: not a journal this fastdata can resume from"):
        convert(8_000, resume=True)


@pytest.mark.parametrize("fault", ["pause:mid_journal", "pause:upload:0"])
def test_resume_after_a_kill_before_any_shard_was_uploaded_finishes(s3, tmp_path, monkeypatch, fault):
    """Killed before the remote journal existed (mid_journal) or with only the journal uploaded
    (upload:0, the journal goes up before the first shard): the same command with --resume finishes."""
    from crashkit import cli, kill, start_paused

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)  # botocore reads it: the CLI has no endpoint flag
    monkeypatch.setenv("FASTDATA_REMOTE_CACHE", str(tmp_path / "cache"))
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    src = arrays_source(tmp_path, 60)
    url = f"s3://{bucket(s3)}/killed"
    args = ["convert", "--data", src / "X.npy", "--labels", src / "y.npy", url, "--shard-size", "4KB", "--workers", "1",
            "--quiet"]
    kill(start_paused(args, fault, tmp_path / "ready"))
    fs = s3.fs()
    names = [p.rsplit("/", 1)[-1] for p in fs.ls(url[5:], refresh=True)] if fs.exists(url[5:]) else []
    if fault == "pause:mid_journal":
        assert names == []
    else:  # the journal is up, shard 0 is not (later shards' uploads run beside it and may be up too)
        assert ".fastdata-journal" in names and "shard-00000.h5" not in names and "manifest.json" not in names
    done = cli(*args, "--resume")
    assert done.returncode == 0, done.stderr
    x = fastdata.open(url, remote=opts(s3, tmp_path / "c")).get_batch(np.arange(60))["x"]
    assert np.array_equal(x[:, 0], np.arange(60, dtype=np.float32))


def test_resume_into_an_empty_prefix_starts_afresh_but_not_over_files_without_a_journal(s3, tmp_path):
    url = f"s3://{bucket(s3)}/fresh"
    report = convert_arrays(tmp_path, url, 40, shard_size=4_000, remote=opts(s3, tmp_path / "up"), resume=True)
    assert report.kept == 0 and len(fastdata.open(url, remote=opts(s3, tmp_path / "c"))) == 40
    other = f"s3://{bucket(s3)}/orphans"
    s3.fs().pipe_file(other[5:] + "/shard-00000.h5", b"left by something else")
    with pytest.raises(UsageError, match=r"no interrupted conversion to resume \(no \.fastdata-journal, but it holds "
                                         r"'shard-00000\.h5'\); convert again with overwrite=True"):
        convert_arrays(tmp_path, other, 40, shard_size=4_000, remote=opts(s3, tmp_path / "up"), resume=True)



def test_overwrite_of_a_url_deletes_the_old_dataset_first(s3, tmp_path):  # docs/remote.md: --overwrite
    url = f"s3://{bucket(s3)}/over"
    first = convert_arrays(tmp_path, url, 12, shard_size=1_000, remote=opts(s3, tmp_path / "up"))
    second = convert_arrays(tmp_path, url, 3, shard_size=1_000, remote=opts(s3, tmp_path / "up"), overwrite=True)
    assert first.shards > second.shards
    names = sorted(p.rsplit("/", 1)[-1] for p in s3.fs().ls(url[5:], refresh=True))
    assert names == ["manifest.json"] + [f"shard-{i:05d}.h5" for i in range(second.shards)]
    assert len(fastdata.open(url, remote=opts(s3, tmp_path / "c"))) == 3


# --- DDP ----------------------------------------------------------------------------------


def _ddp_worker(rank: int, world: int, port: int, url: str, cache: str, endpoint: str, out: str) -> None:
    os.environ.update(CREDS)
    with gloo_group(rank, world, port) as dist:
        import torch

        ro = fastdata.RemoteOptions(cache_dir=cache, storage_options={"client_kwargs": {"endpoint_url": endpoint}},
                                    timeout=30)
        ld = fastdata.loader(url, 8, shuffle="shards", seed=5, remote=ro, device="cpu", num_workers=1)
        ids = []
        batches = 0
        for b in ld:
            ids += b["x"][:, 0].long().tolist()
            batches += 1
        n = torch.tensor([batches])
        dist.all_reduce(n, op=dist.ReduceOp.MAX)  # would hang if ranks disagreed on batch counts
        np.save(f"{out}-{rank}.npy", np.array(ids + [-1, batches, len(ld)]))


def test_ddp_two_ranks_over_a_remote_dataset_get_equal_disjoint_shares(s3, tmp_path):
    import torch

    n = 203
    url = f"s3://{bucket(s3)}/ddp"
    convert_arrays(tmp_path, url, n, shard_size=6_000, remote=opts(s3, tmp_path / "up"))
    torch.multiprocessing.spawn(_ddp_worker, args=(2, free_port(), url, str(tmp_path / "cache"), s3.endpoint,
                                                   str(tmp_path / "r")), nprocs=2, join=True)
    shares, counts = [], []
    for r in range(2):
        a = np.load(tmp_path / f"r-{r}.npy").tolist()
        sep = a.index(-1)
        shares.append(a[:sep])
        counts.append(tuple(a[sep + 1:]))
    assert counts[0] == counts[1] and counts[0][0] == counts[0][1]
    per = -(-n // 2)
    assert len(shares[0]) == len(shares[1]) == per
    assert len(set(shares[0]) & set(shares[1])) <= 1  # only the one wrap-around pad may repeat
    assert set(shares[0]) | set(shares[1]) == set(range(n))


def test_worker_processes_read_a_remote_dataset(s3, tmp_path):
    """mode='processes': forked DataLoader workers download on demand through the same cache while the
    main process prefetches along the plan; no hang, every sample once per epoch."""
    n = 300
    url = f"s3://{bucket(s3)}/procs"
    convert_arrays(tmp_path, url, n, shard_size=6_000, remote=opts(s3, tmp_path / "up"))
    ro = opts(s3, tmp_path / "cache")
    ld = fastdata.loader(url, 16, shuffle="shards", remote=ro, device="cpu", num_workers=2,
                         config=fastdata.LoaderConfig(mode="processes"))
    try:
        for _ in range(2):
            seen = [int(v) for b in ld for v in b["x"][:, 0]]
            assert sorted(seen) == list(range(n))
    finally:
        ld.close()
    shards = len(ld.dataset.manifest.shards)
    assert len(cached_files(tmp_path / "cache")) == shards


def test_lightning_trains_from_a_remote_dataset(s3, tmp_path):
    """Lightning passes our loader through unchanged: it must run whole epochs over s3:// and stop
    after len(loader) batches, every sample once per epoch."""
    L = pytest.importorskip("lightning")
    import torch

    n = 256
    url = f"s3://{bucket(s3)}/lightning"
    convert_arrays(tmp_path, url, n, shard_size=6_000, row=8, remote=opts(s3, tmp_path / "up"))
    ld = fastdata.loader(url, 32, shuffle="shards", remote=opts(s3, tmp_path / "cache"), device="cpu", num_workers=1)
    seen: list[int] = []

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 1)

        def training_step(self, batch, _):
            seen.extend(batch["x"][:, 0].long().tolist())
            return self.lin(batch["x"]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = L.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(Model(), train_dataloaders=ld)
    ld.close()
    assert sorted(seen) == sorted(list(range(n)) * 2)
