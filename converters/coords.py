"""Pixel coordinates (keypoints: x, y first; boxes: x0, y0, x1, y1) in tables or Python samples, rescaled
(float32) when a conversion resizes images; an undeclared look-alike field is then refused."""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from fastdata.converters.image_codec import ImageOptions, resize_plan
from fastdata.converters.table_types import FLOAT_DTYPE
from fastdata.errors import DataError, UsageError

# names that say "pixel coordinates": key points, landmarks, kp(s), boxes, bbox(es), coords, points, joints, ...
COORDINATE_NAME = re.compile(r"key_?points?|landmarks?|(^|[_.-])kps?([_.-]|$)|b_?box|boxes|(^|[_.-])box([_.-]|$)"
                             r"|coord|points?|joints?|corners?|polygons?|(^|[_.-])xy([_.-]|$)", re.IGNORECASE)


def rescale(a: np.ndarray, kind: str, original: Sequence[int], opts: ImageOptions) -> np.ndarray:
    """``a``'s pixel coordinates (``kind`` keypoints or boxes) in the image of upright size
    ``original`` (H, W) moved to the stored image: ``x * new_w / old_w - left``, ``y * new_h / old_h - top``."""
    h, w = int(original[0]), int(original[1])
    plan = resize_plan(w, h, opts)
    sx, sy = plan.scaled[0] / w, plan.scaled[1] / h
    out = np.array(a, dtype=np.float64)
    xs = [0, 2] if kind == "boxes" else [0]
    for c in xs:
        out[..., c] = out[..., c] * sx - plan.left
        out[..., c + 1] = out[..., c + 1] * sy - plan.top
    return out.astype(FLOAT_DTYPE)


def check_declared(lasts: Mapping[str, int | None], keypoints: Sequence[str], boxes: Sequence[str],
                   not_coordinates: Sequence[str], missing: Callable[[str, str], str],
                   bad: Callable[[str, str, str], str]) -> None:
    """Each declared name is in ``lasts`` (name -> its values' last axis length; None: not numeric) with the
    shape its kind needs; ``missing(flag, name)`` and ``bad(flag, name, need)`` word the UsageError."""
    for flag, names in (("keypoints", keypoints), ("boxes", boxes), ("not_coordinates", not_coordinates)):
        for name in names:
            if name not in lasts:
                raise UsageError(missing(flag, name))
    for flag, names, need in (("keypoints", keypoints, "(..., 2 or more): x, y first"),
                              ("boxes", boxes, "(..., 4): x0, y0, x1, y1")):
        for name in names:
            last = lasts[name]
            if last is None or (last < 2 if flag == "keypoints" else last != 4):
                raise DataError(bad(flag, name, need))


def looks_like(name: str, last: int | None, rows: Iterable[Any], originals: Iterable[Sequence[int]]) -> str | None:
    """Why a numeric field ``name`` whose values' last axis has ``last`` entries looks like pixel
    coordinates of images of upright sizes ``originals`` (H, W), or None (file and Python sources alike)."""
    if last is None or last < 2:
        return None
    if COORDINATE_NAME.search(name):
        return "its name says coordinates"
    if last > 4:
        return None
    top = 0.0
    xs, ys = ([0, 2], [1, 3]) if last == 4 else ([0], [1])  # boxes: both corners; points: x, y
    for a, (h, w) in zip(rows, originals):
        a = np.asarray(a, dtype=np.float64)
        if a.size == 0:
            continue
        x, y = a[..., xs], a[..., ys]
        if not (np.all((x >= 0) & (x <= w)) and np.all((y >= 0) & (y <= h))):
            return None
        top = max(top, float(a[..., :2].max()))
    return f"its {last} values per row lie inside each image" if top > 1 else None
