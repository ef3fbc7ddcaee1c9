"""What the CLI's command modules share: argument types, NAME=PATH arguments and the progress bar."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Sequence, TypeVar

from fastdata._units import parse_size

__all__ = ["Bar", "NamedPaths", "duration", "positive", "size", "with_bar", "workers"]

T = TypeVar("T")


def size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _checked(convert: Callable[[str], Any], ok: Callable[[Any], bool], expected: str) -> Callable[[str], Any]:
    """An argparse type: ``convert(text)`` where it succeeds and the value is ``ok``, else the error
    ``<expected>, not '<text>'``."""

    def parse(text: str) -> Any:
        try:
            v = convert(text)
            good = ok(v)
        except ValueError:
            good = False
        if not good:
            raise argparse.ArgumentTypeError(f"{expected}, not {text!r}")
        return v

    return parse


def _seconds(text: str) -> float:
    t = text.strip().lower()
    return float(t.rstrip("sm")) * (60.0 if t.endswith("m") else 1.0)


positive = _checked(int, lambda v: v >= 1, "must be a positive integer")
duration = _checked(_seconds, lambda v: 0 < v < float("inf"), "expected a duration like 30s or 2m")  # 30, 30s, 2m
workers = _checked(lambda t: t if t == "auto" else int(t), lambda v: v == "auto" or v >= 0,
                   "expected 'auto' or an integer >= 0")


def with_bar(quiet: bool, work: Callable[[Bar], T]) -> T:
    """``work(bar)`` with a progress bar (silent if ``quiet``), closed after."""
    bar = Bar(enabled=not quiet)
    try:
        return work(bar)
    finally:
        bar.close()


class NamedPaths(argparse.Action):
    """A repeatable NAME=PATH flag (``--field``) gathered into a dict, each name once; a bad one is an argparse error
    quoting it, with ``example`` as a valid value. ``bare``: a NAME alone is allowed, as (NAME, "")."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, example: str, bare: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.example, self.bare = example, bare

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        text = str(values)
        name, sep, path = text.partition("=")
        fields = dict(getattr(namespace, self.dest, None) or {})
        problem = self._problem(name, sep, path, fields)
        if problem is not None:
            expected = "NAME=PATH" + (" or NAME" if self.bare else "")
            raise argparse.ArgumentError(self, f"{text!r}: {problem}; expected {expected} once per field, "
                                               f"e.g. {self.example}")
        fields[name] = path
        setattr(namespace, self.dest, fields)

    def _problem(self, name: str, sep: str, path: str, fields: dict[str, str]) -> str | None:
        if not name:
            return "no NAME before '='"
        if sep and not path:
            return "no PATH after '='"
        if not sep and not self.bare:
            return "no '=PATH'"
        if name in fields:
            return f"field {name!r} is already given ({name}={fields[name]})"
        return None


class Bar:
    """Progress of long work (convert, merge, verify, index): a tqdm bar on a terminal; elsewhere (a log, a pipe)
    a plain line every ``PLAIN_EVERY`` seconds, and the last count at the end of a phase that printed any."""

    PLAIN_EVERY = 5.0

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = None
        self.nbytes = 0
        self.done = 0
        self.total = 0
        self.desc = ""
        self.unit = "samples"
        self.t0 = self.said = 0.0
        self.lines = 0

    def start(self, total_samples: int, total_bytes: int, desc: str = "converting", unit: str = "samples") -> None:
        self.close()  # one bar per phase, and per conversion
        self.nbytes = self.done = self.lines = 0
        self.total, self.desc, self.unit = total_samples, desc, unit
        self.t0 = self.said = time.monotonic()
        if not self.enabled or not sys.stderr.isatty():
            return
        from tqdm import tqdm

        tqdm.monitor_interval = 0  # no monitor thread: workers are forked
        try:  # a terminal that reports 0 columns or rows gets blank lines from tqdm's sizing
            cols, rows = os.get_terminal_size(sys.stderr.fileno())
        except (OSError, ValueError):
            cols = rows = 0
        sized = {"dynamic_ncols": True} if cols and rows else {"ncols": cols or 80, "nrows": rows or 24}
        self.bar = tqdm(total=total_samples, unit=" " + unit, file=sys.stderr, desc=desc, **sized)

    def update(self, samples: int, nbytes: int) -> None:
        self.nbytes += nbytes
        self.done += samples
        if self.bar is not None:
            self.bar.update(samples)
            elapsed = self.bar.format_dict.get("elapsed") or 0
            if elapsed > 0:
                self.bar.set_postfix_str(f"{self.nbytes / elapsed / 1e6:.0f} MB/s", refresh=False)
        elif self.enabled and time.monotonic() - self.said >= self.PLAIN_EVERY:
            self._say()

    def _say(self) -> None:
        now = time.monotonic()
        self.said, self.lines, s = now, self.lines + 1, max(now - self.t0, 1e-9)
        of = f"/{self.total} {self.unit} ({100 * self.done / self.total:.0f}%)" if self.total else f" {self.unit}"
        print(f"{self.desc}: {self.done}{of}, {self.done / s:.0f} {self.unit}/s, {self.nbytes / s / 1e6:.0f} MB/s, "
              f"{s:.0f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.lines:
            self._say()
            self.lines = 0
