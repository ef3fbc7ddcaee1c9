"""The ``fastdata`` command, a thin layer over fastdata.convert, fastdata.open and the tools. Exit codes: 0 success,
1 data or dataset error, 2 usage error; expected errors print one line (``--debug``: the traceback). Also what the
command modules share: argument types, NAME=PATH flags and the progress bar."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from fastdata._units import fmt_bytes, parse_size
from fastdata._version import __version__
from fastdata.errors import FastdataError
from fastdata.format import read_manifest
from fastdata.format.manifest import source_compression
from fastdata.remote import ENV_TIMEOUT, is_url

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
positives = _checked(lambda t: [int(x) for x in t.split(",")], lambda v: all(x >= 1 for x in v),
                     "expected positive integers separated by commas, e.g. 32,64,128")
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fastdata", description="Fast sharded datasets for PyTorch training.")
    p.add_argument("--version", action="version", version=f"fastdata {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    from fastdata.cli.convert import add_parsers as add_write_parsers

    add_write_parsers(sub)  # convert, merge-parts, merge, index
    d = sub.add_parser("demo", help="run the main job end to end on a small synthetic dataset",
                       description="Generate synthetic .npy samples, convert them to HDF5 and LMDB, read them "
                                   "back and compare throughput with naive per-file np.load.")
    d.add_argument("--samples", type=positive, default=512, metavar="N", help="samples to generate (default: 512)")
    d.add_argument("--dir", metavar="DIR", help="work folder to keep (default: a temporary folder, removed after)")
    d.set_defaults(run=_demo)

    i = sub.add_parser("info", help="describe a dataset", description="Print a dataset's manifest for a person.")
    i.add_argument("dst", metavar="DST", help="dataset folder or URL")
    i.add_argument("--json", action="store_true", help="print the raw manifest as JSON")
    i.set_defaults(run=_info)

    v = sub.add_parser("verify", help="check a dataset's shards against its manifest",
                       description="Check every shard's size and checksum against the manifest; with --deep also "
                                   "read and decode every sample and check it against the schema. Lists each bad "
                                   "shard and sample; exit code 1 if there is any.")
    v.add_argument("dst", metavar="DST", help="dataset folder or URL (shards are downloaded into the cache)")
    v.add_argument("--deep", action="store_true", help="also read every sample (slower)")
    v.set_defaults(run=_verify)

    from fastdata.cli.measure import add_parsers

    add_parsers(sub)  # bench (and bench --cold), tune, doctor
    for name in ("convert", "merge", "index"):  # index replaces only an index (its folder holds nothing else)
        sub.choices[name].add_argument("--overwrite", action="store_true",
                                       help="replace an existing index at DST" if name == "index" else
                                       "replace an existing fastdata dataset (or index) at DST")
    for name in ("convert", "merge", "index", "verify"):
        sub.choices[name].add_argument("--quiet", action="store_true", help="no progress bar")
    for name in ("convert", "merge-parts", "info", "verify", "bench"):  # the commands that take a URL
        sub.choices[name].add_argument(
            "--remote-timeout", type=duration, metavar="SECONDS",
            help="for a URL: how long one remote operation may keep failing (retried, with a warning) before "
                 "the command gives up (default: $FASTDATA_REMOTE_TIMEOUT or 300; docs/remote.md)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from fastdata.cli.convert import flag_message

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse would print the top-level usage: show the subcommand's, and the near options
        words = list(sys.argv[1:] if argv is None else argv)
        if words.index(extra[0]) < words.index(args.command):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        _unknown(parser, args.command, extra)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    restore = _remote_timeout_env(getattr(args, "remote_timeout", None))
    try:
        return args.run(args)  # each sub-parser names its handler (set_defaults)
    except FastdataError as e:
        if args.debug:
            raise
        print(f"fastdata: error: {flag_message(e)}", file=sys.stderr)  # naming the flags, not the parameters
        return e.exit_code
    except KeyboardInterrupt:
        print("fastdata: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (fastdata info DST | head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 1
    finally:
        restore()


def _remote_timeout_env(seconds: float | None) -> Callable[[], object]:
    """Make ``--remote-timeout`` RemoteOptions' default for this command, here and in its worker processes
    (through the environment they inherit); return the function that puts the variable back as it was."""
    before = os.environ.get(ENV_TIMEOUT)
    if seconds is None:
        return lambda: None
    os.environ[ENV_TIMEOUT] = repr(seconds)
    return lambda: os.environ.update({ENV_TIMEOUT: before}) if before is not None else os.environ.pop(ENV_TIMEOUT)


def _unknown(parser: argparse.ArgumentParser, command: str, extra: list[str]) -> None:
    """Exit with the subcommand's usage and the unknown arguments (with the nearest option, if any)."""
    import difflib

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    known = [o for a in sub._actions for o in a.option_strings]
    near = [m for e in extra if e.startswith("-") for m in difflib.get_close_matches(e.split("=")[0], known, 1)]
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    sub.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


def _demo(args: argparse.Namespace) -> int:
    from fastdata import demo

    print(with_bar(False, lambda bar: demo.run(Path(args.dir) if args.dir else None, samples=args.samples,
                                                 progress=bar)))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from fastdata.measure.verify import verify

    report = with_bar(args.quiet, lambda bar: verify(args.dst if is_url(args.dst) else Path(args.dst),
                                                     deep=args.deep, progress=bar))
    for p in report.problems:
        print(f"BAD {p}")
    print(report.summary())
    return 0 if report.ok else 1


def _info(args: argparse.Namespace) -> int:
    if is_url(args.dst):
        from fastdata.remote.store import RemoteStore

        m = RemoteStore(args.dst).manifest
    else:
        m = read_manifest(Path(args.dst))
    print(json.dumps(m.to_json(), indent=1) if args.json else describe(m, args.dst))
    return 0


def describe(m, root: Path | str) -> str:  # type: ignore[no-untyped-def]
    """A person-readable summary of a manifest (what ``fastdata info`` prints)."""
    total = sum(s.bytes for s in m.shards)
    lines = [
        f"dataset   {root}",
        f"format    fastdata v{m.version}, {m.backend}",
        f"samples   {m.num_samples}",
        f"shards    {len(m.shards)}, {fmt_bytes(total)} in all",
        "fields",
    ]
    for f in m.fields:
        shape = "(" + ", ".join("n" if d is None else str(d) for d in f.shape) + ")"
        kind = "ragged" if f.ragged else "fixed"
        image = f" ({f.image.mode} {f.image.layout})" if f.image is not None else ""
        dtype = "str" if f.encoding == "utf8" else str(f.np_dtype)
        packed = ", compressed" if f.compression is not None else ""
        lines.append(f"  {f.name:<12} {dtype:<9} {shape:<22} {kind}, {f.encoding}{image}{packed}")
    if m.classes is not None:
        shown = ", ".join(f"{i}={c}" for i, c in enumerate(m.classes[:20]))
        more = f", ... ({len(m.classes)} in all)" if len(m.classes) > 20 else ""
        lines.append(f"classes   {len(m.classes)}: {shown}{more}")
    if m.keys is not None:
        where = f"{m.keys.file}, {fmt_bytes(m.keys.bytes)}" if m.keys.file else "the sample index"
        lines.append(f"keys      {'relative source paths' if m.keys.file else 'row indices'} ({where})")
    ratio = _compression_line(m, total)
    if ratio:
        lines.append(ratio)
    src = m.source or {}
    if src:
        lines.append("source    " + ", ".join(f"{k}={v}" for k, v in src.items() if not isinstance(v, (dict, list))))
    lines.append("shard files")
    for s in m.shards[:10]:
        lines.append(f"  {s.file}  samples {s.start}..{s.start + s.count - 1}  {fmt_bytes(s.bytes)}  {s.checksum[:21]}")
    if len(m.shards) > 10:
        lines.append(f"  ... {len(m.shards) - 10} more")
    return "\n".join(lines)


def _compression_line(m, total: int) -> str | None:  # type: ignore[no-untyped-def]
    """``compress  lz4:5 on x: 5.76x (1.81 GB of samples in 314 MB of shards)``, or None if not compressed."""
    src = m.source or {}
    codec = source_compression(src)  # a merge's: its inputs'
    packed = [f.name for f in m.fields if f.compression is not None]
    if codec is None and not packed:
        return None
    raw = src.get("sample_bytes")
    if not isinstance(raw, int) and not any(f.ragged for f in m.fields):
        raw = m.num_samples * sum(f.row_nbytes for f in m.fields)  # (written before sample_bytes was recorded)
    on = f" on {', '.join(packed)}" if packed else ""
    line = f"compress  {codec or 'blosc'}{on}"
    if isinstance(raw, int) and raw > 0 and total > 0:
        line += f": {raw / total:.2f}x ({fmt_bytes(raw)} of samples in {fmt_bytes(total)} of shards)"
    return line
