"""What the CLI's command modules share: argument types and the conversion progress bar."""

from __future__ import annotations

import argparse
import sys

from ._units import parse_size

__all__ = ["Bar", "positive", "size"]


def size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return v


class Bar:
    """tqdm progress for conversions: samples with samples/s, and MB/s in the postfix."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = None
        self.nbytes = 0

    def start(self, total_samples: int, total_bytes: int, desc: str = "converting") -> None:
        self.close()  # one bar per phase, and per conversion
        self.nbytes = 0
        if not self.enabled:
            return
        from tqdm import tqdm

        tqdm.monitor_interval = 0  # no monitor thread: workers are forked
        self.bar = tqdm(total=total_samples, unit=" samples", dynamic_ncols=True, file=sys.stderr,
                        disable=None, desc=desc)

    def update(self, samples: int, nbytes: int) -> None:
        if self.bar is None:
            return
        self.nbytes += nbytes
        self.bar.update(samples)
        elapsed = self.bar.format_dict.get("elapsed") or 0
        if elapsed > 0:
            self.bar.set_postfix_str(f"{self.nbytes / elapsed / 1e6:.0f} MB/s", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
