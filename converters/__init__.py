"""Converters: source files -> a fastdata dataset (manifest + HDF5/LMDB shards).

``convert`` is what ``fastdata convert`` runs. It picks the source kind from what it is
given, validates all input before writing anything, and never modifies the source.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastdata.errors import DataError, FastdataError, UsageError
from fastdata.remote import RemoteOptions, is_url

from fastdata.write.destination import check_dst, prepare_dst, prepare_part_dst, refuse_broken_url
from .image_codec import ImageOptions
from .image_folder import ImageFolderSource, is_image_file
from fastdata.write.merge import MergeReport, merge
from .npy_folder import DEFAULT_FIELD, ArraysSource, NpyFolderSource
from fastdata.write.parts import MergePartsReport, merge_parts, parse_part
from .scan import drop_non_samples, walk_files
from .table import ColumnType, is_table, parse_meta_type, scan_table
from fastdata.write.engine import ConvertReport, Progress, Source, WriteOptions, write_dataset

if TYPE_CHECKING:
    from fastdata.write.remote_target import RemoteTarget

__all__ = ["ColumnType", "ConvertReport", "ImageOptions", "MergePartsReport", "MergeReport", "Progress", "WriteOptions",
           "convert", "merge", "merge_parts", "parse_meta_type", "parse_part"]


def convert(
    src: str | os.PathLike[str] | None,
    dst: str | os.PathLike[str],
    options: WriteOptions | None = None,
    *,
    labels: str | os.PathLike[str] | None = None,
    no_labels: bool = False,
    arrays: dict[str, str | os.PathLike[str]] | None = None,
    overwrite: bool = False,
    resume: bool = False,
    skip_bad: bool = False,
    images: ImageOptions | None = None,
    progress: Progress | None = None,
    part: tuple[int, int] | None = None,
    remote: RemoteOptions | None = None,
    meta: str | os.PathLike[str] | None = None,
    meta_types: dict[str, ColumnType] | None = None,
    strict: bool = False,
) -> ConvertReport:
    """Convert ``src`` into a dataset at ``dst``.

    ``src`` is a folder of per-sample ``.npy``/``.npz`` files or of images (labels from
    class sub-folders, from ``labels`` as CSV/JSON, or none), or one large ``.npy`` array
    whose first axis is the sample axis (``labels`` then names a ``.npy`` of labels).
    ``arrays`` maps field names to large ``.npy`` arrays instead of ``src``. ``images``
    says how to store images (default: ``ImageOptions()``, the original files). ``resume``
    finishes an interrupted conversion into ``dst`` (see docs/reliability.md). ``part`` = (I, N)
    converts only part I (from 0) of N into ``dst``, which other parts may share; ``merge_parts``
    finishes the dataset (see docs/scale.md). ``dst`` may be a URL (``s3://bucket/ds``): shards
    are written locally and uploaded as each is finished, the manifest last (fastdata/write/remote_target.py;
    ``remote`` gives the storage options and staging place); with the Ray engine each worker
    uploads the shards it writes, and a ``part`` uploads its part record instead of the manifest.

    ``meta`` is a metadata table (CSV, JSON Lines, Parquet) whose ``path`` column names the samples
    under ``src`` and whose other columns become fields (``meta_types`` forces their types); ``src``
    may itself be such a table (paths relative to its folder); class folders still give ``label`` unless
    the table has a ``label`` column or ``no_labels``. Files in a folder that are not
    samples (README, CSV, ...) are skipped with a warning, or refused with ``strict``.
    """
    t0 = time.perf_counter()
    options = options or WriteOptions()
    if part is not None and not (isinstance(part, tuple) and len(part) == 2 and 0 <= part[0] < part[1]):
        raise UsageError(f"part {part!r}: expected (I, N) with 0 <= I < N")
    url = dst if isinstance(dst, str) and is_url(dst) else None
    if url is None:
        refuse_broken_url(dst)
    if options.engine == "ray":
        from fastdata.write.ray_engine import import_ray

        import_ray()  # before anything is scanned or written: a missing extra is a one-line error
    from fastdata.write.remote_target import RemoteTarget, check_not_urls

    check_not_urls([src, labels, *(arrays or {}).values()])
    if url is None and remote is not None:
        raise UsageError(f"{dst}: remote= options apply to URL destinations only, and this is a local path")
    upload = RemoteTarget(url, remote, part=part, workers_upload=options.engine == "ray") if url is not None else None
    if upload is not None:
        upload.check(overwrite, resume)  # before scanning anything: a refusal costs nothing
    dst = upload.staging if upload is not None else Path(dst)
    label_path = Path(labels) if labels is not None else None
    if label_path is not None and no_labels:
        raise UsageError("--labels and --no-labels contradict each other")
    if label_path is not None and not label_path.is_file():
        raise UsageError(f"{label_path}: labels file not found")
    named = {k: Path(v) for k, v in (arrays or {}).items()}
    meta_path = Path(meta) if meta is not None else None
    if meta_types and meta_path is None and not (src is not None and is_table(Path(src))):
        raise UsageError("--meta-type applies to a metadata table (--meta TABLE, or a table as SRC)")
    if src is not None and is_table(Path(src)) and Path(src).is_file():
        if meta_path is not None:
            raise UsageError(f"{src}: a table given as SRC is the metadata itself; drop --meta")
        meta_path, table_src = Path(src), True
    else:
        table_src = False
    if meta_path is not None:
        if named or src is None:
            raise UsageError("--meta TABLE needs a source folder SRC (the table's paths are relative to it)")
        if label_path is not None:
            raise UsageError("--labels does not apply with a metadata table: its columns are the fields (add a "
                             "'label' column for the labels)")
        if not meta_path.is_file():
            raise UsageError(f"{meta_path}: table not found")
        root = meta_path.parent if table_src else Path(src)
        if not root.is_dir():
            raise UsageError(f"{root}: no such folder")
        inputs = [root, meta_path]
        if upload is None:
            _check_dst(dst, inputs, overwrite, resume, part)
        table: Source = scan_table(meta_path, root, types=dict(meta_types or {}), images=images, skip_bad=skip_bad,
                                   strict=strict, check_unlisted=not table_src, workers=options.workers,
                                   progress=progress, no_labels=no_labels)
        report = _write(table, dst, upload, inputs, options, progress, overwrite, resume, part)
        report.seconds = time.perf_counter() - t0
        return report
    if src is not None:
        src = Path(src)
        if not os.path.exists(src):
            raise UsageError(f"{src}: no such file or folder")
        if src.is_file():
            if src.suffix.lower() != ".npy":
                raise UsageError(f"{src}: a single-file source must be a .npy array or a table "
                                 "(.csv, .tsv, .jsonl, .parquet), or give a folder")
            if DEFAULT_FIELD in named:
                raise UsageError(f"{src}: given both as SRC and as --data")
            named = {DEFAULT_FIELD: src, **named}
        elif named:
            raise UsageError("give either a source folder or arrays (--data/--field), not both")
    elif not named:
        raise UsageError("nothing to convert: give SRC, or --data X.npy")

    if named:
        if images is not None:
            raise UsageError("image options (--images, --size, ...) apply to image folders, not to .npy arrays")
        if label_path is not None:
            if label_path.suffix.lower() != ".npy":
                raise UsageError(f"{label_path}: with array sources, --labels must be a .npy array")
            if "label" in named:
                raise UsageError("--labels and --field label=... both name the labels")
            named["label"] = label_path
        inputs = list(named.values())
        if upload is None:
            _check_dst(dst, inputs, overwrite, resume, part)
        source: ArraysSource | ImageFolderSource | NpyFolderSource = ArraysSource.scan(named)
    else:
        assert src is not None
        inputs = [src] + ([label_path] if label_path is not None else [])
        if upload is None:
            _check_dst(dst, inputs, overwrite, resume, part)
        rels = walk_files(src, {os.path.realpath(label_path)} if label_path else set())
        if _holds_images(src, rels):
            rels = drop_non_samples(src, rels, is_image_file, strict)
            source = ImageFolderSource.scan(src, images or ImageOptions(), labels_file=label_path, no_labels=no_labels,
                                            skip_bad=skip_bad, workers=options.workers, progress=progress, rels=rels)
        elif images is not None:
            raise UsageError(f"{src}: image options (--images, --size, ...) given, but the folder holds no images")
        else:
            rels = drop_non_samples(src, rels, lambda r: r.lower().endswith((".npy", ".npz")), strict)
            source = NpyFolderSource.scan(src, labels_file=label_path, no_labels=no_labels, skip_bad=skip_bad,
                                          rels=rels)
    report = _write(source, dst, upload, inputs, options, progress, overwrite, resume, part)
    report.seconds = time.perf_counter() - t0  # the whole conversion: checking the sources too
    return report


def _check_dst(dst: Path, inputs: list[Path], overwrite: bool, resume: bool, part: tuple[int, int] | None) -> None:
    """Before scanning: a whole conversion checks DST fully; a part only the sources (DST is shared)."""
    if part is None:
        check_dst(dst, inputs, overwrite, resume)
    else:
        check_dst(dst, inputs, overwrite=True)


def _write(source: Any, dst: Path, upload: "RemoteTarget | None", inputs: list[Path], options: WriteOptions,
           progress: Progress | None, overwrite: bool, resume: bool, part: tuple[int, int] | None) -> ConvertReport:
    """Write the scanned ``source``: into the folder ``dst`` (the whole dataset or one part), or to a URL."""
    if upload is not None:
        return _write_remote(upload, source, inputs, options, progress, overwrite, resume)
    prepared = (prepare_dst(dst, inputs, overwrite, resume) if part is None
                else prepare_part_dst(dst, inputs, part, overwrite, resume))
    with prepared as target:
        return write_dataset(source, target, options, progress)


def _write_remote(upload: "RemoteTarget", source: Any, inputs: list[Path], options: WriteOptions,
                  progress: Progress | None, overwrite: bool, resume: bool) -> ConvertReport:
    staging, trusted = upload.prepare(overwrite, resume)
    try:
        prepared = (prepare_dst(staging, inputs, False, resume) if upload.part is None
                    else prepare_part_dst(staging, inputs, upload.part, False, resume))
        with prepared as target:
            target.on_shard = upload.shard_done
            target.trusted = trusted
            if upload.workers_upload:  # Ray: each worker uploads the shards it writes
                target.remote = upload.spec
                target.on_start = upload.started
            report = write_dataset(source, target, options, progress)
        upload.finish()
    except FastdataError as e:
        upload.abandon()
        done = len(upload.uploaded)
        if upload.resumable and not isinstance(e, UsageError):
            what = (f"{done} finished shard(s) are uploaded to {upload.url}" if done
                    else f"its journal is at {upload.url}")
            raise type(e)(f"{str(e).split('; ')[0]}; {what}: fix the problem, then run the same command with "
                          "--resume to finish") from None
        raise
    except BaseException:
        upload.abandon()
        raise
    report.dst = upload.url
    return report


def _holds_images(root: Path, rels: list[str]) -> bool:
    """A folder is an image source when it holds image files; mixing in .npy/.npz samples is an error."""
    if not any(is_image_file(r) for r in rels):
        return False
    arrays = [r for r in rels if r.lower().endswith((".npy", ".npz"))]
    if arrays:
        raise DataError(
            f"{root / arrays[0]}: an array file in a folder of images; a folder holds either images or "
            ".npy/.npz samples, not both"
        )
    return True
