"""Benchmark ``Dataset.get_batch`` against naive per-file loading and a raw-read ceiling.

Usage::

    python benchmarks/bench_get_batch.py [--quick] [--out DIR] [--workdir DIR]

For each synthetic dataset this writes a folder of per-sample ``.npy`` files, converts it
to HDF5 and to LMDB with ``fastdata.convert``, writes the concatenated sample bytes to
one raw file, reads every file once so that everything is in the page cache, and then
times batches of 64 random indices (the same batches for every method):

* naive: ``np.stack([np.load(path) for path in batch])``;
* ``fastdata.open(dst).get_batch(idx)`` for HDF5 and LMDB, with a fresh output and with
  a preallocated ``out=`` buffer;
* ceiling: one unbuffered ``readinto`` of the same number of bytes from the raw file at a
  random sample-aligned offset, into a preallocated buffer.

Preallocated buffers (``out=`` and the ceiling's) are page-aligned, like pinned memory.

Results go to stdout (markdown) and, via ``_harness.write_results``, to
``<out>/get_batch[_quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from _harness import (
    DEFAULT_RESULTS_DIR,
    ceiling_exit,
    check_ceiling,
    machine_info,
    markdown_table,
    time_interleaved,
    warm_page_cache,
    write_results,
)

import fastdata

BATCH = 64
SEED = 0
FIELD = "x"  # the field name a flat .npy folder converts to
BACKENDS = ("hdf5", "lmdb")
ROUNDS = 3  # timing blocks per method, alternating between methods (see _harness.time_interleaved)
PAGE = 4096
FULL_MIN_FREE_BYTES = 8 * 10**9
LARGE_TARGET_CEILING_RATIO = 0.7
SMALL_TARGET_SPEEDUP = 20.0


@dataclass(frozen=True)
class Spec:
    """One synthetic dataset and how hard to time it."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    full_samples: int
    quick_samples: int
    full_repeats: int
    quick_repeats: int

    @property
    def sample_bytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize


SPECS = (
    Spec("large", (2, 256, 21, 21), np.dtype(np.float32), 2_000, 200, 60, 15),
    Spec("small", (1, 28, 28), np.dtype(np.uint8), 20_000, 2_000, 500, 100),
)


def make_sample_files(spec: Spec, n: int, folder: Path, raw_path: Path, rng: np.random.Generator) -> list[Path]:
    """Write ``n`` random samples as ``folder/<index>.npy`` and, concatenated, to ``raw_path``."""
    folder.mkdir(parents=True)
    paths = [folder / f"{i:06d}.npy" for i in range(n)]  # zero-padded: sorted order == index order
    chunk = max(1, (64 << 20) // spec.sample_bytes)
    with open(raw_path, "wb") as raw:
        for start in range(0, n, chunk):
            count = min(chunk, n - start)
            if spec.dtype.kind == "f":
                data = rng.standard_normal((count, *spec.shape), dtype=spec.dtype)
            else:
                data = rng.integers(0, 256, size=(count, *spec.shape), dtype=spec.dtype)
            raw.write(data.tobytes())
            for j in range(count):
                np.save(paths[start + j], data[j])
    return paths


def page_aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose data starts on a page boundary.

    Large ``np.empty`` arrays start 16 bytes past a page boundary; on some machines that
    makes copies into them measurably slower (the kernel's page-cache copy in ``readinto``
    up to ~2x), so the ceiling and the ``out=`` buffers both use page-aligned memory.
    """
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 2 * PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def bench_dataset(spec: Spec, n: int, repeats: int, workdir: Path) -> dict[str, Any]:
    """Generate, convert, warm and time one dataset; return its results."""
    rng = np.random.default_rng(SEED)
    root = workdir / spec.name
    src, raw_path = root / "npy", root / "data.raw"
    print(f"\n## {spec.name}: {n} samples of {spec.shape} {spec.dtype} ({spec.sample_bytes:,} bytes each)", flush=True)

    t0 = time.perf_counter()
    paths = make_sample_files(spec, n, src, raw_path, rng)
    print(f"generated {n} .npy files + data.raw in {time.perf_counter() - t0:.1f} s", flush=True)

    conversions: dict[str, Any] = {}
    datasets: dict[str, fastdata.Dataset] = {}
    for backend in BACKENDS:
        dst = root / backend
        report = fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend)))
        print(f"convert {backend}: {report.summary()}", flush=True)
        conversions[backend] = {
            "seconds": report.seconds,
            "bytes_in": report.bytes_in,
            "bytes_out": report.bytes_out,
            "shards": report.shards,
        }
        datasets[backend] = fastdata.open(dst)
        if len(datasets[backend]) != n:
            raise RuntimeError(f"{dst}: expected {n} samples, found {len(datasets[backend])}")

    warmed = warm_page_cache(root)
    print(f"page cache warmed: read all {warmed / 1e9:.2f} GB under {root} once, so every method reads from memory",
          flush=True)

    batches = [rng.choice(n, size=BATCH, replace=False) for _ in range(repeats)]
    offsets = rng.integers(0, n - BATCH + 1, size=repeats) * spec.sample_bytes
    batch_shape = (BATCH, *spec.shape)
    raw_file = open(raw_path, "rb", buffering=0)  # noqa: SIM115 - closed in finally
    raw_buf = page_aligned_empty(batch_shape, spec.dtype)
    raw_view = memoryview(raw_buf.reshape(-1).view(np.uint8))

    def naive(i: int) -> np.ndarray:
        return np.stack([np.load(paths[j]) for j in batches[i]])

    def get_batch(ds: fastdata.Dataset, buf: np.ndarray | None) -> Callable[[int], Any]:
        if buf is None:
            return lambda i: ds.get_batch(batches[i])
        return lambda i: ds.get_batch(batches[i], out={FIELD: buf})

    def ceiling(i: int) -> None:
        raw_file.seek(int(offsets[i]))
        if raw_file.readinto(raw_view) != len(raw_view):
            raise RuntimeError(f"{raw_path}: short read")

    methods: list[tuple[str, Callable[[int], Any]]] = [("naive: np.load per file + np.stack", naive)]
    for backend, ds in datasets.items():
        methods.append((f"{backend} get_batch", get_batch(ds, None)))
        methods.append((f"{backend} get_batch(out=)", get_batch(ds, page_aligned_empty(batch_shape, spec.dtype))))
    methods.append(("ceiling: raw readinto", ceiling))

    try:
        expected = naive(0)
        for backend, ds in datasets.items():
            if not np.array_equal(ds.get_batch(batches[0])[FIELD], expected):
                raise RuntimeError(f"{backend} get_batch returned different data than the .npy files")
        timings = list(time_interleaved(dict(methods), repeats=repeats, warmup=2, rounds=ROUNDS).items())
    finally:
        raw_file.close()
        for ds in datasets.values():
            ds.close()
        shutil.rmtree(root)

    ceiling_s = timings[-1][1]["median"]
    naive_s = timings[0][1]["median"]
    batch_bytes = BATCH * spec.sample_bytes
    results = []
    for name, t in timings:
        med = t["median"]
        results.append(
            {
                "method": name,
                **{f"{k}_s": v for k, v in t.items() if k != "runs"},
                "runs": t["runs"],
                "samples_per_s": BATCH / med,
                "mb_per_s": batch_bytes / med / 1e6,
                "ratio_to_ceiling": ceiling_s / med,
                "speedup_vs_naive": naive_s / med,
            }
        )
    return {
        "name": spec.name,
        "samples": n,
        "sample_shape": list(spec.shape),
        "dtype": str(spec.dtype),
        "sample_bytes": spec.sample_bytes,
        "batch_size": BATCH,
        "repeats": repeats,
        "conversions": conversions,
        "methods": results,
    }


def check_targets(datasets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Compare every get_batch variant with the targets (large: x ceiling, small: x naive)."""
    goals = {
        "large": ("ratio_to_ceiling", LARGE_TARGET_CEILING_RATIO),
        "small": ("speedup_vs_naive", SMALL_TARGET_SPEEDUP),
    }
    checks = []
    for d in datasets:
        metric, goal = goals[d["name"]]
        for m in d["methods"]:
            if "get_batch" in m["method"]:
                value = m[metric]
                checks.append(
                    {
                        "dataset": d["name"],
                        "method": m["method"],
                        "metric": metric,
                        "target": goal,
                        "measured": value,
                        "met": value >= goal,
                    }
                )
    return checks


def render(
    info: dict[str, Any], settings: dict[str, Any], datasets: list[dict[str, Any]], checks: list[dict[str, Any]]
) -> str:
    """Markdown report: setup, results table, targets."""
    rows = []
    for d in datasets:
        for m in d["methods"]:
            rows.append(
                [
                    d["name"],
                    m["method"],
                    f"{m['median_s'] * 1e3:.3f}",
                    f"{m['p10_s'] * 1e3:.3f}–{m['p90_s'] * 1e3:.3f}",
                    f"{m['samples_per_s']:,.0f}",
                    f"{m['mb_per_s']:,.0f}",
                    f"{m['ratio_to_ceiling']:.3f}",
                    f"{m['speedup_vs_naive']:.1f}",
                ]
            )
    table = markdown_table(
        ["dataset", "method", "median ms/batch", "p10–p90 ms", "samples/s", "MB/s", "x ceiling", "x naive"], rows
    )
    gpu = info["gpu"] if info["cuda_available"] else "none"
    lines = [
        f"# get_batch benchmark ({settings['mode']} run)",
        "",
        f"Machine: {info['cpu_model']}, {info['usable_cores']} usable cores, {info['ram_gib']} GiB RAM, GPU: {gpu}; "
        f"Python {info['python']}, numpy {info['numpy']}, h5py {info['h5py']}, lmdb {info['lmdb']}, "
        f"torch {info['torch']}.",
        "",
        f"Batches of {BATCH} random indices (seed {SEED}), the same batches for every method; each method is "
        f"timed in {ROUNDS} blocks of consecutive batches, alternating with the other methods; warm page cache "
        "(every file read once before timing, so all methods read from memory). MB = 10^6 bytes. "
        "`x ceiling` = ceiling median / method median; `x naive` = naive median / method median. "
        "The ceiling and the `out=` calls read into page-aligned preallocated buffers (as pinned memory is).",
        "",
    ]
    for d in datasets:
        lines.append(
            f"- {d['name']}: {d['samples']} samples of {tuple(d['sample_shape'])} {d['dtype']} "
            f"({d['sample_bytes']:,} B/sample), {d['repeats']} timed batches"
        )
    lines += ["", table, "", "Targets:", ""]
    for c in checks:
        what = "of the ceiling" if c["metric"] == "ratio_to_ceiling" else "x naive"
        verdict = "met" if c["met"] else "NOT met"
        lines.append(
            f"- {c['dataset']}, {c['method']}: {c['measured']:.3g} {what} (target >= {c['target']:g}): {verdict}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sample counts and few repetitions (CI smoke run)")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_RESULTS_DIR, help="results directory (default: %(default)s)"
    )
    parser.add_argument(
        "--workdir", type=Path, default=None, help="parent folder for the generated data (default: system temp dir)"
    )
    args = parser.parse_args(argv)

    mode = "quick" if args.quick else "full"
    if args.quick:
        sizes = [(s, s.quick_samples, s.quick_repeats) for s in SPECS]
    else:
        sizes = [(s, s.full_samples, s.full_repeats) for s in SPECS]
    # Datasets run one after the other and are deleted in between: the peak is the largest one,
    # held four times (npy files, HDF5, LMDB, raw), plus some slack for headers and file-system blocks.
    peak = max(4 * n * s.sample_bytes for s, n, _ in sizes) * 11 // 10
    need = max(peak, FULL_MIN_FREE_BYTES) if not args.quick else peak
    parent = args.workdir if args.workdir is not None else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(parent).free
    if free < need:
        print(f"error: {parent} has {free / 1e9:.1f} GB free; the {mode} run needs at least {need / 1e9:.1f} GB. "
              "Use --workdir on a bigger disk (or --quick).", file=sys.stderr)
        return 2

    info = machine_info()
    if info["ram_available_gib"] is not None and peak > info["ram_available_gib"] * 2**30:
        print(f"warning: {peak / 1e9:.1f} GB of data may not fit in the page cache "
              f"({info['ram_available_gib']} GiB available); results would include disk reads", file=sys.stderr)
    settings = {
        "mode": mode,
        "batch_size": BATCH,
        "seed": SEED,
        "page_cache": "warm",
        "timing_rounds": ROUNDS,
        "preallocated_buffer_alignment": PAGE,
        "workdir_parent": str(parent),
    }

    workdir = Path(tempfile.mkdtemp(prefix="bench_get_batch-", dir=parent))
    try:
        datasets = [bench_dataset(s, n, r, workdir) for s, n, r in sizes]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    checks = check_targets(datasets)
    ratios = {f"{d['name']}: {m['method']}": m["ratio_to_ceiling"] for d in datasets for m in d["methods"]}
    ceiling_check = check_ceiling("bench_get_batch", ratios, args.quick)
    report = render(info, settings, datasets, checks)
    print("\n" + report)
    results = {
        "benchmark": "get_batch",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": settings,
        "machine": info,
        "datasets": datasets,
        "targets": checks,
        "ceiling_check": ceiling_check,
    }
    name = "get_batch_quick" if args.quick else "get_batch"
    json_path, md_path = write_results(name, results, report, args.out)
    print(f"wrote {json_path} and {md_path}")
    return ceiling_exit(ceiling_check)


if __name__ == "__main__":
    sys.exit(main())
