"""Converters: source files -> a fastdata dataset (manifest + HDF5/LMDB shards).

``convert`` is what ``fastdata convert`` runs. It picks the source kind from what it is
given, validates all input before writing anything, and never modifies the source.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from fastdata.errors import DataError, UsageError

from .dst import check_dst, prepare_dst
from .imageio import ImageOptions
from .images import ImageFolderSource, is_image_file
from .npy import DEFAULT_FIELD, ArraysSource, NpyFolderSource
from .scan import walk_files
from .writer import ConvertReport, Progress, WriteOptions, write_dataset

__all__ = ["ConvertReport", "ImageOptions", "Progress", "WriteOptions", "convert"]


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
) -> ConvertReport:
    """Convert ``src`` into a dataset at ``dst``.

    ``src`` is a folder of per-sample ``.npy``/``.npz`` files or of images (labels from
    class sub-folders, from ``labels`` as CSV/JSON, or none), or one large ``.npy`` array
    whose first axis is the sample axis (``labels`` then names a ``.npy`` of labels).
    ``arrays`` maps field names to large ``.npy`` arrays instead of ``src``. ``images``
    says how to store images (default: ``ImageOptions()``, the original files). ``resume``
    finishes an interrupted conversion into ``dst`` (see docs/reliability.md).
    """
    t0 = time.perf_counter()
    options = options or WriteOptions()
    dst = Path(dst)
    label_path = Path(labels) if labels is not None else None
    if label_path is not None and no_labels:
        raise UsageError("--labels and --no-labels contradict each other")
    if label_path is not None and not label_path.is_file():
        raise UsageError(f"{label_path}: labels file not found")
    named = {k: Path(v) for k, v in (arrays or {}).items()}
    if src is not None:
        src = Path(src)
        if not os.path.exists(src):
            raise UsageError(f"{src}: no such file or folder")
        if src.is_file():
            if src.suffix.lower() != ".npy":
                raise UsageError(f"{src}: a single-file source must be a .npy array (or give a folder)")
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
        check_dst(dst, inputs, overwrite, resume)
        source: ArraysSource | ImageFolderSource | NpyFolderSource = ArraysSource.scan(named)
    else:
        assert src is not None
        inputs = [src] + ([label_path] if label_path is not None else [])
        check_dst(dst, inputs, overwrite, resume)
        rels = walk_files(src, {os.path.realpath(label_path)} if label_path else set())
        if _holds_images(src, rels):
            source = ImageFolderSource.scan(src, images or ImageOptions(), labels_file=label_path, no_labels=no_labels,
                                            skip_bad=skip_bad, workers=options.workers, progress=progress, rels=rels)
        elif images is not None:
            raise UsageError(f"{src}: image options (--images, --size, ...) given, but the folder holds no images")
        else:
            source = NpyFolderSource.scan(src, labels_file=label_path, no_labels=no_labels, skip_bad=skip_bad,
                                          rels=rels)
    with prepare_dst(dst, inputs, overwrite, resume) as target:
        report = write_dataset(source, target, options, progress)
    report.seconds = time.perf_counter() - t0  # the whole conversion: checking the sources too
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
