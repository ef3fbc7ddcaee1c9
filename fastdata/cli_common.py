"""What the CLI's command modules share: argument types, NAME=PATH arguments and the conversion progress bar."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

from ._units import parse_size

__all__ = ["Bar", "NamedPaths", "positive", "size"]


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


class NamedPaths(argparse.Action):
    """A repeatable NAME=PATH flag (``--field``) gathered into a dict, each name once. A bad argument is one
    argparse error that quotes it, says what is wrong and what is expected. ``example``: a valid value, for
    that message; ``bare``: a NAME alone is allowed, as (NAME, "") (the field is SRC itself)."""

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
