"""Draw PNG charts from benchmarks/results/*.json: samples/s per configuration, the ceiling as a line.

Usage: python benchmarks/plot.py [--results DIR] [--quick]   (--quick plots the *_quick results)
Each chart is one horizontal bar per configuration, labelled with samples/s and the ratio to the
ceiling where the suite measured one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def bars(ax: Any, title: str, rows: list[tuple[str, float]], ceiling: float | None, unit: str = "samples/s",
         log: bool = False) -> None:
    labels = [r[0] for r in rows][::-1]
    values = [r[1] for r in rows][::-1]
    colors = ["#c44e52" if "naive" in label else "#55a868" if label.startswith("tuned") else "#4c72b0"
              for label in labels]
    ax.barh(labels, values, color=colors)
    top = max(values + ([ceiling] if ceiling else []))
    for y, v in enumerate(values):
        ratio = v / ceiling if ceiling else None
        note = f"{v:,.0f}" + (f"  ({ratio:.2f} of ceiling)" if ratio and ratio >= 0.01 else
                              f"  ({ratio:.4f} of ceiling)" if ratio else "")
        ax.text(v * 1.08 if log else v + top * 0.01, y, note, va="center", fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5, "alpha": 0.85})
    if ceiling:
        ax.axvline(ceiling, color="black", linestyle="--", linewidth=1.2)
        ax.text(ceiling, len(values) - 0.4, " ceiling", fontsize=8, va="bottom")
    if log:
        ax.set_xscale("log")
        ax.set_xlim(min(values) * 0.5, top * 8)
        unit += " (log scale)"
    else:
        ax.set_xlim(0, top * 1.45)
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=10)
    ax.tick_params(axis="y", labelsize=8)


def machine_line(res: dict[str, Any]) -> str:
    m = res.get("machine", {})
    return f"{m.get('cpu_model')}, {m.get('usable_cores')} cores, GPU: {m.get('gpu') or 'none'}, torch {m.get('torch')}"


def plot_get_batch(res: dict[str, Any], out: Path) -> Path:
    fig, axes = plt.subplots(len(res["datasets"]), 1, figsize=(10, 3.2 * len(res["datasets"])))
    for ax, d in zip(list(getattr(axes, "flat", [axes])), res["datasets"]):
        rows = [(m["method"], m["samples_per_s"]) for m in d["methods"] if not m["method"].startswith("ceiling")]
        ceiling = next(m["samples_per_s"] for m in d["methods"] if m["method"].startswith("ceiling"))
        bars(ax, f"get_batch, batches of {d['batch_size']}: {d['samples']} samples of {d['dtype']}{d['sample_shape']}",
             rows, ceiling, log=max(r[1] for r in rows + [("", ceiling)]) / min(r[1] for r in rows) > 50)
    return _save(fig, out / "get_batch.png", machine_line(res))


def plot_loader(res: dict[str, Any], out: Path) -> Path:
    rates = res["samples_per_s"]
    ceiling_key = res["ceiling"]["method"] if "ceiling" in res else next(k for k in rates if k.startswith("ceiling"))
    rows = [(k, v) for k, v in rates.items() if not k.startswith("ceiling")]
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(rows) + 1.5))
    bars(ax, f"Loader throughput, float32{res['shape']}, batch {res['batch']}, device cpu", rows, rates[ceiling_key])
    return _save(fig, out / "loader.png", machine_line(res))


def plot_train(res: dict[str, Any], out: Path) -> Path:
    rows = [(f"{k}  (waited {100 * v['wait_fraction']:.1f}%)", v["samples_per_s"]) for k, v in res["results"].items()]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(rows) + 1.5))
    bars(ax, "Training throughput and input wait (fp32, CPU)", rows, None)
    return _save(fig, out / "train.png", machine_line(res))


def plot_tune(res: dict[str, Any], out: Path) -> Path:
    rows = sorted(res["median"].items(), key=lambda kv: -kv[1])
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(rows) + 1.5))
    bars(ax, "fastdata tune's pick (green) vs hand-picked settings, median of rounds", rows, None)
    return _save(fig, out / "tune.png", machine_line(res))


def plot_generic(name: str, res: dict[str, Any], out: Path) -> Path | None:
    """Suites that store ``{"rows": [{"name": ..., "samples_per_s": ...}], "ceiling": ...}``."""
    rows = res.get("rows")
    if not isinstance(rows, list) or not rows or "samples_per_s" not in rows[0]:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(rows) + 1.5))
    bars(ax, res.get("title", name), [(r["name"], r["samples_per_s"]) for r in rows], res.get("ceiling"))
    return _save(fig, out / f"{name}.png", machine_line(res))


def _save(fig: Any, path: Path, subtitle: str) -> Path:
    fig.suptitle(subtitle, fontsize=8, y=0.995)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_images(res: dict[str, Any], out: Path) -> Path:
    rows = [(m["method"], m["samples_per_s"]) for m in res["result"]["methods"]]
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(rows) + 1.5))
    bars(ax, f"Image loading, {res['result']['images']} JPEGs 256x256, batch 64, CPU", rows, None)
    return _save(fig, out / "images.png", machine_line(res))


PLOTTERS = {"get_batch": plot_get_batch, "loader": plot_loader, "train": plot_train, "tune": plot_tune,
            "images": plot_images}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(RESULTS), help="folder with the suites' JSON files")
    p.add_argument("--quick", action="store_true", help="plot the *_quick results")
    a = p.parse_args(argv)
    folder = Path(a.results)
    suffix = "_quick" if a.quick else ""
    made = []
    for path in sorted(folder.glob(f"*{suffix}.json")):
        name = path.stem[: -len(suffix)] if suffix else path.stem
        if not suffix and name.endswith("_quick"):
            continue
        res = json.loads(path.read_text())
        plotter = PLOTTERS.get(name)
        png = plotter(res, folder) if plotter else plot_generic(name, res, folder)
        if png is not None:
            if suffix:
                png = png.rename(png.with_name(png.stem + suffix + png.suffix))
            made.append(png)
    for png in made:
        print(png)
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())
