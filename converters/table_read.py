"""Reading metadata tables (CSV/TSV, JSON Lines, JSON, Parquet) into columns, one row per sample, and typing each
column, inferred from the whole column or forced (``ColumnType``): scalars, fixed and ragged lists, strings and
relative paths to files. Every problem names the table, the row (and line) and the column."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from fastdata.errors import DataError, UsageError
from fastdata.format.manifest import IMAGE_SUFFIXES, TABLE_SUFFIXES
from fastdata.format.spec import MAX_FIELDS

PATH_COLUMN = "path"


def is_table(path: Path) -> bool:
    return path.suffix.lower() in TABLE_SUFFIXES


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
    """Read a CSV/TSV (header row), JSON Lines, JSON (an array of records, or an object of records
    keyed by path) or Parquet table."""
    kind = TABLE_SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise UsageError(f"{path}: a metadata table must be .csv, .tsv, .jsonl, .json or .parquet")
    if not path.is_file():
        raise UsageError(f"{path}: table not found")
    if kind == "parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UsageError(f"{path}: Parquet tables need pyarrow: pip install 'fastdata[parquet]'") from None
        try:
            width = len(pq.read_schema(path).names)
            cols = pq.read_table(path).to_pydict() if width <= MAX_FIELDS + 1 else {}
        except Exception as e:  # pyarrow's ArrowInvalid and friends
            raise DataError(f"{path}: unreadable Parquet table ({type(e).__name__}: {e})") from None
        _check_width(path, width)
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
        _check_width(path, len(header))
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
    if kind == "json":
        records = _json_records(path, text)
        return Table(path, kind, _by_column(records), len(records))
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
    return Table(path, kind, _by_column(rows), len(rows), starts)


def _by_column(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Records as columns (every key of any record; a missing or null value is _MISSING)."""
    names: dict[str, None] = {}
    for obj in rows:
        names.update(dict.fromkeys(obj))
    return {k: [_MISSING if r.get(k) is None else r[k] for r in rows] for k in names}


def _json_records(path: Path, text: str) -> list[dict[str, Any]]:
    """A JSON table: an array of records, or an object mapping each path to its record (the key is
    the ``path`` column; a record's own ``path``, if any, must agree)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not JSON (line {e.lineno}: {e.msg})") from None
    if isinstance(obj, dict):
        records = []
        for key, rec in obj.items():
            if not isinstance(rec, dict):
                raise DataError(f"{path}: entry {key!r} is a {type(rec).__name__}; a JSON table is an array of records "
                                f"or an object of records keyed by {PATH_COLUMN}")
            if rec.get(PATH_COLUMN, key) != key:
                raise DataError(f"{path}: entry {key!r} has {PATH_COLUMN} {rec[PATH_COLUMN]!r}; give one or make them agree")
            records.append({PATH_COLUMN: key, **rec})
        return records
    if not isinstance(obj, list) or not all(isinstance(r, dict) for r in obj):
        bad = next((k for k, r in enumerate(obj) if not isinstance(r, dict)), 0) if isinstance(obj, list) else None
        where = f"item {bad + 1} is not an object" if bad is not None else f"a {type(obj).__name__}"
        raise DataError(f"{path}: {where}; a JSON table is an array of records (objects) or an object of records "
                        f"keyed by {PATH_COLUMN}")
    return obj


def _check_width(path: Path, columns: int) -> None:
    """A table of more columns than a dataset may have fields is refused before its cells are parsed."""
    if columns > MAX_FIELDS + 1:  # + the path column, which is no field
        raise DataError(f"{path}: {columns} columns, over the limit of {MAX_FIELDS} fields a dataset may have "
                        "(plus the path column)")


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


_FILE_SUFFIXES = tuple(IMAGE_SUFFIXES) + (".npy",)
_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
           "float64", "bool"}
FLOAT_DTYPE = np.dtype("<f4")
INT_DTYPE = np.dtype("<i8")


@dataclass(frozen=True)
class ColumnType:
    """A forced column type: ``dtype`` a numpy name or ``str``; ``shape`` per sample (a leading
    None: ragged), or None for a scalar."""

    dtype: str
    shape: tuple[int | None, ...] | None = None


def parse_meta_type(text: str) -> tuple[str, ColumnType]:
    """``NAME=DTYPE[:SHAPE]``: ``keypoints=float32:17,3``, ``boxes=float32:n,4``, ``subject=str``: the text of
    the CLI's ``--meta-type`` flag, which its errors name (from Python, give ``ColumnType`` values)."""
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
    for number in (int, float):
        try:
            return number(t)
        except ValueError:
            pass
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
class TypedColumn:
    """One parsed column: ``kind`` num (fixed arrays), ragged, str, or file (relative paths)."""

    name: str
    kind: str
    dtype: np.dtype | None = None
    shape: tuple[int | None, ...] = ()
    values: list[Any] = field(default_factory=list)  # per row: an array, a str, a path; None where bad


def parse_column(table: Table, name: str, raw: list[Any], forced: ColumnType | None, root: Path,
                 bad: dict[int, str]) -> TypedColumn:
    """Type the column (forced or inferred from all its cells) and convert every cell; a cell that
    does not fit puts its row in ``bad`` with a message naming the table, row and column."""
    cells = [_cell(v) if table.kind == "csv" else v for v in raw]
    live = [i for i in range(len(cells)) if i not in bad]

    def fail(i: int, msg: str) -> None:
        bad.setdefault(i, f"{table.where(i, name)}: {msg}")

    def texts() -> list[Any]:  # each cell as text (None where the row is bad): a str column's values
        return [None if i in bad else "" if v is _MISSING else v if isinstance(v, str) else json.dumps(v)
                if isinstance(v, list) else str(v) for i, v in enumerate(raw)]

    if forced is not None and forced.dtype == "str":
        return TypedColumn(name, "str", values=texts())
    kinds = Counter(_kind(cells[i]) for i in live)
    if forced is None:
        numeric = kinds["int"] + kinds["float"] + kinds["bool"]
        if kinds["list"] and kinds["list"] * 2 > len(live):
            return _list_column(name, cells, live, None, None, fail)
        if kinds["str"] + kinds["missing"] and numeric * 2 <= len(live):
            return _string_column(name, texts(), live, root, fail)
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
        return _list_column(name, cells, live, dtype, forced.shape, fail)
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


def _scalar_column(name: str, cells: list[Any], live: list[int], dtype: np.dtype, fail: Any) -> TypedColumn:
    col = TypedColumn(name, "num", dtype=dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype, shape=(),
                 values=[None] * len(cells))
    for i in live:
        try:
            col.values[i] = np.asarray(_scalar(cells[i], dtype), dtype=col.dtype)
        except ValueError as e:
            fail(i, f"{e} (the column holds {dtype.name} values)")
    return col


def _list_column(name: str, cells: list[Any], live: list[int], dtype: np.dtype | None,
                 shape: tuple[int | None, ...] | None, fail: Any) -> TypedColumn:
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
    out = TypedColumn(name, "num" if shape[:1] != (None,) else "ragged", dtype=dtype, shape=shape, values=[None] * len(cells))
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


def _string_column(name: str, texts: list[Any], live: list[int], root: Path, fail: Any) -> TypedColumn:
    """A column of text, or of files when every cell names one (a relative path under ``root``)."""
    if live and all(texts[i].lower().endswith(_FILE_SUFFIXES) for i in live):
        col = TypedColumn(name, "file", values=[None] * len(texts))
        for i in live:
            try:
                col.values[i] = safe_rel(texts[i], root)
            except ValueError as e:
                fail(i, str(e))
        return col
    return TypedColumn(name, "str", values=texts)


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
