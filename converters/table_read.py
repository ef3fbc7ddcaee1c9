"""Reading metadata tables (CSV/TSV, JSON Lines, JSON, Parquet) into columns of Python values, one row per
sample; every problem names the table, the row (and line) and the column."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastdata.errors import DataError, UsageError
from fastdata.format.manifest import TABLE_SUFFIXES
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
