"""The write side's commands, ``fastdata convert``, ``merge-parts``, ``merge`` and ``index``: flags -> the library
calls; the library's errors are reworded with the flags that set its parameters (:func:`flag_message`)."""

from __future__ import annotations

import argparse
import ast
import logging
import sys
from typing import Any

from fastdata.cli import NamedPaths, positive, size, with_bar
from fastdata.errors import FastdataError, UsageError

__all__ = ["add_parsers", "flag_message"]

# The flag that sets each parameter whose name differs from the flag's (others: --name-with-dashes).
_FLAGS = {"backend": "--format", "meta_types": "--meta-type", "arrays": "--data/--field", "src": "SRC",
          "dst": "DST", "key_prefixes": "--key-prefix"}
# a flag for one value of a parameter, or (value None: the parameter named alone) a group of flags
_SPECIAL: dict[tuple[str, str | None], str] = {("key_prefixes", "'names'"): "--prefix-keys",
                                               ("images", None): "--images, --size, ..."}


def flag_message(e: FastdataError) -> str:
    """``e``'s message with the parameters it names said as flags: ``shard_size`` -> ``--shard-size``,
    ``engine=ray`` -> ``--engine ray``, ``resume=True`` -> ``--resume``, ``images`` -> ``--images, --size, ...``."""

    def say(name: str, value: str | None) -> str:
        if (name, value) in _SPECIAL:
            return _SPECIAL[(name, value)]
        flag = _FLAGS.get(name, "--" + name.replace("_", "-"))
        if value is not None and value.startswith("("):  # a tuple of names (keypoints=('kp',)): the flag takes them
            value = ",".join(ast.literal_eval(value))    # comma-separated
        return flag if value in (None, "True") else f"{flag} {value}"

    return e.said(say)


def add_parsers(sub: Any) -> None:
    """Add ``convert``, ``merge-parts``, ``merge`` and ``index`` to the CLI's sub-parsers."""
    c = _add_convert(sub)
    _add_convert_groups(c)
    c.set_defaults(run=_convert)
    _add_merge_parts(sub)
    _add_merge(sub)
    _add_index(sub)


def _add_convert(sub: Any) -> argparse.ArgumentParser:
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
    c.add_argument("--shard-size", type=size, default="256MB", metavar="SIZE",
                   help="target bytes per shard, e.g. 512MB or 1GiB (default: 256MB)")
    c.add_argument("--workers", type=positive, default=None, metavar="N",
                   help="processes writing shards in parallel (default: CPU count)")
    c.add_argument("--compression", default="none", metavar="NAME",
                   help="none (default); lz4, lz4:LEVEL, zstd or zstd:LEVEL: each sample of a large fixed field as "
                        "Blosc (shuffle + LZ4/Zstd; both formats; pip install 'fastdata[compress]'); "
                        "HDF5 only: lzf, gzip or gzip:LEVEL")
    c.add_argument("--resume", action="store_true",
                   help="finish an interrupted conversion into DST: keep its verified shards, write the rest "
                        "(same SRC and options; see docs/reliability.md)")
    c.add_argument("--labels", metavar="FILE",
                   help="labels: a CSV/JSON of relative_path,label for folders, or a .npy array for array sources")
    c.add_argument("--labels-columns", type=_names, metavar="PATH,LABEL",
                   help="the path and label columns of a --labels CSV/JSON (default: a header path, file, filename "
                        "or name, and label)")
    c.add_argument("--no-labels", action="store_true",
                   help="do not take labels from class sub-folders (with --meta too)")
    c.add_argument("--data", metavar="X.npy", help="a large array whose first axis is the sample axis (field 'x')")
    c.add_argument("--field", action=NamedPaths, example="label=labels.npy (or label=/labels in an HDF5 SRC)",
                   metavar="NAME=PATH",
                   help="a large array stored as field NAME (repeatable)")
    c.add_argument("--skip-bad", action="store_true",
                   help="skip unreadable or mismatched samples (and bad table rows) and list them in DST/skipped.json")
    c.add_argument("--allow-nan", action="store_true",
                   help="keep NaN and infinite labels (by default they are an error naming the file and row)")
    c.add_argument("--strict", action="store_true",
                   help="files in SRC that are not samples (README, CSV, Thumbs.db, ...) are an error, not skipped")
    c.add_argument("--meta", metavar="TABLE",
                   help="metadata table (CSV, JSON Lines, Parquet, or a JSON array of records or object of records "
                        "keyed by path) with a 'path' column relative to SRC; every other column becomes a field "
                        "(see docs/convert.md)")
    c.add_argument("--meta-type", action="append", type=_meta_type, default=[], metavar="NAME=DTYPE[:SHAPE]",
                   help="force a table column's type, e.g. keypoints=float32:17,3, boxes=float32:n,4 or "
                        "subject=str (repeatable)")
    for flag, what in (("--keypoints", "pixel keypoints (..., >=2), x, y first: rescaled with the images"),
                       ("--boxes", "pixel boxes (..., 4), x0, y0, x1, y1: rescaled with the images"),
                       ("--not-coordinates", "a numeric column that looks like coordinates but is not: kept as is")):
        c.add_argument(flag, action="append", type=_names, default=[], metavar="COL",
                       help=f"table column(s) of {what} (repeatable or comma-separated; docs/convert.md)")
    return c


def _add_convert_groups(c: argparse.ArgumentParser) -> None:
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
    g.add_argument("--size", type=positive, nargs=2, metavar=("H", "W"),
                   help="raw/jpeg: resize the shorter side, then centre-crop to H x W")
    g.add_argument("--max-side", type=positive, metavar="N", help="raw/jpeg: shrink so the longer side is at most N")
    g.add_argument("--quality", type=positive, metavar="Q",
                   help="JPEG quality 1-100 for jpeg (default 90), or to store non-JPEG inputs as JPEG with encoded")
    g.add_argument("--mode", choices=["RGB", "L"], default=None, help="RGB (default) or L (single-channel)")


def _add_merge_parts(sub: Any) -> None:
    mp = sub.add_parser("merge-parts", help="finish a conversion done part by part (--part I/N)",
                        description="Check that all N parts of a 'fastdata convert ... --part I/N' conversion into "
                                    "DST are present, complete and from the same conversion, then write the "
                                    "manifest. The result is byte for byte a one-machine conversion.")
    mp.add_argument("dst", metavar="DST", help="dataset folder or URL (s3://...) the parts were converted into; "
                                              "for a URL the manifest is uploaded last")
    mp.set_defaults(run=_merge_parts)


def _add_merge(sub: Any) -> None:
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
    m.set_defaults(run=_merge)


def _add_index(sub: Any) -> None:
    p = sub.add_parser("index", help="index existing HDF5, .npy or Zarr data in place (no copy)",
                       description="Write a dataset folder whose manifest points into existing files: an HDF5 "
                                   "file or a quoted glob of several, a .npy file, or a Zarr array or group. "
                                   "fastdata.open and fastdata.loader then read the files where they are. "
                                   "See docs/in-place.md.")
    p.add_argument("src", metavar="SRC", help="HDF5 file or glob ('data/*.h5'), .npy file, or Zarr store")
    p.add_argument("dst", metavar="DST", help="the index folder to write (new or empty)")
    p.add_argument("--field", dest="fields", action=NamedPaths, example="x=/images",
                   bare=True, metavar="NAME=PATH",
                   help="a field and where it is in SRC: an HDF5 dataset (x=/images), a Zarr array in a group, "
                        "or a .npy file (y=labels.npy); repeat for several (default for .npy and Zarr "
                        "arrays: SRC itself as x)")
    p.add_argument("--checksum", action="store_true",
                   help="also record each file's full checksum and one per 1 MiB block (read once now): "
                        "fastdata verify --deep checks the first, the reader checks each block it reads")
    p.set_defaults(run=_index)


def _meta_type(text: str) -> tuple[str, object]:
    from fastdata.converters import parse_meta_type

    try:
        return parse_meta_type(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated list of column names."""
    names = tuple(n.strip() for n in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r}: expected column names separated by commas")
    return names


def config_of(args: argparse.Namespace) -> Any:
    """The ConvertConfig the flags of ``fastdata convert`` ask for."""
    from fastdata.converters import ConvertConfig, ImageOptions
    from fastdata.write import WriteOptions, parse_part

    write = WriteOptions(backend=args.format, shard_size=args.shard_size, workers=args.workers,
                         compression=None if args.compression == "none" else args.compression,
                         engine=args.engine, ray_address=args.ray_address)
    images = None
    if any(v is not None for v in (args.images, args.size, args.max_side, args.quality, args.mode)):
        images = ImageOptions(images=args.images or "encoded", size=tuple(args.size) if args.size else None,
                              max_side=args.max_side, quality=args.quality, mode=args.mode or "RGB")
    return ConvertConfig(write=write, images=images, meta_types=dict(args.meta_type), no_labels=args.no_labels,
                         skip_bad=args.skip_bad, strict=args.strict, allow_nan=args.allow_nan,
                         overwrite=args.overwrite, resume=args.resume,
                         part=parse_part(args.part) if args.part is not None else None,
                         keypoints=sum(args.keypoints, ()), boxes=sum(args.boxes, ()),
                         not_coordinates=sum(args.not_coordinates, ()), labels_columns=args.labels_columns)


def _convert(args: argparse.Namespace) -> int:
    from fastdata.converters.convert import convert

    arrays = dict(args.field or {})
    if args.data:
        if "x" in arrays:
            raise UsageError("--data and --field x=... both name field 'x'")
        arrays = {"x": args.data, **arrays}
    config = config_of(args)
    said = logging.StreamHandler(sys.stderr)  # the converter's one-line notes (files skipped as not samples)
    said.setFormatter(logging.Formatter("fastdata: %(message)s"))
    notes = logging.getLogger("fastdata.convert")
    notes.addHandler(said)
    notes.propagate = False
    try:
        report = with_bar(args.quiet, lambda bar: convert(args.src, args.dst, config, labels=args.labels,
                                                          arrays=arrays or None, meta=args.meta, progress=bar))
    finally:
        notes.removeHandler(said)
        notes.propagate = True
    print(report.summary())
    if (note := codec_note(report.dst, config.write.compression)) is not None:
        print(f"fastdata: note: {note}", file=sys.stderr)
    return 0


def codec_note(dst: Any, compression: str | None) -> str | None:
    """For zstd: how fast it decodes here against lz4, on the first compressed sample written, and the disk
    speed above which reading it is slower than uncompressed (decoding then limits the read)."""
    import numpy as np

    from fastdata.format import codec as blosc_codec
    from fastdata.reading.dataset import Dataset
    from fastdata.world import usable_cpus

    chosen = blosc_codec.parse(compression) if compression else None
    if chosen is None or chosen.cname != "zstd" or "://" in str(dst):
        return None
    with Dataset(dst) as ds:
        f = next((f for f in ds.schema if f.compression is not None), None)
        if f is None or len(ds) == 0:
            return None
        sample = ds.get_batch(np.zeros(1, dtype=np.int64))[f.name][0]
    cores = usable_cpus()
    z, zr = blosc_codec.decode_rate(sample, chosen)
    lz, lr = blosc_codec.decode_rate(sample, blosc_codec.Codec("lz4", blosc_codec.DEFAULT_LEVEL["lz4"]))
    return (f"{compression} decodes {z / 1e6:,.0f} MB/s a core here (ratio {zr:.2f}), lz4 {lz / 1e6:,.0f} MB/s "
            f"(ratio {lr:.2f}): with {cores} core(s), reading {dst} is slower than uncompressed wherever the disk "
            f"delivers more than about {z * cores / 1e6:,.0f} MB/s (lz4: {lz * cores / 1e6:,.0f}); "
            f"`fastdata bench {dst} --cold` measures it (docs/convert.md#compression)")


def _merge_parts(args: argparse.Namespace) -> int:
    from fastdata.write import merge_parts

    print(merge_parts(args.dst).summary())
    return 0


def _merge(args: argparse.Namespace) -> int:
    from fastdata.converters.convert import merge

    if len(args.paths) < 2:
        raise UsageError("merge needs at least one input and DST: fastdata merge A [B ...] DST")
    *inputs, dst = args.paths
    prefixes = "names" if args.prefix_keys else args.key_prefix
    report = with_bar(args.quiet, lambda bar: merge(inputs, dst, remap_classes=args.remap_classes, method=args.method,
                                                    overwrite=args.overwrite, progress=bar, key_prefixes=prefixes,
                                                    drop_keys=args.drop_keys))
    print(report.summary())
    return 0


def _index(args: argparse.Namespace) -> int:
    from fastdata.write.inplace import index

    report = with_bar(args.quiet, lambda bar: index(args.src, args.dst, args.fields or {}, checksum=args.checksum,
                                                    overwrite=args.overwrite, progress=bar))
    print(report.summary())
    return 0
