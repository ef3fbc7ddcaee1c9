"""``fastdata index SRC DST --field NAME=PATH``: the command line of :func:`fastdata.index`."""

from __future__ import annotations

import argparse
from typing import Any

from fastdata.cli.common import Bar, NamedPaths


def add_parser(sub: Any) -> None:
    """Add ``index`` to the ``fastdata`` command's sub-parsers."""
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
    p.add_argument("--overwrite", action="store_true", help="replace an existing index at DST")
    p.add_argument("--quiet", action="store_true", help="no progress")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from fastdata.write.inplace import index

    bar = Bar(enabled=not args.quiet)
    try:
        report = index(args.src, args.dst, args.fields or {}, checksum=args.checksum, overwrite=args.overwrite,
                       progress=bar)
    finally:
        bar.close()
    print(report.summary())
    return 0
