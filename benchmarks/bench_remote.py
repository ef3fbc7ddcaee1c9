"""Remote datasets: time to first batch and steady throughput from a local S3 server.

One run, one machine, ratios within the run. The same dataset (float32 samples, HDF5 shards) is
read by ``fastdata.loader(..., shuffle="shards", device="cpu")`` for one epoch per measurement:
- cold cache: from ``s3://`` on moto's standalone S3 server on 127.0.0.1 (a subprocess), with an
  empty shard cache: every shard is downloaded, checked and cached while the loader runs (one epoch);
- warm cache: from ``s3://`` again, every shard already in the cache (nothing is downloaded);
- local disk: the same shards in a local folder, page cache warm (warm and local: several epochs
  with one loader).
Time to first batch counts from opening the dataset (manifest read included) to the first batch;
steady samples/s counts every batch after the first. Cold, warm and local are measured in
interleaved rounds (a fresh cache for each cold run); the figures are medians over the rounds.
Usage: python benchmarks/bench_remote.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

import fastdata  # noqa: E402

SHAPE = (2, 64, 64)  # 32 KiB per sample
BATCH = 64
WORKERS = 2


def _server(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/", timeout=1)
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("moto server did not start")


def _epoch(source: str | Path, remote: fastdata.RemoteOptions | None, epochs: int = 1) -> dict[str, float]:
    t0 = time.perf_counter()
    ld = fastdata.loader(source, BATCH, shuffle="shards", seed=1, device="cpu", num_workers=WORKERS, remote=remote)
    first = None
    cpu0 = 0.0
    samples = 0
    try:
        for _ in range(epochs):
            for batch in ld:
                if first is None:
                    first = time.perf_counter()
                    cpu0 = time.process_time()
                else:
                    samples += len(batch["label"])
        end = time.perf_counter()
        cpu = time.process_time() - cpu0
        downloads = ld.dataset.remote.stats()["downloads"] if ld.dataset.remote is not None else 0
    finally:
        ld.close()
    assert first is not None
    return {"first_batch_s": first - t0, "steady_samples_per_s": samples / (end - first), "downloads": downloads,
            "cpu_ms_per_1000": cpu / samples * 1e6}


def run(n: int, rounds: int, epochs: int, work: Path) -> dict[str, Any]:
    x = np.random.default_rng(0).standard_normal((n, *SHAPE), dtype=np.float32)
    np.save(work / "X.npy", x)
    np.save(work / "y.npy", np.arange(n, dtype=np.int64) % 10)
    opts = fastdata.WriteOptions(shard_size=16 << 20, workers=1)
    arrays = {"x": work / "X.npy"}
    fastdata.convert(None, work / "local", fastdata.ConvertConfig(write=opts), labels=work / "y.npy", arrays=arrays)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    server = _server(port)
    try:
        storage = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
        import s3fs

        s3fs.S3FileSystem(**storage).mkdir("bench")
        url = "s3://bench/ds"
        up = fastdata.RemoteOptions(cache_dir=work / "staging", storage_options=storage)
        fastdata.convert(None, url, fastdata.ConvertConfig(write=opts, remote=up), labels=work / "y.npy", arrays=arrays)
        warm_opts = fastdata.RemoteOptions(cache_dir=work / "warm", cache_limit="10GB", storage_options=storage)
        _epoch(url, warm_opts)  # fills the warm cache (and the page cache)
        _epoch(work / "local", None)  # page cache warm for the local copy
        runs: dict[str, list[dict[str, float]]] = {"cold cache (s3://, moto on 127.0.0.1)": [],
                                                    "warm cache (s3://)": [], "local disk": []}
        for r in range(rounds):
            cold = fastdata.RemoteOptions(cache_dir=work / f"cold-{r}", cache_limit="10GB", storage_options=storage)
            order = list(runs)
            order = order[r % 3:] + order[: r % 3]  # rotate: drift in machine load hits all alike
            for name in order:
                if name.startswith("cold"):
                    runs[name].append(_epoch(url, cold))
                    shutil.rmtree(work / f"cold-{r}", ignore_errors=True)
                elif name.startswith("warm"):
                    runs[name].append(_epoch(url, warm_opts, epochs))
                else:
                    runs[name].append(_epoch(work / "local", None, epochs))
    finally:
        server.kill()
        server.wait()
    summary = {name: {"first_batch_s": statistics.median(r["first_batch_s"] for r in rs),
                      "steady_samples_per_s": statistics.median(r["steady_samples_per_s"] for r in rs),
                      "downloads_per_epoch": statistics.median(r["downloads"] for r in rs),
                      "steady_min": min(r["steady_samples_per_s"] for r in rs),
                      "steady_max": max(r["steady_samples_per_s"] for r in rs),
                      "cpu_ms_per_1000": statistics.median(r["cpu_ms_per_1000"] for r in rs)}
               for name, rs in runs.items()}
    return {"samples": n, "shape": SHAPE, "batch": BATCH, "workers": WORKERS, "rounds": rounds, "epochs": epochs,
            "dataset_bytes": sum(p.stat().st_size for p in (work / "local").iterdir()),
            "shards": len(fastdata.open(work / "local").manifest.shards), "summary": summary, "all_runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small dataset, two rounds (CI smoke run)")
    p.add_argument("--out", default=str(_harness.DEFAULT_RESULTS_DIR), help="results folder")
    p.add_argument("--workdir", default=None, help="where to put the temporary data")
    a = p.parse_args(argv)
    n, rounds, epochs = (512, 2, 2) if a.quick else (4000, 7, 4)
    work = Path(tempfile.mkdtemp(prefix="fastdata-bench-remote-", dir=a.workdir))
    try:
        res = run(n, rounds, epochs, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res["machine"] = _harness.machine_info()
    s = res["summary"]
    local = s["local disk"]["steady_samples_per_s"]
    local_cpu = s["local disk"]["cpu_ms_per_1000"]
    rows = [[name, f"{v['first_batch_s']:.3f}", f"{v['steady_samples_per_s']:,.0f}",
             f"{v['steady_min']:,.0f}-{v['steady_max']:,.0f}", f"{v['steady_samples_per_s'] / local:.2f}",
             f"{v['cpu_ms_per_1000']:.1f}", f"{v['cpu_ms_per_1000'] / local_cpu:.2f}", f"{v['downloads_per_epoch']:.0f}"]
            for name, v in s.items()]
    ratio = s["warm cache (s3://)"]["steady_samples_per_s"] / local
    res["targets"] = {"warm cache >= 0.9 of local disk": {"measured": round(ratio, 3), "target": 0.9,
                                                          "met": ratio >= 0.9}}
    md = [f"# Remote dataset: {n} samples float32{list(SHAPE)} ({res['dataset_bytes'] / 1e6:.0f} MB in "
          f"{res['shards']} HDF5 shards), batch {BATCH}, {WORKERS} reader threads, shuffle='shards', device cpu",
          "", f"Machine: {res['machine']['cpu_model']}, {res['machine']['usable_cores']} cores. S3: moto's standalone "
          "server on 127.0.0.1 (a Python process on the same cores). Medians of "
          f"{rounds} interleaved rounds: cold is one epoch from an empty cache; warm and local are {res['epochs']} "
          "epochs with one loader (steady samples/s over every batch after the first).", "",
          "CPU ms per 1000 samples (process CPU time, all threads, steady part) is the load-robust"
          " figure: on a shared machine the wall-clock rates swing with other work (see the range).", "",
          _harness.markdown_table(["source", "first batch s", "steady samples/s", "range", "x local",
                                   "CPU ms/1000 samples", "CPU x local", "downloads"], rows), ""]
    md += [f"- {k}: {v['measured']} ({'met' if v['met'] else 'NOT met'})" for k, v in res["targets"].items()]
    text = "\n".join(md)
    print(text)
    _harness.write_results("remote_quick" if a.quick else "remote", res, text, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
