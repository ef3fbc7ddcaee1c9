"""Every element a script's ``__getitem__`` returns, matched against the sample's file, the rows of the tables the
script opened and the class folder, so the printed fix keeps it; what matches none is left out, with why."""

from __future__ import annotations

import json
import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from fastdata.format.manifest import TABLE_SUFFIXES

_TABLES = tuple(TABLE_SUFFIXES)  # what fastdata convert reads as a table

_sinks: list[tuple[list[str], bool]] = []  # (paths, tables only)
_SKIP = (".py", ".pyc", ".so", ".pth")  # imports, not data
_lock = threading.Lock()
_hooked = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not _sinks or not args or not isinstance(args[0], (str, os.PathLike)):
        return
    path = os.path.abspath(os.fspath(args[0]))
    if path.endswith(_SKIP) or path.startswith(("/proc/", "/sys/", "/dev/")):
        return
    table = path.lower().endswith(_TABLES)
    for sink, tables_only in list(_sinks):
        if (table or not tables_only) and path not in sink and len(sink) < 256:
            sink.append(path)


@contextmanager
def opened(tables_only: bool = False) -> Iterator[list[str]]:
    """The absolute paths of the files (``tables_only``: the tables) opened by ``open``, in any thread of
    this process, inside the block."""
    global _hooked
    with _lock:
        if not _hooked:  # an audit hook cannot be removed: it does nothing while no block is open
            sys.addaudithook(_audit)
            _hooked = True
    entry: tuple[list[str], bool] = ([], tables_only)
    _sinks.append(entry)
    try:
        yield entry[0]
    finally:
        _sinks.remove(entry)


def is_table(path: str) -> bool:
    return path.lower().endswith(_TABLES) and os.path.isfile(path)


def tables_of(dataset: Any, seen: list[str]) -> list[str]:
    """Tables the script opened, and those named by the dataset's own attributes (a path kept for later)."""
    found = [p for p in seen if is_table(p)]
    for v in list(getattr(dataset, "__dict__", {}).values()):
        if isinstance(v, (str, os.PathLike)) and is_table(os.path.abspath(os.fspath(v))):
            found.append(os.path.abspath(os.fspath(v)))
    return list(dict.fromkeys(found))


def image_hw(shape: Any) -> tuple[int, int] | None:
    """(H, W) of a shape that may be an image: CHW or HWC with 1, 3 or 4 channels (one reading only) and
    sides of at least 8; None otherwise."""
    if len(shape) != 3:
        return None
    chw, hwc = shape[0] in (1, 3, 4), shape[2] in (1, 3, 4)
    hw = (int(shape[1]), int(shape[2])) if chw else (int(shape[0]), int(shape[1]))
    return hw if chw != hwc and min(hw) >= 8 else None


# -- tables --------------------------------------------------------------------------------------------
def _cell(v: Any) -> Any:
    """A table cell as a number, an array of numbers, text, a bool, or None (missing, or anything else)."""
    if isinstance(v, str):
        s = v.strip()
        try:
            v = json.loads(s) if s[:1] == "[" else float(s)
        except ValueError:
            return s
    if isinstance(v, (list, tuple)):
        try:
            return np.asarray(v, dtype=np.float64)
        except (TypeError, ValueError):
            return None
    if isinstance(v, bool):
        return v
    return float(v) if isinstance(v, (int, float, np.number)) else None


def _index(rows: list[dict[str, Any]], files: list[str]) -> tuple[str, str, list[dict[str, Any]]] | None:
    """(path column, the folder its paths are relative to, each file's row) when one column names every file."""
    for col in rows[0] if rows else []:
        by = {v: r for r in rows if isinstance(v := r.get(col), str) and v}
        if not by:
            continue
        root, picked = None, []
        for f in files:
            hit = next(((f[:-len(v)].rstrip(os.sep) or os.sep, r) for v, r in by.items()
                        if os.path.isabs(v) and f == v or f.endswith(os.sep + v.replace("/", os.sep))), None)
            if hit is None or (root is not None and hit[0] != root and not os.path.isabs(next(iter(by)))):
                break
            root = hit[0]
            picked.append(hit[1])
        if root is not None and len(picked) == len(files):
            return col, root, picked
    return None


# -- matching values -------------------------------------------------------------------------------------
def _signs(draws: list[tuple[np.ndarray, Any]]) -> list[int] | None:
    """Per element: -1 where some draw negated it (a flip rule), 1 otherwise; None when the values differ."""
    flips: np.ndarray | None = None
    for a, c in draws:
        if isinstance(c, str) or c is None:
            return None
        c = np.asarray(c, dtype=np.float64).ravel()
        a = a.ravel().astype(np.float64)
        if c.size != a.size or not np.allclose(np.abs(a), np.abs(c), rtol=1e-4, atol=1e-4):
            return None
        neg = (np.abs(c) > 1e-6) & (np.sign(a) == -np.sign(c))
        flips = neg if flips is None else flips | neg
    return None if flips is None else [-1 if f else 1 for f in flips]


def _values(flat: list[tuple[np.ndarray, dict[str, Any]]], columns: list[str]) -> dict[str, Any] | None:
    """A field of numbers (each draw's (value, row)) as one column or one column per element."""
    a0 = flat[0][0]
    if a0.size > 64:
        return None
    for c in columns:
        s = _signs([(a, row.get(c)) for a, row in flat])
        if s is not None:
            return {"columns": [c], "signs": s}
    if a0.size == 1:
        return None
    picked, signs = [], []
    for j in range(a0.size):
        hit = next(((c, s) for c in columns if (s := _signs([(a.ravel()[j:j + 1], row.get(c)) for a, row in flat]))), None)
        if hit is None:
            return None
        picked.append(hit[0])
        signs += hit[1]
    return {"columns": picked, "signs": signs}


def _fit(a: np.ndarray, c: np.ndarray) -> dict[str, Any] | None:
    """``a`` (K, 2+) as ``c`` (K, 2+) scaled and shifted per axis, maybe mirrored (x) with points swapped."""
    ax, ay, cx, cy = a[:, 0], a[:, 1], c[:, 0], c[:, 1]
    if cx.std() < 1e-9 or cy.std() < 1e-9:
        return None
    sx, sy = ax.std() / cx.std(), ay.std() / cy.std()
    best = None
    for sign in (1.0, -1.0):
        px = sign * sx * (cx - cx.mean()) + ax.mean()
        py = sy * (cy - cy.mean()) + ay.mean()
        d = (ax[:, None] - px[None]) ** 2 + (ay[:, None] - py[None]) ** 2
        perm = d.argmin(1)
        err = float(np.sqrt(d[np.arange(len(a)), perm]).max())
        if best is None or err < best["err"]:
            best = {"err": err, "mirrored": sign < 0, "perm": perm.tolist(), "scale": (float(sx), float(sy)),
                    "shift": (float(ax.mean() - sign * sx * cx.mean()), float(ay.mean() - sy * cy.mean()))}
    tol = 0.5 + 0.01 * float(max(np.ptp(ax), np.ptp(ay)))
    ok = best is not None and best["err"] <= tol and (best["mirrored"] or best["perm"] == list(range(len(a))))
    return best if ok else None


def _coords(flat: list[tuple[np.ndarray, dict[str, Any]]], columns: list[str]) -> dict[str, Any] | None:
    a0 = flat[0][0]
    if a0.ndim != 2 or a0.shape[0] < 2 or a0.shape[1] < 2:
        return None
    for c in columns:
        fits = []
        for a, row in flat:
            v = row.get(c)
            if isinstance(v, np.ndarray) and v.size % a.shape[0] == 0 and v.size // a.shape[0] >= 2:
                f = _fit(a.astype(np.float64), v.reshape(a.shape[0], -1))
                if f is not None:
                    fits.append(f)
        if fits and len(fits) >= 0.5 * len(flat):
            pairs = sorted({(min(i, j), max(i, j)) for f in fits if f["mirrored"] for i, j in enumerate(f["perm"]) if i != j})
            return {"columns": [c], "fits": fits, "mirrored": any(f["mirrored"] for f in fits), "flip_pairs": pairs}
    return None


# -- the account -----------------------------------------------------------------------------------------
def _folder_label(files: list[str], values: list[np.ndarray]) -> bool:
    """The values are each file's class folder index (sorted first-level folders), as fastdata convert labels."""
    if any(v.size != 1 or v.dtype.kind not in "iub" for v in values):
        return False
    root = os.path.commonpath([os.path.dirname(f) for f in files])
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    for f, v in zip(files, values):
        rel = os.path.relpath(f, root).split(os.sep)
        if len(rel) < 2 or rel[0] not in classes or classes.index(rel[0]) != int(v.ravel()[0]):
            return False
    return len(classes) >= 2


def account(samples: list[dict[str, Any]], tables: list[str]) -> dict[str, Any]:
    """Where each element of the samples comes from. ``samples``: per drawn sample ``file`` (the first
    non-table file its draw opened, or None), ``first`` and ``again`` (two draws' fields as arrays)."""
    from fastdata.converters.table_read import read_table

    first = samples[0]["first"]
    data = max(first, key=lambda k: first[k].size)  # the largest field (the first of equals)
    out: dict[str, Any] = {"data": data, "views": 1, "fields": {}, "tables": {}}
    files = [s["file"] for s in samples]
    out["fields"][data] = {"role": "data", "shape": list(first[data].shape)}
    for k, v in first.items():  # two augmented versions of one sample: same shape, floats, different values
        if k != data and v.shape == first[data].shape and v.dtype.kind == "f" and v.dtype == first[data].dtype \
                and not np.array_equal(v, first[data]):
            out["fields"][k] = {"role": "view", "of": data}
            out["views"] += 1
    if None in files:
        for k in first:
            out["fields"].setdefault(k, {"role": "left out", "why": "the sample's file is unknown (its draw opened no file)"})
        return out
    indexed = []
    for t in tables:
        try:  # as ``fastdata convert --meta`` reads it, cells parsed (a JSON object keyed by path: column 'path')
            table = read_table(Path(t))
            rows = [{k: _cell(c[i]) for k, c in table.columns.items()} for i in range(table.rows)]
        except Exception as e:  # a table the doctor cannot read: said, never fatal
            out["tables"][t] = {"error": f"{type(e).__name__}: {e}"}
            continue
        hit = _index(rows, files)
        if hit is None:
            out["tables"][t] = {"error": "no column names the sample files (fastdata convert needs a path column)"}
        else:
            col, root, picked = hit
            out["tables"][t] = {"path_column": col, "root": root, "used": []}
            indexed.append((t, col, picked, rows))
    for k in first:
        if k not in out["fields"]:
            out["fields"][k] = _one(k, samples, indexed, files, out["tables"])
    _geometry(out, samples)
    for f in out["fields"].values():
        f.pop("fits", None)
    return out


def _class_index(values: list[np.ndarray], picked: list[dict[str, Any]], rows: list[dict[str, Any]],
                 columns: list[str]) -> str | None:
    """The text column whose sorted distinct values the integer ``values`` index (class names)."""
    if any(v.size != 1 or v.dtype.kind not in "iu" for v in values):
        return None
    for c in columns:
        names = sorted({r[c] for r in rows if isinstance(r.get(c), str)})
        if names and all(isinstance(r.get(c), str) and names.index(r[c]) == int(v.ravel()[0])
                         for v, r in zip(values, picked)):
            return c
    return None


def _one(k: str, samples: list[dict[str, Any]], indexed: list[tuple[str, str, list[dict[str, Any]], list[Any]]],
         files: list[str], tables: dict[str, Any]) -> dict[str, Any]:
    for t, col, picked, rows in indexed:
        flat = [(a, row) for s, row in zip(samples, picked) for a in (s["first"][k], s["again"].get(k, s["first"][k]))]
        columns = [c for c in picked[0] if c != col]
        a0 = samples[0]["first"][k]
        found, kind = (_coords(flat, columns), "keypoints") if a0.ndim == 2 and a0.shape[1] in (2, 3) else (None, "")
        if found is None:
            found = _values(flat, columns)
            kind = "angles" if found and -1 in found["signs"] else "values"
        named = _class_index([s["first"][k] for s in samples], picked, rows, columns) if found is None else None
        if named is not None:  # fastdata convert makes a text column named 'label' class indices (sorted names)
            found, kind = {"columns": [named], "signs": [1]}, "classes"
        if found is not None:
            tables[t]["used"] += [c for c in found["columns"] if c not in tables[t]["used"]]
            return {"role": "table", "table": t, "kind": kind, **found}
    if _folder_label(files, [s["first"][k] for s in samples]):
        return {"role": "folder label"}
    unkeyed = [os.path.basename(t) for t, v in tables.items() if "error" in v]
    return {"role": "left out", "why": "not in the sample's file, a table the script read, nor its class folder "
                                       "(computed in __getitem__: compute it from the batch)"
            + (f"; {', '.join(unkeyed)}: no column names the sample files (add a 'path' column)" if unkeyed else "")}


def _geometry(out: dict[str, Any], samples: list[dict[str, Any]]) -> None:
    """The script's geometric op on images with coordinates: Resize, a crop (centre or random), and/or a
    mirror; from the coordinates' fits and the image files' own sizes."""
    kp = [f for f in out["fields"].values() if f.get("kind") == "keypoints"]
    hw = image_hw(samples[0]["first"][out["data"]].shape)
    if not kp or hw is None:
        return
    try:
        from PIL import Image

        sizes = []
        for s in samples:
            with Image.open(s["file"]) as im:
                sizes.append((im.height, im.width))
    except Exception:
        return
    fits = kp[0]["fits"]
    sx, sy = np.median([f["scale"][0] for f in fits]), np.median([f["scale"][1] for f in fits])
    shifts = {(round(f["shift"][0], 1), round(f["shift"][1], 1)) for f in fits if not f["mirrored"]}
    if all(s == hw for s in sizes) and abs(sx - 1) < 0.02 and abs(sy - 1) < 0.02:
        op = None
    elif abs(sx - 1) < 0.02 and abs(sy - 1) < 0.02:
        op = "RandomCrop" if len(shifts) > 1 else "CenterCrop"
    else:
        op = "Resize"
    out["geometry"] = {"op": op, "size": list(hw), "mirrored": any(f.get("mirrored") for f in kp)}
