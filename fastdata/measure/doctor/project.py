"""The fix, measured: a sample of the dataset's ``__getitem__`` outputs converted to a temporary dataset, and
``fastdata.loader`` timed on it beside the script's replayed step (:class:`Beside`) and alone; then printed: a
``fastdata convert`` command and a ``fastdata.loader(...)`` line that keep every element of the script's samples,
or say why one is left out (:func:`commands`)."""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from fastdata.errors import DataError
from fastdata.measure.doctor.account import account, image_hw, is_table, opened, tables_of

MAX_SAMPLES = 256
ACCOUNT_SAMPLES = 8  # samples drawn twice, with the files each opened, to account for every element
SAMPLE_BUDGET_S = 20.0  # at most this long drawing samples through the user's __getitem__
MEASURE_S = 3.0


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
    account: dict[str, Any] | None = None  # where each element of a sample comes from (fastdata.measure.doctor.account)

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


def _fields(item: Any) -> dict[str, np.ndarray] | None:
    """A sample as named arrays, or None when it holds something that is not an array or a number."""
    if isinstance(item, dict):
        named = list(item.items())
    elif isinstance(item, (tuple, list)):
        named = [(f"f{i}", v) for i, v in enumerate(item)]
    else:
        named = [("f0", item)]
    out = {}
    for k, v in named:
        if hasattr(v, "detach"):
            v = v.detach().cpu().numpy()
        elif not isinstance(v, (np.ndarray, int, float, np.number, bool)) and not hasattr(v, "__array_interface__"):
            return None
        a = np.asarray(v)
        if a.dtype == object:
            return None
        out[str(k)] = a
    return out


def _as_image(a: np.ndarray) -> np.ndarray:
    """A float image (CHW or HWC) as uint8 HWC, its range stretched to 0-255: what ``fastdata convert
    --images raw`` stores, and the loader turns into floats again (the values do not change the time)."""
    hwc = a if a.shape[2] in (1, 3, 4) else a.transpose(1, 2, 0)
    lo, hi = float(hwc.min()), float(hwc.max())
    return np.ascontiguousarray(((hwc - lo) * (255.0 / max(hi - lo, 1e-12))).clip(0, 255).astype(np.uint8))


def _image_ops(ds: Any, i: int, first: dict[str, np.ndarray], images: list[str]) -> tuple[str, ...]:
    """The loader's stand-ins for the script's image transforms: a flip when a second draw of sample ``i``
    differs (random ops), Normalize when the values left 0-1 (normalised)."""
    again = _fields(ds[i]) or {}
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
    for i in idx[:ACCOUNT_SAMPLES]:  # drawn twice, with the files each opened: the account of every element
        if len(drawn) >= 2 and time.perf_counter() - t0 > budget_s / 2:
            break
        with opened() as files:
            f = _fields(ds[i])
        file = next((p for p in files if not is_table(p) and os.path.isfile(p)), None)  # not a table
        if f is None:
            raise DataError(f"sample {i} holds objects that are not arrays or numbers")
        drawn.append({"file": file, "first": f, "again": _fields(ds[i]) or {}})
    acc = account(drawn, list(tables))
    views = [k for k, v in acc["fields"].items() if v["role"] == "view"]  # the loader makes them (views=)
    src = work / "samples"
    src.mkdir()
    kept, images = 0, []
    shapes: dict[str, list[int]] = {}
    ops: tuple[str, ...] = ()
    for n, i in enumerate(idx):
        f = drawn[n]["first"] if n < len(drawn) else _fields(ds[i])
        if f is None:
            raise DataError(f"sample {i} holds objects that are not arrays or numbers")
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
                       "folder label": ("its class folder", "label")}.get(role, ("", ""))
        if role == "table":
            how = {"keypoints": "coordinates, moved with the image (Keypoints)",
                   "classes": "class names, as indices into their sorted list",
                   "angles": "angles negated on a mirror (Custom)"}.get(f["kind"], "values")
            where = f"{', '.join(f['columns'])} of {os.path.basename(f['table'])} ({how})"
            name = " + ".join(f["columns"]) if len(f["columns"]) == 1 else \
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
    if "HorizontalFlip" in ops and targets and not mirrors:
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
                + "; for other sources write each __getitem__ output as SRC/NNNNNN.npz first (docs/doctor.md)"]
    args = ["fastdata", "convert", shlex.quote(folder), "DATASET"]
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
