"""Small benchmark harness: timing with warm-up, a warm page cache, warm-up-then-timed training, machine
description, result files; and what the per-batch device suites share (flags, seeded images, timing
synchronised on a GPU, the machine line, saving a run)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Hashable, Mapping, Sequence, TypeVar

from fastdata.measure.bench import CEILING_LIMIT  # one limit for the harness, the report and fastdata bench
from fastdata.fileio import write_atomic
from fastdata.world import usable_cpus

K = TypeVar("K", bound=Hashable)

if TYPE_CHECKING:
    import torch

DEFAULT_RESULTS_DIR = Path(__file__).resolve().parent / "results"


def time_interleaved(
    fns: dict[str, Callable[[int], Any]], repeats: int, warmup: int = 2, rounds: int = 1
) -> dict[str, dict[str, float]]:
    """Seconds per call of ``fn(i)`` for several callables (median, p10, p90, min and mean, plus
    the number of runs), split into ``rounds`` so that drift in machine load hits all of them alike.

    Each round runs every callable (in rotating order) for a block of consecutive calls:
    ``warmup`` untimed, then its share of ``repeats`` timed. Over all rounds, every callable
    is timed on ``i`` = 0 .. repeats-1 exactly once.
    """
    if repeats < 1 or rounds < 1:
        raise ValueError("repeats and rounds must be at least 1")
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    bounds = [repeats * r // rounds for r in range(rounds + 1)]
    for r in range(rounds):
        block = range(bounds[r], bounds[r + 1])
        for k in range(len(names)):
            name = names[(r + k) % len(names)]
            fn = fns[name]
            for i in block[:warmup]:
                fn(i)
            for i in block:
                t0 = time.perf_counter()
                fn(i)
                times[name].append(time.perf_counter() - t0)
    return {name: summarize(t) for name, t in times.items()}


def paired_rounds(passes: Mapping[K, Callable[[], int]], rounds: int) -> dict[K, list[float]]:
    """Items per second of each pass (it returns its item count) in each of ``rounds`` rounds after an untimed
    warm-up round; the order rotates by one each round (two passes alternate), so drift hits all alike and
    round r's figures pair up."""
    keys = list(passes)
    rates: dict[K, list[float]] = {k: [] for k in keys}
    for r in range(rounds + 1):
        for k in keys[r % len(keys):] + keys[: r % len(keys)]:
            t0 = time.perf_counter()
            n = passes[k]()
            if r:
                rates[k].append(n / (time.perf_counter() - t0))
    return rates


def ratio_quartiles(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """First quartile, median and third quartile of the paired ratios ``a[i] / b[i]``."""
    ratios = [x / y for x, y in zip(a, b)]
    if len(ratios) < 2:
        return ratios[0], ratios[0], ratios[0]
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    return q1, med, q3


def synced(fn: Callable[[int], Any], device: Any) -> Callable[[int], Any]:
    """``fn`` followed by a CUDA synchronize when ``device`` is a GPU, so a timing covers the work, not its launch."""
    if getattr(device, "type", str(device)) != "cuda":
        return fn
    import torch

    def run(i: int) -> Any:
        out = fn(i)
        torch.cuda.synchronize()
        return out

    return run


def summarize(times: Sequence[float]) -> dict[str, float]:
    """Median, p10, p90, min and mean of ``times`` (seconds), and their count as ``runs``."""
    ordered = sorted(times)
    return {
        "median": statistics.median(ordered),
        "p10": _percentile(ordered, 10),
        "p90": _percentile(ordered, 90),
        "min": ordered[0],
        "mean": statistics.fmean(ordered),
        "runs": len(ordered),
    }


def median_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """The median of ``a[i] / b[i]``: a ratio of two readers measured side by side in each round, steadier
    than the ratio of their medians when the machine's speed drifts between rounds."""
    return float(statistics.median(x / y for x, y in zip(a, b)))


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` (0-100) of already sorted values."""
    pos = (len(sorted_values) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def warm_page_cache(*roots: Path) -> int:
    """Read every file under ``roots`` once, so that timed reads come from memory; return the bytes read."""
    buf = bytearray(16 << 20)
    total = 0
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for name in names:
                with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                    while n := f.readinto(buf):
                        total += n
    return total


def timed_fit(model: Any, loader: Any, steps: int, *, during: Any = None, loss: Any = None, **fit_kw: Any) -> Any:
    """``fastdata.train.fit`` of ``model`` (SGD, ``loss`` or cross-entropy on field x), quiet: 3 untimed
    warm-up steps (workers start, caches fill, cuDNN autotunes), then a second ``fit`` (inside the
    context manager ``during``, if given) that counts from step 0 again and stops after ``3 + steps``
    steps. Returns the second ``FitResult``; its last epoch is the figure."""
    import torch

    from fastdata.demo.examples import classification_loss
    from fastdata.train import fit

    loss = loss or classification_loss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    kw = {"log_every": 0, "on_log": lambda _m: None, "epochs": 1000, **fit_kw}
    fit(model, loader, opt, loss, max_steps=3, **kw)
    with during if during is not None else contextlib.nullcontext():
        return fit(model, loader, opt, loss, max_steps=3 + steps, **kw)


def _read_proc(path: str, key: str) -> str | None:
    """Value of the first ``key: value`` line in a /proc file, or None."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None


def _meminfo_gib(key: str) -> float | None:
    kb = _read_proc("/proc/meminfo", key)
    return round(int(kb.split()[0]) / 2**20, 1) if kb else None


def _version(module: str) -> str | None:
    try:
        return str(importlib.import_module(module).__version__)
    except Exception:  # noqa: BLE001 - missing or broken optional module
        return None


def machine_info() -> dict[str, Any]:
    """CPU, cores, RAM, library versions and GPU (if any) of this machine."""
    info: dict[str, Any] = {
        "cpu_model": _read_proc("/proc/cpuinfo", "model name") or platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "usable_cores": usable_cpus(),
        "ram_gib": _meminfo_gib("MemTotal"),
        "ram_available_gib": _meminfo_gib("MemAvailable"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "load_average": [round(v, 2) for v in os.getloadavg()],  # 1, 5, 15 min: other work on the machine
    }
    for module in ("numpy", "h5py", "lmdb", "torch", "fastdata"):
        info[module] = _version(module)
    info["cuda_available"], info["gpu"] = False, None
    try:
        import torch

        if torch.cuda.is_available():
            info["cuda_available"], info["gpu"] = True, torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001 - no torch, or a broken CUDA setup
        pass
    return info


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table; columns of numbers (or numeric strings) right-aligned."""
    numeric = [all(_is_number(r[i]) for r in rows) for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _is_number(cell: Any) -> bool:
    try:
        float(str(cell).replace(",", ""))
    except ValueError:
        return False
    return True


def _write_text(path: Path, text: str) -> None:
    """Write atomically (temporary file, fsync, rename)."""
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def write_results(
    name: str, results: dict[str, Any], markdown: str, out_dir: str | os.PathLike[str] = DEFAULT_RESULTS_DIR
) -> tuple[Path, Path]:
    """Save ``results`` as ``<out_dir>/<name>.json`` and ``markdown`` as ``<name>.md``; return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / f"{name}.json", out / f"{name}.md"
    _write_text(json_path, json.dumps(results, indent=2, sort_keys=False, default=str) + "\n")
    _write_text(md_path, markdown.rstrip("\n") + "\n")
    return json_path, md_path


def check_ceiling(suite: str, ratios: dict[str, float], quick: bool) -> dict[str, Any]:
    """Flag every ratio to its ceiling above ``CEILING_LIMIT`` as a measurement bug: the ceiling is
    the machine's best for the same work, so nothing can beat it by more than noise. Printed
    loudly; the returned record goes into the results JSON (``ceiling_check``), and
    :func:`ceiling_exit` turns it into the run's exit status."""
    over = {k: round(v, 3) for k, v in ratios.items() if v > CEILING_LIMIT}
    if over:
        bar = "!" * 78
        lines = [f"{k}: {v} of its ceiling" for k, v in over.items()]
        print(f"\n{bar}\n{suite}: MEASUREMENT BUG, ratio above {CEILING_LIMIT} of the ceiling (the ceiling is not the "
              f"machine's best for this work{'; a --quick run, recorded only' if quick else ''}):\n  "
              + "\n  ".join(lines) + f"\n{bar}\n", file=sys.stderr, flush=True)
    return {"limit": CEILING_LIMIT, "checked": len(ratios), "over": over, "quick": quick}


def ceiling_exit(check: dict[str, Any]) -> int:
    """Exit status for a suite after :func:`check_ceiling`: 1 when a full run has a ratio over the
    limit; 0 otherwise (a --quick run's tiny data is noise, so its flags are recorded only)."""
    return 1 if check["over"] and not check["quick"] else 0


# --- the per-batch device suites (bench_augment_views, bench_augment_targets) -------------------------


def device_parser(doc: str, quick_help: str) -> argparse.ArgumentParser:
    """The flags of a device suite: ``--quick`` (a smoke run), ``--device`` (cpu or cuda), ``--out``."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=str(DEFAULT_RESULTS_DIR))
    return ap


def seeded_images(n: int, h: int, w: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` float RGB images (n, 3, h, w) uniform in [0, 1), drawn from ``generator`` (default: seed 0)."""
    import torch

    return torch.rand(n, 3, h, w, generator=generator if generator is not None else torch.Generator().manual_seed(0))


def time_on_device(fns: dict[str, Callable[[int], Any]], device: Any, *, repeats: int, warmup: int,
                   rounds: int) -> dict[str, dict[str, float]]:
    """:func:`time_interleaved` of ``fns``, each call followed by a synchronize on a GPU (:func:`synced`)."""
    return time_interleaved({k: synced(f, device) for k, f in fns.items()}, repeats=repeats, warmup=warmup,
                            rounds=rounds)


def torch_machine_line(info: dict[str, Any], *libraries: str) -> str:
    """``Machine: CPU, N usable cores, torch V, <libraries>, T torch threads`` for a suite's markdown."""
    import torch

    return ", ".join([f"Machine: {info['cpu_model']}", f"{info['usable_cores']} usable cores",
                      f"torch {torch.__version__}", *libraries, f"{torch.get_num_threads()} torch threads"])


def save_device_run(name: str, quick: bool, device: Any, results: dict[str, Any], markdown: str,
                    out_dir: str | os.PathLike[str]) -> None:
    """Write ``<out_dir>/<name>[_quick][_cuda].{json,md}`` (:func:`write_results`) and print the markdown."""
    suffix = ("_quick" if quick else "") + ("_cuda" if getattr(device, "type", str(device)) == "cuda" else "")
    write_results(f"{name}{suffix}", results, markdown, out_dir)
    print(markdown)


def resident_bytes(paths: Sequence[Path | str]) -> int:
    """Bytes of ``paths`` in the page cache now (``mincore`` over a fresh map of each file; Linux):
    how a cold measurement checks that the cache really was emptied."""
    import ctypes
    import mmap

    import numpy as np

    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    total = 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        with open(p, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as m:
            view = np.frombuffer(m, dtype=np.uint8)
            vec = np.zeros(-(-size // page), dtype=np.uint8)
            rc = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size),
                              ctypes.c_void_p(vec.ctypes.data))
            del view  # the map cannot close while numpy holds it
            if rc != 0:
                raise OSError(ctypes.get_errno(), f"mincore failed on {p}")
            total += min(int((vec & 1).sum()) * page, size)
    return total
