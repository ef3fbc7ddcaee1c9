"""The printed fix: a ``fastdata convert`` command and a ``fastdata.loader(...)`` line that keep every element of
the script's samples, or say why one is left out."""

from __future__ import annotations

import os
import shlex
from typing import Any

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
