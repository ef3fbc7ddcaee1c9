"""The report's host-to-device keys and line, from the copy counts of fastdata.measure.doctor._h2d."""

from __future__ import annotations

from typing import Any

NO_CUDA = "no CUDA device"  # the reason when the machine has none (also fastdata.measure.doctor._h2d's test)
METHOD = ("CUDA events (enable_timing) on the device's current stream around each Tensor.to/.cuda/.copy_ of a "
          "CPU tensor of the loop's batches to the GPU, read after the fact (no synchronize per step); the first "
          "batches are left out (CUDA start-up)")


def _count(b: dict[str, Any] | None) -> dict[str, Any] | None:
    return {"copies": b["copies"], "bytes": b["bytes"]} if b and b["copies"] else None


def figures(raw: dict[str, Any] | None, main: dict[str, Any], step_s: float) -> dict[str, Any]:
    """``h2d`` and ``h2d_reason`` (and the copies made inside the loader or of other tensors, counted apart)
    for the loader ``main`` of the report, whose mean step is ``step_s``."""
    if raw is None:
        return {"h2d": None, "h2d_reason": "not recorded"}
    if not raw["cuda"]:
        return {"h2d": None, "h2d_reason": NO_CUDA}
    out: dict[str, Any] = {"h2d_inside_loader": _count(raw["inside_loader"]), "h2d_other": _count(raw["other"])}
    b = raw["loaders"].get(str(main["key"]))
    if not b or not b["copies"]:
        out.update(h2d=None, h2d_reason=_why_none(main, out["h2d_inside_loader"]))
        return out
    if not b["timed"] or b["seconds"] <= 0:
        out.update(h2d=None, h2d_reason=f"{b['copies']} copies seen, none could be timed")
        return out
    per_batch = b["seconds"] * b["copies"] / b["timed"] / max(b["batches"], 1)  # untimed copies: at the mean
    h = {"copies": b["copies"], "bytes": b["bytes"], "seconds": b["seconds"], "timed_copies": b["timed"],
         "gb_per_s": b["timed_bytes"] / b["seconds"] / 1e9, "batches": b["batches"], "per_batch_s": per_batch,
         "step_fraction": per_batch / step_s if step_s > 0 else None,
         "pinned_fraction": b["pinned"] / b["copies"], "non_blocking_fraction": b["non_blocking"] / b["copies"],
         "method": METHOD}
    h["advice"] = advice(h["pinned_fraction"], h["non_blocking_fraction"], main)
    out.update(h2d=h, h2d_reason=None)
    return out


def _why_none(main: dict[str, Any], inside: dict[str, Any] | None) -> str:
    if inside is None:
        return "the loop copied none of the loader's batches to a CUDA device"
    seen = f"{inside['copies']} copies, {inside['bytes'] / 1e6:.1f} MB"
    if main["kind"] == "fastdata":
        return (f"fastdata.loader(device='cuda') copies its batches to the GPU itself ({seen}), from pinned memory "
                "on a side stream ahead of use: not timed apart; any copy the loop waited for is in its wait")
    return (f"the batches reach the GPU inside the loader's next() ({seen}, a collate_fn that moves them): "
            "their time is part of the wait")


def advice(pinned: float, non_blocking: float, main: dict[str, Any]) -> str | None:
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


def line(r: dict[str, Any]) -> str:
    """The text report's line."""
    h = r.get("h2d")
    if h is None:
        why = r.get("h2d_reason") or "not recorded"
        return f"host->device not measured ({'no CUDA' if why == NO_CUDA else why})"
    share = f" ({h['step_fraction']:.1%} of the step)" if h["step_fraction"] is not None else ""
    text = (f"host->device: {h['gb_per_s']:.2f} GB/s, {h['per_batch_s'] * 1e3:.2f} ms a batch{share}; "
            f"{h['bytes'] / 1e6:.1f} MB in {h['copies']} copies, {h['pinned_fraction']:.0%} pinned, "
            f"{h['non_blocking_fraction']:.0%} non_blocking")
    return text + (f"; {h['advice']}" if h["advice"] else "")
