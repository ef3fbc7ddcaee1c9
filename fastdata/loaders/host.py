"""Host side of the torch backend: reader threads fill each batch with ``get_batch`` straight into recycled (pinned
on CUDA) buffers, the copies releasing the GIL; with a crop first in ``augment``, they decode only each image's
window (JPEGs at the smallest DCT scale that keeps the output's resolution), resampled into a float batch."""

from __future__ import annotations

import logging
import math
import sys
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Callable, Iterator, Literal

import numpy as np
import simplejpeg
import torch

from fastdata._compat import storage_use_count
from fastdata.augment import (
    Augment,
    CenterCrop,
    HorizontalFlip,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    VerticalFlip,
    batch_generator,
    pair,
)
from fastdata.augment.image_ops import check_fits
from fastdata.augment.targets import Mask
from fastdata.errors import CorruptShardError, LoaderWorkerError
from fastdata.format.spec import (
    CODEC_JPEG,
    CODEC_SUFFIX,
    ENCODING_IMAGE,
    ENCODING_PIXELS,
    IMAGE_ENCODINGS,
    LENGTHS_SUFFIX,
    SHAPE_SUFFIX,
    FieldSpec,
    ImageSpec,
    is_string,
)
from fastdata.loaders.base import LoaderConfig, wrap_error
from fastdata.loaders.transform import BatchTransform, TransformError
from fastdata.reading.dataset import Dataset
from fastdata.reading.decode import SJ_COLORSPACE, DecodeError, check_shapes, decode_image

log = logging.getLogger(__name__)


def torch_dtype(dt: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (native byte order)."""
    return torch.from_numpy(np.empty(0, dtype=np.dtype(dt).newbyteorder("="))).dtype


ALIGN = 64  # a cache line (every dtype's alignment)


def allocate(shape: tuple[int, ...], dtype: torch.dtype, phase: int, pin: bool) -> torch.Tensor:
    """An uninitialised contiguous tensor whose data starts at ``phase`` mod 64 bytes (a multiple of the
    dtype's size, as :func:`copy_phases` gives; torch's allocators align to 64 bytes or more)."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    nbytes = math.prod(shape) * itemsize
    if phase % ALIGN == 0 or nbytes == 0:
        return torch.empty(shape, dtype=dtype, pin_memory=pin)
    if pin and (nbytes - 1).bit_length() != (nbytes + ALIGN - 1).bit_length():
        return torch.empty(shape, dtype=dtype, pin_memory=pin)  # pinned memory comes in powers of two
    flat = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=pin)
    start = (phase - flat.data_ptr()) % ALIGN
    # set_ rather than a view: a view keeps its base tensor, which _in_use would count as a user
    return torch.empty(0, dtype=dtype).set_(flat.untyped_storage(), start // itemsize, shape)  # type: ignore[call-overload]


def _in_use(t: torch.Tensor) -> bool:
    """True while anything but the pool uses ``t``'s memory; when torch cannot tell, assume it is."""
    # getrefcount counts its argument, this function's parameter and the caller's one name for ``t``
    if sys.getrefcount(t) > 3:
        return True
    users = storage_use_count(t)
    return users is None or users > 1  # only the tensor itself may use the storage


class Recycler:
    """Hands out tensors of a shape and dtype, reusing returned ones that nothing else uses."""

    def __init__(self, pin: bool = False) -> None:
        self.pin = pin
        self._free: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        self._lent: list[torch.Tensor] = []
        self._lock = threading.Lock()  # reader threads take and lend concurrently

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, phase: int = 0) -> torch.Tensor:
        """A tensor of ``shape`` and ``dtype`` at address phase ``phase`` where possible (a recycled one keeps
        its own phase: one Recycler per phase); call :meth:`lend` once handed on."""
        with self._lock:
            self._reclaim()
            bucket = self._free.get((tuple(shape), dtype))
            if bucket:
                return bucket.pop()
        return allocate(tuple(shape), dtype, phase, self.pin)

    def lend(self, t: torch.Tensor) -> None:
        """``t`` now belongs to the consumer; reuse it once nothing refers to it any more."""
        with self._lock:
            self._lent.append(t)

    def _reclaim(self) -> None:
        still = []
        while self._lent:
            t = self._lent.pop()
            if _in_use(t):
                still.append(t)
            else:
                self._free.setdefault((tuple(t.shape), t.dtype), []).append(t)
            del t
        self._lent = still


HostBatch = dict[str, torch.Tensor]
Ragged = Literal["padded", "packed"]
Post = Callable[[HostBatch, int], HostBatch]


def reader_fields(dataset: Dataset) -> tuple[dict[str, tuple[tuple[int, ...], str]], dict[str, str]]:
    """The native-endian fields a reader gives ``get_batch`` buffers for: fixed ones as (per-sample shape,
    dtype), ragged ones (and images stored ragged) as the dtype of their padded batch."""
    fixed = {f.name: (f.trailing, f.np_dtype.str) for f in dataset.schema if not f.ragged and f.np_dtype.isnative}
    unit_float = dataset.options.get("decode") == "float"  # encoded images decode to float32
    flat = {f.name: np.dtype(np.float32).str if unit_float and f.encoding == ENCODING_IMAGE else f.np_dtype.str
            for f in dataset.schema if f.ragged and f.np_dtype.isnative and not is_string(f)}
    return fixed, flat


def copy_phases(dataset: Dataset) -> dict[str, int]:
    """Per fixed field, where (mod 64 bytes) its samples lie in the first shard's memory: a batch buffer at the
    same phase fills fastest; fields whose rows are not whole cache lines are left out."""
    out = {}
    for f in dataset.schema:
        if f.ragged or f.row_nbytes % 64:
            continue
        try:
            phase = dataset.readers[0].copy_phase(f.name)
        except Exception:  # only a hint: the read itself reports what is wrong, naming the batch
            continue
        if phase % f.np_dtype.itemsize == 0:
            out[f.name] = phase
    return out


class _BufferPool:
    """Recycled buffers for the native-endian fields of a batch: the batch's shape for fixed fields, flat
    for ragged ones (sized from the batches seen so far)."""

    def __init__(self, dataset: Dataset, pin: bool) -> None:
        self.pin = pin
        fixed, flat = reader_fields(dataset)
        phases = copy_phases(dataset)
        self.fixed = [(name, trailing, torch_dtype(dt), phases.get(name, 0)) for name, (trailing, dt) in fixed.items()]
        self.ragged = {name: torch_dtype(dt) for name, dt in flat.items()}
        self.capacity = dict.fromkeys(self.ragged, 0)  # elements; 0 until a batch was seen
        self.recyclers = {name: Recycler(pin) for name in [*fixed, *flat]}

    def take(self, b: int) -> dict[str, torch.Tensor]:
        """Buffers for a batch of ``b``; they belong to the caller until :meth:`give_back`."""
        bufs = {name: self.recyclers[name].take((b, *shape), dtype, phase) for name, shape, dtype, phase in self.fixed}
        for name, dtype in self.ragged.items():
            if self.capacity[name]:
                bufs[name] = self.recyclers[name].take((self.capacity[name],), dtype)
        return bufs

    def saw(self, name: str, numel: int) -> None:
        """A batch of ragged field ``name`` needed ``numel`` elements: later buffers hold 25% more."""
        if numel > self.capacity.get(name, numel):
            self.capacity[name] = numel + numel // 4
            self.recyclers[name] = Recycler(self.pin)

    def give_back(self, bufs: dict[str, torch.Tensor]) -> None:
        """The batch was yielded: reuse its buffers once the consumer lets go of them."""
        for name, t in bufs.items():
            if t.numel() == self.capacity.get(name, t.numel()):  # not from a recycler since replaced
                self.recyclers[name].lend(t)


def to_tensors(batch: dict[str, Any]) -> HostBatch:
    """Arrays become tensors; lists of strings (string fields, keys) pass through unchanged."""
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if isinstance(v, np.ndarray):
            out[k] = torch.from_numpy(v if v.dtype.isnative else v.astype(v.dtype.newbyteorder("=")))
        else:
            out[k] = v  # (a tensor: already in its final, recycled memory)
    return out


def _same_memory(t: torch.Tensor, a: Any) -> bool:
    """True when numpy array ``a`` is exactly tensor ``t``'s memory (shape, dtype and address)."""
    return isinstance(a, np.ndarray) and a.__array_interface__["data"][0] == t.data_ptr() \
        and tuple(a.shape) == tuple(t.shape) and a.dtype.itemsize == t.element_size() and a.flags.c_contiguous


class ThreadReader:
    """Reads batches in ``threads`` threads, at most ``prefetch`` batches ahead, in order; the user's
    ``transform`` runs in the thread that read the batch."""

    def __init__(self, dataset: Dataset, threads: int, prefetch: int, pin: bool, ragged: Ragged = "padded",
                 transform: BatchTransform | None = None, crop: CropStage | None = None,
                 timeout: float | None = None) -> None:
        self.dataset = dataset
        self.timeout = timeout
        self._stuck = False  # a read outlived the timeout
        self.crop = crop  # decodes the augmented image field window by window (CropStage)
        self.ragged = ragged
        self.transform = transform
        self.threads = threads  # 0: read in the iterating thread
        self.prefetch = max(prefetch, threads)
        self.pool = _BufferPool(dataset, pin)
        self._executor: ThreadPoolExecutor | None = None

    def _read(self, k: int, idx: np.ndarray, bufs: dict[str, torch.Tensor], post: Post | None,
              epoch: int, rank: int) -> HostBatch:
        where = f"loader thread {threading.current_thread().name!r}, batch {k}"
        try:
            batch = self.dataset.get_batch(idx, out={name: t.numpy() for name, t in bufs.items()}, ragged=self.ragged,
                                            companions=True)
            for name in self.pool.ragged:
                self.pool.saw(name, batch[name].size)  # ragged results are views of their buffer when large enough
            if self.crop is not None:
                root = self.dataset.root
                batch = self.crop(batch, epoch, rank, k, lambda j: f"{root}: sample {int(idx[j])}")
            if self.transform is not None:
                batch = self.transform(batch, epoch, rank, k)
            # a fixed field still in its buffer is handed out as the buffer itself (recycled once let go)
            result: dict[str, Any] = {name: bufs[name] for name, v in batch.items()
                                      if name in bufs and name not in self.pool.ragged and _same_memory(bufs[name], v)}
            result.update(to_tensors({name: v for name, v in batch.items() if name not in result}))
        except TransformError as e:
            raise LoaderWorkerError(f"{where}, in the transform: {e}") from e.__cause__
        except Exception as e:  # (also a transform's array torch cannot take: as processes mode says it)
            raise wrap_error(e, where) from e
        return post(result, k) if post is not None else result

    def run(self, plan: list[np.ndarray], first: int = 0, post: Post | None = None,
            epoch: int = 0, rank: int = 0) -> Iterator[HostBatch]:
        """Batches of ``plan`` (``first``, ... of ``epoch``) in order; ``post(batch, k)`` runs in the reader thread."""
        if self.threads == 0:
            for k, idx in enumerate(plan, first):
                bufs = self.pool.take(len(idx))
                yield self._read(k, idx, bufs, post, epoch, rank)
                self.pool.give_back(bufs)
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="fastdata-read")
        pending: deque[tuple[Future[HostBatch], dict[str, torch.Tensor]]] = deque()
        nxt = 0
        try:
            while nxt < len(plan) or pending:
                while nxt < len(plan) and len(pending) < self.prefetch:
                    bufs = self.pool.take(len(plan[nxt]))
                    pending.append((self._executor.submit(self._read, first + nxt, plan[nxt], bufs, post, epoch, rank),
                                    bufs))
                    nxt += 1
                k = first + nxt - len(pending)
                fut, bufs = pending.popleft()
                try:
                    batch = fut.result(timeout=self.timeout)
                except FutureTimeout:
                    self._stuck = True  # its thread is still busy: close() must not wait for it
                    raise LoaderWorkerError(
                        f"batch {k} was not read within timeout={self.timeout} s: its read or transform hangs, or is "
                        "that slow; its reader thread cannot be stopped and stays busy (LoaderConfig(mode='processes') "
                        "kills a hung worker instead)") from None
                yield batch
                self.pool.give_back(bufs)
                del fut, bufs, batch
        finally:
            for fut, _ in pending:
                fut.cancel()
            pending.clear()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=not self._stuck, cancel_futures=True)
            self._executor = None
        self._stuck = False


FIRST_OPS = (RandomResizedCrop, RandomCrop, CenterCrop, Resize)
FLIPS = (HorizontalFlip, VerticalFlip)  # right after the first op: the reader mirrors while it samples


def crop_field(dataset: Dataset, augment: Augment | None, images: tuple[str, ...], config: LoaderConfig,
               threads: bool) -> str | None:
    """The image field the readers can decode window by window (one augmented image field whose chain starts
    with a crop or Resize), or None, and then why is logged."""
    why = _why_not(dataset, augment, images, config, threads)
    if why is not None:
        log.debug("crop decoding off: %s", why)
        return None
    return images[0] if augment is None or augment.fields is None else tuple(augment.fields)[0]


def _why_not(dataset: Dataset, augment: Augment | None, images: tuple[str, ...], config: LoaderConfig,
             threads: bool) -> str | None:
    if augment is None or not augment.enabled_ops or augment.op_kind != "image":
        return "no image augmentation"
    if config.crop_decode == "off" or config.image_dtype != "float32" or config.ragged != "padded" or not threads:
        return "LoaderConfig (crop_decode='off', uint8 images, packed batches or worker processes)"
    if augment.views != 1 or not augment.ops or type(augment.ops[0]) not in FIRST_OPS:
        return "the augmentation does not start with a crop or Resize (or has several views)"
    if any(isinstance(t, Mask) for t in augment.targets.values()):
        return "a Mask target is warped on the image's whole canvas"
    names = tuple(augment.fields) if augment.fields is not None else images
    decoded = [f for f in dataset.schema if f.encoding in IMAGE_ENCODINGS]
    if len(names) != 1 or [f.name for f in decoded] != list(names):
        return f"needs exactly one image field to decode and augment, here {list(names)}"
    f = decoded[0]
    if f.encoding == ENCODING_PIXELS and not f.ragged:
        return "raw pixels of one size: already read without padding"
    if dataset.options.get("decode") is False or dataset.remote is not None:
        return "the dataset does not decode, or is remote"
    return None


class CropStage:
    """Turns a batch read with ``decode=False`` into the output of the chain's first ops for ``field`` (the crop or
    Resize and the flips right after it), one image at a time, in the calling reader thread."""

    def __init__(self, field: FieldSpec, chain: tuple[Any, ...], seed: int, pin: bool) -> None:
        self.field = field
        self.op = chain[0]
        n = 1
        while n < len(chain) and type(chain[n]) in FLIPS:
            n += 1
        self.ops = tuple(chain[:n])
        self.seed = seed
        self.size = pair(self.op.size)
        self._floats = Recycler(pin)

    def boxes(self, shapes: np.ndarray, epoch: int, rank: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(B, 4) float64 windows (x0, y0, w, h, in each image's pixels) from the first op's draw for batch ``k``,
        and (B, 2) bool mirrors (left-right, top-bottom) from the flips' draws after it."""
        hw = torch.from_numpy(np.ascontiguousarray(shapes[:, :2], dtype=np.float32))
        oh, ow = self.size
        if isinstance(self.op, (RandomCrop, CenterCrop)):
            check_fits(type(self.op).__name__, self.size, hw)
        g = batch_generator(self.seed, epoch, k, torch.device("cpu"), rank)
        p = self.op.draw(g, hw)
        flips = np.zeros((len(hw), 2), dtype=bool)
        after = self.op.out_sizes(hw)
        for f in self.ops[1:]:  # drawn in the chain's order, from the same generator
            flips[:, 0 if isinstance(f, HorizontalFlip) else 1] ^= f.draw(g, after)["flip"].numpy()
        h, w = hw[:, 0].double().numpy(), hw[:, 1].double().numpy()
        if isinstance(self.op, RandomResizedCrop):
            fw, fh, cx, cy = (p[n].double().numpy() for n in ("fw", "fh", "cx", "cy"))
            return np.stack([(cx - fw / 2) * w, (cy - fh / 2) * h, fw * w, fh * h], 1), flips
        if isinstance(self.op, Resize):
            return np.stack([np.zeros_like(w), np.zeros_like(h), w, h], 1), flips
        start = p["start"].double().numpy()
        return np.stack([start[:, 1], start[:, 0], np.full_like(w, ow), np.full_like(h, oh)], 1), flips

    def __call__(self, batch: dict[str, Any], epoch: int, rank: int, k: int, where: Callable[[int], str]) -> dict[str, Any]:
        """Replace ``batch[name]`` (stored bytes, padded per row) by the float32 (B, oh, ow, C) first-op
        output in [0, 1]; ``<name>_shape`` keeps the stored sizes (the device stage draws from them)."""
        f, spec = self.field, self.field.image
        assert spec is not None
        name = f.name
        data = batch[name]
        lengths = batch.pop(name + LENGTHS_SUFFIX)
        shapes = batch[name + SHAPE_SUFFIX]
        check_shapes(f, shapes, lengths, where)
        boxes, flips = self.boxes(shapes, epoch, rank, k)
        oh, ow = self.size
        out = self._floats.take((len(shapes), oh, ow, spec.channels), torch.float32)
        self._floats.lend(out)  # reused once the consumer has let go of the batch
        arr = out.numpy()
        codecs = batch.get(name + CODEC_SUFFIX)
        for j, (h, w, _) in enumerate(shapes.tolist()):
            box: tuple[float, float, float, float] = tuple(boxes[j].tolist())
            flip = (bool(flips[j, 0]), bool(flips[j, 1]))
            try:
                if f.encoding == ENCODING_PIXELS:
                    pixels = data[j][: h * w * spec.channels].reshape(h, w, spec.channels)
                    resample_into(pixels, box, (h, w), arr[j], flip, exact=True)
                else:
                    assert codecs is not None, "an encoded image field is read with its codec field"
                    decode_crop(data[j, : int(lengths[j])], int(codecs[j]), spec, (h, w), box, arr[j], flip)
            except DecodeError as e:
                raise CorruptShardError(f"{where(j)}: field {name!r}: {e}") from None
        batch[name] = out
        return batch


SCALES = (8, 4, 2, 1)  # the DCT reductions libjpeg decodes at (1/8 ... 1; its m/8 scales decode slower than 1)
# a window decodes at 1/s while it keeps this fraction of the output's size; below 1 loses visible quality
REACH = 1.0
FAST = {"fastdct": True, "fastupsample": True}  # simplejpeg's faster IDCT and chroma upsampling for windows
_INV255 = np.float32(1 / 255)


def dct_scale(w: float, h: float, ow: int, oh: int) -> int:
    """The largest reduction ``s`` (8, 4, 2 or 1) at which the window (``w`` x ``h`` source pixels) still
    has ``REACH`` of the output's size (``ow`` x ``oh``) on both axes."""
    for s in SCALES:
        if w / s >= REACH * ow and h / s >= REACH * oh:
            return s
    return 1


def _axis(x0: float, extent: float, n_out: int, n_src: int, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For one axis: each output pixel's two source indices and weight, on an
    image of ``n_src`` pixels that is ``scale`` times the full one; positions clamp to the image."""
    j = np.arange(n_out, dtype=np.float64)
    u = x0 + (j + 0.5) * (extent / n_out) - 0.5  # full-resolution position
    v = (u + 0.5) * scale - 0.5 if scale != 1 else u
    v = np.clip(v, 0, n_src - 1)
    i0 = np.floor(v).astype(np.int64)
    t = (v - i0).astype(np.float32)
    i1 = np.minimum(i0 + 1, n_src - 1)
    return i0, i1, t


def resample_into(src: np.ndarray, box: tuple[float, float, float, float], full_hw: tuple[int, int],
                  out: np.ndarray, flip: tuple[bool, bool] = (False, False), exact: bool = False) -> None:
    """Bilinear samples of the window ``box`` (x0, y0, w, h in pixels of the full image ``full_hw``) from ``src``
    (uint8 HWC, any scale) into ``out`` (float32 (oh, ow, C), /255), mirrored as ``flip`` says."""
    x0, y0, w, h = box
    oh, ow = out.shape[:2]
    n_y, n_x = src.shape[:2]
    sy, sx = n_y / full_hw[0], n_x / full_hw[1]  # the whole image, maybe decoded at a reduced scale
    rows, cols = _line(y0, h, oh, sy), _line(x0, w, ow, sx)
    if not exact and _fast_resize(src, rows, cols, out, flip):
        return
    r0, r1, ty = _axis(y0, h, oh, n_y, sy)
    c0, c1, tx = _axis(x0, w, ow, n_x, sx)
    first, last = int(c0[0]), int(c1[-1]) + 1
    if flip[0]:
        c0, c1, tx = c0[::-1], c1[::-1], tx[::-1]
    if flip[1]:
        r0, r1, ty = r0[::-1], r1[::-1], ty[::-1]
    _lerp2(src[:, first:last], (r0, r1, ty), (c0 - first, c1 - first, tx), out)


def _line(x0: float, extent: float, n_out: int, scale: float) -> tuple[float, float]:
    """One axis's sample positions in ``src`` as ``(c, s)``: output pixel ``j`` samples ``c + j * s``
    (before clamping; the full-resolution position mapped onto an image ``scale`` times the full one)."""
    s = extent / n_out * scale
    return (x0 + 0.5 * extent / n_out) * scale - 0.5, s


# torch's uint8 bilinear resize is fast only on AVX2 (channels-last); elsewhere the exact float path runs
_FAST_RESIZE = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
# source pixels: the largest sample-position error the uint8 resize may make, else the exact path
_TOLERANCE = 0.1
_LEAD = 64  # at most this many extra outputs computed before the window's, to line torch's sample grid up with it
_UPSAMPLE = torch.ops.aten.upsample_bilinear2d.out  # takes the output size and the scale both (F.interpolate: one)
_scratch = threading.local()  # each thread's reused memory for the resize's input and output (no page faults per image)


def _grid(c: float, s: float, n: int) -> tuple[int, int, float] | None:
    """Line torch's grid (output ``i`` of an input starting at pixel ``a`` samples ``a + (i + 0.5) * t - 0.5``) up
    with ours (``c + j * s``): ``(a, k, t)`` whose outputs ``k .. k + n - 1`` are within ``_TOLERANCE``, or None."""
    e = c + 0.5 - s / 2  # the window's first edge: ours is c + j * s = e + (j + 0.5) * s - 0.5
    m = (n - 1) / 2
    for k in range(_LEAD + 1):
        a = math.floor(e - k * s + 0.5)
        r = e - k * s - a
        t = s + r / (k + m + 0.5)
        if (k + 0.5) * t >= 0.5 and m * abs(r) / (k + m + 0.5) <= _TOLERANCE:  # torch's output k is at or past a
            return a, k, t
    return None


def _fast_resize(src: np.ndarray, rows: tuple[float, float], cols: tuple[float, float], out: np.ndarray,
                 flip: tuple[bool, bool]) -> bool:
    """The window resized by torch's uint8 kernel and converted to float once, into ``out``; False (nothing
    written) where it cannot match the sampling (see :func:`_grid`)."""
    (oh, ow), c = out.shape[:2], src.shape[2]
    if not _FAST_RESIZE or c > 4 or src.dtype != np.uint8:
        return False
    gy, gx = _grid(*rows, oh), _grid(*cols, ow)
    if gy is None or gx is None:
        return False
    spans = [(a, math.floor(a + (k + n - 0.5) * t - 0.5) + 2) for (a, k, t), n in ((gy, oh), (gx, ow))]
    if any(b <= 0 or a >= end for (a, b), end in zip(spans, src.shape[:2])):
        return False  # a window wholly outside the pixels given (not from a crop's draw): the exact path clamps
    # an output as large as its input is a copy to torch whatever the scale: one more (dropped) output then
    size = [k + n + (k + n == b - a) for (a, k, _), n, (a, b) in zip((gy, gx), (oh, ow), spans)]
    win = _padded(src, spans[0], spans[1])
    y = _buffer("out", size[0] * size[1] * c)[: size[0] * size[1] * c].reshape(size[0], size[1], c)
    x, yt = torch.from_numpy(win).permute(2, 0, 1)[None], torch.from_numpy(y).permute(2, 0, 1)[None]
    _UPSAMPLE(x, size, False, 1 / gy[2], 1 / gx[2], out=yt)  # channels-last in and out: no packing copies
    _to_float(y[gy[1] : gy[1] + oh, gx[1] : gx[1] + ow], out, flip)
    return True


def _buffer(name: str, n: int) -> np.ndarray:
    """This thread's uint8 scratch ``name``, at least ``n`` bytes."""
    buf = getattr(_scratch, name, None)
    if buf is None or buf.size < n:
        buf = np.empty(max(n, 1 << 20), np.uint8)
        setattr(_scratch, name, buf)
    return buf


def _padded(src: np.ndarray, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
    """``src[r0:r1, c0:c1]`` as a C-contiguous array (what torch's kernel takes without a copy of its own),
    indices outside ``src`` repeating its edge pixels."""
    (r0, r1), (c0, c1) = rows, cols
    h, w, c = src.shape
    y0, y1, x0, x1 = max(r0, 0), min(r1, h), max(c0, 0), min(c1, w)
    part = src[y0:y1, x0:x1]
    if (y0, y1, x0, x1) == (r0, r1, c0, c1) and part.flags.c_contiguous and part.flags.writeable:
        return part  # whole rows of a decoded image: no copy
    buf = _buffer("in", (r1 - r0) * (c1 - c0) * c)[: (r1 - r0) * (c1 - c0) * c].reshape(r1 - r0, c1 - c0, c)
    buf[y0 - r0 : y1 - r0, x0 - c0 : x1 - c0] = part
    buf[: y0 - r0] = buf[y0 - r0]
    buf[y1 - r0 :] = buf[y1 - r0 - 1]
    buf[:, : x0 - c0] = buf[:, x0 - c0 : x0 - c0 + 1]
    buf[:, x1 - c0 :] = buf[:, x1 - c0 - 1 : x1 - c0]
    return buf


def _to_float(y: np.ndarray, out: np.ndarray, flip: tuple[bool, bool]) -> None:
    """uint8 (oh, ow, C) into float32 ``out`` /255, mirrored as ``flip`` says (columns by torch: numpy's
    reversed copy of 3-byte pixels is slow)."""
    dst = out[::-1] if flip[1] else out
    if not flip[0]:
        np.multiply(y, _INV255, out=dst, dtype=np.float32)
        return
    step = max(1, _GRAIN // max(1, y.shape[1] * y.shape[2]))
    for a in range(0, y.shape[0], step):
        np.multiply(torch.from_numpy(y[a : a + step]).flip(1).numpy(), _INV255, out=dst[a : a + step], dtype=np.float32)


_GRAIN = 32767  # elements per torch op: below torch's parallel grain (32768), so each op runs in the calling thread


def _lerp2(src: np.ndarray, rows: tuple[np.ndarray, np.ndarray, np.ndarray],
           cols: tuple[np.ndarray, np.ndarray, np.ndarray], out: np.ndarray) -> None:
    """Separable bilinear interpolation, rows first, in blocks small enough that torch runs each op in the
    calling thread (the reader threads are the parallelism)."""
    c = src.shape[2]
    flat = torch.from_numpy(np.ascontiguousarray(src)).view(src.shape[0], -1)  # (h, w' * C) uint8
    r0, r1, ty = (torch.from_numpy(np.ascontiguousarray(a)) for a in rows)
    c0, c1, tx = cols
    chan = np.arange(c)
    i0 = torch.from_numpy((c0[:, None] * c + chan).ravel())
    i1 = torch.from_numpy((c1[:, None] * c + chan).ravel())
    wx = torch.from_numpy(np.repeat(tx, c)).view(1, -1)
    o = torch.from_numpy(out).view(out.shape[0], -1)
    step = max(1, _GRAIN // max(flat.shape[1], o.shape[1]))
    for a in range(0, o.shape[0], step):
        b = min(o.shape[0], a + step)
        top = flat.index_select(0, r0[a:b]).float()
        kept = torch.lerp(top, flat.index_select(0, r1[a:b]).float(), ty[a:b].view(-1, 1))
        torch.lerp(kept.index_select(1, i0), kept.index_select(1, i1), wx, out=o[a:b])
        o[a:b].mul_(float(_INV255))


def decode_crop(data: Any, codec: int, spec: ImageSpec, hw: tuple[int, int], box: tuple[float, float, float, float],
                out: np.ndarray, flip: tuple[bool, bool] = (False, False)) -> str:
    """Decode the window ``box`` of one encoded image (recorded size ``hw``) into ``out`` (float32 (oh, ow, C) in
    [0, 1]), mirrored as ``flip`` says; returns ``"scaled"`` or ``"full"``, raises DecodeError on corrupt data."""
    oh, ow = out.shape[:2]
    h, w = hw
    n = h * w * spec.channels
    pixels = _buffer("full", n)[:n].reshape(h, w, spec.channels)
    s = dct_scale(box[2], box[3], ow, oh) if codec == CODEC_JPEG else 1
    fast = FAST if (box[2], box[3]) != (ow, oh) else {}  # a window taken as it is (a crop) keeps exact pixels
    src = _decode_jpeg(data, spec, (math.ceil(h / s), math.ceil(w / s)), pixels, fast) if codec == CODEC_JPEG else None
    if src is None:  # another codec, or a stream that needs the full decoder's judgement (corrupt, or a warning)
        decode_image(data, codec, spec, pixels)
        src, s = pixels, 1
    resample_into(src, box, hw, out, flip=flip)
    return "scaled" if s > 1 else "full"


def _decode_jpeg(data: Any, spec: ImageSpec, min_hw: tuple[int, int], pixels: np.ndarray,
                 fast: dict[str, bool]) -> np.ndarray | None:
    """The whole JPEG decoded at the reduction that gives at least ``min_hw``, into ``pixels``' memory; None
    when the stream needs the full decoder's judgement (corrupt, a recoverable warning, or not the recorded size)."""
    try:
        if tuple(simplejpeg.decode_jpeg_header(data)[:2]) != pixels.shape[:2]:
            return None
        a = simplejpeg.decode_jpeg(data, colorspace=SJ_COLORSPACE[spec.mode], strict=True, buffer=pixels.reshape(-1),
                                   min_height=min_hw[0], min_width=min_hw[1], **fast)
    except ValueError:
        return None
    return a.reshape(a.shape[0], a.shape[1], -1)
