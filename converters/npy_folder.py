"""``.npy`` sources: a folder of per-sample ``.npy``/``.npz`` files, or large arrays.

A source scans and validates everything first (headers only, cheap), so bad input is
reported before a byte is written. ``part(start, stop)`` gives a small picklable slice
that a worker process reads samples from.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.errors import DataError, FormatError, UsageError
from fastdata.format import LABEL_FIELD, FieldSpec, make_field
from fastdata.handles import PerProcessHandle

from .npy_parse import NpyHeader, read_npy_data, read_npy_header, read_npz_data, read_npz_headers
from .scan import FolderSource, check_labelled, find_and_label, label_field, refuse_bad

DEFAULT_FIELD = "x"


def _field(name: str, dtype: Any, shape: tuple[int | None, ...], where: str) -> FieldSpec:
    try:
        return make_field(name, dtype, shape)
    except FormatError as e:
        raise DataError(f"{where}: {e}") from None


def _signature(headers: dict[str, NpyHeader]) -> tuple:
    """What must agree across samples: per array, dtype and shape after the first axis."""
    return tuple(sorted((k, h.dtype.str, len(h.shape), h.shape[1:]) for k, h in headers.items()))


def _describe(sig: tuple) -> str:
    parts = [f"{name}: {np.dtype(dt)} shape (n, {', '.join(map(str, tr))})" if nd else f"{name}: {np.dtype(dt)} scalar"
             for name, dt, nd, tr in sig]
    return "; ".join(parts)


@dataclass
class NpyFolderSource(FolderSource):
    """Per-sample ``.npy`` (one field ``x``) or ``.npz`` (one field per array) files under a folder."""

    COLUMNS = ("sizes", "headers")

    root: str
    rels: list[str]
    sizes: list[int]
    headers: list[dict[str, NpyHeader]]
    labels: np.ndarray | None
    fields: list[FieldSpec]
    classes: list[str] | None
    npz: bool
    skipped: list[tuple[str, str]] = field(default_factory=list)
    label_kind: str = "none"
    kind: str = "npy-folder"

    @classmethod
    def scan(cls, root: Path, labels_file: Path | None = None, no_labels: bool = False, skip_bad: bool = False,
             rels: list[str] | None = None) -> "NpyFolderSource":
        """``rels``: the files under ``root`` if already walked (:func:`.scan.walk_files`)."""
        rels, labels = find_and_label(root, labels_file, no_labels, ".npy or .npz samples", rels)

        bad: dict[str, str] = {}
        suffix = Counter(Path(r).suffix.lower() for r in rels)
        main = ".npz" if suffix[".npz"] > suffix[".npy"] else ".npy"
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
        check_labelled(root, rels, labels, labels_file, bad)
        good = [g for g in good if g[0] not in bad]
        if good:
            # The signature most files share is the reference (ties: the first file's; a Counter
            # keeps first-seen order, and max returns the first of equals).
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
            fields.append(_field(name, h.dtype, shape, str(root / good[0][0])))
        if labels.by_path is not None:
            if any(f.name == LABEL_FIELD for f in fields):
                raise DataError(f"{root / good[0][0]}: holds an array named 'label', which clashes with the labels; pass --no-labels")
        usable = [g[0] for g in good]
        label_values = labels.of(usable)
        if label_values is not None:
            fields.append(label_field(label_values))
        return cls(
            root=str(root),
            rels=usable,
            sizes=[g[2] for g in good],
            headers=[g[1] for g in good],
            labels=labels.of(usable),
            fields=fields,
            classes=labels.classes,
            npz=main == ".npz",
            skipped=skipped,
            label_kind=labels.kind,
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


@dataclass(eq=False)  # hashable: PerProcessHandle tracks open handles in a WeakSet
class ArraysSource(PerProcessHandle[dict[str, np.ndarray]]):
    """Large arrays with the sample axis first (``X.npy`` + ``y.npy`` or several named fields), memory-mapped
    once per process (the maps are dropped when a part is pickled for a worker)."""

    paths: dict[str, str]
    offset: int
    count: int
    fields: list[FieldSpec]
    file_sizes: dict[str, int]
    classes: list[str] | None = None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    kind: str = "npy-arrays"

    @classmethod
    def scan(cls, paths: dict[str, Path]) -> "ArraysSource":
        if not paths:
            raise UsageError("no arrays given")
        fields, sizes, n0, first = [], {}, None, None
        for name, path in paths.items():
            if not path.is_file():
                raise UsageError(f"{path}: no such file")
            if path.suffix.lower() != ".npy":
                raise DataError(f"{path}: not a .npy file")
            h, size = read_npy_header(str(path))
            if not h.shape:
                raise DataError(f"{path}: a 0-d array has no sample axis")
            if n0 is None:
                n0, first = h.shape[0], path
            elif h.shape[0] != n0:
                raise DataError(f"{path}: has {h.shape[0]} samples but {first} has {n0}")
            fields.append(_field(name, h.dtype, h.shape[1:], str(path)))
            sizes[name] = size
        return cls(paths={k: str(v) for k, v in paths.items()}, offset=0, count=int(n0 or 0), fields=fields, file_sizes=sizes)

    def __len__(self) -> int:
        return self.count

    @property
    def bytes_in(self) -> int:
        return int(sum(self.file_sizes.values()))

    def sample_nbytes(self) -> np.ndarray:
        return np.full(self.count, sum(f.row_nbytes for f in self.fields), dtype=np.int64)

    def ragged_rows(self, name: str) -> np.ndarray:  # arrays are never ragged
        raise KeyError(name)

    def sample_keys(self) -> None:
        """Array rows are keyed by their index."""
        return None

    def part(self, start: int, stop: int) -> "ArraysSource":
        return replace(self, offset=self.offset + start, count=stop - start)

    def _open_handle(self) -> dict[str, np.ndarray]:
        try:
            return {k: np.load(p, mmap_mode="r", allow_pickle=False) for k, p in self.paths.items()}
        except (OSError, ValueError) as e:
            raise DataError(f"cannot map source arrays: {e}") from None

    def read(self, i: int) -> dict[str, np.ndarray]:
        j = self.offset + i
        return {k: np.array(m[j], order="C") for k, m in self.handle().items()}

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "arrays": {k: os.path.abspath(p) for k, p in self.paths.items()}}
