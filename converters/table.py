"""Metadata tables (CSV, JSON Lines, Parquet) as sources: one row per sample, its ``path`` column naming
the sample's file, every other column a field; every problem names the table, the row and the column."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from PIL import Image, UnidentifiedImageError

from fastdata.converters.arrays import NpyFolderSource, read_npy_data, read_npy_header
from fastdata.converters.config import ConvertConfig, ImageOptions
from fastdata.converters.images import (
    ORIGINAL_SIZE_SUFFIX,
    ImageFolderSource,
    check_declared,
    image_specs,
    is_image_file,
    looks_like,
    rescale,
)
from fastdata.converters.registry import Request, SourceKind, register
from fastdata.converters.scan import Labels, check_finite_rows, drop_non_samples, folder_labels, refuse_bad, walk_files
from fastdata.converters.table_read import (
    _MISSING,
    FLOAT_DTYPE,
    INT_DTYPE,
    PATH_COLUMN,
    ColumnType,
    Table,
    TypedColumn,
    is_table,
    parse_column,
    read_table,
    safe_rel,
)
from fastdata.errors import DataError, UsageError
from fastdata.format import LABEL_FIELD, FieldSpec, make_field
from fastdata.format.manifest import IMAGE_SUFFIXES
from fastdata.format.spec import _NAME_RE, ENCODING_UTF8, KEY_FIELD, SHAPE_DTYPE, SHAPE_SUFFIX

if TYPE_CHECKING:
    from fastdata.write import Progress

# --- file columns ----------------------------------------------------------------------------


@dataclass
class FileColumn:
    """A column of files read as a field: images as pixels (``np.asarray`` of the PIL image:
    palette indices stay indices, so masks stay masks), ``.npy`` files as arrays."""

    name: str
    image: bool
    rels: list[str]
    shapes: np.ndarray  # (n, ndim) per-sample array shape
    dtype: np.dtype
    mode: str | None = None  # images: L or RGB
    fixed: tuple[int, ...] | None = None  # .npy: one shape for all samples

    def fields(self) -> list[FieldSpec]:
        if self.image:
            return image_specs(self.name, ImageOptions("raw", mode="RGB" if self.mode == "RGB" else "L"))
        if self.fixed is not None:
            return [make_field(self.name, self.dtype, self.fixed)]
        return [make_field(self.name, self.dtype, (None, *self.shapes[0][1:].tolist()))]

    def nbytes(self) -> np.ndarray:
        return np.prod(self.shapes, axis=1) * self.dtype.itemsize + (24 if self.image else 0)

    def rows(self) -> np.ndarray:
        return np.prod(self.shapes, axis=1) if self.image else self.shapes[:, 0]

    def read(self, root: str, i: int) -> dict[str, np.ndarray]:
        path = os.path.join(root, self.rels[i])
        want = tuple(self.shapes[i].tolist())
        if self.image:
            try:
                with Image.open(path) as im:
                    if im.mode not in _PIXEL_MODES:
                        raise DataError(f"{path}: image mode {im.mode} (a file column takes 8-bit L, P, 1 or RGB "
                                        "images)")
                    a = np.asarray(im, dtype=np.uint8)
            except (OSError, UnidentifiedImageError, ValueError) as e:
                raise DataError(f"{path}: unreadable image ({type(e).__name__}: {e})") from None
            a = a.reshape((*a.shape[:2], 1)) if a.ndim == 2 else a
            if a.shape != want:
                raise DataError(f"{path}: changed during the conversion (shape {list(a.shape)}, was {list(want)})")
            return {self.name: a.reshape(-1), self.name + SHAPE_SUFFIX: np.array(want, dtype=SHAPE_DTYPE)}
        h, size = read_npy_header(path)
        a = read_npy_data(path, h, size)
        if a.shape != want or a.dtype != self.dtype:
            raise DataError(f"{path}: changed during the conversion")
        return {self.name: np.ascontiguousarray(a)}

    def part(self, a: int, b: int) -> "FileColumn":
        return replace(self, rels=self.rels[a:b], shapes=self.shapes[a:b])


_PIXEL_MODES = {"L": "L", "P": "L", "1": "L", "RGB": "RGB"}


def scan_file_column(table: Table, col: TypedColumn, root: Path, rows: list[int], bad: dict[int, str]) -> FileColumn:
    """Look at every file of a file column (image header or .npy header) to learn its shape."""
    rels = [col.values[i] for i in rows]
    image = all(str(r).lower().endswith(tuple(IMAGE_SUFFIXES)) for r in rels)
    if not image and not all(str(r).lower().endswith(".npy") for r in rels):
        raise DataError(f"{table.path}: column {col.name!r} mixes image and .npy files; one kind per column")
    info: dict[int, Any] = {}  # row -> (shape, image mode or array dtype)
    for i, rel in zip(rows, rels):
        path = str(root / rel)
        try:
            if image:
                with Image.open(path) as im:
                    if im.mode not in _PIXEL_MODES:
                        raise DataError(f"image mode {im.mode} (a file column takes 8-bit L, P, 1 or RGB images)")
                    pm = _PIXEL_MODES[im.mode]
                    info[i] = (im.height, im.width, 3 if pm == "RGB" else 1), pm
            else:
                h, _ = read_npy_header(path)
                info[i] = h.shape, h.dtype
        except (DataError, OSError, UnidentifiedImageError) as e:
            bad.setdefault(i, f"{table.where(i, col.name)}: {path}: {e}")
    common = Counter(k for _, k in info.values()).most_common(1)
    mode = common[0][0] if image and common else None
    dtype = common[0][0] if not image and common else np.dtype(np.uint8)
    if not image:
        trailing = Counter(s[1:] for s, _ in info.values())
        tr = trailing.most_common(1)[0][0] if trailing else ()
    for i, (shape, k) in info.items():
        if image and k != mode:
            bad.setdefault(i, f"{table.where(i, col.name)}: {root / col.values[i]} is {k}, the column's images {mode}")
        if not image and (k != dtype or len(shape) == 0 or shape[1:] != tr):
            bad.setdefault(i, f"{table.where(i, col.name)}: {root / col.values[i]} holds {k} {list(shape)}, the "
                              f"column's arrays are {dtype} [n, {', '.join(map(str, tr))}]")
    ok = [i for i in rows if i not in bad]
    shapes = [info[i][0] for i in ok]
    fixed = shapes[0] if not image and shapes and all(s == shapes[0] for s in shapes) else None
    dims = len(shapes[0]) if shapes else 3 if image else 1  # no good row: an empty column, its rows all in bad
    return FileColumn(col.name, image, [col.values[i] for i in ok],
                      np.array(shapes, dtype=np.int64).reshape(len(ok), dims), np.dtype(dtype), mode, fixed)


# --- the table source --------------------------------------------------------------------------


@dataclass
class TableColumns:
    """The parsed columns of a table for the rows kept: fields, per-row arrays (text as its UTF-8 bytes), file
    columns, classes."""

    fields: list[FieldSpec]
    values: dict[str, list[Any]]
    files: list[FileColumn]
    classes: list[str] | None = None


def table_columns(table: Table, root: Path, types: dict[str, ColumnType], bad: dict[int, str],
                  reserved: set[str]) -> dict[str, TypedColumn]:
    """Parse every column but ``path`` (a cell that does not fit puts its row in ``bad``)."""
    unknown = sorted(set(types) - set(table.columns))
    if unknown:
        raise UsageError(f"%(meta_types) names {unknown[0]!r}, which is not a column of {table.path} "
                         f"(columns: {', '.join(table.columns)})")
    cols: dict[str, TypedColumn] = {}
    for name, raw in table.columns.items():
        if name == PATH_COLUMN:
            continue
        if name == KEY_FIELD or name in reserved:
            raise DataError(f"{table.path}: column {name!r} clashes with a field fastdata writes itself "
                            f"({', '.join(sorted(reserved | {KEY_FIELD}))}); rename the column")
        if not _NAME_RE.match(name) or name.endswith(("_lengths", SHAPE_SUFFIX)):
            raise DataError(f"{table.path}: column name {name!r} cannot be a field name (letters, digits, _ . -, "
                            "not starting with a digit, not ending in _lengths or _shape); rename the column")
        cols[name] = parse_column(table, name, raw, types.get(name), root, bad)
        if name == LABEL_FIELD and cols[name].kind == "str":  # an empty label is a missing one, not a class ''
            for i, v in enumerate(cols[name].values):
                if v == "":
                    bad.setdefault(i, f"{table.where(i, name)}: empty cell: every sample needs a label")
    return cols


def finish_columns(table: Table, cols: dict[str, TypedColumn], rows: list[int], root: Path,
                   bad: dict[int, str]) -> TableColumns:
    """Fields and per-row values of the columns, for ``rows`` (file columns scanned here, which may
    find more bad rows: call again with the rows left if it did)."""
    fields: list[FieldSpec] = []
    values: dict[str, list[Any]] = {}
    files: list[FileColumn] = []
    classes = None
    for name, c in cols.items():
        if c.kind == "file":
            fc = scan_file_column(table, c, root, rows, bad)
            if not fc.rels:  # every row of the column is bad: scan_table reports them (table, row, column)
                continue
            files.append(fc)
            fields += fc.fields()
        elif c.kind == "str" and name == LABEL_FIELD:
            classes = sorted({c.values[i] for i in rows})
            index = {v: k for k, v in enumerate(classes)}
            values[name] = [np.asarray(index[c.values[i]], dtype=INT_DTYPE) for i in rows]
            fields.append(make_field(name, INT_DTYPE, ()))
        elif c.kind == "str":
            values[name] = [np.frombuffer(c.values[i].encode("utf-8"), dtype=np.uint8) for i in rows]
            fields.append(make_field(name, "|u1", (None,), encoding=ENCODING_UTF8))
        else:
            assert c.dtype is not None
            values[name] = [c.values[i] for i in rows]
            fields.append(make_field(name, c.dtype, c.shape))
    return TableColumns(fields, values, files, classes)


@dataclass
class TableSource:
    """A main source (image or ``.npy`` files named by ``path``) plus the table's other columns."""

    main: Any
    cols: TableColumns
    table_path: str
    skipped: list[tuple[str, str]] = field(default_factory=list)
    kind: str = "table"
    fields: list[FieldSpec] = field(init=False)
    classes: list[str] | None = field(init=False)

    def __post_init__(self) -> None:
        self.fields = list(self.main.fields) + self.cols.fields
        self.classes = self.main.classes if self.main.classes is not None else self.cols.classes

    def inputs(self) -> tuple[list[str], list[np.ndarray]]:
        """The main source's, the file columns' files and the table itself."""
        files, values = self.main.inputs()
        columns = [os.path.join(self.main.root, r) for f in self.cols.files for r in f.rels]
        return files + columns + [os.path.abspath(self.table_path)], values

    def __len__(self) -> int:
        return len(self.main)

    @property
    def bytes_in(self) -> int:
        extra = sum(os.path.getsize(os.path.join(self.main.root, r)) for f in self.cols.files for r in f.rels)
        return int(self.main.bytes_in) + extra

    def sample_nbytes(self) -> np.ndarray:
        total = self.main.sample_nbytes() + sum(f.nbytes() for f in self.cols.files)
        for v in self.cols.values.values():
            total += np.array([x.nbytes for x in v], dtype=np.int64)
        return total

    def ragged_rows(self, name: str) -> np.ndarray:
        if any(f.name == name for f in self.main.fields):
            return self.main.ragged_rows(name)
        files = [f.rows() for f in self.cols.files if f.name == name]
        return files[0] if files else np.array([len(x) for x in self.cols.values[name]], dtype=np.int64)

    def part(self, start: int, stop: int) -> "TableSource":
        cols = replace(self.cols, values={k: v[start:stop] for k, v in self.cols.values.items()},
                       files=[f.part(start, stop) for f in self.cols.files])
        return replace(self, main=self.main.part(start, stop), cols=cols, skipped=[])

    def read(self, i: int) -> dict[str, np.ndarray]:
        sample = self.main.read(i)
        sample.update({k: v[i] for k, v in self.cols.values.items()})
        for f in self.cols.files:
            sample.update(f.read(self.main.root, i))
        return sample

    def sample_keys(self) -> list[str]:
        return list(self.main.rels)

    def describe(self) -> dict[str, Any]:
        labelled = any(f.name == LABEL_FIELD for f in self.cols.fields)  # the table's 'label' column
        return {**self.main.describe(), "kind": self.kind, "table": os.path.abspath(self.table_path),
                "skipped": len(self.skipped), **({"labels": "table"} if labelled else {})}


def scan_table(table_path: Path, root: Path, config: "ConvertConfig", check_unlisted: bool,
               progress: Any) -> TableSource:
    """Read and check a table and every file it names, and build the source; the first bad row raises (naming table,
    row and column) unless ``config.skip_bad``; NaN or infinite labels unless ``config.allow_nan``."""
    images, skip_bad = config.images, config.skip_bad
    table = read_table(table_path)
    paths, bad = _paths(table, table_path, root)
    rows = [i for i in range(table.rows) if i not in bad]
    is_img = [is_image_file(paths[i]) for i in rows]
    if any(is_img) and not all(is_img):
        first = rows[is_img.index(False)]
        raise DataError(f"{table.where(first, PATH_COLUMN)}: {paths[first]!r} is not an image, other rows name "
                        "images; a table's path column names one kind of file")
    image_kind = bool(is_img) and all(is_img)
    reserved = {"image", "image_shape", "image_codec", "image" + ORIGINAL_SIZE_SUFFIX} if image_kind else {"x"}
    cols = table_columns(table, root, dict(config.meta_types), bad, reserved)
    rows = [i for i in range(table.rows) if i not in bad]
    finish_columns(table, cols, rows, root, bad)  # scans file columns: may find bad rows
    rows = [i for i in range(table.rows) if i not in bad]

    # skipped.json names a bad row by its path when it has one, else by its place in the table
    skipped_rows = refuse_bad({paths[i] or f"{table.path.name}:row {i + 1}": msg for i, msg in bad.items()}, skip_bad)
    if check_unlisted:
        skipped_rows += _unlisted(table, table_path, root, paths, cols, image_kind, config.strict, skip_bad)
    if not rows:
        raise DataError(f"{table_path}: no usable rows (all {table.rows} are bad)")
    rels = [paths[i] for i in rows]
    folders = not config.no_labels and LABEL_FIELD not in table.columns and _class_folders(table, root, rels)
    labels = folder_labels(rels, root) if folders else Labels()
    if image_kind:
        main: Any = ImageFolderSource.scan(root, images or ImageOptions(), rels, labels, skip_bad, config.write.workers,
                                           progress)
    else:
        if images is not None:
            raise UsageError(f"{table_path}: image options (%(images)) given, but the path column names no images")
        main = NpyFolderSource.scan(root, rels, labels, skip_bad)
    row_of = {paths[i]: i for i in rows}
    kept = [row_of[r] for r in main.rels]
    final = finish_columns(table, cols, kept, root, {})
    if not config.allow_nan and final.values.get(LABEL_FIELD):
        check_finite_rows(final.values[LABEL_FIELD], lambda i: f"{table_path}: the row for {main.rels[i]!r}, column "
                                                              f"{LABEL_FIELD!r}")
    originals = main.originals if image_kind else np.zeros((len(kept), 2), dtype=np.int32)
    rescale_columns(str(table_path), final, list(cols), originals, images if image_kind else None, config.keypoints,
                    config.boxes, config.not_coordinates)
    return TableSource(main=main, cols=final, table_path=str(table_path),
                       skipped=sorted(skipped_rows) + list(main.skipped))


def _paths(table: Table, table_path: Path, root: Path) -> tuple[list[Any], dict[int, str]]:
    """The ``path`` column, checked: each row's relative path (None where bad), and the bad rows."""
    if PATH_COLUMN not in table.columns:
        raise DataError(f"{table_path}: no {PATH_COLUMN!r} column (columns: {', '.join(table.columns)})")
    if table.rows == 0:
        raise DataError(f"{table_path}: the table has no rows")
    bad: dict[int, str] = {}
    paths: list[Any] = [None] * table.rows
    seen: dict[str, int] = {}
    for i, v in enumerate(table.columns[PATH_COLUMN]):
        try:
            if not isinstance(v, str) or not v.strip():
                raise ValueError("empty path" if v is _MISSING or v == "" else f"{v!r} is not a path")
            rel = safe_rel(v, root)
        except ValueError as e:
            bad[i] = f"{table.where(i, PATH_COLUMN)}: {e}"
            continue
        if rel in seen:
            bad[i] = f"{table.where(i, PATH_COLUMN)}: duplicate path {rel!r} (also row {seen[rel] + 1})"
            continue
        seen[rel] = i
        paths[i] = rel
    return paths, bad


def _unlisted(table: Table, table_path: Path, root: Path, paths: list[Any], cols: dict[str, TypedColumn],
              image_kind: bool, strict: bool, skip_bad: bool) -> list[tuple[str, str]]:
    """Sample files under ``root`` that the table does not list: an error, or skipped with ``skip_bad``."""
    listed = set(paths[i] for i in range(table.rows) if paths[i]) | {
        c.values[i] for c in cols.values() if c.kind == "file" for i in range(table.rows) if c.values[i]}
    others = [r for r in walk_files(root, {os.path.realpath(table_path)}) if r not in listed]
    suffixes = tuple(IMAGE_SUFFIXES) if image_kind else (".npy", ".npz")
    unlisted = drop_non_samples(root, others, lambda r: r.lower().endswith(suffixes), strict)
    msg = {r: f"{root / r}: a sample file that {table_path} does not list (add a row for it, or move it)"
           for r in unlisted}
    return refuse_bad(msg, skip_bad) if msg else []


def _class_folders(table: Table, root: Path, rels: list[str]) -> bool:
    """Whether the table's paths lie in class folders (every path in a sub-folder of ``root``, at least two of them);
    paths both directly in ``root`` and in sub-folders are refused."""
    flat = [r for r in rels if "/" not in r]
    if len(flat) == len(rels) or len({r.split("/", 1)[0] for r in rels}) < 2:
        return False
    if flat:
        raise DataError(f"{table.path}: path {flat[0]!r} lies directly in {root} while other rows name files in "
                        "sub-folders, whose names would be the classes (field 'label'); pass %(no_labels=True) for no "
                        "labels from folders, or add a 'label' column to the table")
    return True


def _scan(req: Request, config: "ConvertConfig", progress: "Progress | None") -> TableSource:
    assert req.meta is not None and req.src is not None  # (detect, and the request's checks)
    return scan_table(req.meta, req.src, config, not req.table_src, progress)


# A metadata table (``meta``, or SRC itself a table, its paths relative to its folder): its ``path`` column names
# the samples.
register(SourceKind("table", lambda req: req.meta is not None, _scan,
                    lambda src: "table" if is_table(src) and src.is_file() else None))


def _trailing(cols: TableColumns, name: str) -> int | None:
    """The length of a numeric column's last axis (None: a scalar, a 1-D ragged list, a string or a file column)."""
    f = next((f for f in cols.fields if f.name == name), None)
    if f is None or name not in cols.values or np.dtype(f.dtype).kind not in "iuf" or not f.shape:
        return None
    return f.shape[-1]


def rescale_columns(table: str, cols: TableColumns, columns: Sequence[str], originals: np.ndarray,
                    opts: ImageOptions | None, keypoints: Sequence[str], boxes: Sequence[str],
                    not_coordinates: Sequence[str]) -> None:
    """Check the declared coordinate columns; when ``opts`` resizes, rescale them in place (float32) to
    each row's stored image (``originals``: (n, 2) upright H, W) and refuse undeclared look-alikes."""
    check_declared({c: _trailing(cols, c) for c in columns}, keypoints, boxes, not_coordinates,
                   lambda flag, name: f"%({flag}) names {name!r}, which is not a column of {table} "
                                      f"(columns: {', '.join(columns)})",
                   lambda flag, name, need: f"{table}: column {name!r} is given as %({flag}) but is not numeric of "
                                            f"shape {need}")
    if opts is None or not opts.resizes:
        return
    declared = set(keypoints) | set(boxes) | set(not_coordinates)
    for name in cols.values:
        if name in declared:
            continue
        why = looks_like(name, _trailing(cols, name), cols.values[name], originals)
        if why is not None:
            one = repr((name,))  # a tuple in ConvertConfig, the name on the command line
            say = f"%(keypoints={one}), %(boxes={one})" if _trailing(cols, name) == 4 else f"%(keypoints={one})"
            raise DataError(f"{table}: column {name!r} looks like pixel coordinates ({why}) and the images are "
                            f"resized; say what it is: {say} or %(not_coordinates={one})")
    kinds: dict[str, str] = {**{n: "keypoints" for n in keypoints}, **{n: "boxes" for n in boxes}}
    for name, kind in kinds.items():
        cols.values[name] = [rescale(a, kind, o, opts) for a, o in zip(cols.values[name], originals)]
        cols.fields = [make_field(name, FLOAT_DTYPE, f.shape) if f.name == name else f for f in cols.fields]
