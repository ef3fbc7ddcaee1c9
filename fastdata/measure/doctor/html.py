"""The doctor's HTML page: the verdict and a timeline of waits and steps as inline SVG (no script, no CDN)."""

from __future__ import annotations

import html
from typing import Any

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
