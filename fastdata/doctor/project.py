"""The fix, measured: a sample of the dataset's ``__getitem__`` outputs as a temporary fastdata dataset.

Runs in the doctor's child after the script is stopped. It draws up to ``MAX_SAMPLES`` samples from the
map-style dataset the loop iterated most, writes them as per-sample ``.npz`` files, converts them
with ``fastdata.convert`` and times ``fastdata.loader`` over the result with the script's batch size.
The samples are what ``__getitem__`` returned, after the script's transforms: the projection assumes
those transforms move to conversion time or to the device (said in the report).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

MAX_SAMPLES = 256
SAMPLE_BUDGET_S = 20.0  # at most this long drawing samples through the user's __getitem__
MEASURE_S = 3.0


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


def workers_for_projection() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def project_loader(rec: Any, out: Path) -> dict[str, Any]:
    """Measure fastdata.loader on a converted sample of the busiest loader's dataset; a dict for project.json."""
    if not rec.loaders:
        return {"ok": False, "why": "the script iterated no DataLoader"}
    key = max(rec.loaders, key=lambda k: len(rec.loaders[k].events))
    ds, bs = rec.datasets.get(key), rec.batch_sizes.get(key)
    if ds is None:
        return {"ok": False, "why": "the loop already reads through fastdata.loader"}
    if not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__")) or not bs:
        return {"ok": False, "why": "the dataset is not map-style (no __len__/__getitem__) or has no batch size"}
    work = Path(tempfile.mkdtemp(prefix="fastdata-doctor-", dir=os.environ.get("FASTDATA_DOCTOR_TMP")))
    try:
        return _sample_and_measure(ds, int(bs), work)
    except Exception as e:  # the projection is optional: say why it is missing, never fail the report
        return {"ok": False, "why": f"{type(e).__name__}: {e}"}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _sample_and_measure(ds: Any, bs: int, work: Path) -> dict[str, Any]:
    import fastdata
    from fastdata.conversion import convert
    from fastdata.converters import ConvertConfig
    from fastdata.write import WriteOptions

    n = len(ds)
    rng = np.random.default_rng(0)
    idx = rng.permutation(n)[:MAX_SAMPLES]
    src = work / "samples"
    src.mkdir()
    t0 = time.perf_counter()
    kept = 0
    for i in idx:
        f = _fields(ds[int(i)])
        if f is None:
            return {"ok": False, "why": f"sample {int(i)} holds objects that are not arrays or numbers"}
        np.savez(src / f"{kept:06d}.npz", **f)  # type: ignore[arg-type]  # numpy stubs mistype **kwds
        kept += 1
        if time.perf_counter() - t0 > SAMPLE_BUDGET_S and kept >= 2 * bs:
            break
    rep = convert(src, work / "ds", ConvertConfig(write=WriteOptions(workers=1), no_labels=True))
    workers = workers_for_projection()
    loader = fastdata.loader(str(work / "ds"), batch_size=min(bs, kept), device="cpu", num_workers=workers,
                             drop_last=True)
    times: list[float] = []
    deadline, first = time.perf_counter() + MEASURE_S, True
    while time.perf_counter() < deadline:  # whole passes until the time is up
        it = iter(loader)
        while True:
            t = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            if not first:  # the very first batch pays the start-up
                times.append(time.perf_counter() - t)
            first = False
    if not times:
        return {"ok": False, "why": f"only {kept} samples: too few for a batch of {bs} after the first"}
    batch_s = float(np.mean(times))
    return {"ok": True, "samples": kept, "fields": rep.fields, "batch_size": min(bs, kept), "workers": workers,
            "batch_s": batch_s, "sample_bytes": rep.bytes_in / max(kept, 1),
            "note": "samples are the dataset's __getitem__ outputs (after its transforms)"}
