"""Image folders -> samples: ImageFolder layout (``root/<class>/<file>``) or a flat folder + labels file.
Every image is converted at scan to learn its stored shape, and again by the shard workers (same bytes)."""

from __future__ import annotations

import os
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fastdata.converters.image_codec import ImageOptions, Prepared, is_image_file, prepare_bytes, read_source
from fastdata.converters.registry import Request, SourceKind, register
from fastdata.converters.scan import FolderSource, Labels, check_labelled, find_labels, map_tasks, refuse_bad
from fastdata.errors import DataError, FastdataError
from fastdata.format import FieldSpec, ImageSpec, make_field
from fastdata.format.spec import (
    CODEC_DTYPE,
    CODEC_SUFFIX,
    CODECS,
    ENCODING_IMAGE,
    ENCODING_PIXELS,
    SHAPE_DTYPE,
    SHAPE_SUFFIX,
)
from fastdata.write import Progress

if TYPE_CHECKING:
    from fastdata.converters.config import ConvertConfig

IMAGE_FIELD = "image"
# A resizing conversion stores each image's upright size before the resize (int32 H, W) as "<image>_original_size".
ORIGINAL_SIZE_SUFFIX = "_original_size"
ORIGINAL_SIZE_DTYPE = np.dtype("<i4")
_SCAN_CHUNK = 32  # files per scan task


def image_specs(name: str, opts: ImageOptions, fixed: tuple[int | None, ...] | None = None) -> list[FieldSpec]:
    """The fields image field ``name`` is stored as: one fixed-shape field when every image is raw pixels of shape
    ``fixed``, else payload and shape (plus codec when encoded, plus original size when resized)."""
    spec = ImageSpec(mode=opts.mode)
    if fixed is not None:
        fields = [make_field(name, "|u1", fixed, image=spec)]
    else:
        encoding = ENCODING_PIXELS if opts.images == "raw" else ENCODING_IMAGE
        fields = [make_field(name, "|u1", (None,), encoding=encoding, image=spec),
                  make_field(name + SHAPE_SUFFIX, SHAPE_DTYPE, (3,))]
        if encoding == ENCODING_IMAGE:
            fields.append(make_field(name + CODEC_SUFFIX, CODEC_DTYPE, ()))
    if opts.resizes:
        fields.append(make_field(name + ORIGINAL_SIZE_SUFFIX, ORIGINAL_SIZE_DTYPE, (2,)))
    return fields


def image_arrays(name: str, p: Prepared, opts: ImageOptions, fixed: bool) -> dict[str, np.ndarray]:
    """What one converted image is stored as: the fields :func:`image_specs` names."""
    out: dict[str, np.ndarray]
    if fixed:
        out = {name: p.payload.reshape(p.shape)}
    else:
        out = {name: p.payload.reshape(-1), name + SHAPE_SUFFIX: np.asarray(p.shape, dtype=SHAPE_DTYPE)}
        if opts.images != "raw":
            out[name + CODEC_SUFFIX] = np.asarray(p.codec, dtype=np.uint8)
    if opts.resizes:
        out[name + ORIGINAL_SIZE_SUFFIX] = np.asarray(p.original, dtype=ORIGINAL_SIZE_DTYPE)
    return out


# The per-file columns of the scan, in _scan_chunk's order, and their types.
_COLUMNS: dict[str, Any] = {"shapes": np.int64, "nbytes": np.int64, "codecs": np.uint8, "kept": bool,
                            "crcs": np.uint32, "originals": ORIGINAL_SIZE_DTYPE, "file_sizes": np.int64}


def _scan_chunk(root: str, rels: list[str], opts: ImageOptions) -> list[tuple[Any, ...]]:
    """Convert each file once: (shape, payload bytes, codec, kept, crc, original size, file size) or (error message,)."""
    out: list[tuple[Any, ...]] = []
    for rel in rels:
        path = os.path.join(root, rel)
        try:
            p = prepare_bytes(read_source(path), path, opts)
        except DataError as e:
            out.append((str(e),))
            continue
        out.append((p.shape, p.payload.nbytes, p.codec, p.kept, p.crc, p.original, os.path.getsize(path)))
    return out


@dataclass(kw_only=True)
class ImageFolderSource(FolderSource):
    """Image files under a folder; one sample per file, in sorted order of relative path."""

    COLUMNS = tuple(_COLUMNS)

    opts: ImageOptions
    shapes: np.ndarray  # (n, 3) int64: stored H, W, C
    nbytes: np.ndarray  # (n,) payload bytes
    codecs: np.ndarray  # (n,) uint8, 0 for pixels
    kept: np.ndarray  # (n,) bool: the source file's bytes, untouched
    crcs: np.ndarray  # (n,) uint32 CRC-32 of the source files
    originals: np.ndarray  # (n, 2) int32: upright H, W before any resize
    file_sizes: np.ndarray  # (n,)
    kind: str = "image-folder"
    fixed: tuple[int, ...] | None = None  # every image has this shape: a fixed-shape field

    @classmethod
    def scan(cls, root: Path, opts: ImageOptions, rels: list[str], labels: Labels, skip_bad: bool = False,
             workers: int | None = None, progress: Progress | None = None) -> "ImageFolderSource":
        """Convert-check every image file ``rels`` under ``root``; bad files raise (or are skipped)."""
        bad: dict[str, str] = {}
        check_labelled(root, rels, labels, bad)
        todo = [r for r in rels if r not in bad]
        if progress is not None:
            progress.start(len(todo), 0, desc="checking images")
        tasks = [(str(root), todo[i : i + _SCAN_CHUNK], opts) for i in range(0, len(todo), _SCAN_CHUNK)]
        results = map_tasks(_scan_chunk, tasks, workers, progress, lambda r: sum(x[-1] for x in r if len(x) > 1))
        bad.update((rel, r[0]) for rel, r in zip(todo, results) if len(r) == 1)  # (error message,)
        good = [(rel, r) for rel, r in zip(todo, results) if len(r) > 1]
        skipped = refuse_bad(bad, skip_bad)
        if not good:
            raise DataError(f"{root}: no usable images (all {len(rels)} files are bad)")
        columns = {k: np.array([g[1][c] for g in good], dtype=t) for c, (k, t) in enumerate(_COLUMNS.items())}
        shapes = columns["shapes"]
        # raw images of one shape (always so with --size) are a fixed-shape field, read with plain copies
        fixed = tuple(shapes[0].tolist()) if opts.images == "raw" and bool((shapes == shapes[0]).all()) else None
        return cls.labelled_source(root, [g[0] for g in good], labels, image_specs(IMAGE_FIELD, opts, fixed), skipped,
                                   opts=opts, fixed=fixed, **columns)

    @property
    def bytes_in(self) -> int:
        return int(self.file_sizes.sum())

    def sample_nbytes(self) -> np.ndarray:
        return self.nbytes + sum(f.row_nbytes for f in self.fields if f.name != IMAGE_FIELD)

    def ragged_rows(self, name: str) -> np.ndarray:
        if name != IMAGE_FIELD or self.fixed is not None:
            raise KeyError(name)
        return self.nbytes

    def read(self, i: int) -> dict[str, np.ndarray]:
        path = os.path.join(self.root, self.rels[i])
        if self.kept[i]:
            data = read_source(path)
            p = Prepared(np.frombuffer(data, dtype=np.uint8), tuple(self.shapes[i].tolist()), int(self.codecs[i]), True,
                         zlib.crc32(data), tuple(self.originals[i].tolist()))
        else:
            p = prepare_bytes(read_source(path), path, self.opts)
        if p.crc != self.crcs[i]:
            raise DataError(f"{path}: changed during the conversion; convert again")
        if p.payload.nbytes != self.nbytes[i]:  # same file, other bytes: conversion is not deterministic here
            raise FastdataError(f"{path}: converted to {p.payload.nbytes} bytes, {self.nbytes[i]} at scan time")
        return self.labelled(image_arrays(IMAGE_FIELD, p, self.opts, self.fixed is not None), i)

    def inputs(self) -> tuple[list[str], list[np.ndarray]]:
        files, values = super().inputs()
        return files, [*values, self.crcs]  # a changed image with the same size and time changes its CRC

    def describe(self) -> dict[str, Any]:
        codecs = Counter(CODECS.get(int(c), "pixels") for c in self.codecs)
        return {
            **super().describe(), "images": self.opts.images,
            "mode": self.opts.mode, "size": list(self.opts.size) if self.opts.size else None,
            "max_side": self.opts.max_side, "quality": self.opts.quality,
            "kept_files": int(self.kept.sum()), "codecs": dict(sorted(codecs.items())),
        }


def _detect(req: Request) -> bool:
    """A folder of images (labels from class sub-folders, a labels file, or none)."""
    if req.meta is not None or req.arrays or req.src is None or not req.src.is_dir():
        return False
    if not any(is_image_file(r) for r in req.files):
        return False
    arrays = [r for r in req.files if r.lower().endswith((".npy", ".npz"))]
    if arrays:
        raise DataError(f"{req.src / arrays[0]}: an array file in a folder of images; a folder holds either "
                        "images or .npy/.npz samples, not both")
    return True


def _scan(req: Request, config: "ConvertConfig", progress: Progress | None) -> ImageFolderSource:
    assert req.src is not None
    rels, labels = find_labels(req.src, req.files, is_image_file, "images", req.labels, config)
    return ImageFolderSource.scan(req.src, config.images or ImageOptions(), rels, labels, config.skip_bad,
                                  config.write.workers, progress)


register(SourceKind("image-folder", _detect, _scan))
