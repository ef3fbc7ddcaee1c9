"""The fix, measured: a sample of the dataset's ``__getitem__`` outputs converted, each element matched to the
sample's file, a table the script read or the class folder (else left out, with why), and ``fastdata.loader`` timed on
it beside the replayed step (:class:`Beside`) and alone; then printed as a convert command and a loader line."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from fastdata.errors import DataError
from fastdata.format.manifest import TABLE_SUFFIXES

MAX_SAMPLES = 256
ACCOUNT_SAMPLES = 8  # samples drawn twice, with the files each opened, to account for every element
SAMPLE_BUDGET_S = 20.0  # at most this long drawing samples through the user's __getitem__
MEASURE_S = 3.0


# -- the files the script opens ------------------------------------------------------------------------
_TABLES = tuple(TABLE_SUFFIXES)  # what fastdata convert reads as a table
_sinks: list[tuple[list[str], bool]] = []  # (paths, tables only)
_SKIP = (".py", ".pyc", ".so", ".pth")  # imports, not data
NO_PATH_COLUMN = "no column names the sample files (fastdata convert needs a path column)"
# how the fix's loader trains on the script's own samples where DATASET holds more (a split, a fold)
_SUBSET = ('pass fastdata.open("DATASET").subset(KEYS) to fastdata.loader in place of "DATASET" (KEYS: the files\' '
           'paths relative to SRC, as the table names them)')
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


# -- the sample, and fastdata's loader on it -----------------------------------------------------------
@dataclass
class Sampled:
    """A converted sample of the dataset, in a temporary folder removed by :meth:`remove`."""

    work: Path
    samples: int
    fields: Any
    batch_size: int
    workers: int
    sample_bytes: float
    shapes: dict[str, list[int]]  # each field's shape in the first sample (what __getitem__ returned)
    images: tuple[str, ...] = ()  # float image fields stored as uint8 (the loader makes them floats again)
    ops: tuple[str, ...] = ()  # the loader's augment ops standing in for the script's image transforms
    account: dict[str, Any] | None = None  # where each element of a sample comes from (:func:`account`)

    def augment(self) -> Any:
        from fastdata.augment import Augment, HorizontalFlip, Normalize

        shape = self.shapes[self.images[0]] if self.images else [3]
        c = min(shape[0], shape[-1])  # the image's channels (CHW or HWC)
        ops = [HorizontalFlip() if o == "HorizontalFlip" else Normalize((0.5,) * c, (0.25,) * c) for o in self.ops]
        views = (self.account or {}).get("views", 1)
        return Augment(tuple(ops), views=views) if views > 1 else (ops or None)

    @property
    def path(self) -> Path:
        return self.work / "ds"

    def loader(self) -> Any:
        import fastdata

        return fastdata.loader(str(self.path), batch_size=self.batch_size, device="cpu",
                               num_workers=self.workers, drop_last=True, augment=self.augment())

    def remove(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def _named(item: Any) -> list[tuple[Any, Any]]:
    """A sample's elements with their field names: a dict's keys, else ``f0``, ``f1``, ..."""
    if isinstance(item, dict):
        return list(item.items())
    return [(f"f{i}", v) for i, v in enumerate(item if isinstance(item, (tuple, list)) else [item])]


def _fields(item: Any) -> dict[str, np.ndarray] | None:
    """A sample as named arrays, or None when it holds something that is not an array or a number."""
    out = {}
    for k, v in _named(item):
        if hasattr(v, "detach"):
            v = v.detach().cpu().numpy()
        elif not isinstance(v, (np.ndarray, int, float, np.number, bool)) and not hasattr(v, "__array_interface__"):
            return None
        a = np.asarray(v)
        if a.dtype == object:
            return None
        out[str(k)] = a
    return out


def _why_not(v: Any) -> str:
    return (f"{'None' if v is None else 'a ' + type(v).__name__}, not an array or a number, which the projection's "
            "per-sample .npz files cannot hold (fastdata.convert(dataset, DST) from Python keeps strings and bytes "
            "too: docs/convert.md)")


def _unstorable(i: int, item: Any) -> DataError:
    """Why sample ``i`` cannot be projected: its first element that :func:`_fields` refuses, named, and what to do."""
    k, v = next(((k, v) for k, v in _named(item) if _fields({0: v}) is None), ("?", item))
    return DataError(f"sample {i}: element {str(k)!r} is {_why_not(v)}; the fix leaves it out")


def _storable(item: Any) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A sample's arrays and numbers by name, and its other elements (a str, None, ...) with why they are left
    out: the projection and the fix go on with the rest (the account of a table's columns included)."""
    out: dict[str, np.ndarray] = {}
    left: dict[str, str] = {}
    for k, v in _named(item):
        f = _fields({str(k): v})
        if f is None:
            left[str(k)] = _why_not(v)
        else:
            out.update(f)
    return out, left


def _as_image(a: np.ndarray) -> np.ndarray:
    """A float image (CHW or HWC) as uint8 HWC, its range stretched to 0-255: what ``fastdata convert
    --images raw`` stores, and the loader turns into floats again (the values do not change the time)."""
    hwc = a if a.shape[2] in (1, 3, 4) else a.transpose(1, 2, 0)
    lo, hi = float(hwc.min()), float(hwc.max())
    return np.ascontiguousarray(((hwc - lo) * (255.0 / max(hi - lo, 1e-12))).clip(0, 255).astype(np.uint8))


def _image_ops(ds: Any, i: int, first: dict[str, np.ndarray], images: list[str]) -> tuple[str, ...]:
    """The loader's stand-ins for the script's image transforms: a flip when a second draw of sample ``i``
    differs (random ops), Normalize when the values left 0-1 (normalised)."""
    again = _storable(ds[i])[0]
    random = any(k in again and again[k].shape == first[k].shape and not np.array_equal(again[k], first[k])
                 for k in images)
    normalised = any(float(first[k].min()) < 0 or float(first[k].max()) > 1.0 for k in images)
    return (("HorizontalFlip",) if random else ()) + (("Normalize",) if normalised else ())


def sample(rec: Any, key: int | None = None) -> Sampled | str:
    """Convert a sample of the dataset of loader ``key`` (default: the busiest); a string says why not."""
    if not rec.loaders:
        return "the script iterated no DataLoader"
    if key is None:
        key = max(rec.loaders, key=lambda k: len(rec.loaders[k].events))
    ds, bs = rec.datasets.get(key), rec.batch_sizes.get(key)
    if ds is None:
        return "the loop already reads through fastdata.loader"
    if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")) or not bs:
        return "the dataset is not map-style (no __len__/__getitem__) or has no batch size"
    if len(ds) == 0:
        return "the dataset is empty (its __len__ is 0): nothing to sample"
    work = Path(tempfile.mkdtemp(prefix="fastdata-doctor-", dir=os.environ.get("FASTDATA_DOCTOR_TMP")))
    try:
        return _sample(ds, int(bs), work, rec.step_on_cpu(), tables_of(ds, list(rec.tables)),
                       rec.sample_budget_s or SAMPLE_BUDGET_S)
    except Exception as e:  # the projection is optional: say why it is missing, never fail the report
        shutil.rmtree(work, ignore_errors=True)
        return str(e) if isinstance(e, DataError) else f"{type(e).__name__}: {e}"


def _sample(ds: Any, bs: int, work: Path, on_cpu: bool = True, tables: Any = (),
            budget_s: float = SAMPLE_BUDGET_S) -> Sampled:
    from fastdata.converters import ConvertConfig
    from fastdata.converters.convert import convert
    from fastdata.write import WriteOptions

    idx = [int(i) for i in np.random.default_rng(0).permutation(len(ds))[:MAX_SAMPLES]]
    t0 = time.perf_counter()
    drawn: list[dict[str, Any]] = []
    left: dict[str, str] = {}
    for i in idx[:ACCOUNT_SAMPLES]:  # drawn twice, with the files each opened: the account of every element
        if len(drawn) >= 2 and time.perf_counter() - t0 > budget_s / 2:
            break
        with opened() as files:
            item = ds[i]
        file = next((p for p in files if not is_table(p) and os.path.isfile(p)), None)  # not a table
        f, more = _storable(item)
        if not f:
            raise _unstorable(i, item)
        left.update(more)
        drawn.append({"file": file, "first": f, "again": _storable(ds[i])[0]})
    acc = account(drawn, list(tables))
    acc["fields"].update({k: {"role": "left out", "why": why} for k, why in left.items()})
    acc["samples"] = len(ds)  # against the table's rows: a script that trains on a split of the table
    views = [k for k, v in acc["fields"].items() if v["role"] == "view"]  # the loader makes them (views=)
    src = work / "samples"
    src.mkdir()
    kept, images = 0, []
    shapes: dict[str, list[int]] = {}
    ops: tuple[str, ...] = ()
    for n, i in enumerate(idx):
        if n < len(drawn):
            f = drawn[n]["first"]
        else:
            item = ds[i]
            if not (f := _storable(item)[0]):
                raise _unstorable(i, item)
        f = {k: v for k, v in f.items() if k not in views}
        if not shapes:
            shapes = {k: list(np.shape(v)) for k, v in f.items()}
            images = [k for k, v in f.items() if on_cpu and v.dtype.kind == "f" and image_hw(v.shape)]
            ops = _image_ops(ds, i, f, images) if images else ()
        for k in images:
            if image_hw(f[k].shape):
                f[k] = _as_image(f[k])
        np.savez(src / f"{kept:06d}.npz", **f)  # type: ignore[arg-type]  # numpy stubs mistype **kwds
        kept += 1
        if time.perf_counter() - t0 > budget_s and kept >= 2 * bs:
            break
    rep = convert(src, work / "ds", ConvertConfig(write=WriteOptions(workers=1), no_labels=True))
    shutil.rmtree(src, ignore_errors=True)
    workers = max(1, min(4, os.cpu_count() or 1))
    return Sampled(work, kept, rep.fields, min(bs, kept), workers, rep.bytes_in / max(kept, 1), shapes,
                   tuple(images), ops, acc)


class Beside:
    """fastdata's loader over the sample, one batch per replayed step of the script: the replay then times
    the step as it would run after the switch, reader threads and all, on the same CPU."""

    def __init__(self, s: Sampled) -> None:
        self.sampled, self._loader = s, s.loader()
        self._it: Iterator[Any] | None = None
        self.position = 0  # the batch's position in its pass (0: a pass's start-up)
        self.next()  # the first pass's start-up is not timed

    def next(self) -> float:
        """Take one batch (dropped: the replay hands the script its cached batch); the seconds waited."""
        t = time.perf_counter()
        while True:
            if self._it is None:
                self._it, self.position = iter(self._loader), -1
            try:
                next(self._it)
                self.position += 1
                return time.perf_counter() - t
            except StopIteration:
                self._it = None

    def close(self) -> None:
        it, self._it = self._it, None
        close = getattr(it, "close", None)
        if close is not None:
            close()


def project_loader(rec: Any, out: Path, sampled: Sampled | str | None = None) -> dict[str, Any]:
    """Measure fastdata.loader alone on a converted sample of the busiest loader's dataset (``sampled``
    when the replay already made one); a dict for project.json. The sample is removed after."""
    s = sample(rec) if sampled is None else sampled
    if isinstance(s, str):
        return {"ok": False, "why": s}
    try:
        return _measure(s, rec.measure_s or MEASURE_S)
    except Exception as e:  # the projection is optional: say why it is missing, never fail the report
        return {"ok": False, "why": f"{type(e).__name__}: {e}"}
    finally:
        s.remove()


def _measure(s: Sampled, seconds: float = MEASURE_S) -> dict[str, Any]:
    """fastdata.loader alone on the sample, by fastdata.measure.bench.measure (the first batch left out)."""
    from fastdata.measure.bench import measure

    loader = s.loader()
    r = measure("fastdata.loader", lambda: loader, bytes_per_sample=s.sample_bytes, max_seconds=seconds, warmup=1)
    return {"ok": True, "samples": s.samples, "fields": s.fields, "batch_size": s.batch_size, "workers": s.workers,
            "batch_s": r.seconds / r.batches, "sample_bytes": s.sample_bytes, "shapes": s.shapes,
            "ops": list(s.ops), "account": s.account, "note": "samples are the dataset's __getitem__ outputs (after its transforms)"
            + (f"; images as uint8, the loader's {' + '.join(('to float',) + s.ops)} in the script's place"
               if s.images else "")}


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


def _part(flat: list[tuple[np.ndarray, dict[str, Any]]], columns: list[str]) -> dict[str, Any] | None:
    """A field equal to one position of a column's last axis (the visibility flags of (K, 3) keypoints)."""
    for c in columns:
        cells = [v for _, row in flat if isinstance(v := row.get(c), np.ndarray) and v.ndim >= 2]
        if len(cells) != len(flat):
            continue
        for j in range(cells[0].shape[-1]):
            if all(a.shape == v.shape[:-1] and np.array_equal(a.astype(np.float64), v[..., j].astype(np.float64))
                   for (a, _), v in zip(flat, cells)):
                return {"columns": [c], "signs": [1], "part": j}
    return None


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
    out["files"] = files
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
            out["tables"][t] = {"error": NO_PATH_COLUMN}
        else:
            col, root, picked = hit
            out["tables"][t] = {"path_column": col, "root": root, "used": [], "rows": len(rows),
                                "absolute": os.path.isabs(str(picked[0][col]))}
            indexed.append((t, col, picked, rows))
    stored = _stored(files)
    if stored is not None:
        _as_stored(out, data, samples, stored)
    for k in first:
        if k not in out["fields"]:
            out["fields"][k] = _one(k, samples, indexed, files, out["tables"])
    _geometry(out, samples)
    for f in out["fields"].values():
        f.pop("fits", None)
    return out


def _stored(files: list[str]) -> list[np.ndarray] | None:
    """Each sample's ``.npy`` file as ``fastdata convert`` stores it (memory-mapped), or None (other files)."""
    try:
        return [np.load(f, mmap_mode="r") for f in files] if all(f.endswith(".npy") for f in files) else None
    except Exception:  # a file the doctor cannot read as .npy: nothing said about it
        return None


def _as_stored(out: dict[str, Any], data: str, samples: list[dict[str, Any]], stored: list[np.ndarray]) -> None:
    """Whether ``__getitem__`` changed the sample's file (the fix stores the file as it is), and the integer
    element that is each file's length where lengths vary (the fix's ``x_lengths``)."""
    got = [s["first"][data] for s in samples]
    if any(g.dtype != a.dtype or not np.array_equal(g, a) for g, a in zip(got, stored)):
        out["fields"][data]["changed"] = f"{stored[0].dtype} {tuple(stored[0].shape)} -> {got[0].dtype} {tuple(got[0].shape)}"
    lengths = [a.shape[0] if a.ndim else -1 for a in stored]
    if len(set(lengths)) < 2:  # a fixed-shape field: no lengths in the batch
        return
    for k in samples[0]["first"]:
        draws = [d.get(k, s["first"][k]) for s in samples for d in (s["first"], s["again"])]
        if k != data and all(v.size == 1 and v.dtype.kind in "iu" for v in draws) and \
                [int(v.ravel()[0]) for v in draws] == [n for n in lengths for _ in (0, 1)]:
            out["fields"][k] = {"role": "lengths"}


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
        found = found or _part(flat, columns)
        named = _class_index([s["first"][k] for s in samples], picked, rows, columns) if found is None else None
        if named is not None:  # fastdata convert makes a text column named 'label' class indices (sorted names)
            found, kind = {"columns": [named], "signs": [1]}, "classes"
        if found is not None:
            tables[t]["used"] += [c for c in found["columns"] if c not in tables[t]["used"]]
            return {"role": "table", "table": t, "kind": kind, **found}
    if _folder_label(files, [s["first"][k] for s in samples]):
        return {"role": "folder label"}
    unkeyed = [f"; {os.path.basename(t)}: " + ("no column names the sample files (add a 'path' column)"
                                                if v["error"] == NO_PATH_COLUMN else f"not read as a table ({v['error']})")
               for t, v in tables.items() if "error" in v]  # a table it could not read at all (COCO) says why
    return {"role": "left out", "why": "not in the sample's file, a table the script read, nor its class folder "
                                       "(computed in __getitem__: compute it from the batch)" + "".join(unkeyed),
            "negated": any(-1 in (_signs([(s["again"][k], s["first"][k])]) or []) for s in samples if k in s["again"])}


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


# -- the printed fix ---------------------------------------------------------------------------------
NO_GAIN = 1.1  # below this projected speedup there is no input bottleneck worth a conversion


def _tables(acc: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The ``--meta`` / ``--labels`` arguments for the tables the samples' elements came from, and what
    could not be said as one (left out, with why)."""
    args: list[str] = []
    notes: list[str] = []
    meta = labels = False
    for t, info in acc.get("tables", {}).items():
        used = info.get("used") or []
        if not used:
            continue
        names = [f["columns"][0] for f in acc["fields"].values() if f.get("table") == t and f.get("kind") == "classes"]
        if any(c != "label" for c in names):  # class names become indices in a column named 'label' only
            notes.append(f"{t}: column {names[0]!r} holds the class names the script indexes: fastdata convert "
                         f"makes indices of a text column named 'label' (rename it), else keeps the text")
        name = shlex.quote(t)
        if info.get("absolute"):  # fastdata convert takes a table's paths relative to SRC, never absolute
            notes.append(f"{t}: columns {', '.join(used)} left out: its paths are absolute, and fastdata convert "
                         f"--meta takes them relative to SRC; write a copy of the table with each path relative "
                         f"to the folder converted and pass it as --meta")
            for f in acc["fields"].values():
                if f.get("table") == t:
                    f.update(role="left out", why=notes[-1])
            continue
        if info.get("rows", 0) > acc.get("samples", info.get("rows", 0)):  # DATASET holds every row of the table
            notes.append(f"{t} lists {info['rows']} files, the script's dataset has {acc['samples']}: DATASET holds "
                         f"all {info['rows']}; to train on the script's own, {_SUBSET}")
        if not meta and info["path_column"] == "path":
            args += ["--meta", name]
            meta = True
        elif not labels and len(used) == 1:
            args += ["--labels", name, "--labels-columns", f"{info['path_column']},{used[0]}"]
            labels = True
        else:
            notes.append(f"{t}: columns {', '.join(used)} left out: fastdata convert takes one --meta table (its "
                         f"path column named 'path') and one --labels column; merge them into one table")
            for f in acc["fields"].values():
                if f.get("table") == t:
                    f.update(role="left out", why=notes[-1])
    return args, notes


def lines(acc: dict[str, Any] | None, images: bool) -> list[str]:
    """One line per element of a sample: what it is in the proposed dataset, or why it is left out."""
    if not acc:
        return []
    x, out = "image" if images else "x", []
    for k, f in acc["fields"].items():
        role = f["role"]
        if role == "left out":
            out.append(f"{k}: left out: {f['why']}")
            continue
        where, name = {"data": ("the sample's file", x),
                       "view": (f"a second augmented view of {f.get('of')}", f"{x}[:, 1] (views=2)"),
                       "lengths": ("the length of the sample's file (its first axis)", f"{x}_lengths"),
                       "folder label": ("its class folder", "label")}.get(role, ("", ""))
        if f.get("changed"):  # the fix stores the file as it is: the change is the script's to redo on the batch
            where += f" as __getitem__ changed it ({f['changed']}; the fix stores the file as it is: redo the change on the batch)"
        if role == "table":
            how = {"keypoints": "coordinates, moved with the image (Keypoints)",
                   "classes": "class names, as indices into their sorted list",
                   "angles": "angles negated on a mirror (Custom)"}.get(f["kind"], "values")
            part = f"[..., {f['part']}]" if "part" in f else ""  # one position of the column's last axis
            where = f"{', '.join(f['columns'])}{part} of {os.path.basename(f['table'])} ({how})"
            name = " + ".join(f["columns"]) + part if len(f["columns"]) == 1 else \
                "torch.stack([" + ", ".join(f"batch[{c!r}]" for c in f["columns"]) + "], 1)"
        out.append(f"{k}: {where} -> {name}")
    return out


def _targets(acc: dict[str, Any]) -> tuple[dict[str, str], bool]:
    """``{field: "Keypoints(...)" | "Custom(...)"}`` for the coordinates and angles, and whether any mirrors."""
    out, mirrors = {}, False
    for f in acc["fields"].values():
        if f.get("role") != "table":
            continue
        if f["kind"] == "keypoints":
            pairs = [tuple(p) for p in f.get("flip_pairs") or []]
            out[f["columns"][0]] = f"Keypoints(flip_pairs={pairs})" if pairs else "Keypoints()"
            mirrors |= bool(f.get("mirrored"))
        elif f["kind"] == "angles":
            mirrors = True
            if len(f["columns"]) == 1:
                rule = f"a * a.new_tensor({[float(s) for s in f['signs']]})" if len(f["signs"]) > 1 else "-a"
                out[f["columns"][0]] = f"Custom(on_hflip=lambda a: {rule})"
            else:
                for c, s in zip(f["columns"], f["signs"]):
                    if s < 0:
                        out[c] = "Custom(on_hflip=lambda a: -a)"
    return out, mirrors


def _augment(proj: dict[str, Any], acc: dict[str, Any] | None) -> tuple[str, list[str], list[str]]:
    """The ``augment=`` argument, the names it imports, and notes (an op left out, and why)."""
    ops, notes = list(proj.get("ops") or []), []
    targets, mirrors = _targets(acc) if acc else ({}, False)
    geo = (acc or {}).get("geometry") or {}
    if geo.get("op"):
        h, w = geo["size"]
        ops.insert(0, f"{geo['op']}(({h}, {w}))")
    negated = [k for k, f in (acc or {}).get("fields", {}).items() if f.get("role") == "left out" and f.get("negated")]
    if "HorizontalFlip" in ops and negated:  # a flip would leave them unmirrored once the user adds them
        ops.remove("HorizontalFlip")
        notes.append(f"HorizontalFlip left out: the script negates {', '.join(negated)} on a mirror, and the fix "
                     "leaves it out; flip only with it declared as a target (Custom(on_hflip=...), docs/augment.md)")
    elif "HorizontalFlip" in ops and targets and not mirrors:
        ops.remove("HorizontalFlip")
        notes.append("HorizontalFlip left out: the script's random changes did not mirror its coordinates or angles")
    shape = (proj.get("shapes") or {}).get((acc or {}).get("data", ""), [3])
    channels = min(shape[0], shape[-1]) if len(shape) == 3 else 3
    norm = "Normalize(IMAGENET_MEAN, IMAGENET_STD)" if channels == 3 else f"Normalize({(0.5,) * channels}, {(0.25,) * channels})"
    calls = [norm if o == "Normalize" else o if "(" in o else f"{o}()" for o in ops]
    names = sorted({o.split("(")[0] for o in ops} | ({"IMAGENET_MEAN", "IMAGENET_STD"} if "Normalize" in ops and channels == 3 else set()))
    views = (acc or {}).get("views", 1)
    if not calls and views == 1:
        return "", [], notes
    if not targets and views == 1:
        return f"augment=[{', '.join(calls)}], ", names, notes
    extra = ""
    if targets:
        extra += ", targets={" + ", ".join(f"{k!r}: {v}" for k, v in targets.items()) + "}"
    if views > 1:
        extra += f", views={views}"
    return f"augment=Augment([{', '.join(calls)}]{extra}), ", ["Augment"] + names, notes


def _convert(acc: dict[str, Any], table_args: list[str], source: dict[str, Any] | None,
             size: tuple[int, int] | None) -> list[str]:
    used = [i for i in acc.get("tables", {}).values() if i.get("used")]
    folder = used[0]["root"] if used and table_args else (source or {}).get("folder")
    if not folder or not (source and source["convertible"]):
        seen = f" (the workers read {', '.join(source['kinds'])} files under {source['folder']})" if source else ""
        return ["fastdata convert SRC DATASET   # SRC: a folder of per-sample .npy/.npz/image files" + seen
                + "; for other sources write the arrays and numbers of each __getitem__ output as SRC/NNNNNN.npz "
                + "first (docs/doctor.md)"]
    args = ["fastdata", "convert", shlex.quote(folder), "DATASET"]
    labelled = any(f["role"] == "folder label" or f["role"] == "table" and "label" in f["columns"]
                   for f in acc.get("fields", {}).values())  # (a table's 'label' column is the label: no folders)
    nested = any(os.path.dirname(f) != folder.rstrip(os.sep) for f in acc.get("files", []))
    if nested and "--labels" not in table_args and not labelled:
        args.append("--no-labels")  # no element is the class folder: sub-folders of SRC must not make a label
    if size is not None:  # the projection read images as __getitem__ returned them: decoded, that size
        coords = acc.get("geometry") is not None
        args += ["--images", "raw"] + ([] if coords else ["--size", str(size[0]), str(size[1])])
    return [" ".join(args + table_args)]


def commands(main: dict[str, Any], proj: dict[str, Any] | None, source: dict[str, Any] | None,
             size: tuple[int, int] | None, episode: dict[str, Any] | None) -> tuple[list[str], list[str]]:
    """The fix's commands (convert, imports, loader) and notes on what it leaves out."""
    acc = (proj or {}).get("account")
    table_args, notes = _tables(acc) if acc else ([], [])
    convert = _convert(acc or {}, table_args, source, size)
    bs = main["settings"].get("batch_size")
    nw = proj["workers"] if proj else "auto"
    aug, names, more = _augment(proj or {}, acc)
    notes += more
    if main["settings"].get("sampler"):  # the loader line reads every sample: said, never dropped silently
        notes.append(f"the script's sampler, {main['settings']['sampler']}, is not in the loader line, which reads "
                     f"every sample of DATASET: {_SUBSET}, or pass sampler= (docs/loader.md#samplers)")
    imports = ["import fastdata", "import torch"]
    if names:
        imports.append(f"from fastdata.augment import {', '.join(names)}")
    targets = sorted({n for n in ("Keypoints", "Custom") if n + "(" in aug})
    if targets:
        imports.append(f"from fastdata.augment.targets import {', '.join(targets)}")
    if bs is None:  # a batch_sampler made the batches: the same episodes from fastdata's sampler
        imports.append("from fastdata.reading.samplers import Episodic")
        way, per = (episode or {}).get("classes"), (episode or {}).get("per_class")
        sampler = f"Episodic({way}, {per})" if way and per else "Episodic(N_WAY, K_SHOT)"
        line = f'loader = fastdata.loader("DATASET", None, sampler={sampler}, num_workers={nw!r}, {aug}device="auto")'
    else:
        line = f'loader = fastdata.loader("DATASET", batch_size={bs}, num_workers={nw!r}, {aug}device="auto")'
    return convert + ["; ".join(imports), line], notes
