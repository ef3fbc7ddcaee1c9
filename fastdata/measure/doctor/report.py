"""From what the hooks recorded to the verdict: ``analyse`` reads the doctor's folder (raw.json, worker-*.json,
project.json) into the report dict; ``render`` makes its one-screen text, ``page`` its HTML page."""

from __future__ import annotations

import html
import json
import os
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

from fastdata.format.manifest import ARRAY_SUFFIXES, IMAGE_SUFFIXES
from fastdata.measure.doctor._probe import WARMUP
from fastdata.measure.doctor.project import NO_GAIN, commands, image_hw, is_table, lines

INPUT_BOUND = 0.10  # a loop waiting more than this fraction of its time for data is input-bound
SATURATED = 0.80  # workers busy more than this fraction of their lifetime cannot go faster


def _steps(events: list[list[float]], warmup: int = WARMUP) -> tuple[list[float], list[float]]:
    """Per measured step: (wait, step) seconds, leaving out the first ``warmup`` batches of each pass."""
    waits, steps = [], []
    pos = 0  # the batch's position in its pass
    for i, (asked, got, p) in enumerate(events):
        pos = pos + 1 if i and events[i - 1][2] == p else 0
        if pos >= max(warmup, 1):
            waits.append(got - asked)
            steps.append(got - events[i - 1][1])
    return waits, steps


def measured_steps(events: list[list[float]]) -> tuple[list[float], list[float], str]:
    """The steps to measure, and how far to trust them: slow steps leave few in a budget, and then the
    warm-up is cut to one batch a pass rather than leave no verdict."""
    waits, steps = _steps(events)
    if len(steps) < 3:
        waits, steps = _steps(events, 1)
    n = len(steps)
    confidence = "high" if n >= 20 else "medium" if n >= 5 else "low"
    return waits, steps, confidence


def _replay_step(loader: dict[str, Any], stopped_at: float | None) -> float | None:
    """The median step on the cached batches, less the median copy: medians, as other load on the machine
    makes single steps slow."""
    marks = [t for t, _ in loader["replay"]] + ([stopped_at] if stopped_at else [])
    copies = sorted(c for _, c in loader["replay"])
    if len(marks) < 3:
        return None
    gaps = sorted(b - a for a, b in zip(marks, marks[1:]))
    return max(gaps[len(gaps) // 2] - copies[len(copies) // 2], 0.0)


def _workers(folder: Path, main_pid: int, num_workers: int) -> dict[str, Any] | None:
    rows = [json.loads(p.read_text()) for p in sorted(folder.glob("worker-*.json"))]
    rows = [r for r in rows if (r["pid"] == main_pid) == (num_workers == 0)]
    if not rows:
        return None
    alive = sum(r["alive_s"] for r in rows) or 1e-9
    fetch, collate = sum(r["fetch_s"] for r in rows), sum(r["collate_s"] for r in rows)
    samples, batches = sum(r["samples"] for r in rows), sum(r["batches"] for r in rows)
    ios = [r["io"] for r in rows if r["io"]]
    causes = sum((Counter(r["causes"]) for r in rows), Counter[str]())
    out: dict[str, Any] = {
        "processes": len(rows), "samples": samples,
        "getitem_s_per_sample": fetch / samples if samples else None,
        "collate_s_per_batch": collate / batches if batches else None,
        "getitem_fraction": fetch / alive, "collate_fraction": collate / alive,
        "cpu_fraction": sum(r["cpu_s"] for r in rows) / alive,
        # time inside known readers and decoders, as a fraction of the workers' time (sorted, largest first)
        "causes": {k: v / alive for k, v in causes.most_common()},
        "source": source_of([f for r in rows for f in r["files"]]),
    }
    if ios and num_workers > 0:  # the main process's counters hold the whole script, not the dataset
        rchar, read_bytes = sum(i["rchar"] for i in ios), sum(i["read_bytes"] for i in ios)
        out["io"] = {"rchar": rchar, "read_bytes": read_bytes,
                     "from_storage_fraction": min(read_bytes / rchar, 1.0) if rchar else None,
                     "method": "/proc/<worker>/io: read_bytes (fetched from storage) / rchar (asked of read()); "
                               "mmap reads are not counted"}
    return out


def source_of(files: list[str]) -> dict[str, Any] | None:
    """The folder the dataset's files share and what they are (from the paths the workers opened), and
    whether ``fastdata convert`` takes that folder as it is (per-sample .npy/.npz or image files)."""
    files = [f for f in files if os.path.isfile(f) and not is_table(f)]  # tables: fastdata.measure.doctor.project
    if not files:
        return None
    kinds = dict(Counter(os.path.splitext(f)[1].lower() or "(none)" for f in files))
    folder = os.path.commonpath([os.path.dirname(f) for f in files])
    per_sample = len(files) > 1 and all(k in IMAGE_SUFFIXES or k in ARRAY_SUFFIXES for k in kinds)
    return {"folder": folder, "kinds": kinds, "files_seen": len(files), "convertible": per_sample}


def _bottleneck(wait: float, loader: dict[str, Any], w: dict[str, Any] | None) -> tuple[str, str]:
    if wait < INPUT_BOUND:
        return "compute", f"compute-bound: the loop waited {wait:.1%} of its time for data"
    head = f"input-bound: the loop waited {wait:.1%} of its time for data"
    nw = loader["settings"].get("num_workers") or 0
    if w is None:
        return "loader", head + " (no timings from inside the loader: workers not started with fork?)"
    if nw == 0:
        return "num_workers=0", (head + f"; samples are loaded in the training process (num_workers=0), "
                                 f"{w['getitem_fraction']:.1%} of its time in __getitem__")
    io = w.get("io") or {}
    busy = w["getitem_fraction"] + w["collate_fraction"]
    # storage-bound: saturated workers, idle on the CPU, reading from storage (a few pages explain no wait)
    read_enough = io.get("read_bytes", 0) >= max(1 << 20, 4096 * (w.get("samples") or 0))
    if busy >= SATURATED and read_enough and io.get("from_storage_fraction") and io["from_storage_fraction"] > 0.5 \
            and w["cpu_fraction"] < 0.5 * busy:
        return "storage", head + (f"; the workers wait on storage reads ({io['from_storage_fraction']:.1%} of "
                                  f"the bytes they read were not in the page cache)")
    what, frac = ("collate", w["collate_fraction"]) if w["collate_fraction"] > w["getitem_fraction"] else (
        "__getitem__", w["getitem_fraction"])
    per = (f"{w['getitem_s_per_sample'] * 1e3:.1f} ms/sample" if what == "__getitem__"
           else f"{w['collate_s_per_batch'] * 1e3:.1f} ms/batch")
    if busy < 0.5:
        return "loader", head + f"; the workers are busy only {busy:.1%} of the time (start-up, IPC, or too few in flight)"
    cause, share = next(iter(w["causes"].items()), ("", 0.0))
    who = "the worker spends" if nw == 1 else f"the {nw} workers spend"
    its = "its" if nw == 1 else "their"
    if what == "__getitem__" and share >= 0.5 * frac:
        return ("decode" if cause.startswith("decoding") else "read",
                head + f"; {who} {share:.1%} of {its} time {cause} ({per} in __getitem__)")
    return ("dataset_getitem" if what == "__getitem__" else "collate",
            head + f"; {who} {frac:.1%} of {its} time in {what} ({per})")


def analyse(folder: Path, command: list[str]) -> dict[str, Any]:
    """The report (the JSON file's content) of one doctor run whose files are in ``folder``."""
    raw = json.loads((folder / "raw.json").read_text())
    proj_path = folder / "project.json"
    proj = json.loads(proj_path.read_text()) if proj_path.exists() else {"ok": False, "why": "not measured"}
    none = {"command": command, "stop_reason": raw["stop_reason"], "bottleneck": None, "loaders": []}
    if not raw["loaders"]:
        return {**none, "verdict": "no DataLoader was iterated: nothing to measure"}
    main = max(raw["loaders"], key=lambda r: len(r["events"]))
    waits, steps, confidence = measured_steps(main["events"])
    if not steps:
        return {**none, "verdict": "one batch in the budget: a step takes longer than the budget allows; raise "
                                   "--seconds" if raw["stop_reason"] == "budget spent" else
                                   f"too few batches to measure ({len(main['events'])}) before the script stopped"}
    wait_fraction = sum(waits) / sum(steps)
    step_s = sum(steps) / len(steps)
    compute = _replay_step(main, raw.get("stopped_at")) if raw.get("replay_key") == main["key"] else None
    method = "replay: the script's step timed on cached batches (the first it had, up to 8)"
    if compute is None:
        compute, method = step_s - sum(waits) / len(waits), "estimate: step time minus the wait in next()"
    nw = main["settings"].get("num_workers") or 0
    w = _workers(folder, raw["main_pid"], nw) if main["kind"] == "torch" else None
    bottleneck, verdict = _bottleneck(wait_fraction, main, w)
    out: dict[str, Any] = {
        "command": command, "stop_reason": raw["stop_reason"], "verdict": verdict, "bottleneck": bottleneck,
        "wait_fraction": wait_fraction, "step_s": step_s, "steps_measured": len(steps), "confidence": confidence,
        "compute_only_step_s": compute, "compute_only_method": method,
        "loader": {"kind": main["kind"], "dataset": main["dataset"], "settings": main["settings"],
                   "batches": len(main["events"]), "passes": main["passes"]},
        "workers": w, "other_loaders": [{"dataset": r["dataset"], "batches": len(r["events"])}
                                        for r in raw["loaders"] if r is not main],
        "timeline": main["events"][:2000], "replay": main["replay"],
    }
    out.update(h2d_figures(raw.get("h2d"), main, step_s))
    out.update(_projection(proj, step_s, wait_fraction * step_s, compute, w, _beside(raw)))
    ok = proj if proj.get("ok") else None
    source = (w or {}).get("source")
    out["account"] = (ok or {}).get("account")
    out["images"] = _images_only(source)
    speedup = out.get("projected_speedup")
    size = _image_size(source, ok) if source else None
    out["fix"], out["fix_notes"] = commands(main, ok, source, size, raw.get("episode"))
    out["commands"] = out["fix"]  # what is printed: the fix, unless there is nothing to gain
    if main["kind"] == "fastdata":
        out["commands"] = []
        out["no_fix"] = "nothing to convert: the loop already reads through fastdata.loader"
    elif speedup is not None and speedup < NO_GAIN:
        out["commands"] = []
        out["no_fix"] = (f"no input bottleneck to remove: fastdata is projected at {speedup:.2f}x, below "
                         f"{NO_GAIN}x; keep your loader")
    return out


def _beside(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The step replayed beside fastdata's loader: its mean (less the doctor's copy of the cached batch) and
    the fraction spent waiting for fastdata, leaving out each pass's first batch (start-up)."""
    rows, why = raw.get("beside") or [], raw.get("beside_why")
    if len(rows) < 2:
        return {"why": why} if why else None
    steps = [(b[0] - a[0] - b[2], b[1], b[3]) for a, b in zip(rows, rows[1:])]  # (step, waited, position)
    kept = [s for s in steps if s[2] > 0] or steps
    times = [max(s[0], 0.0) for s in kept]
    total = sum(times) or 1e-12
    return {"step_s": total / len(times), "wait_fraction": min(sum(s[1] for s in kept) / total, 1.0),
            "wait_s": sum(s[1] for s in kept) / len(kept), "steps": len(kept)}


def _projection(proj: dict[str, Any], step_s: float, wait_s: float, compute: float,
                workers: dict[str, Any] | None, beside: dict[str, Any] | None = None) -> dict[str, Any]:
    if not proj.get("ok"):
        return {"projected_wait_fraction": None, "projected_speedup": None, "projection": proj}
    busy = workers is not None and workers["getitem_fraction"] + workers["collate_fraction"] >= 0.5
    if beside and "step_s" in beside:  # measured: the step with fastdata's reader threads on the same CPU
        # input-bound or busy workers: the step beside fastdata is the step after the switch; else its own work stays
        if busy or wait_s >= INPUT_BOUND * step_s:
            new_step, basis = beside["step_s"], f"step replayed beside fastdata's loader ({beside['steps']} steps)"
        else:
            new_step = max(step_s - wait_s + beside["wait_s"], beside["step_s"])
            basis = (f"longer of the step less its wait and the step replayed beside fastdata's loader "
                     f"({beside['steps']} steps)")
        return {"projected_wait_fraction": min(beside["wait_s"] / new_step, 1.0) if new_step > 0 else None,
                "projected_step_s": new_step, "projected_speedup": step_s / new_step if new_step > 0 else None,
                "projection_basis": basis, "projection": proj, "beside": beside}
    # without that replay (watch(), --no-replay): the longer of the step's own work and fastdata's batch alone
    work, basis = (min(compute, step_s), "compute-only step (busy workers took CPU from the step)") if busy \
        else (step_s - wait_s, "step less the wait")
    new_step = max(work, proj["batch_s"])
    return {"projected_wait_fraction": max(proj["batch_s"] - work, 0.0) / new_step,
            "projected_step_s": new_step, "projected_speedup": step_s / new_step, "projection_basis": basis,
            "projection": proj, "beside": beside}


def _images_only(source: dict[str, Any] | None) -> bool:
    """Whether the workers read image files only."""
    return bool(source and source["kinds"] and all(k in IMAGE_SUFFIXES for k in source["kinds"]))


def _image_size(source: dict[str, Any], proj: dict[str, Any] | None) -> tuple[int, int] | None:
    """(H, W) of the one image field of the samples when the workers read image files only: the size to
    decode and resize to at conversion, as the projection measured."""
    if proj is None or not _images_only(source):
        return None
    sizes = [hw for hw in map(image_hw, (proj.get("shapes") or {}).values()) if hw is not None]
    return sizes[0] if len(sizes) == 1 else None


def render(r: dict[str, Any]) -> str:
    """The one-screen text: verdict first, then the figures behind it and the fix."""
    cmd = shlex.join(r["command"])
    if r.get("bottleneck") is None:
        return f"doctor report on: {cmd}\n{r['verdict']} ({r['stop_reason']})\n"
    out = [f"doctor report on: {cmd}",
           f"({r['steps_measured']} steps measured, {r.get('confidence', 'high')} confidence; {r['stop_reason']})", ""]
    verdict = r["verdict"]
    if r["projected_speedup"] is not None:
        verdict += (f"; with fastdata: projected wait {r['projected_wait_fraction']:.1%}, "
                    f"{r['projected_speedup']:.1f}x steps/s")
    out += [verdict[:1].upper() + verdict[1:] + ".", ""]
    s = r["loader"]["settings"]
    out.append(f"loader   {r['loader']['kind']} over {r['loader']['dataset']}: "
                 + ", ".join(f"{k}={v}" for k, v in s.items() if v is not None))
    out.append(f"step     {r['step_s'] * 1e3:.1f} ms, of which waiting {r['wait_fraction'] * r['step_s'] * 1e3:.1f} ms;"
                 f" compute-only {r['compute_only_step_s'] * 1e3:.1f} ms ({r['compute_only_method'].split(':')[0]})")
    w = r.get("workers")
    if w:
        per = w["getitem_s_per_sample"]
        out.append(f"workers  {w['processes']} process(es): __getitem__ {w['getitem_fraction']:.1%} of their time"
                     + (f" ({per * 1e3:.2f} ms/sample)" if per else "")
                     + f", collate {w['collate_fraction']:.1%}, CPU {w['cpu_fraction']:.1%} of one core each")
        if w.get("causes"):
            out.append("inside   " + ", ".join(f"{k} {v:.1%}" for k, v in w["causes"].items())
                         + " of the workers' time")
        io = w.get("io")
        if io and io["from_storage_fraction"] is not None:
            out.append(f"reads    {io['rchar'] / 1e6:.1f} MB read by the workers, "
                         f"{io['from_storage_fraction']:.1%} from storage, the rest from the page cache")
    out.append(h2d_line(r))
    p = r["projection"]
    if p.get("ok"):
        ops = f", images as uint8 with {' + '.join(p['ops'])} on the batch" if p.get("ops") else ""
        out.append(f"fastdata {p['batch_s'] * 1e3:.1f} ms/batch alone on {p['samples']} sampled samples "
                     f"({p['workers']} reader threads{ops}); projected step {r['projected_step_s'] * 1e3:.1f} ms, "
                     f"from the {r['projection_basis']}")
    else:
        out.append(f"fastdata not projected: {p.get('why')}")
    acc = lines(r.get("account"), bool(r.get("images")))
    if acc:
        out += ["", "each sample's elements, and where they go:"] + [f"  {a}" for a in acc]
    if r.get("no_fix"):
        out += ["", r["no_fix"][:1].upper() + r["no_fix"][1:] + "."]
    elif r["commands"]:
        out += ["", "the fix:"] + [f"  {c}" for c in r["commands"]]
        out += [f"  # {n}" for n in r.get("fix_notes") or []]
    return "\n".join(out) + "\n"


# -- host-to-device copies ------------------------------------------------------------------------------
NO_CUDA = "no CUDA device"  # the reason when the machine has none
H2D_METHOD = ("CUDA events (enable_timing) on the device's current stream around each Tensor.to/.cuda/.copy_ of "
              "a CPU tensor of the loop's batches to the GPU, read after the fact (no synchronize per step); the first "
              "batches are left out (CUDA start-up)")


def _count(b: dict[str, Any] | None) -> dict[str, Any] | None:
    return {"copies": b["copies"], "bytes": b["bytes"]} if b and b["copies"] else None


def h2d_figures(raw: dict[str, Any] | None, main: dict[str, Any], step_s: float) -> dict[str, Any]:
    """``h2d`` and ``h2d_reason`` (and the copies made inside the loader or of other tensors, counted apart)
    for the loader ``main`` of the report, whose mean step is ``step_s``."""
    if raw is None:
        return {"h2d": None, "h2d_reason": "not recorded"}
    if not raw["cuda"]:
        return {"h2d": None, "h2d_reason": NO_CUDA}
    out: dict[str, Any] = {"h2d_inside_loader": _count(raw["inside_loader"]), "h2d_other": _count(raw["other"])}
    b = raw["loaders"].get(str(main["key"]))
    if not b or not b["copies"] or not b["timed"] or b["seconds"] <= 0:
        why = f"{b['copies']} copies seen, none could be timed" if b and b["copies"] else \
            _h2d_why(main, out["h2d_inside_loader"])
        return {**out, "h2d": None, "h2d_reason": why}
    per_batch = b["seconds"] * b["copies"] / b["timed"] / max(b["batches"], 1)  # untimed copies: at the mean
    h = {"copies": b["copies"], "bytes": b["bytes"], "seconds": b["seconds"], "timed_copies": b["timed"],
         "gb_per_s": b["timed_bytes"] / b["seconds"] / 1e9, "batches": b["batches"], "per_batch_s": per_batch,
         "step_fraction": per_batch / step_s if step_s > 0 else None,
         "pinned_fraction": b["pinned"] / b["copies"], "non_blocking_fraction": b["non_blocking"] / b["copies"],
         "method": H2D_METHOD}
    h["advice"] = _h2d_advice(h["pinned_fraction"], h["non_blocking_fraction"], main)
    out.update(h2d=h, h2d_reason=None)
    return out


def _h2d_why(main: dict[str, Any], inside: dict[str, Any] | None) -> str:
    if inside is None:
        return "the loop copied none of the loader's batches to a CUDA device"
    seen = f"{inside['copies']} copies, {inside['bytes'] / 1e6:.1f} MB"
    if main["kind"] == "fastdata":
        return (f"fastdata.loader(device='cuda') copies its batches to the GPU itself ({seen}), from pinned memory "
                "on a side stream ahead of use: not timed apart; any copy the loop waited for is in its wait")
    return (f"the batches reach the GPU inside the loader's next() ({seen}, a collate_fn that moves them): "
            "their time is part of the wait")


def _h2d_advice(pinned: float, non_blocking: float, main: dict[str, Any]) -> str | None:
    """What to change when copies come from pageable memory or block; None when they are pinned and async."""
    if pinned < 1.0:
        if main["kind"] == "fastdata":
            fix = "pass device='cuda' to fastdata.loader (it copies from pinned memory, ahead of use)"
        elif main["settings"].get("pin_memory"):
            fix = "copy the tensors as the DataLoader hands them (pin_memory=True pins those)"
        else:
            fix = "pass pin_memory=True to the DataLoader"
        nb = " and non_blocking=True to .to()" if non_blocking < 1.0 and main["kind"] != "fastdata" else ""
        return f"pageable: {fix}{nb}"
    if non_blocking < 1.0:
        return "blocking: pass non_blocking=True to .to()/.cuda() (the source is pinned already)"
    return None


def h2d_line(r: dict[str, Any]) -> str:
    """The text report's host-to-device line."""
    h = r.get("h2d")
    if h is None:
        why = r.get("h2d_reason") or "not recorded"
        return f"host->device not measured ({'no CUDA' if why == NO_CUDA else why})"
    share = f" ({h['step_fraction']:.1%} of the step)" if h["step_fraction"] is not None else ""
    text = (f"host->device: {h['gb_per_s']:.2f} GB/s, {h['per_batch_s'] * 1e3:.2f} ms a batch{share}; "
            f"{h['bytes'] / 1e6:.1f} MB in {h['copies']} copies, {h['pinned_fraction']:.0%} pinned, "
            f"{h['non_blocking_fraction']:.0%} non_blocking")
    return text + (f"; {h['advice']}" if h["advice"] else "")


# -- the HTML page: the verdict and a timeline of waits and steps as inline SVG (no script, no CDN) -------
WIDTH, ROW, MAX_STEPS = 960, 26, 400


def page(r: dict[str, Any], text: str) -> str:
    """A self-contained page: the text report, then the timeline of the first steps of the main loader."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>fastdata doctor</title>"
            "<style>body{font-family:sans-serif;margin:2em}pre{background:#f6f6f6;padding:1em}"
            ".wait{fill:#d9534f}.step{fill:#5b8bd9}.replay{fill:#5cb85c}</style></head><body>\n"
            f"<h1>fastdata doctor</h1>\n<pre>{html.escape(text)}</pre>\n<h2>Timeline</h2>\n"
            "<p>Each row is a stretch of the training loop: red, waiting in next() for a batch; blue, the step "
            "(everything between batches); green, the compute-only replay on cached batches.</p>\n"
            f"{timeline(r)}\n</body></html>\n")


def timeline(r: dict[str, Any]) -> str:
    """An SVG of (asked, got) events: red bars for waits, blue for the work between them."""
    ev = (r.get("timeline") or [])[:MAX_STEPS]
    if len(ev) < 2:
        return "<p>(no steps recorded)</p>"
    t0 = ev[0][1]
    replay = [t for t, _ in r.get("replay") or []]
    t_end = max(ev[-1][1], replay[-1] if replay and len(ev) < MAX_STEPS else ev[-1][1])
    rows = 8
    span = max((t_end - t0) / rows, 1e-9)
    parts = []

    def bar(a: float, b: float, cls: str, title: str) -> None:
        while b > a:  # a bar that crosses the end of a row goes on in the next one
            row = min(int((a - t0) / span), rows - 1)
            end = min(b, t0 + (row + 1) * span) if row < rows - 1 else b
            x, w = (a - t0 - row * span) / span * WIDTH, max((end - a) / span * WIDTH, 0.5)
            parts.append(f'<rect class="{cls}" x="{x:.1f}" y="{row * ROW + 4}" width="{w:.1f}" height="{ROW - 8}">'
                         f"<title>{html.escape(title)}</title></rect>")
            if end <= a:
                break
            a = end

    for i, (asked, got, _) in enumerate(ev):
        if asked >= t0:
            bar(asked, got, "wait", f"batch {i}: waited {(got - asked) * 1e3:.1f} ms")
        if i + 1 < len(ev):
            bar(got, ev[i + 1][0], "step", f"step {i}: {(ev[i + 1][0] - got) * 1e3:.1f} ms")
    if len(ev) < MAX_STEPS:
        for a, b in zip(replay, replay[1:]):
            bar(a, b, "replay", f"compute-only step: {(b - a) * 1e3:.1f} ms")
    axis = f'<text x="0" y="{rows * ROW + 16}" font-size="12">each row {span * 1e3:.0f} ms</text>'
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{rows * ROW + 24}" '
            f'viewBox="0 0 {WIDTH} {rows * ROW + 24}">{"".join(parts)}{axis}</svg>')
