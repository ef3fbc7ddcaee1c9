"""Raw data at memory speed (issue 16): every figure a ratio to its ceiling, measured in one run.

Usage::

    python benchmarks/bench_raw.py [--quick] [--workdir DIR] [--out DIR]

Sections (random batches of 64, seeded; every source read once first, so all reads hit the page
cache; methods alternate in rounds after one discarded warm-up round). Each figure, method and
ceiling alike, is its best round: on a shared machine other work only ever slows a round down, so
the best round is the closest to what the machine does; the median and range are in the details.
Every ceiling is the machine's best for the same work, measured in the same run: each is timed at
every thread count from 1 to the loader's own (``THREADS``) and the fastest counts.

1. raw images: 256x256 synthetic photos converted ``--images raw`` (all one shape, so a fixed-shape
   field), HDF5 and LMDB. ``fastdata.loader`` keeping uint8 (``LoaderConfig(image_dtype="uint8")``)
   against a memcpy gather of the same rows from RAM into reused buffers; the default float output
   against the same conversion (torch ``copy_`` + ``mul_``) of uint8 batches already in RAM into
   reused float buffers, by torch's intra-op threads or by threads converting a batch each.
2. variable-size samples, ``get_batch`` into reused ``out=`` buffers (the loader's way) in one
   thread, against a one-thread memcpy gather of the same samples' bytes from RAM into a reused
   buffer, back to back: mixed-size raw images (sides 160-352) and ragged float32 sequences of
   10-100 rows of 16.
3. JPEG shards (``--images encoded``: the same JPEG bytes): the loader's default float output
   against simplejpeg decoding the same bytes, no loader.
4. ``fastdata convert`` (``THREADS`` workers) of a ~1.8 GB folder of (2, 256, 21, 21) float32
   ``.npy`` files against a parallel copy of the same files with the same workers and fsync policy
   (each worker copies the files of one shard-sized group into one file, fsyncs it, moves on).
5. the ``.npy`` loader: ``fastdata.loader`` on that HDF5 dataset against a memcpy gather.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness  # noqa: E402
import bench_images  # noqa: E402

import fastdata  # noqa: E402
import fastdata.write  # noqa: E402
from fastdata.demo import write_npy_folder  # noqa: E402
from fastdata.write import DEFAULT_SHARD_SIZE, plan_shards  # noqa: E402
from fastdata.fileio import fsync_dir  # noqa: E402
from fastdata.loaders import LoaderConfig  # noqa: E402

BATCH = 64
THREADS = 2
NPY_SHAPE = (2, 256, 21, 21)
FULL = {"images": 2000, "mixed": 800, "seqs": 10000, "npy": 2000, "rounds": 5}
QUICK = {"images": 200, "mixed": 100, "seqs": 1000, "npy": 100, "rounds": 1}
TARGETS = {  # row -> the least ratio (throughput) to its ceiling
    "raw uint8": 0.6, "raw float": 0.7, "mixed images": 0.5, "ragged sequences": 0.5, "jpeg float": 0.8,
    "convert": round(1 / 1.5, 2),  # convert takes at most 1.5x the parallel copy's time
    "npy loader": 0.8,
    "info": 0.0,  # a reference row, no target
}
COUNTS = range(1, THREADS + 1)  # ceilings are timed at each of these thread counts; the best counts


def rounds(methods: dict[str, Callable[[], int]], n_rounds: int) -> dict[str, dict[str, float]]:
    """Samples/s of each method: one warm-up round, then ``n_rounds`` interleaved rounds; median and range."""
    rates: dict[str, list[float]] = {k: [] for k in methods}
    for r in range(n_rounds + 1):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            n = fn()
            if r:
                rates[name].append(n / (time.perf_counter() - t0))
    return {k: {"best": max(v), "median": statistics.median(v), "min": min(v), "max": max(v), "rounds": v}
            for k, v in rates.items()}


def best(rates: dict[str, dict[str, float]], prefix: str) -> tuple[str, float]:
    """The fastest of the methods named ``prefix...`` (a ceiling at several thread counts): name, median."""
    name = max((k for k in rates if k.startswith(prefix)), key=lambda k: rates[k]["best"])
    return name, rates[name]["best"]


def threads_label(n: int) -> str:
    return f"{n} thread{'s' if n > 1 else ''}"


def plans(n: int, epochs: int, seed: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[p[a : a + BATCH] for a in range(0, n, BATCH)] for p in (rng.permutation(n) for _ in range(epochs))]


def gather_epoch(data: np.ndarray, plan: list[np.ndarray], bufs: list[np.ndarray], pool: ThreadPoolExecutor) -> int:
    """The ceiling: each batch's rows copied from RAM into a reused buffer, batches on the pool's threads."""

    def gather(k: int) -> int:
        out = bufs[k % len(bufs)][: len(plan[k])]
        for j, i in enumerate(plan[k].tolist()):
            out[j] = data[i]
        return len(plan[k])

    return sum(pool.map(gather, range(len(plan))))


def loader_epoch(ld: Any, field: str) -> int:
    n = 0
    for batch in ld:
        n += batch[field].shape[0]
    return n


def make_mixed(root: Path, n: int) -> None:
    """``n`` JPEGs with sides drawn from 160-352 (average about 256x256), in one class folder."""
    rng = np.random.default_rng(7)
    (root / "c").mkdir(parents=True, exist_ok=True)
    for i in range(n):
        h, w = (int(v) for v in rng.integers(160, 353, 2))
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        base = (np.stack([x / w, y / h, (x + y) / (w + h)], -1) * 255 + rng.normal(0, 12, (h, w, 3)))
        buf = io.BytesIO()
        Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        (root / "c" / f"{i:05d}.jpg").write_bytes(buf.getvalue())


def make_seqs(root: Path, n: int) -> None:
    rng = np.random.default_rng(8)
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        np.save(root / f"{i:06d}.npy", rng.standard_normal((int(rng.integers(10, 101)), 16)).astype(np.float32))


def get_batch_epoch(ds: fastdata.Dataset, plan: list[np.ndarray], out: dict[str, np.ndarray],
                    ragged: str = "padded") -> int:
    fixed = {f.name for f in ds.schema if not f.ragged}
    for idx in plan:
        ds.get_batch(idx, out={k: v[: len(idx)] if k in fixed else v for k, v in out.items()}, ragged=ragged)  # type: ignore[arg-type]
    return sum(len(p) for p in plan)


def ragged_gather_epoch(flat: np.ndarray, offsets: np.ndarray, plan: list[np.ndarray], buf: np.ndarray) -> int:
    """The ceiling for variable-size samples: each batch's samples (``flat[offsets[i]:offsets[i + 1]]``)
    copied from RAM back to back into one reused buffer by one ``np.concatenate``."""
    for idx in plan:
        parts = [flat[offsets[i] : offsets[i + 1]] for i in idx.tolist()]
        np.concatenate(parts, out=buf[: sum(len(q) for q in parts)])
    return sum(len(p) for p in plan)


def ragged_take_epoch(flat: np.ndarray, offsets: np.ndarray, plan: list[np.ndarray], buf: np.ndarray) -> int:
    """The same gather as one ``np.take`` of rows: the batch's row numbers built with numpy, no Python loop."""
    for idx in plan:
        lengths = offsets[idx + 1] - offsets[idx]
        total = int(lengths.sum())
        rows = np.repeat(offsets[idx] - np.cumsum(lengths) + lengths, lengths) + np.arange(total)
        np.take(flat, rows, axis=0, out=buf[:total])
    return sum(len(p) for p in plan)


def numpy_padded_epoch(images: list[np.ndarray], plan: list[np.ndarray], buf: np.ndarray, zero_first: bool = True) -> int:
    """The padded layout's own cost, no reader: numpy copies each in-RAM image into the batch padded
    to its largest height and width, padding zeroed, as ``get_batch`` must. ``zero_first``: each
    image's whole block zeroed, then its rows copied (the readers' order); else the rows first, then
    the right and bottom margins (the order before; both compared in bench_choices 5)."""
    for idx in plan:
        hs = [images[i].shape[0] for i in idx]
        ws = [images[i].shape[1] for i in idx]
        H, W = max(hs), max(ws)
        o = buf[: len(idx) * H * W * 3].reshape(len(idx), H, W * 3)
        for k, i in enumerate(idx.tolist()):
            h, w = hs[k], ws[k]
            if zero_first:
                o[k] = 0
            o[k, :h, : w * 3] = images[i].reshape(h, w * 3)
            if not zero_first:
                o[k, :h, w * 3 :] = 0
                o[k, h:] = 0
    return sum(len(p) for p in plan)


def numpy_fixed_epoch(images: np.ndarray, plan: list[np.ndarray], buf: np.ndarray) -> int:
    """The same with fixed-shape images of the same average bytes: one contiguous copy each."""
    for idx in plan:
        o = buf[: len(idx)]
        for k, i in enumerate(idx.tolist()):
            o[k] = images[i]
    return sum(len(p) for p in plan)


def reuse_buffers(ds: fastdata.Dataset, plan: list[np.ndarray]) -> dict[str, np.ndarray]:
    """``out=`` buffers as the loader keeps them: batch-shaped for fixed fields, flat and large
    enough for the biggest batch for ragged ones."""
    out: dict[str, np.ndarray] = {}
    for f in ds.schema:
        if not f.ragged:
            out[f.name] = np.empty((BATCH, *f.shape), f.np_dtype)
    biggest = {f.name: 0 for f in ds.schema if f.ragged}
    for idx in plan:
        b = ds.get_batch(idx)
        for name in biggest:
            biggest[name] = max(biggest[name], b[name].size)
    for f in ds.schema:
        if f.ragged:
            out[f.name] = np.empty(biggest[f.name], f.np_dtype)
    return out


def section_raw(work: Path, cfg: dict[str, int], jpegs: Path) -> dict[str, Any]:
    n = cfg["images"]
    res: dict[str, Any] = {"rows": {}, "conversions": {}}
    for be in ("hdf5", "lmdb"):
        rep = fastdata.convert(jpegs, work / f"raw_{be}", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=be, workers=THREADS), images=fastdata.ImageOptions(images="raw")))
        res["conversions"][f"raw {be}"] = rep.summary()
    ds = fastdata.open(work / "raw_hdf5")
    assert ds.manifest.fields[0].shape == (256, 256, 3), ds.manifest.fields[0]
    data = ds.get_batch(np.arange(n))["image"]  # every image, in RAM
    plan = plans(n, 1, 1)[0]
    pools = {t: ThreadPoolExecutor(t) for t in COUNTS}
    bufs = [np.empty((BATCH, 256, 256, 3), np.uint8) for _ in range(2 * THREADS)]
    batches = [torch.from_numpy(data[p]) for p in plan[: 2 * THREADS]]  # uint8 batches already in RAM
    floats = [torch.empty(batches[0].shape, dtype=torch.float32)]
    sizes = [len(p) for p in plan]  # the last batch is short: every method converts exactly n samples

    def torch_plain() -> int:
        for k, m in enumerate(sizes):
            batches[k % len(batches)][:m].float().div_(255)
        return sum(sizes)

    def torch_intra(t: int) -> int:
        """One batch at a time, converted into one reused float buffer by torch's ``t`` intra-op threads."""
        torch.set_num_threads(t)
        try:
            for k, m in enumerate(sizes):
                floats[0][:m].copy_(batches[k % len(batches)][:m]).mul_(1 / 255)
        finally:
            torch.set_num_threads(THREADS)
        return sum(sizes)

    mine = threading.local()  # each converting thread's own float buffer, reused batch after batch

    def torch_per_thread(t: int) -> int:
        """``t`` threads, each converting whole batches into its own reused float buffer (as the
        loader's reader threads do: a batch handed over and released, its buffer reused at once)."""
        def one(k: int) -> int:
            out = getattr(mine, "out", None)
            if out is None:
                out = mine.out = torch.empty(batches[0].shape, dtype=torch.float32)
            out[: sizes[k]].copy_(batches[k % len(batches)][: sizes[k]]).mul_(1 / 255)
            return sizes[k]

        return sum(pools[t].map(one, range(len(sizes))))

    methods: dict[str, Callable[[], int]] = {}
    for t in COUNTS:
        methods[f"ceiling: memcpy gather, {threads_label(t)}"] = lambda t=t: gather_epoch(data, plan, bufs, pools[t])
        methods[f"ceiling float: torch copy_+mul_ into reused buffers, {t} intra-op"] = lambda t=t: torch_intra(t)
        if t > 1:
            methods[f"ceiling float: torch copy_+mul_ into reused buffers, {threads_label(t)}, a batch each"] = \
                lambda t=t: torch_per_thread(t)
    methods["info: torch x.float().div_(255), a new output per batch"] = torch_plain
    loaders = {}
    for be in ("hdf5", "lmdb"):
        loaders[f"{be} loader uint8"] = fastdata.loader(work / f"raw_{be}", BATCH, device="cpu", num_workers=THREADS,
                                                        config=LoaderConfig(image_dtype="uint8"))
        loaders[f"{be} loader float (default)"] = fastdata.loader(work / f"raw_{be}", BATCH, device="cpu",
                                                                  num_workers=THREADS)
    for name, ld in loaders.items():
        methods[name] = lambda ld=ld: loader_epoch(ld, "image")
    rates = rounds(methods, cfg["rounds"])
    for ld in loaders.values():
        ld.close()
    for pool in pools.values():
        pool.shutdown()
    gather_name, gather = best(rates, "ceiling: memcpy gather")
    conv_name, conv = best(rates, "ceiling float:")
    for be in ("hdf5", "lmdb"):
        res["rows"][f"raw uint8 ({be})"] = ("raw uint8", rates[f"{be} loader uint8"]["best"], gather,
                                           f"loader uint8 / {gather_name[9:]}")
        res["rows"][f"raw float ({be})"] = ("raw float", rates[f"{be} loader float (default)"]["best"], conv,
                                           f"loader float / {conv_name[15:]}")
    res["rates"] = rates
    return res


def section_ragged(work: Path, cfg: dict[str, int]) -> dict[str, Any]:
    res: dict[str, Any] = {"rows": {}, "rates": {}}
    mixed_src, seq_src = work / "mixed_src", work / "seq_src"
    make_mixed(mixed_src, cfg["mixed"])
    make_seqs(seq_src, cfg["seqs"])
    for be in ("hdf5", "lmdb"):
        fastdata.convert(mixed_src, work / f"mixed_{be}", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=be, workers=THREADS), no_labels=True, images=fastdata.ImageOptions(images="raw")))
        fastdata.convert(seq_src, work / f"seq_{be}", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=be, workers=THREADS), no_labels=True))
    mixed = fastdata.open(work / "mixed_hdf5")
    assert mixed.manifest.fields[0].encoding == "pixels"
    shapes = mixed.get_batch(np.arange(len(mixed)))["image_shape"]
    side = int(round(float(np.sqrt((shapes[:, 0] * shapes[:, 1]).mean()))))
    rng = np.random.default_rng(9)
    np.save(work / "fixed_img.npy", rng.integers(0, 256, (cfg["mixed"], side, side, 3), dtype=np.uint8))
    seqs = fastdata.open(work / "seq_hdf5")
    mean_rows = float(seqs.get_batch(np.arange(len(seqs)))["x_lengths"].mean())
    rows = int(round(mean_rows))
    np.save(work / "fixed_seq.npy", rng.standard_normal((cfg["seqs"], rows, 16)).astype(np.float32))
    for be in ("hdf5", "lmdb"):
        fastdata.convert(None, work / f"fixedimg_{be}", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=be, workers=THREADS)), arrays={"image": work / "fixed_img.npy"})
        fastdata.convert(None, work / f"fixedseq_{be}", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=be, workers=THREADS)), arrays={"x": work / "fixed_seq.npy"})
    _harness.warm_page_cache(work)
    methods: dict[str, Callable[[], int]] = {}
    for kind, n, fixed_name, ragged_name in (("img", cfg["mixed"], "fixedimg", "mixed"),
                                             ("seq", cfg["seqs"], "fixedseq", "seq")):
        plan = plans(n, 1, 3)[0]
        for be in ("hdf5", "lmdb"):
            for name in (fixed_name, ragged_name):
                ds = fastdata.open(work / f"{name}_{be}")
                out = reuse_buffers(ds, plan)
                methods[f"{name} {be}"] = lambda ds=ds, plan=plan, out=out: get_batch_epoch(ds, plan, out)
                if name == ragged_name:
                    methods[f"{name} packed {be}"] = (lambda ds=ds, plan=plan, out=out:
                                                      get_batch_epoch(ds, plan, out, "packed"))
        ds = fastdata.open(work / f"{ragged_name}_hdf5")
        b = ds.get_batch(np.arange(n), ragged="packed")
        field = "image" if kind == "img" else "x"
        flat, offs = b[field].reshape(-1), b[field + "_offsets"]
        row = 1 if kind == "img" else 16  # the gather's unit: bytes of an image, float32 rows of 16 of a sequence
        flat = flat.reshape(-1, row)
        out_buf = np.empty((max(int((offs[p + 1] - offs[p]).sum()) for p in plan), row), flat.dtype)
        methods[f"ceiling {kind}: memcpy gather, concatenate, 1 thread"] = (
            lambda f=flat, o=offs, plan=plan, buf=out_buf: ragged_gather_epoch(f, o, plan, buf))
        if kind == "seq":
            methods[f"ceiling {kind}: memcpy gather, rows by index, 1 thread"] = (
                lambda f=flat, o=offs, plan=plan, buf=out_buf: ragged_take_epoch(f, o, plan, buf))
        if kind == "img":  # the padded layout's floor: plain numpy copies of in-RAM images, no reader
            b = ds.get_batch(np.arange(n))
            imgs = [b["image"][k, :h, :w].copy() for k, (h, w, _) in enumerate(b["image_shape"].tolist())]
            fixed_imgs = fastdata.open(work / "fixedimg_hdf5").get_batch(np.arange(n))["image"]
            pad_buf = np.empty(reuse_buffers(ds, plan)["image"].size, np.uint8)
            fix_buf = np.empty_like(fixed_imgs[:BATCH])
            methods["numpy padded"] = lambda imgs=imgs, plan=plan, buf=pad_buf: numpy_padded_epoch(imgs, plan, buf)
            methods["numpy fixed"] = lambda imgs=fixed_imgs, plan=plan, buf=fix_buf: numpy_fixed_epoch(imgs, plan, buf)
    rates = rounds(methods, cfg["rounds"])
    res["rates"] = rates
    res["average_image"] = f"{side}x{side}x3 ({side * side * 3} bytes); mixed average {(shapes.prod(1)).mean():.0f} bytes"
    res["average_sequence"] = f"({rows}, 16) float32; ragged average {mean_rows:.1f} rows"
    img_name, img_ceiling = best(rates, "ceiling img:")
    seq_name, seq_ceiling = best(rates, "ceiling seq:")
    img_what, seq_what = img_name.split(": ", 1)[1], seq_name.split(": ", 1)[1]
    for be in ("hdf5", "lmdb"):
        res["rows"][f"mixed images ({be})"] = ("mixed images", rates[f"mixed {be}"]["best"], img_ceiling,
                                              f"get_batch mixed, padded / {img_what}")
        res["rows"][f"mixed images packed ({be})"] = ("mixed images", rates[f"mixed packed {be}"]["best"],
                                                     img_ceiling, f"get_batch(ragged='packed') mixed / {img_what}")
        res["rows"][f"ragged sequences ({be})"] = ("ragged sequences", rates[f"seq {be}"]["best"], seq_ceiling,
                                                  f"get_batch ragged, padded / {seq_what}")
        res["rows"][f"ragged sequences packed ({be})"] = ("ragged sequences", rates[f"seq packed {be}"]["best"],
                                                         seq_ceiling, f"get_batch(ragged='packed') ragged / {seq_what}")
    res["rows"]["info: padded layout, numpy"] = ("info", rates["numpy padded"]["best"], img_ceiling,
                                                 f"numpy copy into the padded batch, no reader / {img_what}")
    return res


def section_jpeg(work: Path, cfg: dict[str, int], jpegs: Path) -> dict[str, Any]:
    import simplejpeg

    n = cfg["images"]
    fastdata.convert(jpegs, work / "jpeg_ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=THREADS), images=fastdata.ImageOptions(images="encoded")))
    files = sorted(jpegs.rglob("*.jpg"))
    blobs = [p.read_bytes() for p in files]
    plan = plans(n, 1, 4)[0]
    pools = {t: ThreadPoolExecutor(t) for t in COUNTS}

    shape = simplejpeg.decode_jpeg(blobs[0], colorspace="RGB").shape
    u8 = [np.empty((BATCH, *shape), np.uint8) for _ in range(2 * THREADS)]
    f32 = [np.empty((BATCH, *shape), np.float32) for _ in range(2 * THREADS)]

    def decode_epoch(t: int) -> int:
        """The ceiling: ``t`` threads, each decoding whole batches into a reused uint8 batch (no
        allocation per image, no barrier per batch), as the loader's reader threads do."""
        def batch(k: int) -> None:
            o = u8[k % len(u8)]
            for j, i in enumerate(plan[k].tolist()):
                simplejpeg.decode_jpeg(blobs[i], colorspace="RGB", buffer=o[j])

        list(pools[t].map(batch, range(len(plan))))
        return n

    def decode_float_epoch() -> int:
        """The float output's own cost, no loader: each image decoded into a reused batch, then
        converted to float while it is still in cache (a cast into the batch row, then the multiply
        in place, as ``decode="float"`` does), batches on ``THREADS`` threads."""
        def batch(k: int) -> None:
            o, f = u8[k % len(u8)], f32[k % len(f32)]
            for j, i in enumerate(plan[k].tolist()):
                simplejpeg.decode_jpeg(blobs[i], colorspace="RGB", buffer=o[j])
                f[j] = o[j]
                np.multiply(f[j], np.float32(1 / 255), out=f[j])

        list(pools[THREADS].map(batch, range(len(plan))))
        return n

    ld = fastdata.loader(work / "jpeg_ds", BATCH, device="cpu", num_workers=THREADS)
    ld8 = fastdata.loader(work / "jpeg_ds", BATCH, device="cpu", num_workers=THREADS,
                          config=LoaderConfig(image_dtype="uint8"))
    methods: dict[str, Callable[[], int]] = {
        f"ceiling: simplejpeg decode into reused buffers, {threads_label(t)}": (lambda t=t: decode_epoch(t))
        for t in COUNTS}
    methods.update({"loader float (default)": lambda: loader_epoch(ld, "image"),
                    "info: loader uint8": lambda: loader_epoch(ld8, "image"),
                    f"info: decode + float per image, no loader, {threads_label(THREADS)}": decode_float_epoch})
    rates = rounds(methods, cfg["rounds"])
    ld.close()
    ld8.close()
    for pool in pools.values():
        pool.shutdown()
    dec_name, dec = best(rates, "ceiling: simplejpeg")
    what = dec_name[9:]
    return {"rates": rates, "rows": {
        "jpeg float": ("jpeg float", rates["loader float (default)"]["best"], dec, f"loader float / {what}"),
        "info: loader uint8": ("info", rates["info: loader uint8"]["best"], dec, f"loader uint8 / {what}"),
        "info: float output, no loader": (
            "info", rates[f"info: decode + float per image, no loader, {threads_label(THREADS)}"]["best"], dec,
            f"decode + float per image (no loader) / {what}"),
    }}


def section_convert(work: Path, cfg: dict[str, int]) -> dict[str, Any]:
    src = work / "npy"
    files = write_npy_folder(src, cfg["npy"], NPY_SHAPE)
    total = sum(p.stat().st_size for p in files)
    _harness.warm_page_cache(src)

    groups = [files[start:stop] for start, stop in
              plan_shards(np.array([p.stat().st_size for p in files]), DEFAULT_SHARD_SIZE)]

    def copy_group(k: int) -> None:
        """One worker's shard: the group's files read into a reused buffer and written to one file, fsynced."""
        buf = bytearray(max(p.stat().st_size for p in groups[k]))
        with open(work / "copy" / f"{k:05d}.bin", "wb", buffering=0) as f:
            for q in groups[k]:
                with open(q, "rb", buffering=0) as g:
                    m = g.readinto(buf)
                f.write(memoryview(buf)[:m])
            os.fsync(f.fileno())

    def parallel_copy() -> float:
        shutil.rmtree(work / "copy", ignore_errors=True)
        (work / "copy").mkdir()
        os.sync()
        t0 = time.perf_counter()
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(copy_group, range(len(groups))))
        fsync_dir(work / "copy")
        return time.perf_counter() - t0

    def convert() -> float:
        shutil.rmtree(work / "npy_hdf5", ignore_errors=True)
        os.sync()
        t0 = time.perf_counter()
        fastdata.convert(src, work / "npy_hdf5", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="hdf5", workers=THREADS)))
        return time.perf_counter() - t0

    copy_name = f"parallel copy, {THREADS} workers, fsync per shard"
    times: dict[str, list[float]] = {copy_name: [], "fastdata convert": []}
    for _ in range(max(2, cfg["rounds"])):
        times[copy_name].append(parallel_copy())
        times["fastdata convert"].append(convert())
    shutil.rmtree(work / "copy", ignore_errors=True)
    med = {k: min(v) for k, v in times.items()}  # the best round of each, as for the rates
    return {"bytes": total, "seconds": times, "files": files, "shards": len(groups),
            "rows": {"convert": ("convert", med["fastdata convert"], med[copy_name],
                                 f"convert time / {copy_name} time")}}


def section_npy(work: Path, cfg: dict[str, int], files: list[Path]) -> dict[str, Any]:
    n = cfg["npy"]
    data = np.stack([np.load(p) for p in files])
    plan = plans(n, 1, 5)[0]
    pools = {t: ThreadPoolExecutor(t) for t in COUNTS}
    bufs = [np.empty((BATCH, *NPY_SHAPE), np.float32) for _ in range(2 * THREADS)]
    ld = fastdata.loader(work / "npy_hdf5", BATCH, device="cpu", num_workers=THREADS)
    methods: dict[str, Callable[[], int]] = {
        f"ceiling: memcpy gather, {threads_label(t)}": (lambda t=t: gather_epoch(data, plan, bufs, pools[t]))
        for t in COUNTS}
    methods["loader (default)"] = lambda: loader_epoch(ld, "x")
    rates = rounds(methods, cfg["rounds"])
    ld.close()
    for pool in pools.values():
        pool.shutdown()
    name, ceiling = best(rates, "ceiling: memcpy gather")
    return {"rates": rates, "rows": {"npy loader": ("npy loader", rates["loader (default)"]["best"], ceiling,
                                                    f"loader / {name[9:]}")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run, figures meaningless")
    ap.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=_harness.DEFAULT_RESULTS_DIR)
    ap.add_argument("--only", choices=("raw", "ragged", "jpeg", "convert"), default=None,
                    help="run one section (convert includes the .npy loader); results go to raw_<section>.*")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    torch.set_num_threads(THREADS)
    check: dict[str, Any] = {"over": {}, "quick": True}
    work = Path(tempfile.mkdtemp(prefix="bench_raw_", dir=args.workdir))
    try:
        need = cfg["npy"] * int(np.prod(NPY_SHAPE)) * 4 * 3 + (2 << 30)
        free = shutil.disk_usage(work).free
        if free < need:
            print(f"only {free / 1e9:.1f} GB free in {work}; the convert section needs {need / 1e9:.1f} GB", file=sys.stderr)
            return 2
        t0 = time.perf_counter()
        jpegs = work / "jpegs"
        bench_images.generate(jpegs, cfg["images"])
        _harness.warm_page_cache(jpegs)
        sections: dict[str, dict[str, Any]] = {}
        runs_of: dict[str, Callable[[], dict[str, Any]]] = {
            "raw": lambda: section_raw(work, cfg, jpegs), "ragged": lambda: section_ragged(work, cfg),
            "jpeg": lambda: section_jpeg(work, cfg, jpegs), "convert": lambda: section_convert(work, cfg)}
        for name, run in runs_of.items():
            if args.only in (None, name):
                sections[name] = run()
                print(f"{name} done", flush=True)
        if "convert" in sections:
            sections["npy"] = section_npy(work, cfg, sections["convert"].pop("files"))
        rows, table = [], []
        for sec in sections.values():
            for label, (target_key, value, ceiling, what) in sec["rows"].items():
                unit = "s" if target_key == "convert" else "samples/s"
                ratio = ceiling / value if unit == "s" else value / ceiling  # throughput, a fraction of the ceiling's
                goal = TARGETS[target_key]
                met = ratio >= goal
                rows.append({"row": label, "what": what, "value": value, "ceiling": ceiling, "ratio": ratio,
                             "target": goal if target_key != "info" else None, "met": met, "unit": unit})
                table.append([label, what, f"{value:,.2f}" if unit == "s" else f"{value:,.0f}",
                              f"{ceiling:,.2f}" if unit == "s" else f"{ceiling:,.0f}", unit, f"{ratio:.2f}",
                              f">= {goal}" if target_key != "info" else "-",
                              ("met" if met else "MISSED") if target_key != "info" else ""])
        check = _harness.check_ceiling("bench_raw", {r["row"]: r["ratio"] for r in rows}, args.quick)
        md = _harness.markdown_table(["row", "ratio of", "fastdata", "ceiling", "unit", "x ceiling", "target", ""], table)
        details = [f"\n### {name}\n" + _harness.markdown_table(
            ["method", "best", "median", "min"],
            [[k, f"{v['best']:,.0f}", f"{v['median']:,.0f}", f"{v['min']:,.0f}"] for k, v in sec["rates"].items()])
            for name, sec in sections.items() if "rates" in sec]
        if "convert" in sections:
            conv = sections["convert"]
            details.append(f"\n### convert\n{conv['bytes'] / 1e9:.2f} GB; seconds per round: " +
                           "; ".join(f"{k}: {', '.join(f'{t:.2f}' for t in v)}" for k, v in conv["seconds"].items()))
        extra = (f"\nmixed-size comparison: {sections['ragged']['average_image']}; {sections['ragged']['average_sequence']}\n"
                 if "ragged" in sections else "")
        text = (f"# bench_raw{' (quick: figures meaningless)' if args.quick else ''}\n\n{md}\n{extra}" + "\n".join(details)
                + f"\n\nwall time {time.perf_counter() - t0:.0f} s\n")
        print(text)
        results = {"config": cfg, "machine": _harness.machine_info(), "rows": rows, "ceiling_check": check,
                   "sections": {k: {kk: vv for kk, vv in v.items() if kk != "rows"} for k, v in sections.items()}}
        name = "raw" + (f"_{args.only}" if args.only else "") + ("_quick" if args.quick else "")
        _harness.write_results(name, results, text, args.out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return _harness.ceiling_exit(check)


if __name__ == "__main__":
    sys.exit(main())
