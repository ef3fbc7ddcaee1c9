"""Benchmark JPEG crop decoding: RandomResizedCrop(224) + flip, float output, batch 64, 2 threads.

Usage::

    python benchmarks/bench_jpeg_crop.py [--quick] [--out DIR] [--workdir DIR] [--no-train]

ImageNet-like photos, quality 90: half are crops of the real photos on this machine (matplotlib's
grace_hopper.jpg, the Rust embedded book's two board photos) resized to 350-800 px on the long side
with a little sensor noise, half are synthetic natural-looking scenes (multi-octave clouds, a sky
gradient, blurred shapes with edges, fine texture, noise). Two sets: mixed sizes, and one fixed size
(500x375). Each set is converted with the JPEG files kept (``--images encoded``), and the mixed set also
re-encoded with ``--images jpeg --max-side 256`` and ``384`` (quality 90), the other lever.

Timed (whole epochs, interleaved in rounds, median of the rounds; ratios paired within each round):

* the plain loop, the independent ceiling (what a user writes without fastdata): a full decode (simplejpeg,
  or PIL), a numpy crop of the drawn window, torch's uint8 antialiased bilinear resize on the channels-last
  view, the flip, /255 into a reused float NCHW batch, images mapped over 1 .. 2 threads, bytes in memory; its
  best variant (decoder, thread count) in the run is the ceiling;
* fastdata's loader with ``LoaderConfig(crop_decode=...)``: ``auto`` (simplejpeg, DCT-scaled when the
  window allows), ``off`` (whole images into a padded batch, crop after: the path before crop decoding);
  and ``auto`` with one of fastdata.loaders.host's settings changed (``AB``: paired A/B rows);
* fastdata's DALI backend (CPU, ``fn.decoders.image_slice`` of the drawn window);
* DALI's own CPU ``fn.decoders.image_random_crop`` + ``fn.resize`` + ``crop_mirror_normalize`` (coin-flip
  mirror), bytes from memory;
* FFCV: not measured when it cannot be installed from wheels (recorded why).

Quality: over each set, each image's first-epoch draw against the full decode + the exact float
crop and resize (``resample_into(..., exact=True)``): the loader's path (DCT-scaled decode where the window
allows, uint8 resize) and its A/B variants, the uint8 resize alone on the full decode, the plain loop's
resize, and the max-side conversions (PSNR, mean and worst).
Training parity: a small CNN trained with crop decoding on and off (3 seeds each) on 12 classes of
photo crops, evaluated on the same held-out images. fastdata's methods run with 2 threads.
Results: ``<out>/jpeg_crop[_quick].{json,md}``.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import simplejpeg
import torch
from _harness import DEFAULT_RESULTS_DIR, machine_info, markdown_table, warm_page_cache, write_results
from PIL import Image, ImageDraw, ImageFilter

import fastdata
from fastdata.augment import HorizontalFlip, RandomResizedCrop
from fastdata.converters import ConvertConfig, ImageOptions
from fastdata.format import ImageSpec
from fastdata.format.spec import CODEC_JPEG
from fastdata.loaders import LoaderConfig, host
from fastdata.loaders.host import decode_crop, resample_into
from fastdata.write import WriteOptions

OUT = 224
BATCH = 64
THREADS = 2
QUALITY = 90
FIXED = (375, 500)  # (H, W)
RESIZE_ROW = "uint8 resize alone (full decode)"
FULL = {"images": 512, "repeats": 9}
QUICK = {"images": 64, "repeats": 1}
PHOTOS = [Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
          / "matplotlib" / "mpl-data" / "sample_data" / "grace_hopper.jpg"]
PHOTOS += sorted(Path("/root/.rustup/toolchains").glob("stable-*/share/doc/rust/html/embedded-book/assets/*.jp*g"))


def photos() -> list[np.ndarray]:
    """The real photos found on this machine (RGB arrays)."""
    return [np.asarray(Image.open(p).convert("RGB")) for p in PHOTOS if p.exists()]


def synthetic(h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """A natural-looking scene: sky gradient, multi-octave clouds, blurred shapes with edges, texture, noise."""
    y = np.linspace(0, 1, h, dtype=np.float32)[:, None, None]
    top, bottom = rng.uniform(40, 220, 3), rng.uniform(20, 200, 3)
    img = top * (1 - y) + bottom * y + np.zeros((h, w, 3), np.float32)
    for k in range(1, 7):  # octaves of smooth noise
        small = rng.normal(0, 1, (2 ** k + 1, 2 ** k + 1, 3)).astype(np.float32)
        up = np.stack([np.asarray(Image.fromarray(small[..., c]).resize((w, h), Image.BICUBIC)) for c in range(3)], -1)
        img += up * (48 / k)
    im = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(im)
    for _ in range(rng.integers(4, 10)):
        x0, y0 = rng.uniform(-0.2, 1, 2) * (w, h)
        x1, y1 = x0 + rng.uniform(0.1, 0.6) * w, y0 + rng.uniform(0.1, 0.6) * h
        colour = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)([x0, y0, x1, y1], fill=colour)
    im = im.filter(ImageFilter.GaussianBlur(rng.uniform(0.6, 1.6)))
    a = np.asarray(im).astype(np.float32)
    a += np.sin(np.arange(w)[None, :, None] * rng.uniform(0.3, 1.2)) * rng.uniform(2, 8)  # fine texture
    a += rng.normal(0, 3, a.shape)
    return np.clip(a, 0, 255).astype(np.uint8)


def from_photo(src: np.ndarray, h: int, w: int, rng: np.random.Generator, quadrant: int | None = None) -> np.ndarray:
    """A crop of a real photo (in ``quadrant`` 0-3 when given), resized to (h, w), mirrored at random, with grain."""
    sh, sw = src.shape[:2]
    ch = int(sh * rng.uniform(0.4, 0.7))
    cw = min(sw, int(ch * w / h))
    if quadrant is None:
        y0, x0 = rng.integers(0, sh - ch + 1), rng.integers(0, sw - cw + 1)
    else:
        y0 = int(np.clip((quadrant // 2) * (sh - ch) + rng.integers(-sh // 10, sh // 10 + 1), 0, sh - ch))
        x0 = int(np.clip((quadrant % 2) * (sw - cw) + rng.integers(-sw // 10, sw // 10 + 1), 0, sw - cw))
    im = Image.fromarray(src[y0 : y0 + ch, x0 : x0 + cw]).resize((w, h), Image.BICUBIC)
    a = np.asarray(im).astype(np.float32) + rng.normal(0, 3, (h, w, 3))
    return np.clip(a, 0, 255).astype(np.uint8)


def size_of(rng: np.random.Generator, fixed: bool) -> tuple[int, int]:
    if fixed:
        return FIXED
    long = int(rng.integers(350, 801))
    short = int(long * rng.uniform(0.6, 1.0))
    return (short, long) if rng.random() < 0.75 else (long, short)


def make_set(root: Path, n: int, fixed: bool, seed: int) -> list[Path]:
    """``n`` JPEGs (quality 90) in one class folder: half from the real photos, half synthetic."""
    rng = np.random.default_rng(seed)
    srcs = photos()
    (root / "all").mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        h, w = size_of(rng, fixed)
        a = from_photo(srcs[i % len(srcs)], h, w, rng) if srcs and i % 2 else synthetic(h, w, rng)
        p = root / "all" / f"{i:05d}.jpg"
        Image.fromarray(a).save(p, "JPEG", quality=QUALITY)
        paths.append(p)
    return paths


def convert(src: Path, dst: Path, **image_kw: Any) -> Path:
    config = ConvertConfig(write=WriteOptions(workers=1), images=ImageOptions(**image_kw), overwrite=True)
    fastdata.convert(src, dst, config)
    return dst


def draws(n_batches: int, hw: np.ndarray, epoch: int) -> list[np.ndarray]:
    """Per batch, (B, 5) RandomResizedCrop windows (x0, y0, w, h) and HorizontalFlip's coin (0/1), from a
    seeded generator."""
    op, flip = RandomResizedCrop(OUT), HorizontalFlip()
    out = []
    for k in range(n_batches):
        rows = torch.from_numpy(hw[k * BATCH : (k + 1) * BATCH].astype(np.float32))
        g = torch.Generator().manual_seed(epoch * 10_000 + k)
        p = op.draw(g, rows)
        fw, fh, cx, cy = (p[n].double().numpy() for n in ("fw", "fh", "cx", "cy"))
        mirror = flip.draw(g, op.out_sizes(rows))["flip"].double().numpy()
        h, w = rows[:, 0].double().numpy(), rows[:, 1].double().numpy()
        out.append(np.stack([(cx - fw / 2) * w, (cy - fh / 2) * h, fw * w, fh * h, mirror], 1))
    return out


def _crop(i: int, boxes: np.ndarray) -> tuple[int, int, int, int]:
    """Batch row ``i``'s drawn window (x0, y0, w, h) rounded to whole pixels, as a user's numpy crop takes it."""
    x0, y0, w, h = (int(round(v)) for v in boxes[i, :4])
    return x0, y0, max(w, 1), max(h, 1)


def _decode_pil(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))


PLAIN_DECODERS: dict[str, Callable[[bytes], np.ndarray]] = {
    "simplejpeg": lambda data: simplejpeg.decode_jpeg(data, colorspace="RGB"), "PIL": _decode_pil}


def plain_image(files: list[bytes], decoder: str = "simplejpeg") -> tuple[Callable[[int, int, np.ndarray], None],
                                                                          torch.Tensor]:
    """The plain loop's work for one image, ``one(i, j, boxes)``: file ``i`` with row ``j`` of ``boxes`` (its
    batch's draws) into row ``j`` of the reused float NCHW (channels-last) batch it returns beside ``one``."""
    decode = PLAIN_DECODERS[decoder]
    out = torch.empty((BATCH, 3, OUT, OUT), dtype=torch.float32).contiguous(memory_format=torch.channels_last)

    def one(i: int, j: int, boxes: np.ndarray) -> None:
        x0, y0, w, h = _crop(j, boxes)
        x = torch.from_numpy(decode(files[i])[y0 : y0 + h, x0 : x0 + w]).permute(2, 0, 1)[None]
        y = torch.nn.functional.interpolate(x, (OUT, OUT), mode="bilinear", antialias=True)[0]
        torch.mul(y.flip(-1) if boxes[j, 4] else y, 1 / 255, out=out[j])

    return one, out


def plain_loop(files: list[bytes], hw: np.ndarray, decoder: str, threads: int) -> Callable[[int], int]:
    """The loop a user writes without fastdata (the independent ceiling): per image, a full decode
    (simplejpeg or PIL), a numpy crop of the drawn window, torch's uint8 antialiased bilinear resize on the
    channels-last view (its fast kernel's layout), the flip, and /255 into a reused float NCHW (channels-last)
    batch; ``threads`` > 1: the images of a batch mapped over a thread pool. Bytes from memory."""
    one, _ = plain_image(files, decoder)
    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    n_batches = len(files) // BATCH

    def epoch(e: int) -> int:
        for k, boxes in enumerate(draws(n_batches, hw, e)):
            if pool is None:
                for j in range(BATCH):
                    one(k * BATCH + j, j, boxes)
            else:
                list(pool.map(lambda j, k=k, boxes=boxes: one(k * BATCH + j, j, boxes), range(BATCH)))
        return n_batches * BATCH

    return epoch


def loader_epoch(root: Path, crop: str, backend: str = "torch") -> tuple[Callable[[int], int], Any]:
    aug = [RandomResizedCrop(OUT), HorizontalFlip()]
    ld = fastdata.loader(root, BATCH, device="cpu", backend=backend, augment=aug, num_workers=THREADS,  # type: ignore[arg-type]
                         drop_last=True, config=LoaderConfig(crop_decode=crop))  # type: ignore[arg-type]

    def epoch(i: int) -> int:
        n = 0
        for b in ld:
            n += len(b["image"])
        return n

    return epoch, ld


def dali_random_crop(files: list[bytes]) -> Callable[[int], int] | str:
    """DALI's own CPU random-crop decoder, fed the bytes from memory."""
    try:
        from nvidia.dali import fn, pipeline_def, types
    except ImportError as e:
        return f"DALI not installed: {e}"
    arrays = [np.frombuffer(f, np.uint8) for f in files]
    n_batches = len(files) // BATCH

    @pipeline_def(batch_size=BATCH, num_threads=THREADS, device_id=None, seed=0, prefetch_queue_depth=2)
    def pipe() -> Any:
        data = fn.external_source(source=lambda info: arrays[(info.iteration % n_batches) * BATCH:][:BATCH],
                                  batch=True, batch_info=True, dtype=types.UINT8)
        img = fn.decoders.image_random_crop(data, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                                            random_aspect_ratio=[3 / 4, 4 / 3])
        img = fn.resize(img, resize_x=OUT, resize_y=OUT, interp_type=types.INTERP_LINEAR, antialias=False)
        return fn.crop_mirror_normalize(img, dtype=types.FLOAT, output_layout="HWC", mean=[0.0] * 3, std=[255.0] * 3,
                                        mirror=fn.random.coin_flip())

    p = pipe()
    p.build()

    def epoch(i: int) -> int:
        for _ in range(n_batches):
            p.run()
        return n_batches * BATCH

    return epoch


def ffcv_status() -> str:
    """Whether FFCV installs here from wheels (``pip download ffcv==1.0.2 --no-deps``), and why not."""
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "ffcv==1.0.2", "--no-deps", "--only-binary=:all:",
                            "-d", d], capture_output=True, text=True, timeout=120)
        if r.returncode == 0:
            return "a wheel exists (not measured by this script)"
    return ("not measured: ffcv 1.0.2 is published as an sdist only (no wheel); its setup.py needs pkg-config's "
            "opencv4 and libjpeg-turbo headers, which pip cannot bring (pkg-config --exists opencv4 fails here)")


def gil_check(files: list[bytes], hw: np.ndarray) -> dict[str, float]:
    """A Python loop's speed while another thread decodes, as a fraction of its speed beside a sleeping
    thread: near that reference when the decoder releases the GIL (on 2 cores the loop shares a core)."""
    boxes = np.concatenate(draws(len(files) // BATCH, hw, 0))
    kinds: dict[str, Callable[[int], Any]] = {"sleep": lambda j: time.sleep(0.001),
                                              "simplejpeg": lambda j: simplejpeg.decode_jpeg(files[j], colorspace="RGB")}
    decoded = [simplejpeg.decode_jpeg(f, colorspace="RGB") for f in files[:16]]
    out = np.empty((OUT, OUT, 3), np.float32)

    def resize(j: int) -> None:
        i = j % len(decoded)
        resample_into(decoded[i], tuple(boxes[i, :4]), tuple(decoded[i].shape[:2]), out, flip=(j % 2 == 0, False))

    kinds["crop-and-resize (uint8, flip)"] = resize
    loops = {}
    for kind, fn in kinds.items():
        stop = threading.Event()

        def work(fn: Callable[[int], Any] = fn, stop: threading.Event = stop) -> None:
            j = 0
            while not stop.is_set():
                fn(j % len(boxes))
                j += 1

        t = threading.Thread(target=work)
        t.start()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            n += 1
        stop.set()
        t.join()
        loops[kind] = n
    return {k: round(v / loops["sleep"], 2) for k, v in loops.items() if k != "sleep"}


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a - b) ** 2).mean())
    return 99.0 if mse == 0 else 10 * np.log10(1 / mse)


def stored(root: Path) -> tuple[list[bytes], np.ndarray]:
    """The stored JPEG bytes and (H, W) of every sample, in the dataset's order."""
    ds = fastdata.open(root, decode=False)
    b = ds.get_batch(np.arange(len(ds)))
    files = [b["image"][i, : int(b["image_lengths"][i])].tobytes() for i in range(len(ds))]
    return files, b["image_shape"][:, :2].astype(np.int64)


AUTO = "crop decode (auto)"
PLAIN_ROW = "plain loop (antialiased uint8 resize of the rounded window, full decode)"
# crop_decode=auto with one of fastdata.loaders.host's settings changed, timed and measured (A/B): its fast IDCT
# switched off, and the 1/2 scale for windows 1-2x the output (REACH=0.5), which the default does not take
AB = {"FAST off (libjpeg-turbo's exact IDCT and chroma upsampling)": {"FAST": {}},
      "REACH=0.5 (1/2 scale also for windows 1-2x the output)": {"REACH": 0.5}}


def with_settings(fn: Callable[[int], Any], settings: dict[str, Any]) -> Callable[[int], Any]:
    """``fn`` run with fastdata.loaders.host's module settings changed (restored after each call)."""
    def run(i: int) -> Any:
        old = {k: getattr(host, k) for k in settings}
        for k, v in settings.items():
            setattr(host, k, v)
        try:
            return fn(i)
        finally:
            for k, v in old.items():
                setattr(host, k, v)

    return run


def quality(full: tuple[list[bytes], np.ndarray], smaller: dict[str, tuple[list[bytes], np.ndarray]]) -> dict[str, Any]:
    """PSNR of each image's first-epoch window (and flip) against the full-resolution decode + the exact float
    crop and resize: the loader's path (and each A/B variant), the uint8 resize alone on the full decode, the
    plain loop's resize, the max-side conversions."""
    files, hw = full
    boxes = np.concatenate(draws(len(files) // BATCH, hw, 0))
    spec = ImageSpec(mode="RGB")
    ref, got = np.empty((OUT, OUT, 3), np.float32), np.empty((OUT, OUT, 3), np.float32)
    variants = {AUTO: {}, **{f"crop decode, {k}": v for k, v in AB.items()}}
    rows: dict[str, list[float]] = {k: [] for k in variants}
    rows.update({RESIZE_ROW: [], PLAIN_ROW: []})
    rows.update({f"--max-side {k}": [] for k in smaller})
    plans: list[str] = []
    cpu: dict[str, list[float]] = {k: [] for k in [*variants, PLAIN_ROW]}
    plain, batch = plain_image(files)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the plain loop's torch ops on this thread alone, as its CPU time counts them
    order = list(variants)
    for i, drawn in enumerate(boxes):
        h, w = (int(v) for v in hw[i])
        box, flip = tuple(drawn[:4]), (bool(drawn[4]), False)
        whole = simplejpeg.decode_jpeg(files[i], colorspace="RGB")
        resample_into(whole, box, (h, w), ref, flip=flip, exact=True)
        for name in order[i % len(order) :] + order[: i % len(order)]:  # rotated: no variant always first
            c0 = time.thread_time()
            plan = with_settings(lambda i, hw=(h, w), box=box, flip=flip: decode_crop(files[i], CODEC_JPEG, spec, hw, box,
                                                                                     got, flip), variants[name])(i)
            cpu[name].append(time.thread_time() - c0)
            plans += [plan] if name == AUTO else []
            rows[name].append(_psnr(got, ref))
        resample_into(whole, box, (h, w), got, flip=flip)
        rows[RESIZE_ROW].append(_psnr(got, ref))
        c0 = time.thread_time()
        plain(i, i % BATCH, boxes[i // BATCH * BATCH :])  # the plain loop's work for this image, on this thread
        cpu[PLAIN_ROW].append(time.thread_time() - c0)
        rows[PLAIN_ROW].append(_psnr(batch[i % BATCH].permute(1, 2, 0).numpy(), ref))
        for k, (sf, shw) in smaller.items():
            s = shw[i, 1] / w  # the re-encoded image's scale; the same relative window
            resample_into(simplejpeg.decode_jpeg(sf[i], colorspace="RGB"), tuple(drawn[:4] * s), tuple(shw[i]), got,
                          flip=flip)
            rows[f"--max-side {k}"].append(_psnr(got, ref))
    torch.set_num_threads(threads)
    out = {}
    for name, ps in rows.items():
        arr = np.array(ps)
        out[name] = {"mean_db": round(float(arr.mean()), 2), "worst_db": round(float(arr.min()), 2),
                     "worst_sample": int(arr.argmin()), "images": len(arr)}
    for name, t in cpu.items():  # one thread's CPU time per window, and as a multiple of auto's per block of windows
        blocks = [sum(cpu[AUTO][a : a + BATCH]) / sum(t[a : a + BATCH]) for a in range(0, len(t), BATCH)]
        out[name]["cpu_ms_per_window"] = round(float(np.mean(t)) * 1e3, 3)
        out[name]["x_auto_cpu_blocks"] = {"median": round(float(np.median(blocks)), 3), "min": round(min(blocks), 3),
                                          "max": round(max(blocks), 3)}
    scaled = [p for p, pl in zip(rows[AUTO], plans) if pl == "scaled"]
    out[AUTO]["scaled_windows"] = len(scaled)
    out[AUTO]["scaled_mean_db"] = round(float(np.mean(scaled)), 2) if scaled else None
    return out


class Net(torch.nn.Module):
    """A small CNN for the parity check."""

    def __init__(self, classes: int) -> None:
        super().__init__()
        c = [3, 16, 32, 64]
        layers: list[torch.nn.Module] = []
        for a, b in zip(c, c[1:]):
            layers += [torch.nn.Conv2d(a, b, 3, stride=2, padding=1), torch.nn.BatchNorm2d(b), torch.nn.ReLU()]
        self.body = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.head = torch.nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def parity_sets(work: Path, n_train: int, n_test: int) -> tuple[Path, Path]:
    """12 classes: which real photo (3) and which quadrant of it (4) a crop comes from; mixed sizes."""
    srcs = photos()
    rng = np.random.default_rng(7)
    roots = []
    for name, n in (("train", n_train), ("test", n_test)):
        src = work / f"parity_{name}_src"
        shutil.rmtree(src, ignore_errors=True)
        for i in range(n):
            cls = i % (len(srcs) * 4)
            h, w = size_of(rng, False)
            folder = src / f"c{cls:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(from_photo(srcs[cls // 4], h, w, rng, cls % 4)).save(folder / f"{i:05d}.jpg", quality=QUALITY)
        roots.append(convert(src, work / f"parity_{name}", images="encoded"))
    return roots[0], roots[1]


def train_once(train: Path, test: Path, crop: str, seed: int, epochs: int) -> float:
    torch.manual_seed(seed)
    model = Net(12)
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    aug = [RandomResizedCrop(96, scale=(0.25, 1.0)), HorizontalFlip()]
    ld = fastdata.loader(train, 32, device="cpu", augment=aug, seed=seed, num_workers=THREADS,
                         config=LoaderConfig(crop_decode=crop))  # type: ignore[arg-type]
    for _ in range(epochs):
        for b in ld:
            loss = torch.nn.functional.cross_entropy(model(b["image"]), b["label"].long())
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    from fastdata.augment import Resize

    ev = fastdata.loader(test, 64, device="cpu", shuffle=False, augment=[Resize(96)], config=LoaderConfig(crop_decode="off"))
    right = total = 0
    with torch.no_grad():
        for b in ev:
            right += int((model(b["image"]).argmax(1) == b["label"].long()).sum())
            total += len(b["label"])
    return right / total


def parity(work: Path, quick: bool) -> dict[str, Any]:
    train, test = parity_sets(work, 96 if quick else 480, 48 if quick else 240)
    seeds, epochs = ((0,), 1) if quick else ((0, 1, 2), 8)
    acc = {crop: [round(train_once(train, test, crop, s, epochs), 4) for s in seeds] for crop in ("auto", "off")}
    return {"accuracy": acc, "epochs": epochs, "seeds": list(seeds), "classes": 12,
            "mean": {k: round(float(np.mean(v)), 4) for k, v in acc.items()},
            "spread": {k: round(float(np.max(v) - np.min(v)), 4) for k, v in acc.items()}}


PLAIN = "plain loop"
DALI_CPU = "DALI CPU image_random_crop"


def time_set(roots: dict[str, Path], repeats: int) -> dict[str, Any]:
    """Images/s of every method on one set (``roots``: "encoded" and any max-side conversions); the plain
    loop in every variant (decoder, 1 .. THREADS threads), its best variant the ceiling."""
    files, hw = stored(roots["encoded"])
    n = len(files) // BATCH * BATCH
    methods: dict[str, Callable[[int], int]] = {}
    for decoder in PLAIN_DECODERS:
        for t in range(1, THREADS + 1):
            methods[f"{PLAIN}: {decoder}, {t} thread{'s' if t > 1 else ''}"] = plain_loop(files[:n], hw, decoder, t)
    for crop in ("auto", "off"):
        methods[f"fastdata crop_decode={crop}"], _ = loader_epoch(roots["encoded"], crop)
    for name, settings in AB.items():
        methods[f"fastdata crop_decode=auto, {name} (A/B)"] = with_settings(loader_epoch(roots["encoded"], "auto")[0],
                                                                            settings)
    methods["fastdata DALI backend (image_slice)"], _ = loader_epoch(roots["encoded"], "auto", "dali")
    dali = dali_random_crop(files[:n])
    if callable(dali):
        methods[DALI_CPU] = dali
    for k in roots:
        if k != "encoded":
            methods[f"fastdata crop_decode=auto, --max-side {k}"], _ = loader_epoch(roots[k], "auto")
    times, cpu = interleaved(methods, repeats)
    rate = {k: n / float(np.median(t)) for k, t in times.items()}
    best = max((k for k in rate if k.startswith(PLAIN)), key=rate.__getitem__)
    out = {"images": n, "seconds_per_round": {k: [round(x, 4) for x in t] for k, t in times.items()},
           "cpu_seconds_per_round": {k: [round(x, 4) for x in t] for k, t in cpu.items()},
           "cpu_ms_per_image": {k: round(float(np.median(t)) / n * 1e3, 3) for k, t in cpu.items()},
           "images_per_s": {k: round(v, 1) for k, v in rate.items()}, "plain_loop_best": best,
           "x_plain_loop": paired(times, best), "dali_random_crop": None if callable(dali) else dali,
           # each variant's speed (wall, and CPU time) as a multiple of crop_decode=auto's, round by round
           "ab": {k: paired(times, "fastdata crop_decode=auto")[f"fastdata crop_decode=auto, {k} (A/B)"] for k in AB},
           "ab_cpu": {k: paired(cpu, "fastdata crop_decode=auto")[f"fastdata crop_decode=auto, {k} (A/B)"] for k in AB}}
    if callable(dali):
        out["x_dali_cpu"] = paired(times, DALI_CPU)
    return out


def interleaved(methods: dict[str, Callable[[int], int]], repeats: int) -> tuple[dict[str, list[float]], ...]:
    """Wall and CPU seconds (this process, all threads) of one epoch of every method in each of ``repeats``
    rounds; a round runs every method (in rotating order) once untimed, then once timed, so that the machine's
    drift hits all of them alike. CPU time barely moves with other tenants' load: the A/B rows' steadier measure."""
    names = list(methods)
    wall: dict[str, list[float]] = {k: [] for k in names}
    cpu: dict[str, list[float]] = {k: [] for k in names}
    for r in range(repeats):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            methods[name](r)
            t0, c0 = time.perf_counter(), time.process_time()
            methods[name](r)
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    return wall, cpu


def paired(times: dict[str, list[float]], ref: str) -> dict[str, dict[str, float]]:
    """Each method's speed as a multiple of ``ref``'s, round by round (the same round's epochs): median and range."""
    out = {}
    for k, t in times.items():
        r = [b / a for a, b in zip(t, times[ref])]
        out[k] = {"median": round(float(np.median(r)), 3), "min": round(min(r), 3), "max": round(max(r), 3)}
    return out


def _ratio(r: dict[str, float]) -> str:
    return f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"


def render(info: dict[str, Any], res: dict[str, Any]) -> str:
    out = ["# JPEG crop decoding: RandomResizedCrop(224) + flip, float, batch 64, 2 threads", "",
           f"Machine: {info.get('cpu_model')}, {info.get('usable_cores')} usable cores. FFCV: {res['ffcv']}", ""]
    for name, s in res["sets"].items():
        out += [f"## {name} ({s['images']} images)", ""]
        dali = s.get("x_dali_cpu")
        rows = [(k + (" (best: the ceiling)" if k == s["plain_loop_best"] else ""), f"{v:,.0f}",
                 _ratio(s["x_plain_loop"][k]), _ratio(dali[k]) if dali else "-", f"{s['cpu_ms_per_image'][k]:.2f}")
                for k, v in s["images_per_s"].items()]
        out += [markdown_table(["method", "images/s", "x plain loop", "x DALI CPU", "CPU ms per image"], rows), ""]
        out += [f"Medians of {len(next(iter(s['seconds_per_round'].values())))} interleaved rounds; the ratios are "
                "paired within each round (median, and range over the rounds).", ""]
        out += ["A/B: `crop_decode=auto` with one setting of fastdata/loaders/host.py changed, its speed as a "
                "multiple of `crop_decode=auto`'s, paired per round (wall clock; and by CPU time, which other tenants' "
                "load barely moves):", "",
                markdown_table(["changed", "x crop_decode=auto, wall (median, range)", "x crop_decode=auto, CPU time"],
                               [(k, _ratio(v), _ratio(s["ab_cpu"][k])) for k, v in s["ab"].items()]), ""]
    out += [f"Python loop speed beside a decoding thread, as a fraction of beside a sleeping one (GIL released "
            f"when well above 0): {res['gil']}", ""]
    for name, q in res["quality"].items():
        out += [f"## Quality: PSNR against full decode + the exact float crop and resize ({name})", ""]
        out += [markdown_table(["path", "mean dB", "worst dB", "worst sample", "CPU ms per window",
                                "speed x crop decode (auto), by CPU time"],
                               [(k, v["mean_db"], v["worst_db"], v["worst_sample"], v.get("cpu_ms_per_window", "-"),
                                 _ratio(v["x_auto_cpu_blocks"]) if "x_auto_cpu_blocks" in v else "-")
                                for k, v in q.items()]), ""]
        out += ["CPU ms per window: `decode_crop` alone (the plain loop: its work for one image, torch on one "
                "thread), on this one thread (its own CPU time, which other tenants' load barely moves), each window "
                "done by every variant in turn (rotated order); the speed ratio's median and range are over blocks of "
                f"{BATCH} windows.", ""]
        a = q[AUTO]
        out += [f"{a['scaled_windows']} of {a['images']} windows were decoded at a DCT scale (mean "
                f"{a['scaled_mean_db']} dB); the others at full scale; every window is then resized in uint8 (the row "
                f"'{RESIZE_ROW}': that resize alone).", ""]
    if res.get("parity"):
        p = res["parity"]
        out += ["## Training parity (small CNN, 12 classes of photo crops)", "",
                markdown_table(["crop_decode", "accuracy per seed", "mean", "spread"],
                               [(k, ", ".join(f"{x:.3f}" for x in v), f"{p['mean'][k]:.3f}", f"{p['spread'][k]:.3f}")
                                for k, v in p["accuracy"].items()]),
                "", f"{p['epochs']} epochs, seeds {p['seeds']}, evaluated on the same held-out images (Resize(96)).", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(DEFAULT_RESULTS_DIR))
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--no-train", action="store_true", help="skip the training parity check")
    a = ap.parse_args(argv)
    settings = QUICK if a.quick else FULL
    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-jpeg-crop-"))
    t0 = time.perf_counter()
    res: dict[str, Any] = {"settings": settings, "ffcv": ffcv_status(), "sets": {}}
    try:
        mixed = {"encoded": convert(work / "mixed_src", work / "mixed", images="encoded")} \
            if make_set(work / "mixed_src", settings["images"], False, 0) else {}
        for side in (256, 384):
            mixed[str(side)] = convert(work / "mixed_src", work / f"mixed_{side}", images="jpeg", max_side=side,
                                       quality=QUALITY)
        make_set(work / "fixed_src", settings["images"], True, 1)
        fixed = {"encoded": convert(work / "fixed_src", work / "fixed", images="encoded")}
        warm_page_cache(work)
        names = ("mixed sizes, 350-800 px long side", f"one size, {FIXED[1]}x{FIXED[0]}")
        res["quality"] = {names[0]: quality(stored(mixed["encoded"]), {k: stored(v) for k, v in mixed.items()
                                                                        if k != "encoded"}),
                          names[1]: quality(stored(fixed["encoded"]), {})}
        res["sets"][names[0]] = time_set(mixed, settings["repeats"])
        res["sets"][names[1]] = time_set(fixed, settings["repeats"])
        res["gil"] = gil_check(*stored(mixed["encoded"]))
        res["parity"] = None if a.no_train or a.quick else parity(work, a.quick)
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    info = machine_info()
    md = render(info, res)
    write_results("jpeg_crop_quick" if a.quick else "jpeg_crop", {"machine": info, **res}, md, a.out)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
