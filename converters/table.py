"""Metadata tables (CSV, JSON Lines, Parquet) as sources of fields.

One row per sample. The ``path`` column names the sample's image or ``.npy`` file relative to
the source folder; every other column becomes a field: integers (int64), floats (float32),
booleans, strings (utf8 fields; a ``label`` column of strings becomes class indices), fixed-length
numeric lists (a JSON array in a CSV cell, a list in JSONL/Parquet: keypoints ``(17, 3)``),
variable-length lists (ragged: boxes ``(n, 4)``), and columns of relative paths to other files
(a mask PNG, a ``.npy``), which are read and stored. Types are inferred from the whole column
and can be forced (``--meta-type NAME=DTYPE[:SHAPE]``). Every problem with a row names the
table, the row and the column; ``--skip-bad`` skips such rows and lists them in skipped.json.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from fastdata.errors import DataError, UsageError
from fastdata.format import LABEL_FIELD, FieldSpec, ImageSpec, make_field
from fastdata.format.spec import _NAME_RE, ENCODING_PIXELS, ENCODING_UTF8, KEY_FIELD, SHAPE_DTYPE, SHAPE_SUFFIX

from .image_codec import IMAGE_EXTENSIONS, ImageOptions
from .npy_parse import read_npy_data, read_npy_header

TABLE_SUFFIXES = {".csv": "csv", ".tsv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
PATH_COLUMN = "path"
_FILE_SUFFIXES = tuple(IMAGE_EXTENSIONS) + (".npy",)
_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
           "float64", "bool"}
FLOAT_DTYPE = np.dtype("<f4")
INT_DTYPE = np.dtype("<i8")


def is_table(path: Path) -> bool:
    return path.suffix.lower() in TABLE_SUFFIXES


# --- reading ---------------------------------------------------------------------------------


@dataclass
class Table:
    """A table's raw cells by column; ``csv`` cells are text, the others keep their JSON/Arrow types."""

    path: Path
    kind: str
    columns: dict[str, list[Any]]
    rows: int
    lines: list[int] | None = None  # CSV/JSONL: the file line each row starts on

    def where(self, row: int, column: str | None = None) -> str:
        line = f" (line {self.lines[row]})" if self.lines is not None else ""
        col = f", column {column!r}" if column is not None else ""
        return f"{self.path}: row {row + 1}{line}{col}"


_MISSING = object()


def read_table(path: Path) -> Table:
    """Read a CSV/TSV (header row), JSON Lines or Parquet table."""
    kind = TABLE_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise UsageError(f"{path}: a metadata table must be .csv, .tsv, .jsonl or .parquet")
    if not path.is_file():
        raise UsageError(f"{path}: table not found")
    if kind == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UsageError(f"{path}: Parquet tables need pyarrow: pip install 'fastdata[parquet]'") from None
        try:
            cols = pq.read_table(path).to_pydict()
        except Exception as e:  # pyarrow's ArrowInvalid and friends
            raise DataError(f"{path}: unreadable Parquet table ({type(e).__name__}: {e})") from None
        n = len(next(iter(cols.values()))) if cols else 0
        return Table(path, kind, {k: [_MISSING if v is None else v for v in vs] for k, vs in cols.items()}, n)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read table: {e}") from None
    if kind == "csv":
        reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
        lines = _csv_lines(path, reader)
        if not lines:
            raise DataError(f"{path}: empty table (no header row)")
        header = [h.strip() for h in lines[0][1]]
        if len(set(header)) != len(header):
            raise DataError(f"{path}: duplicate column names in the header {header}")
        columns: dict[str, list[Any]] = {h: [] for h in header}
        body = lines[1:]
        for i, (ln, r) in enumerate(body):
            if len(r) != len(header):
                raise DataError(f"{path}: row {i + 1} (line {ln}): {len(r)} cells, the header has {len(header)}")
            for h, v in zip(header, r):
                columns[h].append(v)
        return Table(path, kind, columns, len(body), [ln for ln, _ in body])
    rows: list[dict[str, Any]] = []
    starts: list[int] = []
    for ln, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: line {ln}: not JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}: line {ln}: each line must be a JSON object")
        rows.append(obj)
        starts.append(ln)
    names: dict[str, None] = {}
    for obj in rows:
        names.update(dict.fromkeys(obj))
    return Table(path, kind, {k: [_MISSING if r.get(k) is None else r[k] for r in rows] for k in names}, len(rows),
                 starts)


def _csv_lines(path: Path, reader: Any) -> list[tuple[int, list[str]]]:
    """Every row of ``reader`` but blank lines, with the line it starts on (a quoted cell may span
    lines); the csv module's errors (a cell over its size limit, a NUL byte) name the line."""
    lines: list[tuple[int, list[str]]] = []
    try:
        end = 0
        for row in reader:
            if row:
                lines.append((end + 1, row))
            end = reader.line_num
    except csv.Error as e:
        big = "field larger than field limit" in str(e)
        fix = (f"; a cell over {csv.field_size_limit()} characters needs a JSON Lines or Parquet table" if big
               else "")
        raise DataError(f"{path}: line {reader.line_num}: not a readable CSV row ({e}){fix}") from None
    return lines


# --- column types ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnType:
    """A forced column type: ``dtype`` a numpy name or ``str``; ``shape`` per sample (a leading
    None: ragged), or None for a scalar."""

    dtype: str
    shape: tuple[int | None, ...] | None = None


def parse_meta_type(text: str) -> tuple[str, ColumnType]:
    """``NAME=DTYPE[:SHAPE]``: ``keypoints=float32:17,3``, ``boxes=float32:n,4``, ``subject=str``."""
    name, sep, spec = text.partition("=")
    dtype, _, shape_text = spec.partition(":")
    if not sep or not name or dtype not in _DTYPES | {"str"}:
        raise UsageError(f"--meta-type {text!r}: expected NAME=DTYPE[:SHAPE] with DTYPE one of "
                         f"{', '.join(sorted(_DTYPES))} or str (e.g. keypoints=float32:17,3 or boxes=float32:n,4)")
    shape: tuple[int | None, ...] | None = None
    if shape_text:
        if dtype == "str":
            raise UsageError(f"--meta-type {text!r}: a str column has no shape")
        dims: list[int | None] = []
        for k, d in enumerate(shape_text.split(",")):
            d = d.strip()
            if k == 0 and d in ("n", "N", "*"):
                dims.append(None)
            elif d.isdigit():
                dims.append(int(d))
            else:
                raise UsageError(f"--meta-type {text!r}: bad shape {shape_text!r} (integers; 'n' first for ragged)")
        shape = tuple(dims)
    return name, ColumnType(dtype, shape)


def _cell(v: Any) -> Any:
    """A CSV cell's value: JSON arrays, booleans, integers, floats, else the text itself."""
    if not isinstance(v, str):
        return v
    t = v.strip()
    if t == "":
        return _MISSING
    if t.startswith("["):
        try:
            return json.loads(t)
        except json.JSONDecodeError:
            return v
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        return v


def _kind(v: Any) -> str:
    if v is _MISSING:
        return "missing"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, np.integer)):
        return "int"
    if isinstance(v, (float, np.floating)):
        return "float"
    if isinstance(v, (list, tuple)):
        return "list"
    if isinstance(v, str):
        return "str"
    return type(v).__name__


@dataclass
class Column:
    """One parsed column: ``kind`` num (fixed arrays), ragged, str, or file (relative paths)."""

    name: str
    kind: str
    dtype: np.dtype | None = None
    shape: tuple[int | None, ...] = ()
    values: list[Any] = field(default_factory=list)  # per row: an array, a str, a path; None where bad


def parse_column(table: Table, name: str, raw: list[Any], forced: ColumnType | None, root: Path,
                 bad: dict[int, str]) -> Column:
    """Type the column (forced or inferred from all its cells) and convert every cell; a cell that
    does not fit puts its row in ``bad`` with a message naming the table, row and column."""
    cells = [_cell(v) if table.kind == "csv" else v for v in raw]
    live = [i for i in range(len(cells)) if i not in bad]

    def fail(i: int, msg: str) -> None:
        bad.setdefault(i, f"{table.where(i, name)}: {msg}")

    if forced is not None and forced.dtype == "str":
        col = Column(name, "str", values=[None] * len(cells))
        for i in live:
            v = raw[i]
            col.values[i] = "" if v is _MISSING else v if isinstance(v, str) else json.dumps(v) if isinstance(v, list) else str(v)
        return col
    kinds = Counter(_kind(cells[i]) for i in live)
    if forced is None:
        numeric = kinds["int"] + kinds["float"] + kinds["bool"]
        if kinds["list"] and kinds["list"] * 2 > len(live):
            return _list_column(table, name, cells, live, None, None, fail)
        if kinds["str"] + kinds["missing"] and numeric * 2 <= len(live):
            return _string_column(table, name, raw, cells, live, root, fail)
        dtype: np.dtype
        if kinds["bool"] == len(live):
            dtype = np.dtype(bool)
        elif kinds["int"] + kinds["bool"] == numeric and not kinds["float"]:
            dtype = INT_DTYPE
        else:
            dtype = FLOAT_DTYPE
        return _scalar_column(name, cells, live, dtype, fail)
    dtype = np.dtype(forced.dtype)
    if forced.shape:
        return _list_column(table, name, cells, live, dtype, forced.shape, fail)
    return _scalar_column(name, cells, live, dtype, fail)


def _scalar(v: Any, dtype: np.dtype) -> Any:
    k = _kind(v)
    if dtype.kind == "b":
        if k != "bool":
            raise ValueError(f"{v!r} is not true/false")
        return v
    if k not in ("int", "float") or (dtype.kind in "iu" and k == "float" and not float(v).is_integer()):
        raise ValueError(f"{'empty cell' if v is _MISSING else repr(v)} is not {'an integer' if dtype.kind in 'iu' else 'a number'}")
    if dtype.kind in "iu":
        iv = int(v)
        info = np.iinfo(dtype)
        if not info.min <= iv <= info.max:
            raise ValueError(f"{iv} does not fit {dtype}")
        return iv
    fv = float(v)
    if math.isfinite(fv) and abs(fv) > float(np.finfo(dtype).max):  # would turn into inf silently
        raise ValueError(f"{v!r} does not fit {dtype} (largest {np.finfo(dtype).max:g})")
    return fv


def _scalar_column(name: str, cells: list[Any], live: list[int], dtype: np.dtype, fail: Any) -> Column:
    col = Column(name, "num", dtype=dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype, shape=(),
                 values=[None] * len(cells))
    for i in live:
        try:
            col.values[i] = np.asarray(_scalar(cells[i], dtype), dtype=col.dtype)
        except ValueError as e:
            fail(i, f"{e} (the column holds {dtype.name} values)")
    return col


def _list_column(table: Table, name: str, cells: list[Any], live: list[int], dtype: np.dtype | None,
                 shape: tuple[int | None, ...] | None, fail: Any) -> Column:
    arrays: dict[int, np.ndarray] = {}
    any_float = False
    for i in live:
        v = cells[i]
        if not isinstance(v, (list, tuple)):
            fail(i, f"{'empty cell' if v is _MISSING else repr(v)} is not a list of numbers")
            continue
        try:
            a = np.array(v)
        except ValueError:
            fail(i, "nested lists of unequal lengths")
            continue
        if a.size and a.dtype.kind not in "biuf":
            fail(i, "the list holds non-numbers")
            continue
        any_float |= a.size > 0 and a.dtype.kind == "f"
        arrays[i] = a
    if dtype is None:
        dtype = FLOAT_DTYPE if any_float else INT_DTYPE
    dtype = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
    if shape is None:  # inferred: one shape for all, or ragged on the first axis
        trailing = Counter(a.shape[1:] for a in arrays.values() if a.size)
        tr = trailing.most_common(1)[0][0] if trailing else ()
        shapes = {a.shape for a in arrays.values()}
        shape = next(iter(shapes)) if len(shapes) == 1 else (None, *tr)
    out = Column(name, "num" if shape[:1] != (None,) else "ragged", dtype=dtype, shape=shape, values=[None] * len(cells))
    for i, a in arrays.items():
        try:
            if shape[:1] == (None,):
                tr = tuple(shape[1:])
                if a.size == 0:
                    a = a.reshape((0, *tr))
                elif a.shape[1:] != tr:
                    if tr and a.ndim == 1 and a.size % math.prod(tr) == 0:  # a flat list of whole rows
                        a = a.reshape((-1, *tr))
                    else:
                        raise ValueError(f"has shape {list(a.shape)}, rows of the column are {list(tr)}")
            elif a.shape != shape:
                if a.size != math.prod(shape):  # type: ignore[arg-type]
                    raise ValueError(f"has {a.size} values (shape {list(a.shape)}), the column's shape "
                                     f"{list(shape)} needs {math.prod(shape)}")  # type: ignore[arg-type]
                a = a.reshape(shape)  # type: ignore[arg-type]
            if dtype.kind in "iu" and a.dtype.kind == "f" and not np.all(np.mod(a, 1) == 0):
                raise ValueError("holds non-integers, the column is integer")
            if dtype.kind in "iu" and a.size and (int(a.min()) < np.iinfo(dtype).min or int(a.max()) > np.iinfo(dtype).max):
                raise ValueError(f"holds a number outside {dtype}'s range")
            if dtype.kind == "f" and a.size and np.any(np.abs(a[np.isfinite(a)]) > np.finfo(dtype).max):
                raise ValueError(f"holds a number too large for {dtype} (largest {np.finfo(dtype).max:g})")
            out.values[i] = np.ascontiguousarray(a, dtype=dtype)
        except (ValueError, OverflowError) as e:
            fail(i, str(e))
    return out


def _string_column(table: Table, name: str, raw: list[Any], cells: list[Any], live: list[int], root: Path,
                   fail: Any) -> Column:
    texts: list[Any] = [None] * len(cells)
    for i in live:
        v = raw[i]
        texts[i] = "" if v is _MISSING else v if isinstance(v, str) else json.dumps(v) if isinstance(v, list) else str(v)
    shown = [texts[i] for i in live]
    if shown and all(t.lower().endswith(_FILE_SUFFIXES) for t in shown):
        col = Column(name, "file", values=[None] * len(cells))
        for i in live:
            try:
                col.values[i] = safe_rel(texts[i], root)
            except ValueError as e:
                fail(i, str(e))
        return col
    return Column(name, "str", values=texts)


def safe_rel(text: str, root: Path) -> str:
    """``text`` as a normalised relative POSIX path of an existing file under ``root``; ValueError if it
    is absolute, escapes ``root`` or names no file."""
    t = text.strip()
    p = PurePosixPath(t.replace("\\", "/"))
    if not t or p.is_absolute() or re.match(r"^[A-Za-z]:", t):
        raise ValueError(f"path {text!r} is not relative to {root}")
    parts = [x for x in p.parts if x not in (".", "")]
    if ".." in parts:
        raise ValueError(f"path {text!r} leads out of {root}")
    rel = "/".join(parts)
    full = root / rel
    real_root = os.path.realpath(root)
    if not os.path.realpath(full).startswith(real_root.rstrip(os.sep) + os.sep):
        raise ValueError(f"path {text!r} leads out of {root} (through a link)")
    if not full.is_file():
        raise ValueError(f"file {rel!r} not found under {root}")
    return rel


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
            assert self.mode is not None
            return [make_field(self.name, "|u1", (None,), encoding=ENCODING_PIXELS, image=ImageSpec(self.mode)),
                    make_field(self.name + SHAPE_SUFFIX, SHAPE_DTYPE, (3,))]
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
            a = _image_pixels(path)
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


def _image_pixels(path: str) -> np.ndarray:
    try:
        with Image.open(path) as im:
            if im.mode not in _PIXEL_MODES:
                raise DataError(f"{path}: image mode {im.mode} (a file column takes 8-bit L, P, 1 or RGB images)")
            return np.asarray(im, dtype=np.uint8)
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise DataError(f"{path}: unreadable image ({type(e).__name__}: {e})") from None


def scan_file_column(table: Table, col: Column, root: Path, rows: list[int], bad: dict[int, str]) -> FileColumn:
    """Look at every file of a file column (image header or .npy header) to learn its shape."""
    rels = [col.values[i] for i in rows]
    image = all(str(r).lower().endswith(tuple(IMAGE_EXTENSIONS)) for r in rels)
    if not image and not all(str(r).lower().endswith(".npy") for r in rels):
        raise DataError(f"{table.path}: column {col.name!r} mixes image and .npy files; one kind per column")
    shapes: list[tuple[int, ...]] = []
    dtypes: Counter[Any] = Counter()
    modes: Counter[str] = Counter()
    info: dict[int, Any] = {}
    for i, rel in zip(rows, rels):
        path = str(root / rel)
        try:
            if image:
                with Image.open(path) as im:
                    if im.mode not in _PIXEL_MODES:
                        raise DataError(f"image mode {im.mode} (a file column takes 8-bit L, P, 1 or RGB images)")
                    pm = _PIXEL_MODES[im.mode]
                    info[i] = (im.height, im.width, 3 if pm == "RGB" else 1), pm
                    modes[pm] += 1
            else:
                h, _ = read_npy_header(path)
                info[i] = h.shape, h.dtype
                dtypes[h.dtype] += 1
        except (DataError, OSError, UnidentifiedImageError) as e:
            bad.setdefault(i, f"{table.where(i, col.name)}: {path}: {e}")
    mode = modes.most_common(1)[0][0] if modes else None
    dtype = dtypes.most_common(1)[0][0] if dtypes else np.dtype(np.uint8)
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
    """The parsed columns of a table for the rows kept: fields, per-row arrays, classes."""

    fields: list[FieldSpec]
    values: dict[str, list[Any]]  # num/ragged: arrays; str: text
    strings: list[str]
    files: list[FileColumn]
    classes: list[str] | None = None
    n: int = 0  # rows (a table may have no column but path)

    def part(self, idx: slice) -> "TableColumns":
        return replace(self, values={k: v[idx] for k, v in self.values.items()},
                       files=[f.part(idx.start, idx.stop) for f in self.files], n=len(range(self.n)[idx]))

    def read(self, root: str, i: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for k, v in self.values.items():
            x = v[i]
            out[k] = np.frombuffer(x.encode("utf-8"), dtype=np.uint8) if k in self.strings else x
        for f in self.files:
            out.update(f.read(root, i))
        return out

    def nbytes(self) -> np.ndarray:
        total = np.zeros(self.n, dtype=np.int64)
        for k, v in self.values.items():
            total += np.array([len(x.encode("utf-8")) if k in self.strings else x.nbytes for x in v], dtype=np.int64)
        for f in self.files:
            total += f.nbytes()
        return total

    def ragged_rows(self, name: str) -> np.ndarray:
        if name in self.strings:
            return np.array([len(x.encode("utf-8")) for x in self.values[name]], dtype=np.int64)
        for f in self.files:
            if f.name == name:
                return f.rows()
        return np.array([len(x) for x in self.values[name]], dtype=np.int64)


def table_columns(table: Table, root: Path, types: dict[str, ColumnType], bad: dict[int, str],
                  reserved: set[str]) -> tuple[dict[str, Column], list[int]]:
    """Parse every column but ``path``; returns the columns and the rows not bad so far."""
    unknown = sorted(set(types) - set(table.columns))
    if unknown:
        raise UsageError(f"--meta-type names {unknown[0]!r}, which is not a column of {table.path} "
                         f"(columns: {', '.join(table.columns)})")
    cols: dict[str, Column] = {}
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
    return cols, [i for i in range(table.rows) if i not in bad]


def finish_columns(table: Table, cols: dict[str, Column], rows: list[int], root: Path,
                   bad: dict[int, str]) -> TableColumns:
    """Fields and per-row values of the columns, for ``rows`` (file columns scanned here, which may
    find more bad rows: call again with the rows left if it did)."""
    fields: list[FieldSpec] = []
    values: dict[str, list[Any]] = {}
    strings: list[str] = []
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
            values[name] = [c.values[i] for i in rows]
            strings.append(name)
            fields.append(make_field(name, "|u1", (None,), encoding=ENCODING_UTF8))
        else:
            assert c.dtype is not None
            values[name] = [c.values[i] for i in rows]
            fields.append(make_field(name, c.dtype, c.shape))
    return TableColumns(fields, values, strings, files, classes, len(rows))


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

    @property
    def root(self) -> str:
        return str(self.main.root)

    @property
    def rels(self) -> list[str]:
        """Every file read (for the journal's fingerprint): the samples', the file columns' and the
        table itself (absolute, so joining it to the root keeps it)."""
        return list(self.main.rels) + [r for f in self.cols.files for r in f.rels] + [os.path.abspath(self.table_path)]

    @property
    def labels(self) -> np.ndarray | None:  # for the journal's fingerprint: the class folders' labels
        return self.main.labels

    def __len__(self) -> int:
        return len(self.main)

    @property
    def bytes_in(self) -> int:
        extra = sum(os.path.getsize(os.path.join(self.root, r)) for f in self.cols.files for r in f.rels)
        return int(self.main.bytes_in) + extra

    def sample_nbytes(self) -> np.ndarray:
        return self.main.sample_nbytes() + self.cols.nbytes()

    def ragged_rows(self, name: str) -> np.ndarray:
        if any(f.name == name for f in self.main.fields):
            return self.main.ragged_rows(name)
        return self.cols.ragged_rows(name)

    def part(self, start: int, stop: int) -> "TableSource":
        return replace(self, main=self.main.part(start, stop), cols=self.cols.part(slice(start, stop)), skipped=[])

    def read(self, i: int) -> dict[str, np.ndarray]:
        sample = self.main.read(i)
        sample.update(self.cols.read(self.root, i))
        return sample

    def sample_keys(self) -> list[str]:
        return list(self.main.rels)

    def describe(self) -> dict[str, Any]:
        return {**self.main.describe(), "kind": self.kind, "table": os.path.abspath(self.table_path),
                "skipped": len(self.skipped)}


def scan_table(table_path: Path, root: Path, *, types: dict[str, ColumnType], images: ImageOptions | None,
               skip_bad: bool, strict: bool, check_unlisted: bool, workers: int | None, progress: Any,
               no_labels: bool = False) -> TableSource:
    """Read and check a table and every file it names; build the source. Bad rows raise (the
    first, naming table, row and column) unless ``skip_bad``. Class folders give ``label`` as for
    a folder source unless the table has a ``label`` column or ``no_labels``."""
    from .image_folder import ImageFolderSource, is_image_file
    from .npy_folder import NpyFolderSource
    from .scan import drop_non_samples, refuse_bad, walk_files

    table = read_table(table_path)
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
    rows = [i for i in range(table.rows) if i not in bad]
    is_img = [is_image_file(paths[i]) for i in rows]
    if any(is_img) and not all(is_img):
        first = rows[is_img.index(False)]
        raise DataError(f"{table.where(first, PATH_COLUMN)}: {paths[first]!r} is not an image, other rows name "
                        "images; a table's path column names one kind of file")
    image_kind = bool(is_img) and all(is_img)
    reserved = {"image", "image_shape", "image_codec"} if image_kind else {"x"}
    cols, _ = table_columns(table, root, types, bad, reserved)
    rows = [i for i in range(table.rows) if i not in bad]
    finish_columns(table, cols, rows, root, bad)  # scans file columns: may find bad rows
    rows = [i for i in range(table.rows) if i not in bad]

    skipped_rows = refuse_bad({_row_key(table, i, paths): msg for i, msg in bad.items()}, skip_bad)
    if check_unlisted:
        listed = set(paths[i] for i in range(table.rows) if paths[i]) | {
            c.values[i] for c in cols.values() if c.kind == "file" for i in range(table.rows) if c.values[i]}
        ours = {os.path.realpath(table_path)}
        others = [r for r in walk_files(root, ours) if r not in listed]
        unlisted = drop_non_samples(root, others, lambda r: _is_sample(r, image_kind), strict)
        if unlisted:
            msg = {r: f"{root / r}: a sample file that {table_path} does not list (add a row for it, or move it)"
                   for r in unlisted}
            skipped_rows += refuse_bad(msg, skip_bad)
    if not rows:
        raise DataError(f"{table_path}: no usable rows (all {table.rows} are bad)")
    rels = [paths[i] for i in rows]
    folders = not no_labels and LABEL_FIELD not in table.columns and _class_folders(table, root, rels)
    if image_kind:
        main: Any = ImageFolderSource.scan(root, images or ImageOptions(), no_labels=not folders, skip_bad=skip_bad,
                                           workers=workers, progress=progress, rels=rels)
    else:
        if images is not None:
            raise UsageError(f"{table_path}: image options given, but the path column names no images")
        main = NpyFolderSource.scan(root, no_labels=not folders, skip_bad=skip_bad, rels=rels)
    row_of = {paths[i]: i for i in rows}
    kept = [row_of[r] for r in main.rels]
    final = finish_columns(table, cols, kept, root, {})
    return TableSource(main=main, cols=final, table_path=str(table_path),
                       skipped=sorted(skipped_rows) + list(main.skipped))


def _class_folders(table: Table, root: Path, rels: list[str]) -> bool:
    """Whether the table's paths lie in class folders (every path in a sub-folder of ``root``, two
    sub-folders at least: one folder, ``images/``, is a layout, not a class), as in a folder source;
    paths both directly in ``root`` and in sub-folders are refused, as there."""
    flat = [r for r in rels if "/" not in r]
    if len(flat) == len(rels) or len({r.split("/", 1)[0] for r in rels}) < 2:
        return False
    if flat:
        raise DataError(f"{table.path}: path {flat[0]!r} lies directly in {root} while other rows name files in "
                        "sub-folders, whose names would be the classes (field 'label'); pass --no-labels for no "
                        "labels from folders, or add a 'label' column to the table")
    return True


def _row_key(table: Table, i: int, paths: list[Any]) -> str:
    """How skipped.json names a bad row: its path when it has one, else the table row."""
    return paths[i] if paths[i] else f"{table.path.name}:row {i + 1}"


def _is_sample(rel: str, image_kind: bool) -> bool:
    low = rel.lower()
    return low.endswith(tuple(IMAGE_EXTENSIONS)) if image_kind else low.endswith((".npy", ".npz"))
