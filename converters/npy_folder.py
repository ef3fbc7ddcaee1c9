"""A folder of per-sample ``.npy``/``.npz`` files as a source: every header checked at scan (cheap),
before a byte is written."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fastdata.converters.image_codec import is_image_file
from fastdata.converters.npy_parse import (
    NpyHeader,
    data_field,
    read_npy_data,
    read_npy_header,
    read_npz_data,
    read_npz_headers,
)
from fastdata.converters.registry import DEFAULT_FIELD, Request, SrcForm, register
from fastdata.converters.scan import (
    FolderSource,
    Labels,
    check_labelled,
    drop_non_samples,
    find_labels,
    refuse_bad,
)
from fastdata.errors import DataError, UsageError
from fastdata.format import LABEL_FIELD
from fastdata.format.external import ZARR_META

if TYPE_CHECKING:
    from fastdata.converters.config import ConvertConfig
    from fastdata.write import Progress


def _signature(headers: dict[str, NpyHeader]) -> tuple:
    """What must agree across samples: per array, dtype and shape after the first axis."""
    return tuple(sorted((k, h.dtype.str, len(h.shape), h.shape[1:]) for k, h in headers.items()))


def _describe(sig: tuple) -> str:
    parts = [f"{name}: {np.dtype(dt)} shape (n, {', '.join(map(str, tr))})" if nd else f"{name}: {np.dtype(dt)} scalar"
             for name, dt, nd, tr in sig]
    return "; ".join(parts)


def _headers(root: Path, rels: list[str], main: str, bad: dict[str, str]) -> list[tuple[str, dict[str, NpyHeader], int]]:
    """Each good file's headers (one per array) and size; the others go to ``bad`` with the reason."""
    good: list[tuple[str, dict[str, NpyHeader], int]] = []
    for rel in rels:
        path = str(root / rel)
        ext = Path(rel).suffix.lower()
        if ext not in (".npy", ".npz"):
            bad[rel] = f"{path}: not a .npy or .npz file"
            continue
        if ext != main:
            bad[rel] = f"{path}: is {ext} but the folder holds {main} files"
            continue
        try:
            if main == ".npy":
                h, size = read_npy_header(path)
                good.append((rel, {DEFAULT_FIELD: h}, size))
            else:
                hs, size = read_npz_headers(path)
                good.append((rel, hs, size))
        except DataError as e:
            bad[rel] = str(e)
    return good


@dataclass(kw_only=True)
class NpyFolderSource(FolderSource):
    """Per-sample ``.npy`` (one field ``x``) or ``.npz`` (one field per array) files under a folder."""

    COLUMNS = ("sizes", "headers")

    sizes: list[int]
    headers: list[dict[str, NpyHeader]]
    npz: bool
    kind: str = "npy-folder"

    @classmethod
    def scan(cls, root: Path, rels: list[str], labels: Labels, skip_bad: bool = False) -> "NpyFolderSource":
        """Check the header of every file ``rels`` under ``root``; bad files raise (or are skipped)."""
        bad: dict[str, str] = {}
        suffix = Counter(Path(r).suffix.lower() for r in rels)
        main = ".npz" if suffix[".npz"] > suffix[".npy"] else ".npy"
        good = _headers(root, rels, main, bad)
        check_labelled(root, rels, labels, bad)
        good = [g for g in good if g[0] not in bad]
        if good:
            # The signature most files share is the reference (ties: the first file's).
            sig_of = [_signature(h) for _, h, _ in good]
            sigs = Counter(sig_of)
            ref = max(sigs, key=sigs.__getitem__)
            for (rel, _, _), sig in zip(good, sig_of):
                if sig != ref:
                    bad[rel] = (
                        f"{root / rel}: has {_describe(sig)}, but {sigs[ref]} other file(s) have {_describe(ref)}"
                    )
            good = [g for g in good if g[0] not in bad]
        skipped = refuse_bad(bad, skip_bad)
        if not good:
            raise DataError(f"{root}: no usable samples (all {len(rels)} files are bad)")

        first_headers = good[0][1]
        fields = []
        for name in sorted(first_headers):
            h = first_headers[name]
            firsts = {g[1][name].shape[0] for g in good} if h.shape else {None}
            shape = (None, *h.shape[1:]) if len(firsts) > 1 else h.shape
            fields.append(data_field(name, h.dtype, shape, str(root / good[0][0])))
        if labels.by_path is not None and any(f.name == LABEL_FIELD for f in fields):
            raise DataError(f"{root / good[0][0]}: holds an array named 'label', which clashes with the labels; pass %(no_labels=True)")
        return cls.labelled_source(
            root, [g[0] for g in good], labels, fields, skipped,
            sizes=[g[2] for g in good],
            headers=[g[1] for g in good],
            npz=main == ".npz",
        )

    @property
    def bytes_in(self) -> int:
        return int(sum(self.sizes))

    def sample_nbytes(self) -> np.ndarray:
        return np.array([sum(h.nbytes for h in hs.values()) for hs in self.headers], dtype=np.int64)

    def ragged_rows(self, name: str) -> np.ndarray:
        """First-axis length of field ``name`` in every sample."""
        return np.array([hs[name].shape[0] for hs in self.headers], dtype=np.int64)

    def read(self, i: int) -> dict[str, np.ndarray]:
        path = os.path.join(self.root, self.rels[i])
        hs = self.headers[i]
        if self.npz:
            arrays = read_npz_data(path)
            for name, h in hs.items():
                a = arrays.get(name)
                if a is None or a.dtype != h.dtype or a.shape != h.shape:
                    raise DataError(f"{path}: changed during conversion (array {name!r})")
        else:
            arrays = {DEFAULT_FIELD: read_npy_data(path, hs[DEFAULT_FIELD], self.sizes[i])}
        return self.labelled(arrays, i)


class NpyFolderKind:
    """A folder of per-sample ``.npy``/``.npz`` files (what a folder without images is)."""

    name = "npy-folder"

    def src_form(self, src: Path) -> SrcForm | None:
        return None  # a folder: detect() decides, from its files

    def detect(self, req: Request) -> bool:
        return (req.meta is None and not req.arrays and req.src is not None and req.src.is_dir()
                and not req.in_file and not any(is_image_file(r) for r in req.files)
                and not any(os.path.basename(r) in ZARR_META for r in req.files))  # a Zarr store: kind "zarr"

    def scan(self, req: Request, config: "ConvertConfig", progress: "Progress | None") -> NpyFolderSource:
        assert req.src is not None
        if config.images is not None:
            raise UsageError(f"{req.src}: image options (%(images)) given, but the folder holds no images")
        rels = drop_non_samples(req.src, req.files, lambda r: r.lower().endswith((".npy", ".npz")), config.strict)
        labels = find_labels(req.src, rels, ".npy or .npz samples", req.labels, config)
        return NpyFolderSource.scan(req.src, rels, labels, config.skip_bad)


register(NpyFolderKind())
