"""``fastdata tune``: choose loader settings by measurement, and remember them for this machine.

Candidates (reader mode, workers or threads, prefetch depth, optionally batch size) are raced by
successive halving: every candidate gets a short trial, the slower half is dropped, and the
survivors are measured again for twice as long, until the budget is spent or one is left. The
winner is stored in the user's cache directory (never in the dataset), keyed by the dataset's
content, the batch size, the device and the machine; ``fastdata.loader(num_workers="auto")``
uses it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .bench import BenchResult, measure, sample_bytes
from .dataset import Dataset
from .fileio import write_atomic
from .handles import usable_cpus

log = logging.getLogger("fastdata.tune")

CACHE_FILE = "tuned.json"


def cache_dir() -> Path:
    """``$FASTDATA_CACHE_DIR``, else ``$XDG_CACHE_HOME/fastdata``, else ``~/.cache/fastdata``."""
    if os.environ.get("FASTDATA_CACHE_DIR"):
        return Path(os.environ["FASTDATA_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fastdata"


def machine_id() -> str:
    """What makes timings comparable: host, CPU model, usable cores."""
    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{platform.node()}|{cpu or platform.processor()}|{usable_cpus()}"


def settings_key(ds: Dataset, batch_size: int, device: str) -> str:
    """Same dataset content (shard checksums), batch size, device type and machine -> same key."""
    h = hashlib.sha256()
    for s in ds.manifest.shards:
        h.update(s.sha256.encode())
    h.update(f"|{','.join(f.name for f in ds.schema)}|{batch_size}|{device}|{machine_id()}".encode())
    return h.hexdigest()[:32]


def load_tuned(ds: Dataset, batch_size: int, device: str) -> dict[str, Any] | None:
    """Stored settings for this dataset/batch size/device on this machine, or None."""
    entry = _read_cache(cache_dir() / CACHE_FILE).get(settings_key(ds, batch_size, device))
    if not isinstance(entry, dict) or not isinstance(entry.get("settings"), dict):
        return None
    return entry["settings"]


def store_tuned(ds: Dataset, batch_size: int, device: str, settings: dict[str, Any], rate: float) -> Path:
    """Remember the winner (atomic write of the cache file)."""
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / CACHE_FILE
    data = _read_cache(path)
    data[settings_key(ds, batch_size, device)] = {
        "settings": settings, "samples_per_s": rate, "dataset": str(ds.root.resolve()), "batch_size": batch_size,
        "device": device, "machine": machine_id(), "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    text = json.dumps(data, indent=1) + "\n"
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))
    return path


def _read_cache(path: Path) -> dict[str, Any]:
    """The cache file's entries; empty when it is missing or unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def candidates(cores: int, batch_sizes: list[int]) -> list[dict[str, Any]]:
    """The settings worth racing on a machine with ``cores`` cores."""
    threads = sorted({0, 1, 2, cores, cores + 1, 2 * cores})
    out = []
    for bs in batch_sizes:
        for t in threads:
            for pf in ((2, 4, 8) if t else (1,)):
                out.append({"mode": "threads", "num_workers": t, "prefetch": pf, "batch_size": bs})
        for w in sorted({2, cores}):
            out.append({"mode": "processes", "num_workers": w, "prefetch": 4, "batch_size": bs})
    return out


@dataclass
class TuneResult:
    winner: dict[str, Any]
    rate: float
    table: list[tuple[dict[str, Any], BenchResult, int]] = field(default_factory=list)  # (settings, result, round)
    stored_at: Path | None = None


def tune(
    path: str | os.PathLike[str],
    *,
    batch_size: int = 64,
    budget_s: float = 60.0,
    device: str = "cpu",
    batch_sizes: list[int] | None = None,
    store: bool = True,
    on_trial: Callable[[dict[str, Any], BenchResult, int], None] | None = None,
) -> TuneResult:
    """Race loader settings on the dataset at ``path`` within ``budget_s`` seconds; store the winner."""
    ds = Dataset(path)
    alive = candidates(usable_cpus(), batch_sizes or [batch_size])
    deadline = time.perf_counter() + budget_s
    _warm_up(ds, min(batch_size, 64), device, max_seconds=0.15 * budget_s)
    # Halving keeps every round's cost about equal: n candidates x t, n/2 x 2t, ...
    rounds = max(1, (len(alive) - 1).bit_length())
    trial_s = max(0.2, budget_s / (rounds * len(alive)))
    table: list[tuple[dict[str, Any], BenchResult, int]] = []
    rnd = 0
    while True:
        scored = []
        for s in alive:
            if time.perf_counter() > deadline and scored:
                break
            r = measure_setting(ds, s, device=device, max_seconds=trial_s)
            scored.append((r.samples_per_s, s))
            table.append((s, r, rnd))
            if on_trial is not None:
                on_trial(s, r, rnd)
        scored.sort(key=lambda t: -t[0])
        rnd += 1
        if len(scored) <= 1 or time.perf_counter() > deadline:
            break
        alive = [s for _, s in scored[: len(scored) // 2]]  # the slower half cannot win
        trial_s *= 2
    rate, winner = scored[0]  # the fastest of the last (longest) round, at its rate there
    stored = store_tuned(ds, winner["batch_size"], device, winner, rate) if store else None
    return TuneResult(winner=winner, rate=rate, table=table, stored_at=stored)


def measure_setting(ds: Dataset, s: dict[str, Any], *, device: str = "cpu", max_seconds: float) -> BenchResult:
    """One trial of the race: a loader with the settings ``s`` (as :func:`candidates` gives them),
    measured by :func:`fastdata.bench.measure` for ``max_seconds``."""
    from .loaders import LoaderConfig, loader

    ld = loader(ds, s["batch_size"], device=device, num_workers=s["num_workers"],
                config=LoaderConfig(mode=s["mode"], prefetch=s["prefetch"]))
    try:
        return measure(_describe(s), lambda: ld, bytes_per_sample=sample_bytes(ds), max_seconds=max_seconds,
                       warmup=2, settings=s)
    finally:
        ld.close()


def _warm_up(ds: Dataset, batch_size: int, device: str, max_seconds: float) -> None:
    """Read the dataset in storage order before racing, so the first candidates do not pay for a cold
    page cache that the later ones would not (bounded: a dataset larger than RAM stays disk-bound)."""
    from .loaders import loader

    ld = loader(ds, batch_size, shuffle=False, device=device, num_workers=2)
    t0 = time.perf_counter()
    try:
        for _ in ld:
            if time.perf_counter() - t0 > max_seconds:
                break
    finally:
        ld.close()


def _describe(s: dict[str, Any]) -> str:
    return f"{s['mode']} workers={s['num_workers']} prefetch={s['prefetch']} batch={s['batch_size']}"
