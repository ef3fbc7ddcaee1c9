"""Byte sizes for people: parse ``512MB`` / ``1GiB``, print ``1.80 GB``."""

from __future__ import annotations

import re
from fractions import Fraction

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "p": 10**15, "pb": 10**15,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40, "pib": 1 << 50}
MAX_SIZE = 1 << 60  # 1 EiB: beyond any disk, and far inside the int64 byte counts of shard plans and manifests


def parse_size(text: str) -> int:
    """``"512MB"`` -> 512000000; ``"1GiB"`` -> 1073741824 (units B, KB..PB, KiB..PiB). Raises
    ValueError on nonsense, and on sizes of zero or over ``MAX_SIZE``."""
    m = re.fullmatch(r"\s*(\d+)(\.\d{1,30})?\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(3).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 512MB, 1GiB, 2PB, 100000000)")
    if len(m.group(1).lstrip("0")) > 20:  # more than any unit can make under the limit
        raise ValueError(f"size too large: {text!r} is over the limit of 1 EiB ({MAX_SIZE} bytes)")
    value = int(Fraction(m.group(1) + (m.group(2) or "")) * _UNITS[m.group(3).lower()])  # exact: no float rounding
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    if value > MAX_SIZE:
        raise ValueError(f"size too large: {text!r} is over the limit of 1 EiB ({MAX_SIZE} bytes)")
    return value


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} PB"
