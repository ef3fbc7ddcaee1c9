"""The ``fastdata`` command: a thin layer over converters and fastdata.open.

Exit codes: 0 success, 1 data or dataset error, 2 usage error. Expected errors print
one line without a traceback; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ._units import parse_size
from ._version import __version__
from .errors import FastdataError, UsageError
from .remote import is_url


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = 0.0
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text!r}")
    return v


_URL_COMMANDS = ("convert", "merge-parts", "info", "verify", "bench")  # the commands that take a URL


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text!r}")
    return v


def _named_array(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH.npy, not {text!r}")
    return name, path


def _meta_type(text: str) -> tuple[str, object]:
    from converters.table import parse_meta_type

    try:
        return parse_meta_type(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fastdata", description="Fast sharded datasets for PyTorch training.")
    p.add_argument("--version", action="version", version=f"fastdata {__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    c = sub.add_parser("convert", help="convert .npy files, arrays or image folders into a sharded dataset",
                       description="Convert a folder of per-sample .npy/.npz files, a folder of images, or large "
                                   ".npy arrays, into a sharded HDF5 or LMDB dataset with a manifest.")
    c.add_argument("src", nargs="?", metavar="SRC",
                   help="folder of .npy/.npz samples or of images, one large .npy array, or a metadata table "
                        "(.csv/.tsv/.jsonl/.parquet) whose path column names each sample's file")
    c.add_argument("dst", metavar="DST", help="dataset folder to create, or a URL (s3://bucket/ds: written locally, "
                                              "uploaded shard by shard, manifest last; with --engine ray or "
                                              "--part, by every worker; docs/remote.md)")
    c.add_argument("--format", choices=["hdf5", "lmdb"], default="hdf5", help="shard format (default: hdf5)")
    c.add_argument("--shard-size", type=_size, default="256MB", metavar="SIZE",
                   help="target bytes per shard, e.g. 512MB or 1GiB (default: 256MB)")
    c.add_argument("--workers", type=_positive, default=None, metavar="N",
                   help="processes writing shards in parallel (default: CPU count)")
    c.add_argument("--compression", default="none", metavar="NAME",
                   help="none (default); lz4, lz4:LEVEL, zstd or zstd:LEVEL: each sample of a large fixed field as "
                        "Blosc (shuffle + LZ4/Zstd; both formats; pip install 'fastdata[compress]'); "
                        "HDF5 only: lzf, gzip or gzip:LEVEL")
    c.add_argument("--overwrite", action="store_true", help="replace an existing fastdata dataset at DST")
    c.add_argument("--resume", action="store_true",
                   help="finish an interrupted conversion into DST: keep its verified shards, write the rest "
                        "(same SRC and options; see docs/reliability.md)")
    c.add_argument("--labels", metavar="FILE",
                   help="labels: a CSV/JSON of relative_path,label for folders, or a .npy array for array sources")
    c.add_argument("--no-labels", action="store_true",
                   help="do not take labels from class sub-folders (with --meta too)")
    c.add_argument("--data", metavar="X.npy", help="a large array whose first axis is the sample axis (field 'x')")
    c.add_argument("--field", action="append", type=_named_array, default=[], metavar="NAME=PATH",
                   help="a large array stored as field NAME (repeatable)")
    c.add_argument("--skip-bad", action="store_true",
                   help="skip unreadable or mismatched samples (and bad table rows) and list them in DST/skipped.json")
    c.add_argument("--strict", action="store_true",
                   help="files in SRC that are not samples (README, CSV, Thumbs.db, ...) are an error, not skipped")
    c.add_argument("--meta", metavar="TABLE",
                   help="metadata table (CSV, JSON Lines or Parquet) with a 'path' column relative to SRC; every "
                        "other column becomes a field (see docs/convert.md)")
    c.add_argument("--meta-type", action="append", type=_meta_type, default=[], metavar="NAME=DTYPE[:SHAPE]",
                   help="force a table column's type, e.g. keypoints=float32:17,3, boxes=float32:n,4 or "
                        "subject=str (repeatable)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    r = c.add_argument_group("many machines (see docs/scale.md)")
    r.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="local: a process pool on this machine; ray: one Ray task per shard, on the cluster at "
                        "--ray-address or RAY_ADDRESS, else on a local Ray (needs fastdata[ray]) (default: local)")
    r.add_argument("--ray-address", metavar="ADDR", help="Ray cluster to run on (with --engine ray)")
    r.add_argument("--part", metavar="I/N",
                   help="convert only part I (0 to N-1) of N into DST, for clusters without Ray (SLURM arrays, "
                        "Spark); then run fastdata merge-parts DST")
    g = c.add_argument_group("image folders (see docs/convert.md)")
    g.add_argument("--images", choices=["encoded", "raw", "jpeg"], default=None,
                   help="encoded: keep JPEG files as they are (others as PNG); raw: decode once to uint8 pixels; "
                        "jpeg: re-encode at --quality (default: encoded)")
    g.add_argument("--size", type=_positive, nargs=2, metavar=("H", "W"),
                   help="raw/jpeg: resize the shorter side, then centre-crop to H x W")
    g.add_argument("--max-side", type=_positive, metavar="N", help="raw/jpeg: shrink so the longer side is at most N")
    g.add_argument("--quality", type=_positive, metavar="Q",
                   help="JPEG quality 1-100 for jpeg (default 90), or to store non-JPEG inputs as JPEG with encoded")
    g.add_argument("--mode", choices=["RGB", "L"], default=None, help="RGB (default) or L (single-channel)")
    c.set_defaults(run=_convert)

    mp = sub.add_parser("merge-parts", help="finish a conversion done part by part (--part I/N)",
                        description="Check that all N parts of a 'fastdata convert ... --part I/N' conversion into "
                                    "DST are present, complete and from the same conversion, then write the "
                                    "manifest. The result is byte for byte a one-machine conversion.")
    mp.add_argument("dst", metavar="DST", help="dataset folder or URL (s3://...) the parts were converted into; "
                                              "for a URL the manifest is uploaded last")
    mp.set_defaults(run=_merge_parts)

    m = sub.add_parser("merge", help="one dataset from several with the same schema",
                       description="Make DST hold the samples of A, then B, ... (same fields and format). Shards "
                                   "are hard-linked, not copied, where the filesystem allows; the output says which "
                                   "were linked, copied or rewritten. Class lists must be identical unless "
                                   "--remap-classes.")
    m.add_argument("paths", nargs="+", metavar="PATH", help="input datasets A B ..., then DST (a new folder)")
    m.add_argument("--remap-classes", action="store_true",
                   help="classes differ: DST's classes are A's followed by the new ones of B, ...; shards whose "
                        "labels change are rewritten")
    m.add_argument("--method", choices=["auto", "link", "copy"], default="auto",
                   help="auto: hard-link shards, copy where the filesystem refuses links (said in the output); "
                        "link: hard links or an error; copy: always copy (default: auto)")
    m.add_argument("--overwrite", action="store_true", help="replace an existing fastdata dataset at DST")
    k = m.add_argument_group("sample keys (see docs/scale.md)",
                             "DST keeps the inputs' sample keys; a key found in two inputs is an error unless "
                             "each input's keys get a prefix")
    kx = k.add_mutually_exclusive_group()
    kx.add_argument("--prefix-keys", action="store_true",
                    help="key each sample '<input folder name>/<its key>' (the folder names must differ)")
    kx.add_argument("--key-prefix", action="append", metavar="PREFIX",
                    help="key the samples of one input '<PREFIX>/<its key>': once per input, in order "
                         "('' keeps that input's keys)")
    kx.add_argument("--drop-keys", action="store_true",
                    help="DST has no sample keys (needed to merge inputs without keys with inputs that have some)")
    m.add_argument("--quiet", action="store_true", help="no progress bar")
    m.set_defaults(run=_merge)

    d = sub.add_parser("demo", help="run the main job end to end on a small synthetic dataset",
                       description="Generate synthetic .npy samples, convert them to HDF5 and LMDB, read them "
                                   "back and compare throughput with naive per-file np.load.")
    d.add_argument("--samples", type=_positive, default=512, metavar="N", help="samples to generate (default: 512)")
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
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    v.set_defaults(run=_verify)

    from .cli_bench import add_parsers

    add_parsers(sub)  # bench, tune
    from .cli_cold import add_cold

    add_cold(sub.choices["bench"])  # bench --cold
    from .doctor.cli import add_parser as add_doctor

    add_doctor(sub)
    from .cli_index import add_parser as add_index

    add_index(sub)  # index (fastdata/indexer.py)
    for name in _URL_COMMANDS:
        sub.choices[name].add_argument(
            "--remote-timeout", type=_seconds, metavar="SECONDS",
            help="for a URL: how long one remote operation may keep failing (retried, with a warning) before "
                 "the command gives up (default: $FASTDATA_REMOTE_TIMEOUT or 300; docs/remote.md)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
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
        print(f"fastdata: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("fastdata: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (fastdata info DST | head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes
        return 1
    finally:
        restore()


def _remote_timeout_env(seconds: float | None) -> Callable[[], None]:
    """Make ``--remote-timeout`` RemoteOptions' default for this command, here and in its worker processes
    (through the environment they inherit); return the function that puts the variable back as it was."""
    from .remote.options import ENV_TIMEOUT

    before = os.environ.get(ENV_TIMEOUT)
    if seconds is None:
        return lambda: None
    os.environ[ENV_TIMEOUT] = repr(seconds)

    def restore() -> None:
        if before is None:
            os.environ.pop(ENV_TIMEOUT, None)
        else:
            os.environ[ENV_TIMEOUT] = before

    return restore


def _unknown(parser: argparse.ArgumentParser, command: str, extra: list[str]) -> None:
    """Exit with the subcommand's usage and the unknown arguments (with the nearest option, if any)."""
    import difflib

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    known = [o for a in sub._actions for o in a.option_strings]
    near = [m for e in extra if e.startswith("-") for m in difflib.get_close_matches(e.split("=")[0], known, 1)]
    hint = f" (did you mean {', '.join(near)}?)" if near else ""
    sub.error(f"unrecognized arguments: {' '.join(extra)}{hint}")


class _Bar:
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


def _convert(args: argparse.Namespace) -> int:
    import converters

    arrays = dict(args.field)
    if args.data:
        if "x" in arrays:
            raise UsageError("--data and --field x=... both name field 'x'")
        arrays = {"x": args.data, **arrays}
    options = converters.WriteOptions(backend=args.format, shard_size=args.shard_size, workers=args.workers,
                                      compression=None if args.compression == "none" else args.compression,
                                      engine=args.engine, ray_address=args.ray_address)
    part = converters.parse_part(args.part) if args.part is not None else None
    images = None
    if any(v is not None for v in (args.images, args.size, args.max_side, args.quality, args.mode)):
        images = converters.ImageOptions(images=args.images or "encoded", size=tuple(args.size) if args.size else None,
                                         max_side=args.max_side, quality=args.quality, mode=args.mode or "RGB")
    bar = _Bar(enabled=not args.quiet)
    said = logging.StreamHandler(sys.stderr)  # the converter's one-line notes (files skipped as not samples)
    said.setFormatter(logging.Formatter("fastdata: %(message)s"))
    notes = logging.getLogger("fastdata.convert")
    notes.addHandler(said)
    notes.propagate = False
    try:
        report = converters.convert(args.src, args.dst, options, labels=args.labels, no_labels=args.no_labels,
                                    arrays=arrays or None, overwrite=args.overwrite, resume=args.resume,
                                    skip_bad=args.skip_bad, images=images, progress=bar, part=part, meta=args.meta,
                                    meta_types=dict(args.meta_type) or None, strict=args.strict)
    finally:
        bar.close()
        notes.removeHandler(said)
        notes.propagate = True
    print(report.summary())
    return 0


def _merge_parts(args: argparse.Namespace) -> int:
    import converters

    print(converters.merge_parts(args.dst).summary())
    return 0


def _merge(args: argparse.Namespace) -> int:
    import converters

    if len(args.paths) < 2:
        raise UsageError("merge needs at least one input and DST: fastdata merge A [B ...] DST")
    *inputs, dst = args.paths
    bar = _Bar(enabled=not args.quiet)
    try:
        prefixes = "names" if args.prefix_keys else args.key_prefix
        report = converters.merge(inputs, dst, remap_classes=args.remap_classes, method=args.method,
                                  overwrite=args.overwrite, progress=bar, key_prefixes=prefixes,
                                  drop_keys=args.drop_keys)
    finally:
        bar.close()
    print(report.summary())
    return 0


def _demo(args: argparse.Namespace) -> int:
    from . import demo

    bar = _Bar(enabled=True)
    try:
        print(demo.run(Path(args.dir) if args.dir else None, samples=args.samples, progress=bar))
    finally:
        bar.close()
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .verify import verify

    bar = _Bar(enabled=not args.quiet)
    try:
        report = verify(args.dst if is_url(args.dst) else Path(args.dst), deep=args.deep, progress=bar)
    finally:
        bar.close()
    for p in report.problems:
        print(f"BAD {p}")
    print(report.summary())
    return 0 if report.ok else 1


def _info(args: argparse.Namespace) -> int:
    from .format import read_manifest

    if is_url(args.dst):
        from .remote.store import RemoteStore

        m = RemoteStore(args.dst).manifest
    else:
        m = read_manifest(Path(args.dst))
    if args.json:
        print(json.dumps(m.to_json(), indent=1))
        return 0
    print(describe(m, args.dst))
    return 0


def describe(m, root: Path | str) -> str:  # type: ignore[no-untyped-def]
    """A person-readable summary of a manifest (what ``fastdata info`` prints)."""
    from ._units import fmt_bytes

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
    from ._units import fmt_bytes

    src = m.source or {}
    codec = src.get("compression", "none")
    packed = [f.name for f in m.fields if f.compression is not None]
    if codec in (None, "none") and not packed:
        return None
    raw = src.get("sample_bytes")
    if not isinstance(raw, int) and not any(f.ragged for f in m.fields):
        raw = m.num_samples * sum(f.row_nbytes for f in m.fields)  # (written before sample_bytes was recorded)
    on = f" on {', '.join(packed)}" if packed else ""
    line = f"compress  {codec if codec not in (None, 'none') else 'blosc'}{on}"
    if isinstance(raw, int) and raw > 0 and total > 0:
        line += f": {raw / total:.2f}x ({fmt_bytes(raw)} of samples in {fmt_bytes(total)} of shards)"
    return line


if __name__ == "__main__":
    sys.exit(main())
