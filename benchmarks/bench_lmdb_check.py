"""What the per-read LMDB record-header check costs on records copied from the reader's own map.

Usage::

    python benchmarks/bench_lmdb_check.py [--quick] [--workdir DIR] [--out DIR]

LMDB records over 64 KiB are copied from the reader's own map of the shard once their place is known
(``fastdata.format.lmdb._Located``); every such read first compares each record's header in the map
with the one its first read found (``ShardReader._check_mapped_headers``). This times ``get_batch`` of
random 64-sample batches, one thread, page cache warm, with that comparison and with it replaced by a
no-op, interleaved in one process: for fixed-layout records (196 KB images) and ragged ones (about
100 KB sequences); and the comparison by itself on the same batches. Results go to ``<out>/lmdb_check[_quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402

import fastdata  # noqa: E402
from fastdata.format import lmdb as lmdb_format  # noqa: E402

BATCH = 64


def make_fixed(work: Path, n: int) -> Path:
    x = np.random.default_rng(0).integers(0, 256, (n, 256, 256, 3), dtype=np.uint8)
    np.save(work / "x.npy", x)
    dst = work / "fixed"
    fastdata.convert(None, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", workers=1)), arrays={"x": work / "x.npy"})
    return dst


def make_ragged(work: Path, n: int) -> Path:
    src = work / "seq"
    src.mkdir()
    rng = np.random.default_rng(1)
    for i in range(n):
        np.save(src / f"{i:05d}.npy", rng.standard_normal((int(rng.integers(5000, 7500)), 4)).astype("<f4"))
    dst = work / "ragged"
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb", workers=1)))
    return dst


def pair(name: str, ds: Any, batches: int) -> dict[str, Callable[[int], Any]]:
    """get_batch of ``batches`` random batches, with the header check and without it."""
    n = len(ds)
    plans = [np.random.default_rng(k).integers(0, n, BATCH) for k in range(batches)]
    ds.get_batch(np.arange(n))  # every record's place learned: all later reads copy from the map
    check = lmdb_format.ShardReader._check_mapped_headers

    def run(enabled: bool) -> Callable[[int], Any]:
        def epoch(_i: int) -> None:
            lmdb_format.ShardReader._check_mapped_headers = check if enabled else (lambda *a: None)  # type: ignore[method-assign]
            try:
                for idx in plans:
                    ds.get_batch(idx)
            finally:
                lmdb_format.ShardReader._check_mapped_headers = check  # type: ignore[method-assign]
        return epoch

    return {f"{name}: header checked on every read": run(True), f"{name}: no per-read check": run(False)}


def check_alone(name: str, ds: Any, batches: int) -> dict[str, Callable[[int], Any]]:
    """The header comparison by itself (what a batch of ``BATCH`` records pays), on the first shard."""
    r = ds._readers[0]
    loc = r.handle().located
    n = len(loc.offsets)
    plans = [np.random.default_rng(k).integers(0, n, BATCH) for k in range(batches)]
    ix = r.records() if r._record_size is None else None
    fixed = np.frombuffer(r._expected_header, dtype=np.uint8)[None, :]

    def epoch(_i: int) -> None:
        for local in plans:
            expected = fixed if ix is None else r._headers_of(ix.sizes[local])
            r._check_mapped_headers(loc.mem, loc.offsets[local], local, expected)

    return {f"{name}: the comparison alone": epoch}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run, figures meaningless")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=_harness.DEFAULT_RESULTS_DIR)
    args = ap.parse_args(argv)
    n, batches, rounds = (80, 2, 1) if args.quick else (1000, 20, 30)
    work = Path(tempfile.mkdtemp(prefix="bench_lmdb_check_", dir=args.workdir))
    try:
        sets = {"196 KB fixed records": fastdata.open(make_fixed(work, n)),
                "~100 KB ragged records": fastdata.open(make_ragged(work, n))}
        _harness.warm_page_cache(work)
        fns: dict[str, Callable[[int], Any]] = {}
        for name, ds in sets.items():
            fns.update(pair(name, ds, batches))
        alone: dict[str, Callable[[int], Any]] = {}
        for name, ds in sets.items():
            alone.update(check_alone(name, ds, batches))
        times = _harness.time_interleaved({**fns, **alone}, repeats=2 * rounds, warmup=1, rounds=rounds)
        names = list(fns)
        rows = []
        for on, off in zip(names[0::2], names[1::2]):
            a, b = times[on]["median"], times[off]["median"]
            per_record_us = (a - b) / (batches * BATCH) * 1e6
            fa, fb = times[on]["min"], times[off]["min"]
            rows.append([on.split(":")[0], f"{a / batches * 1e3:.2f}", f"{b / batches * 1e3:.2f}",
                         f"{(a / b - 1) * 100:+.1f}%", f"{per_record_us:+.2f}", f"{(fa / fb - 1) * 100:+.1f}%",
                         f"{times[on.split(':')[0] + ': the comparison alone']['median'] / (batches * BATCH) * 1e6:.2f}"])
        md = (f"# LMDB per-read header check ({'quick: figures meaningless' if args.quick else 'full'})\n\n"
              f"get_batch of {BATCH} random samples, 1 thread, page cache warm, records copied from the map.\n\n"
              + _harness.markdown_table(["records", "checked: ms per batch", "unchecked: ms per batch",
                                         "cost (medians)", "cost per record (us)", "cost (fastest runs)",
                                         "the comparison alone (us per record)"], rows) + "\n")
        print(md)
        _harness.write_results("lmdb_check_quick" if args.quick else "lmdb_check",
                               {"machine": _harness.machine_info(), "batch": BATCH, "batches_per_run": batches,
                                "times": times}, md, args.out)
        for ds in sets.values():
            ds.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
