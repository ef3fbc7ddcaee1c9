"""Benchmark the Ray engine against the local engine: the same .npy folder, the same 2 CPUs.

Usage::

    python benchmarks/bench_scale.py [--quick] [--gb 1.8] [--shard-size 128MB] [--repeats 3] [--out DIR] [--workdir DIR]

Generates ``--gb`` GB of per-sample float32 ``.npy`` files of shape (2, 256, 21, 21) (the FLIM user's
samples, 0.9 MB each) in 4 class folders, reads them once so that every run reads from the page
cache, then times ``fastdata convert`` as a real command (a fresh process per run, as a user or a
cluster job runs it; the output folder is deleted after each run):

* local: ``--workers 2`` (a process pool on this machine);
* ray, warm cluster: ``--engine ray --ray-address ADDR`` on a local Ray with 2 CPUs that this script
  started once (as a running cluster is), interleaved with the local runs; twice: with Ray's default
  worker niceness (15: on a machine shared with other work its workers get less CPU than the local
  engine's), and with its workers at nice 0, the priority the local engine's workers have;
* the in-process API (``fastdata.convert`` called by a program that is connected to the nice 0
  cluster, as a Ray application is): the engine's own cost with no interpreter start, Ray import or
  worker start (Ray starts a job's workers once), interleaved with ``workers=2`` in-process local runs;
* cold, once each before the clusters start: local again, and ``--engine ray`` with no address (the
  command starts and stops a local Ray itself, its workers at nice 0).

Each row gives the process wall time and the conversion's own time (the ``seconds`` of its report:
scanning the source, connecting to Ray, writing and fsyncing shards, the manifest). One more run
with ``--workers 1`` gives the time per shard on one core, which docs/scale.md projects to 1 TB.
Every output is checked byte-identical to the first local run's. Results go to stdout (markdown)
and to ``<out>/scale[_quick].{json,md}``.
"""

from __future__ import annotations

import fastdata

import argparse
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import DEFAULT_RESULTS_DIR, machine_info, markdown_table, summarize, warm_page_cache, write_results  # noqa: E402

from fastdata._units import parse_size  # noqa: E402
from fastdata.demo import write_npy_folder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPE = (2, 256, 21, 21)
SAMPLE_BYTES = 4 * 2 * 256 * 21 * 21
_SECONDS = re.compile(r", ([0-9.]+) s, ")
_SHARDS = re.compile(r"-> (\d+) \w+ shard")
API_ROW = "ray, in-process API on the nice 0 cluster, the job's workers running"


def _convert(src: Path, dst: Path, shard_size: str, *extra: str) -> dict[str, Any]:
    """Run ``fastdata convert`` in a fresh process; its wall time and the report's own seconds."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "fastdata", "convert", str(src), str(dst), "--shard-size", shard_size, "--quiet", *extra]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    m = _SECONDS.search(r.stdout)
    return {"wall": wall, "internal": float(m.group(1)) if m else float("nan"), "summary": r.stdout.strip()}


@contextlib.contextmanager
def _cluster(niceness: int) -> Iterator[str]:
    """A local Ray with 2 CPUs in this process (loopback only), its workers at ``niceness`` (Ray's
    default is 15); yields its address for ``fastdata convert --ray-address``."""
    import ray

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only (read when ray is imported: set early too)
    ctx: Any = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=40,
                        _system_config={"worker_niceness": niceness})
    try:
        yield ctx.address_info["address"]
    finally:
        ray.shutdown()


def _digest(dst: Path) -> str:
    """SHA-256 over every file's name and bytes: runs must produce the same dataset."""
    h = hashlib.sha256()
    for p in sorted(dst.iterdir()):
        h.update(p.name.encode())
        with open(p, "rb") as f:
            while chunk := f.read(16 << 20):
                h.update(chunk)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="0.1 GB, one repeat (a smoke run)")
    p.add_argument("--gb", type=float, default=1.8, help="source size in GB (default 1.8)")
    p.add_argument("--shard-size", default="128MB", help="shard size (default 128MB: 14 shards of 1.8 GB)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per engine on the warm cluster")
    p.add_argument("--out", default=str(DEFAULT_RESULTS_DIR))
    p.add_argument("--workdir", help="where to generate data (default: a temporary folder, removed after)")
    a = p.parse_args(argv)
    gb, repeats = (0.1, 1) if a.quick else (a.gb, a.repeats)
    n = max(8, int(gb * 1e9 / SAMPLE_BYTES))
    work = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="bench_scale_"))
    work.mkdir(parents=True, exist_ok=True)
    src, dst = work / "npy", work / "out"
    try:
        t0 = time.perf_counter()
        if not src.exists():
            write_npy_folder(src, n, SHAPE)
        gen_s = time.perf_counter() - t0
        src_bytes = warm_page_cache(src)
        print(f"source: {n} samples, {src_bytes / 1e9:.2f} GB in {src} (generated in {gen_s:.0f} s)", flush=True)

        from fastdata.converters import ConvertConfig, Request, detect

        t0 = time.perf_counter()
        # what every --part process repeats, and the Ray driver does once
        detect(Request(src)).scan(Request(src), ConvertConfig(), None)
        scan_s = time.perf_counter() - t0
        print(f"scan: {scan_s:.2f} s for {n} files ({n / scan_s:.0f} files/s, page cache warm)", flush=True)

        runs: dict[str, list[dict[str, Any]]] = {}
        digests: dict[str, str] = {}

        def run(name: str, *extra: str) -> None:
            shutil.rmtree(dst, ignore_errors=True)
            r = _convert(src, dst, a.shard_size, *extra)
            digests[name] = _digest(dst)
            shutil.rmtree(dst)
            runs.setdefault(name, []).append(r)
            print(f"{name}: wall {r['wall']:.2f} s, convert {r['internal']:.2f} s | {r['summary']}", flush=True)

        def api(name: str, **kw: Any) -> None:
            """fastdata.convert in this process (a program that holds the Ray connection, as a Ray
            application or notebook does): no interpreter start, no Ray import, and with ``engine="ray"``
            the job's workers stay up between conversions (Ray starts them once per job)."""

            shutil.rmtree(dst, ignore_errors=True)
            t0 = time.perf_counter()
            rep = fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(shard_size=parse_size(a.shard_size), **kw)))
            r = {"wall": time.perf_counter() - t0, "internal": rep.seconds, "summary": rep.summary()}
            digests[name] = _digest(dst)
            shutil.rmtree(dst)
            runs.setdefault(name, []).append(r)
            print(f"{name}: wall {r['wall']:.2f} s, convert {r['internal']:.2f} s | {r['summary']}", flush=True)

        run("local, 1 worker (per-shard time)", "--workers", "1")
        run("local, 2 workers (cold process)", "--workers", "2")
        run("ray, local Ray started by the command", "--engine", "ray")

        # Each cluster is warmed up (its first job starts the workers), then timed interleaved with
        # the local engine; the clusters run one after the other, each with its own local baseline.
        # On the nice 0 cluster the in-process API runs first, in a block of its own: a command-line
        # job in between would take the CPU slots and Ray would stop this job's idle workers.
        for niceness, name in ((15, "ray, warm cluster, workers at nice 15 (Ray's default)"),
                               (0, "ray, warm cluster, workers at nice 0")):
            with _cluster(niceness) as address:
                if niceness == 0:
                    api("warm-up", engine="ray")
                    runs.pop("warm-up")
                    for _ in range(repeats):
                        api("local, 2 workers, in-process API", workers=2)
                        api(API_ROW, engine="ray")
                run("warm-up", "--engine", "ray", "--ray-address", address)
                runs.pop("warm-up")
                for _ in range(repeats):
                    run(f"local, 2 workers (with nice {niceness} cluster)", "--workers", "2")
                    run(name, "--engine", "ray", "--ray-address", address)
        if len(set(digests.values())) != 1:
            raise SystemExit(f"outputs differ between runs: {digests}")

        local_warm = [r for name, rs in runs.items() if name.startswith("local, 2 workers (with") for r in rs]
        found = _SHARDS.search(local_warm[0]["summary"])
        shards = int(found.group(1)) if found else 0

        def baseline(name: str) -> list[dict[str, Any]]:
            """The local runs a row is compared with: those of its own phase, else all warm-phase ones."""
            if name in (API_ROW, "local, 2 workers, in-process API"):
                return runs["local, 2 workers, in-process API"]
            m = re.search(r"nice (\d+)", name)
            return runs[f"local, 2 workers (with nice {m.group(1)} cluster)"] if m else local_warm

        rows, table = [], []
        for name, rs in runs.items():
            wall = summarize([r["wall"] for r in rs])
            internal = summarize([r["internal"] for r in rs])
            base = summarize([r["wall"] for r in baseline(name)])["median"]
            base_in = summarize([r["internal"] for r in baseline(name)])["median"]
            row = {"engine": name, "runs": len(rs), "wall_median_s": round(wall["median"], 2),
                   "wall_min_s": round(wall["min"], 2), "wall_max_s": round(max(r["wall"] for r in rs), 2),
                   "convert_median_s": round(internal["median"], 2),
                   "mb_per_s": round(src_bytes / 1e6 / internal["median"], 1),
                   "wall_vs_local_2w": round(wall["median"] / base, 3),
                   "convert_vs_local_2w": round(internal["median"] / base_in, 3)}
            rows.append(row)
            table.append([name, len(rs), f"{wall['median']:.2f}", f"{row['wall_min_s']:.2f}-{row['wall_max_s']:.2f}",
                          f"{internal['median']:.2f}", f"{row['mb_per_s']:.0f}", f"{row['wall_vs_local_2w']:.2f}",
                          f"{row['convert_vs_local_2w']:.2f}"])
        one = summarize([r["internal"] for r in runs["local, 1 worker (per-shard time)"]])["median"]
        per_shard = one / shards
        md = (f"# Ray engine vs local engine ({'quick' if a.quick else 'full'})\n\n"
              f"Source: {n} .npy samples of {list(SHAPE)} float32, {src_bytes / 1e9:.2f} GB, page cache warm; "
              f"shard size {a.shard_size} ({shards} shards); hdf5; 2 CPUs. Ratios: median over the median of the "
              f"local runs interleaved with it (the ray rows: those of their own cluster's phase; the others: all "
              f"warm-phase local runs).\n\n"
              + markdown_table(["engine", "runs", "wall s (median)", "wall s (range)", "convert s (median)",
                                "MB/s (convert)", "wall / local", "convert / local"], table)
              + f"\n\nOne core: {per_shard:.2f} s per {a.shard_size} shard "
                f"({parse_size(a.shard_size) / 1e6 / per_shard:.0f} MB/s per core). Scanning the source: "
                f"{scan_s:.2f} s for {n} files ({n / scan_s:.0f} files/s).\n")
        cli = summarize([r["wall"] for r in runs["ray, warm cluster, workers at nice 0"]])["median"]
        eng = summarize([r["wall"] for r in runs[API_ROW]])["median"]
        md += (f"\nA `--engine ray` command costs {cli - eng:.2f} s more than the same conversion by a program "
               f"already connected to the cluster (median wall {cli:.2f} s against {eng:.2f} s): starting Python, "
               "importing Ray, and Ray starting the new job's worker processes.\n")
        print(md)
        results = {"machine": machine_info(), "samples": n, "source_bytes": src_bytes, "shape": list(SHAPE),
                   "shard_size": a.shard_size, "shards": shards, "repeats": repeats, "rows": rows,
                   "per_shard_s_one_core": round(per_shard, 3), "scan_s": round(scan_s, 3), "runs": runs}
        write_results("scale_quick" if a.quick else "scale", results, md, a.out)
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
