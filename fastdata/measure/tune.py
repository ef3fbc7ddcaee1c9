"""``fastdata tune``: race loader settings by successive halving within a budget, and store the winner for
``fastdata.loader(num_workers="auto")``, keyed by dataset content, batch size, device and machine."""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fastdata.errors import UsageError
from fastdata.loaders.settings_cache import load_tuned, settings_key, store_tuned
from fastdata.measure.bench import BenchResult, measure, sample_bytes
from fastdata.reading.dataset import Dataset
from fastdata.world import usable_cpus

__all__ = ["load_tuned", "measure_setting", "settings_key", "store_tuned", "tune"]


def candidates(cores: int, batch_sizes: list[int], processes: bool = True) -> list[dict[str, Any]]:
    """The settings worth racing on a machine with ``cores`` cores (worker processes if ``processes``)."""
    threads = sorted({0, 1, 2, cores, cores + 1, 2 * cores})
    out = []
    for bs in batch_sizes:
        for t in threads:
            for pf in ((2, 4, 8) if t else (1,)):
                out.append({"mode": "threads", "num_workers": t, "prefetch": pf, "batch_size": bs})
        if processes:
            for w in sorted({1, 2, cores}):
                out.append({"mode": "processes", "num_workers": w, "prefetch": 4, "batch_size": bs})
    return out


@dataclass
class TuneResult:
    winner: dict[str, Any]
    rate: float
    table: list[tuple[dict[str, Any], BenchResult, int]] = field(default_factory=list)  # (settings, result, round)
    stored_at: Path | None = None
    reason: str = ""  # why the winner's reader mode: what it was raced against


def tune(
    path: str | os.PathLike[str],
    *,
    batch_size: int = 64,
    budget_s: float = 60.0,
    device: str = "cpu",
    batch_sizes: list[int] | None = None,
    store: bool = True,
    on_trial: Callable[[dict[str, Any], BenchResult, int], None] | None = None,
    transform: Any = None,
) -> TuneResult:
    """Race loader settings on the dataset at ``path`` within ``budget_s`` seconds, at ``batch_size`` and any
    ``batch_sizes``; store the winner. With
    ``transform``, every trial runs it, worker processes are raced too, and the winner is stored for it."""
    ds = Dataset(path)
    if len(ds) == 0:
        raise UsageError(f"{path}: the dataset has no samples: nothing to tune")
    sizes = sorted({batch_size, *(batch_sizes or ())})  # --batch-sizes: "also search these"
    alive = candidates(usable_cpus(), sizes, processes=transform is not None)
    deadline = time.perf_counter() + budget_s
    _warm_up(ds, min(batch_size, 64), device, max_seconds=0.15 * budget_s)
    # Halving keeps every round's cost about equal: n candidates x t, n/2 x 2t, ...
    rounds = max(1, (len(alive) - 1).bit_length())
    trial_s = max(0.2, budget_s / (rounds * len(alive)))
    table: list[tuple[dict[str, Any], BenchResult, int]] = []
    for rnd in itertools.count():  # rounds until one candidate is left or the budget is spent
        scored: list[tuple[float, dict[str, Any]]] = []
        for s in alive:
            if time.perf_counter() > deadline and scored:
                break
            r = measure_setting(ds, s, device=device, max_seconds=trial_s, transform=transform)
            scored.append((r.samples_per_s, s))
            table.append((s, r, rnd))
            if on_trial is not None:
                on_trial(s, r, rnd)
        scored.sort(key=lambda t: -t[0])
        if len(scored) <= 1 or time.perf_counter() > deadline:
            break
        alive = [s for _, s in scored[: len(scored) // 2]]  # the slower half cannot win
        trial_s *= 2
    rate, winner = scored[0]  # the fastest of the last (longest) round, at its rate there
    from fastdata.loaders.torch_backend import resolve_device

    kind = resolve_device(device).type  # keyed as fastdata.loader looks it up: "auto" and "cuda:1" resolved
    stored = store_tuned(ds, winner["batch_size"], kind, winner, rate, transform) if store else None
    return TuneResult(winner=winner, rate=rate, table=table, stored_at=stored, reason=_reason(winner, table, transform))


def _reason(winner: dict[str, Any], table: list[tuple[dict[str, Any], BenchResult, int]], transform: Any) -> str:
    """Why the winner's reader mode: the best rate of the other mode, in the latest round it reached."""
    if transform is None:
        return ("threads: no transform was given, so worker processes were not raced (they hand over the same "
                "bytes through shared memory and cannot win by more than noise; pass a transform to race them)")
    other = "threads" if winner["mode"] == "processes" else "processes"
    # each mode's best rate in the latest round any of its candidates reached
    mine, theirs = (max(((rnd, r.samples_per_s) for s, r, rnd in table if s["mode"] == m), default=None)
                    for m in (winner["mode"], other))
    assert mine is not None
    if theirs is None:
        return f"{winner['mode']}: the only mode raced"
    why = ("the transform holds the GIL, so threads wait for each other" if winner["mode"] == "processes" else
           "the transform releases the GIL (or is cheap), so threads keep pace without the hand-off")
    return (f"{winner['mode']}: {mine[1]:,.0f} samples/s with the transform, against {theirs[1]:,.0f} for the best "
            f"{other} setting (round {theirs[0]}): {why}")


def measure_setting(ds: Dataset, s: dict[str, Any], *, device: str = "cpu", max_seconds: float,
                    transform: Any = None) -> BenchResult:
    """One trial of the race: a loader with the settings ``s`` (as :func:`candidates` gives them),
    measured by :func:`fastdata.measure.bench.measure` for ``max_seconds``."""
    from fastdata.loaders import LoaderConfig, loader

    ld = loader(ds, s["batch_size"], device=device, num_workers=s["num_workers"],
                config=LoaderConfig(mode=s["mode"], prefetch=s["prefetch"]), transform=transform)
    name = f"{s['mode']} workers={s['num_workers']} prefetch={s['prefetch']} batch={s['batch_size']}"
    try:
        return measure(name, lambda: ld, bytes_per_sample=sample_bytes(ds), max_seconds=max_seconds,
                       warmup=2, settings=s)
    finally:
        ld.close()


def _warm_up(ds: Dataset, batch_size: int, device: str, max_seconds: float) -> None:
    """Read the dataset in storage order before racing, so the first candidates do not pay for a cold
    page cache that the later ones would not (bounded: a dataset larger than RAM stays disk-bound)."""
    from fastdata.loaders import loader

    with loader(ds, batch_size, shuffle=False, device=device, num_workers=2) as ld:
        measure("warm-up", lambda: ld, bytes_per_sample=0.0, max_seconds=max_seconds, warmup=0, one_pass=True)
