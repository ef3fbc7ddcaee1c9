"""Finding source files and their labels (class folders, CSV/JSON label files), and what the folder sources
share. Hidden files are ignored; symlinks are followed, each real directory at most once."""

from __future__ import annotations

import csv
import itertools
import json
import logging
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Self

import numpy as np

from fastdata.errors import DataError, UsageError
from fastdata.format import LABEL_FIELD, FieldSpec, make_field
from fastdata.world import usable_cpus
from fastdata.write.engine import mp_context

if TYPE_CHECKING:
    from fastdata.converters.config import ConvertConfig
    from fastdata.write import Progress

LABEL_DTYPE = np.dtype("<i8")
_INT64 = np.iinfo(LABEL_DTYPE)
log = logging.getLogger("fastdata.convert")


def drop_non_samples(root: Path, rels: list[str], is_sample: Any, strict: bool) -> list[str]:
    """The sample files of ``rels``; the others (README, CSV, JSON, Thumbs.db, ...) are skipped with
    one line saying how many and naming a few, or are an error with ``strict``."""
    keep = [r for r in rels if is_sample(r)]
    other = [r for r in rels if not is_sample(r)]
    if other:
        few = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
        if strict:
            raise DataError(f"{root / other[0]}: not a sample file ({len(other)} such file(s) in {root}: {few}); "
                            "without %(strict=True) they are skipped")
        log.warning("%s: skipped %d file(s) that are not samples: %s (--strict makes this an error)",
                    root, len(other), few)
    return keep


def map_tasks(fn: Callable[..., list[Any]], tasks: list[tuple[Any, ...]], workers: int | None,
              progress: "Progress | None", nbytes: Callable[[list[Any]], int]) -> list[Any]:
    """``fn(*task)`` of every task, the result lists joined in order, on up to ``workers`` processes (None: one per
    CPU; one: in this process); ``progress`` counts each task's results and their ``nbytes``."""
    workers = min(workers or usable_cpus(), len(tasks))
    ex = ProcessPoolExecutor(workers, mp_context()) if workers > 1 else None
    results: list[Any] = []
    try:
        for r in ex.map(fn, *zip(*tasks)) if ex is not None else itertools.starmap(fn, tasks):
            results += r
            if progress is not None:
                progress.update(len(r), nbytes(r))
    finally:
        if ex is not None:
            ex.shutdown(cancel_futures=True)
    return results


def walk_files(root: Path, exclude: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    """Relative POSIX paths of every non-hidden file under ``root``, sorted."""
    found: list[str] = []
    seen: set[str] = set()

    def visit(path: str, rel: str) -> None:
        real = os.path.realpath(path)
        if real in seen:
            return  # a symlink loop or a second link to the same folder
        seen.add(real)
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except OSError as err:
            raise DataError(f"{path}: cannot list folder: {err.strerror or err}") from None
        for ent in entries:
            if ent.name.startswith("."):
                continue
            try:  # a sample's key is its path as UTF-8 text: a name that is not UTF-8 cannot be one
                ent.path.encode("utf-8")
            except UnicodeEncodeError:
                shown = os.fsencode(ent.path).decode("utf-8", "backslashreplace")
                raise DataError(f"{shown}: the file name is not valid UTF-8 (sample keys are UTF-8 text); "
                                "rename it") from None
            r = f"{rel}/{ent.name}" if rel else ent.name
            try:
                if ent.is_dir(follow_symlinks=True):
                    visit(ent.path, r)
                elif ent.is_file(follow_symlinks=True):
                    if os.path.realpath(ent.path) not in exclude:
                        found.append(r)
                elif ent.is_symlink():
                    raise DataError(f"{ent.path}: broken symlink")
            except OSError as err:
                raise DataError(f"{ent.path}: cannot read: {err.strerror or err}") from None

    visit(str(root), "")
    found.sort()
    return found


@dataclass
class Labels:
    """A label per relative path (an integer, or a float or vector: regression targets), and the
    class names when labels came from names."""

    by_path: dict[str, Any] | None = None  # None: the dataset has no labels
    classes: list[str] | None = None
    kind: str = "none"  # "folders" | "file" | "none" (a table's 'label' column: "table", TableSource.describe)
    dtype: np.dtype = LABEL_DTYPE
    shape: tuple[int, ...] = ()
    file: Path | None = None  # the labels file they came from

    def of(self, rels: list[str]) -> np.ndarray | None:
        """The label of each of ``rels``, or None when the dataset has no labels."""
        if self.by_path is None:
            return None
        return np.array([self.by_path[r] for r in rels], dtype=self.dtype).reshape(len(rels), *self.shape)


def folder_labels(paths: list[str], root: Path) -> Labels:
    """Labels from the first path component (``root/<class>/...``), classes sorted by name."""
    flat = [p for p in paths if "/" not in p]
    if len(flat) == len(paths):
        return Labels()
    if flat:
        raise DataError(
            f"{root}: mixed layout: {root / flat[0]} lies directly in the folder while other files are in "
            "class sub-folders; move it into a class folder, or pass %(no_labels=True) or %(labels=FILE)"
        )
    classes = sorted({p.split("/", 1)[0] for p in paths})
    index = {c: i for i, c in enumerate(classes)}
    return Labels({p: index[p.split("/", 1)[0]] for p in paths}, classes, "folders")


def file_labels(path: Path, columns: tuple[str, str] | None = None, allow_nan: bool = False) -> Labels:
    """``relative_path,label`` pairs from CSV or JSON (``columns``: the path and label columns; default: by name);
    string labels become indices into the sorted class names; NaN or infinite is refused unless ``allow_nan``."""
    suffix = path.suffix.lower()
    if suffix not in (".json", ".csv", ".txt", ".tsv"):
        also = (f"; a .npy of labels goes with a single-array source (fastdata convert X.npy DST --labels "
                f"{path.name})") if suffix == ".npy" else ""
        raise UsageError(f"{path}: a folder source takes %(labels) as a CSV of relative_path,label lines or a JSON "
                         f"object of path: label{also}")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read labels file ({e}); a folder source takes %(labels) as a UTF-8 CSV "
                         "of relative_path,label lines (or a JSON object of path: label)") from None
    pairs = _json_pairs(path, text, columns) if suffix == ".json" else _csv_pairs(path, text, columns)
    if not pairs:
        raise DataError(f"{path}: labels file is empty")
    raw: dict[str, str] = {}
    for rel, label in pairs:
        key = Path(rel).as_posix()  # normalises "./a//b" to "a/b"
        if key in raw and raw[key] != label:
            raise DataError(f"{path}: {rel!r} is listed twice with different labels")
        raw[key] = label
    empty = next((k for k, v in raw.items() if not v.strip()), None)
    if empty is not None:  # a missing label, never a class named ''
        raise DataError(f"{path}: the row for {empty!r} has an empty label (every sample file needs one)")
    try:
        ints = {k: int(v) for k, v in raw.items()}
    except ValueError:
        typed = _typed_labels(path, raw, allow_nan)
        if typed is not None:
            return typed
        classes = sorted(set(raw.values()))
        index = {c: i for i, c in enumerate(classes)}
        return Labels({k: index[v] for k, v in raw.items()}, classes, "file", file=path)
    big = next((k for k, v in ints.items() if not _INT64.min <= v <= _INT64.max), None)
    if big is not None:
        raise DataError(f"{path}: label {raw[big]!r} of {big!r} does not fit a 64-bit integer")
    return Labels(ints, None, "file", file=path)


def _typed_labels(path: Path, raw: dict[str, str], allow_nan: bool) -> Labels | None:
    """Float labels (float32) or fixed-length numeric vectors (JSON arrays); None if the labels are
    names. A labels file mixing numbers and names, or vectors of several lengths, is an error."""
    vals: dict[str, Any] = {}
    for k, v in raw.items():
        t = v.strip()
        try:
            vals[k] = np.asarray(json.loads(t) if t.startswith("[") else float(t), dtype=np.float64)
        except (ValueError, json.JSONDecodeError):
            if vals:
                raise DataError(f"{path}: label {v!r} of {k!r} is not a number, other labels are") from None
            return None
    shapes = {a.shape for a in vals.values()}
    if len(shapes) != 1:
        raise DataError(f"{path}: labels have several shapes {sorted(map(list, shapes))}; vector labels need one length")
    if not allow_nan:
        keys = sorted(vals)
        check_finite(np.stack([vals[k] for k in keys]), lambda i: f"{path}: the row for {keys[i]!r}")
    shape = shapes.pop()
    return Labels({k: a.astype(np.float32) for k, a in vals.items()}, None, "file", np.dtype("<f4"), shape, path)


PATH_HEADERS = ("path", "relative_path", "file", "filename", "file_name", "name")  # a labels file's path column


def _csv_pairs(path: Path, text: str, columns: tuple[str, str] | None = None) -> list[tuple[str, str]]:
    delim = "\t" if path.suffix.lower() == ".tsv" else ","
    rows = [r for r in csv.reader(text.splitlines(), delimiter=delim) if r and any(c.strip() for c in r)]
    header = [c.strip() for c in rows[0]] if rows else []
    if columns is not None:
        missing = [c for c in columns if c not in header]
        if missing:
            raise DataError(f"{path}: no column {missing[0]!r} in the header {header} (%(labels_columns) names the "
                            "path and label columns)")
        p, lab = header.index(columns[0]), header.index(columns[1])
        for n, r in enumerate(rows[1:], 2):
            if len(r) != len(header):
                raise DataError(f"{path}: row {n}: {len(r)} cells, the header has {len(header)}")
        return [(r[p].strip(), r[lab].strip()) for r in rows[1:]]
    if len(header) == 2 and header[0].lower() in PATH_HEADERS and header[1].lower() == "label":
        rows = rows[1:]
    out = []
    for n, r in enumerate(rows, 1):
        if len(r) != 2:
            raise DataError(f"{path}: line {n}: expected 'relative_path,label', got {len(r)} columns (name the "
                            "columns of a wider file with %(labels_columns=PATH,LABEL))")
        out.append((r[0].strip(), r[1].strip()))
    return out


def _json_pairs(path: Path, text: str, columns: tuple[str, str] | None = None) -> list[tuple[str, str]]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: invalid JSON ({e})") from None
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, list):
        items = []
        keys = columns or ("path", "label")
        for item in obj:
            if isinstance(item, dict) and columns is None and keys[0] not in item:
                keys = (next((k for k in PATH_HEADERS if k in item), keys[0]), keys[1])
            if isinstance(item, dict) and keys[0] in item and keys[1] in item:
                items.append((item[keys[0]], item[keys[1]]))
            elif isinstance(item, list) and len(item) == 2:
                items.append((item[0], item[1]))
            else:
                raise DataError(f"{path}: entries must be [path, label] or {{{keys[0]!r}:..., {keys[1]!r}:...}}")
    else:
        raise DataError(f"{path}: expected an object or a list")
    out = []
    for p, label in items:
        if isinstance(label, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in label):
            label = json.dumps(label)
        if not isinstance(p, str) or isinstance(label, bool) or not isinstance(label, (int, float, str)):
            raise DataError(f"{path}: bad entry {p!r}: {label!r} (paths are strings, labels numbers, lists of "
                            "numbers or strings)")
        out.append((p, str(label)))
    return out


def find_labels(root: Path, files: list[str], is_sample: Callable[[str], bool], expected: str,
                labels_file: Path | None, config: "ConvertConfig") -> tuple[list[str], Labels]:
    """The sample files of ``files`` under ``root`` (:func:`drop_non_samples`) and where their labels come from:
    ``labels_file`` (its ``config.labels_columns``), nothing (``config.no_labels``), or the class folders."""
    rels = drop_non_samples(root, files, is_sample, config.strict)
    if not rels:
        raise DataError(f"{root}: no files found (expected {expected})")
    if labels_file is not None:
        return rels, file_labels(labels_file, config.labels_columns, config.allow_nan)
    return rels, Labels() if config.no_labels else folder_labels(rels, root)


def check_labelled(root: Path, rels: list[str], labels: Labels, bad: dict[str, str]) -> None:
    """Mark as bad every file not bad already that the labels file has no label for; refuse a
    labels file that lists a file not under ``root``."""
    if labels.by_path is None:
        return
    for rel in rels:
        if rel not in bad and rel not in labels.by_path:
            bad[rel] = f"{root / rel}: no label for it in {labels.file}"
    missing = sorted(set(labels.by_path) - set(rels))
    if missing:
        raise DataError(f"{labels.file}: lists {missing[0]!r}, which is not a file under {root}")


def refuse_bad(bad: dict[str, str], skip_bad: bool) -> list[tuple[str, str]]:
    """Raise for the first bad file (by path) unless ``skip_bad``; returns the skipped files, sorted."""
    if bad and not skip_bad:
        first = min(bad)
        more = f" ({len(bad) - 1} more bad file(s); %(skip_bad=True) skips them and lists them in skipped.json)" if len(bad) > 1 else ""
        raise DataError(bad[first] + more)
    return sorted(bad.items())


def check_finite_rows(rows: list[np.ndarray], where: Any) -> None:
    """``check_finite`` for per-row arrays of any shapes (a table column, fixed or ragged)."""
    if np.asarray(rows[0]).dtype.kind not in "fc":
        return
    flat = np.concatenate([np.asarray(r).reshape(-1) for r in rows])
    bad = np.flatnonzero(~np.isfinite(flat))
    if len(bad):
        i = int(np.searchsorted(np.cumsum([np.asarray(r).size for r in rows]), bad[0], side="right"))
        check_finite(np.asarray(rows[i])[None], lambda _: where(i))


def check_finite(values: np.ndarray, where: Any) -> None:
    """Refuse a NaN or infinite label of ``values`` (one row each), naming it by ``where(row)``."""
    if values.dtype.kind not in "fc" or not len(values):
        return
    ok = np.isfinite(values.reshape(len(values), -1)).all(axis=1)
    if not ok.all():
        i = int(np.argmin(ok))
        raise DataError(f"{where(i)}: label {np.asarray(values[i]).tolist()!r} is not a finite number; pass "
                        "%(allow_nan=True) to keep NaN and infinite labels")


@dataclass(kw_only=True)
class FolderSource:
    """What the folder sources share: sample ``i`` is the file ``root/rels[i]``, labelled ``labels[i]``.
    ``part`` slices ``rels``, ``labels`` and the per-sample columns a subclass names in ``COLUMNS``."""

    COLUMNS: ClassVar[tuple[str, ...]] = ()
    root: str
    rels: list[str]
    labels: np.ndarray | None
    fields: list[FieldSpec]
    classes: list[str] | None
    skipped: list[tuple[str, str]] = field(default_factory=list)
    label_kind: str = "none"
    kind: str

    @classmethod
    def labelled_source(cls, root: Path, rels: list[str], labels: Labels, fields: list[FieldSpec],
                        skipped: list[tuple[str, str]], **columns: Any) -> Self:
        """The source of the usable files ``rels``: ``fields``, then the labels' field when there are labels."""
        values = labels.of(rels)
        label = [] if values is None else [make_field(LABEL_FIELD, values.dtype, values.shape[1:])]
        return cls(root=str(root), rels=rels, labels=values, fields=fields + label, classes=labels.classes,
                   skipped=skipped, label_kind=labels.kind, **columns)

    def __len__(self) -> int:
        return len(self.rels)

    def part(self, start: int, stop: int) -> Any:
        s = slice(start, stop)
        columns = {k: getattr(self, k)[s] for k in ("rels", "labels", *self.COLUMNS) if getattr(self, k) is not None}
        return replace(self, skipped=[], **columns)

    def sample_keys(self) -> list[str] | None:
        """Each sample's key: its path relative to the source folder."""
        return list(self.rels)

    def labelled(self, sample: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
        """``sample`` with sample ``i``'s label added, when the dataset has labels."""
        if self.labels is not None:
            sample[LABEL_FIELD] = np.array(self.labels[i], order="C")
        return sample

    def inputs(self) -> tuple[list[str], list[np.ndarray]]:
        return [os.path.join(self.root, r) for r in self.rels], [] if self.labels is None else [self.labels]

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": os.path.abspath(self.root), "labels": self.label_kind,
                "files": len(self.rels), "skipped": len(self.skipped)}
