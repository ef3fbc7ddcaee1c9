"""The DALI backend (``backend="dali"``): one pipeline kept across epochs, fed by fastdata's reader (how each
field travels into ``fn.external_source``, the callback that reads batches and draws their parameters), decoding
and augmenting with DALI's operators; order, epochs and resume are the shared ``Loader``'s."""

from __future__ import annotations

import functools
import gc
import logging
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Collection, Iterator, Literal

import numpy as np
import torch

from fastdata.augment import Augment, batch_generator, shapes_after
from fastdata.augment.pipeline import augment_batch, join_views
from fastdata.errors import (
    BackendUnavailableError,
    FastdataError,
    LoaderWorkerError,
    UsageError,
)
from fastdata.format import LENGTHS_SUFFIX
from fastdata.format.spec import ENCODING_IMAGE, ENCODING_PIXELS, SHAPE_SUFFIX, is_image_field, is_string
from fastdata.loaders.base import Loader, LoaderConfig, wrap_error
from fastdata.loaders.dali_augment import Chain, Graph, Img, compile_chain
from fastdata.loaders.host import torch_dtype
from fastdata.reading.dataset import Dataset
from fastdata.seeds import Stream, int_seed

log = logging.getLogger("fastdata.loader")

GENERATOR_STATE = "\0generator"  # bypassed entry: the batch generator's state after DALI's draws
Kind = Literal["encoded", "pixels", "raw_image", "plain"]

# DALI's torch plugin lacks unsigned types over 8 bits and complex: they cross as same-size signed views
_SIGNED_VIEW: dict[np.dtype, np.dtype] = {np.dtype(np.uint16): np.dtype(np.int16), np.dtype(np.uint32): np.dtype(np.int32),
                np.dtype(np.uint64): np.dtype(np.int64)}
_PAIR_VIEW: dict[np.dtype, np.dtype] = {np.dtype(np.complex64): np.dtype(np.float32), np.dtype(np.complex128): np.dtype(np.float64)}
_CARRIED = {np.dtype(t) for t in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")}


@dataclass
class Route:
    """How one output field travels: ``kind``, whether it becomes a float NCHW image, its augmentation."""

    name: str
    kind: Kind
    dtype: np.dtype  # the dtype the caller gets (native byte order)
    image: bool = False  # uint8 HWC -> float (B, C, H, W) in [0, 1]
    channels: int = 0
    variable_size: bool = False  # images of one batch may differ in size
    hw: tuple[int, int] | None = None  # the fixed (H, W) of a raw image field
    chain: Chain | None = None
    more: list[Chain] = field(default_factory=list)  # the chains of views 1, 2, ... (Augment(views=...))
    bypass: bool = False  # a plain field that goes around DALI, straight to torch (CPU mode)

    @property
    def chains(self) -> list[Chain]:
        """One compiled chain per view (none: not augmented by DALI)."""
        return [self.chain, *self.more] if self.chain is not None else []

    @property
    def carrier(self) -> np.dtype:
        """The dtype the field has inside DALI."""
        return _SIGNED_VIEW.get(self.dtype) or _PAIR_VIEW.get(self.dtype) or self.dtype

    @property
    def outputs(self) -> list[tuple[np.dtype, str]]:
        """dtype and layout of each external-source output this field uses."""
        if self.kind == "encoded":
            return [(np.dtype(np.uint8), ""), (np.dtype(np.int32), "")]  # padded bytes, lengths
        return [(self.carrier, "HWC" if self.kind in ("pixels", "raw_image") else "")]

    @property
    def pads(self) -> bool:
        """A float image field whose batches can mix image sizes: padded to the batch's largest image, in
        crop_mirror_normalize."""
        return self.image and self.variable_size and (self.chain is None or self.chain.out_size is None)

    def host(self, batch: dict[str, np.ndarray]) -> list[Any]:
        """This field of a ``get_batch`` result, as the external source takes it (see ``outputs``)."""
        data = batch[self.name]
        if self.kind == "encoded":
            return [data, batch[self.name + LENGTHS_SUFFIX].astype(np.int32).reshape(-1, 1)]
        if self.kind == "pixels":
            shapes = batch[self.name + SHAPE_SUFFIX]
            return [[data[k, : h * w * c].reshape(h, w, c) for k, (h, w, c) in enumerate(shapes.tolist())]]
        if not data.dtype.isnative:
            data = data.astype(data.dtype.newbyteorder("="))
        if self.bypass:
            return [data]
        if self.dtype in _PAIR_VIEW:
            return [np.ascontiguousarray(data)[..., None].view(self.carrier)]
        return [data.view(self.carrier) if self.dtype in _SIGNED_VIEW else data]

    def sizes(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """(B, 2) heights and widths of this image field's samples, known before decoding."""
        if self.kind in ("encoded", "pixels"):
            return batch[self.name + SHAPE_SUFFIX][:, :2]
        assert self.hw is not None, "a raw image field has a fixed shape"
        return np.broadcast_to(np.array(self.hw, dtype=np.int64), (len(batch[self.name]), 2))


def plan_routes(dataset: Dataset, images: tuple[str, ...] | None, targets: Collection[str] = ()) -> list[Route]:
    """One route per output field, in schema order (a ragged field's ``_lengths`` right after it);
    ``targets``: fields declared as augmentation targets (raw arrays, kept on the host)."""
    routes: list[Route] = []
    schema = {f.name: f for f in dataset.schema}
    for name in targets:
        f = schema.get(name)
        if f is not None and f.encoding in (ENCODING_IMAGE, ENCODING_PIXELS):
            raise UsageError(f"target field {name!r} is stored as {f.encoding} images; the DALI backend takes "
                             "targets stored as arrays: convert it as an array field, or use backend='torch'")
    text = [f.name for f in dataset.schema if is_string(f)] + [n for n in dataset.fields if n not in schema]
    if text:
        raise UsageError(f"the DALI backend carries tensors only, not the text of {text[0]!r} (string fields and "
                         "keys); use backend='torch', or leave it out of fields=")
    if images is not None:
        bad = [n for n in images if n not in schema or not is_image_field(schema[n])]
        if bad:
            raise UsageError(f"LoaderConfig.images names {bad[0]!r}, which is not a uint8 HWC image field here")
    for f in dataset.schema:
        chosen = (images is None or f.name in images) and f.name not in targets
        if f.encoding in (ENCODING_IMAGE, ENCODING_PIXELS):
            assert f.image is not None, "image encodings always carry an image spec"
            kind: Kind = "encoded" if f.encoding == ENCODING_IMAGE else "pixels"
            routes.append(Route(f.name, kind, np.dtype(np.uint8), chosen, f.image.channels, True))
        elif is_image_field(f):
            routes.append(Route(f.name, "raw_image" if chosen else "plain", np.dtype(np.uint8), chosen,
                                int(f.trailing[-1]), hw=(int(f.trailing[0]), int(f.trailing[1]))))
        else:
            dt = f.np_dtype.newbyteorder("=")
            if dt not in _SIGNED_VIEW and dt not in _PAIR_VIEW and dt not in _CARRIED:
                raise UsageError(f"field {f.name!r} has dtype {dt}, which the DALI backend cannot carry; "
                                 "use backend='torch'")
            routes.append(Route(f.name, "plain", dt))
            if f.ragged:
                routes.append(Route(f.name + LENGTHS_SUFFIX, "plain", np.dtype(np.int64)))
    return routes


@dataclass
class HostTargets:
    """Declared targets, transformed on the host by the torch backend's code with the parameters the image
    field ``image`` gets in DALI (the same generator, replayed)."""

    augment: Augment
    image: Route
    inputs: tuple[str, ...]  # the batch fields the targets read (with ``<boxes>_lengths``)

    def __call__(self, batch: dict[str, np.ndarray], g: torch.Generator) -> dict[str, np.ndarray]:
        hw = torch.from_numpy(np.ascontiguousarray(self.image.sizes(batch)))
        tb = {n: torch.from_numpy(np.ascontiguousarray(batch[n])) for n in self.inputs}
        outs = [self.augment.run(tb, g, None, hw=hw, ops=ops) for ops in self.augment.view_ops]
        out = dict(tb)
        written = [k for k in outs[0] if k not in tb or k in self.augment.targets]
        join_views(out, outs, written, stack=len({c.out_size for c in self.image.chains}) == 1)
        return {n: v.numpy() for n, v in out.items()}


@dataclass
class Pass:
    """One pass over the data: this rank's index batches from batch ``first`` of ``epoch`` on."""

    plan: list[np.ndarray]
    first: int
    epoch: int


class Feed:
    """The external-source callback: batch ``info.iteration`` of the pass registered for DALI's epoch; a read
    error ends the pass (``error``), raised by the loader after the last good batch."""

    def __init__(self, dataset: Dataset, routes: list[Route], seed: int, rank: int, keep: int,
                 targets: HostTargets | None = None, rest: bool = False) -> None:
        self.dataset, self.routes, self.seed, self.rank = dataset, routes, seed, rank
        self.rest = rest  # torch code runs after DALI: hand it the generator's state
        self.targets = targets
        self._alive: deque[tuple[Any, ...]] = deque(maxlen=keep)  # fed without a copy: DALI reads them later
        self._augmented = [r for r in routes if any(c.steps for c in r.chains)]
        self._padded = [r for r in routes if r.pads]
        self.passes: dict[int, Pass] = {}
        self.bypassed: deque[dict[str, np.ndarray]] = deque()
        self.error: BaseException | None = None

    def add(self, dali_epoch: int, p: Pass) -> None:
        """Serve ``p`` when DALI asks for epoch ``dali_epoch`` (older passes are forgotten)."""
        self.passes = {k: v for k, v in self.passes.items() if k >= dali_epoch - 1}
        self.passes[dali_epoch] = p

    def _generator(self, p: Pass, i: int) -> torch.Generator:
        """Batch ``i`` of pass ``p``'s augmentation generator: the torch backend's (the same draws)."""
        return batch_generator(self.seed, p.epoch, p.first + i, torch.device("cpu"), self.rank)

    def __call__(self, info: Any) -> tuple[Any, ...]:
        p, i = self.passes.get(info.epoch_idx), info.iteration
        if p is None or i >= len(p.plan) or self.error is not None:
            raise StopIteration
        try:
            try:
                batch = self.dataset.get_batch(p.plan[i], companions=True)
            except Exception as e:
                raise wrap_error(e, f"DALI source, batch {p.first + i}") from e
            out = [a for r in self.routes if not r.bypass for a in r.host(batch)]
            bypassed = {r.name: r.host(batch)[0] for r in self.routes if r.bypass}
            g = self._generator(p, i)
            for r in self._augmented:  # each view in turn, as the torch backend draws them
                for c in r.chains:
                    out.extend(c.draw(g, r.sizes(batch)))
            if self.rest:  # where the torch code after DALI goes on drawing (sequence ops, Mix)
                bypassed[GENERATOR_STATE] = g.get_state().numpy()
            if self.targets is not None:  # the same draws, replayed
                bypassed.update(self.targets({**batch, **bypassed}, self._generator(p, i)))
            for r in self._padded:
                hw = r.chain.out_hw(r.sizes(batch)).max(axis=0) if r.chain is not None else r.sizes(batch).max(axis=0)
                out.extend(np.full(len(p.plan[i]), v, dtype=np.float32) for v in hw)
        except Exception as e:  # delivered after the batches before it
            self.error = e
            raise StopIteration from None
        self.bypassed.append(bypassed)
        fed = tuple(out)
        self._alive.append(fed)
        return fed


def import_dali(device: torch.device | None = None) -> SimpleNamespace:
    """DALI's modules, or BackendUnavailableError with the pip command when it is not installed, or when it is
    built for another CUDA major version than torch and ``device`` is CUDA (CPU mode needs no match)."""
    try:
        import nvidia.dali as dali
        import nvidia.dali.fn as fn
        import nvidia.dali.math as dmath
        import nvidia.dali.types as types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator
    except ImportError as e:
        raise BackendUnavailableError(
            f"backend='dali' needs NVIDIA DALI, which cannot be imported here ({e}). Install it with: "
            "pip install \"fastdata[dali]\"  (the nvidia-dali-cuda130 wheel), or use backend='torch'"
        ) from None
    cuda = device is not None and device.type == "cuda"
    problem = cuda_mismatch(dali.__cuda_version__, torch.version.cuda) if cuda else None
    if problem:
        raise BackendUnavailableError(f"backend='dali' on {device}: {problem}")
    return SimpleNamespace(dali=dali, fn=fn, math=dmath, types=types, Iterator=DALIGenericIterator)


def cuda_mismatch(dali_cuda_version: int, torch_cuda: str | None) -> str | None:
    """Why DALI (built for ``__cuda_version__`` ``dali_cuda_version``, ``13492`` for 13.4.92) cannot share a GPU
    with this torch, or None."""
    digits = str(dali_cuda_version)
    dali_cuda = int(digits[:2]) if len(digits) >= 5 else int(digits[:1])  # the major version, as DALI reads it
    if torch_cuda is None:
        return f"DALI is built for CUDA {dali_cuda}, but this torch is a CPU-only build (torch.version.cuda is None)"
    torch_major = int(torch_cuda.split(".")[0])
    if torch_major != dali_cuda:
        return (f"DALI is built for CUDA {dali_cuda} (nvidia-dali-cuda{dali_cuda}0), torch for CUDA {torch_cuda}: "
                f"install the DALI wheel for torch's CUDA, pip install nvidia-dali-cuda{torch_major}0")
    return None


def dali_problem(device: torch.device) -> str | None:
    """Why ``backend="auto"`` should not pick DALI for ``device`` (None: it can)."""
    try:
        import_dali(device)
    except BackendUnavailableError as e:
        return str(e)
    except Exception as e:  # a broken install (missing shared library, ...) means: not available
        return f"DALI failed to load: {type(e).__name__}: {e}"
    return None


def dali_unsupported(ds: Dataset, augment: Augment | None, config: LoaderConfig | None) -> str | None:
    """Why the DALI backend cannot serve ``ds`` with ``augment`` (a dtype it cannot carry, an
    augmentation it cannot express), or None; DALI is not imported."""
    if config is not None and config.image_dtype != "float32":
        return f"the DALI backend gives float images only, not image_dtype={config.image_dtype!r}"
    if config is not None and config.ragged != "padded":
        return "the DALI backend gives padded batches only, not ragged='packed'"
    try:
        targets = tuple(augment.targets) if augment is not None else ()
        _attach_augment(plan_routes(ds, (config or LoaderConfig()).images, targets), augment)
    except UsageError as e:
        return str(e)
    return None


class DaliLoader(Loader):
    """The DALI backend; the same contract as the torch backend (see :func:`fastdata.loader`).
    ``threads``: DALI's CPU threads (decoding and augmentation in CPU mode)."""

    backend = "dali"
    _unpicklable = ("_dali", "_run")

    def __init__(self, dataset: Dataset, batch_size: int, *, threads: int, **common: Any) -> None:
        """``common``: :class:`Loader`'s arguments."""
        super().__init__(dataset, batch_size, **common)
        device = self.device
        self._dali = import_dali(device)
        self.threads = max(1, threads)
        if self.config.image_dtype != "float32" or self.config.ragged != "padded":
            raise UsageError(f"{dali_unsupported(dataset, None, self.config)}: use backend='torch'")
        targets = tuple(self.augment.targets) if self.augment is not None else ()
        self.routes: list[Route] = plan_routes(dataset, self.config.images, targets)
        self._targets = _attach_augment(self.routes, self.augment, region=self.config.crop_decode != "off")
        # sequence ops and Mix run with the torch code on DALI's output, with the generator where DALI left it
        self._rest = self.augment is not None and (self.augment.mix is not None
                                                   or self.augment.enabled_ops and self.augment.op_kind != "image")
        if self._rest:
            _log_once(("rest", self.augment is not None and self.augment.op_kind), "DALI backend: %s run(s) with the "
                      "torch backend's code on DALI's output, with the same draws (docs/augment.md)",
                      "MixUp/CutMix" if self.augment is not None and self.augment.op_kind == "image"
                      else "the sequence/array ops")
        # In CPU mode plain fields beside images go around DALI; targets are transformed on the host (HostTargets).
        images = any(r.kind != "plain" for r in self.routes)
        host = self._targets.inputs if self._targets is not None else ()
        for r in self.routes:
            r.bypass = (images and r.kind == "plain" and device.type != "cuda") or r.name in host
        self._dali_routes = [r for r in self.routes if not r.bypass]
        self._device_id = (device.index if device.index is not None else torch.cuda.current_device()) \
            if device.type == "cuda" else None
        self._run: SimpleNamespace | None = None  # the pipeline, its iterator and feed, and where they stand

    def _make_stages(self) -> None:
        """After unpickling: DALI's modules again; the pipeline is built by the first pass."""
        self._dali = import_dali()
        self._run = None

    def _build(self, feed: Feed, seed: int) -> Any:
        d, gpu = self._dali, self.device.type == "cuda"
        g = Graph(d.fn, d.types, d.math, gpu)
        routes = self._dali_routes
        # the feed's outputs, in its order: each route's data, augmentation parameters, padded sizes
        spec = [o for r in routes for o in r.outputs]
        spec += [(dt, "") for r in routes for c in r.chains for dt in c.param_dtypes]
        spec += [(np.dtype(np.float32), "")] * (2 * sum(r.pads for r in routes))
        channels_last = self.config.channels_last

        @d.dali.pipeline_def(batch_size=self.batch_size, num_threads=self.threads, device_id=self._device_id,
                             seed=seed, prefetch_queue_depth=self.config.prefetch, exec_dynamic=True)
        def pipeline() -> tuple[Any, ...]:
            nodes = iter(d.fn.external_source(source=feed, num_outputs=len(spec), batch=True, batch_info=True,
                                              dtype=[d.types.to_dali_type(dt) for dt, _ in spec],
                                              layout=[layout for _, layout in spec], no_copy=True))
            data = [[next(nodes) for _ in r.outputs] for r in routes]
            params = [[[next(nodes) for _ in c.param_dtypes] for c in r.chains] for r in routes]
            pads = [[next(nodes), next(nodes)] if r.pads else [] for r in routes]
            return tuple(o for r, x, p, hw in zip(routes, data, params, pads) for o in _graph(g, r, x, p, hw, channels_last))

        pipe = pipeline()
        pipe.build()
        return pipe

    def _start(self, plan: list[np.ndarray], epoch: int, first: int) -> SimpleNamespace:
        """A new pipeline positioned at the start of the pass; its own random draws (only GaussianNoise)
        are seeded by (seed, epoch, rank, first batch)."""
        feed = Feed(self.dataset, self.routes, self.seed, self.world.rank, keep=2 * self.config.prefetch + 2,
                    targets=self._targets, rest=self._rest)
        feed.add(0, Pass(plan, first, epoch))
        pipe = self._build(feed, int_seed(self.seed, epoch, Stream.DALI, self.world.rank, first, bits=31))
        it = self._dali.Iterator([pipe], [_view_name(r.name, v) for r in self._dali_routes
                                          for v in range(max(1, len(r.chains)))], auto_reset=False,
                                 prepare_first_batch=False)
        return SimpleNamespace(pipe=pipe, it=it, feed=feed, dali_epoch=0, at=(epoch, first), fresh=True)

    def _batches(self, plan: list[np.ndarray], epoch: int, first: int) -> Iterator[dict[str, torch.Tensor]]:
        if not plan:
            return
        run = self._run
        if run is None or not run.fresh or run.at != (epoch, first):
            self._release()  # positioned elsewhere (set_epoch, resume, an abandoned pass): start over
            run = self._run = self._start(plan, epoch, first)
        run.fresh = False
        complete = False
        try:
            delivered = 0
            while run.it is not None:
                try:
                    out = next(run.it)[0]
                except StopIteration:
                    break
                except FastdataError:
                    raise
                except Exception as e:  # DALI failed (a corrupt image, ...): say where, precisely if possible
                    raise self._diagnose(plan, first, delivered, e) from None
                delivered += 1
                yield self._to_torch(out, run.feed.bypassed.popleft())
            if run.it is None:  # closed during the pass
                return
            if run.feed.error is not None:
                raise run.feed.error
            complete = True
        finally:
            if not complete:
                self._drop(run)
        # Complete: start the next epoch now, while the training loop finishes this one
        run.dali_epoch += 1
        run.feed.add(run.dali_epoch, Pass(self.plan(epoch + 1), 0, epoch + 1))
        run.it.reset()
        run.at, run.fresh = (epoch + 1, 0), True

    def _drop(self, run: SimpleNamespace) -> None:
        run.pipe = run.it = None  # DALI's threads and buffers go with the last reference
        if self._run is run:
            self._run = None
        # collect DALI's reference cycles here: in a forked child their finalizers could hang
        gc.collect()

    def _to_torch(self, out: dict[str, torch.Tensor], bypassed: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """DALI's outputs and the bypassing fields of the same batch, in schema order, as the torch backend."""
        batch: dict[str, torch.Tensor] = {}
        state = bypassed.pop(GENERATOR_STATE, None)
        views: dict[str, list[torch.Tensor]] = {}
        for r in self.routes:
            if r.bypass:
                batch[r.name] = torch.from_numpy(bypassed.pop(r.name)).to(self.device)
                continue
            for v in range(max(1, len(r.chains))):
                t = out[_view_name(r.name, v)]
                if r.image and self.config.channels_last:
                    t = t.permute(0, 3, 1, 2)  # HWC memory seen as NCHW: channels_last, as the torch backend
                elif r.carrier != r.dtype:
                    t = torch.view_as_complex(t) if r.dtype.kind == "c" else t.view(torch_dtype(r.dtype))
                views.setdefault(r.name, []).append(t)
            batch[r.name] = views[r.name][0]
        for name, a in bypassed.items():  # added by the targets (``<boxes>_valid``)
            batch[name] = torch.from_numpy(a).to(self.device)
        for r in self.routes:  # sizes after the crops, as the torch backend reports them; views joined
            shapes = batch.get(r.name + SHAPE_SUFFIX)
            if not r.chains or self.augment is None:
                continue
            outs = [{r.name: t} for t in views[r.name]]
            if shapes is not None:
                for o, ops in zip(outs, self.augment.view_ops):
                    o[r.name + SHAPE_SUFFIX] = shapes_after(ops, shapes)
            join_views(batch, outs, [r.name, r.name + SHAPE_SUFFIX])
        if state is not None and self.augment is not None:
            g = torch.Generator()
            g.set_state(torch.from_numpy(state))
            done = frozenset(r.name for r in self.routes if r.chains)
            augment_batch(self.augment, batch, g, tuple(r.name for r in self.routes if r.image), skip=done)
        return batch

    def _diagnose(self, plan: list[np.ndarray], first: int, delivered: int, e: Exception) -> Exception:
        """An error naming the batch; the sample too when fastdata's own decoder fails on it."""
        msg = " ".join(str(e).split())[:500]
        host = self.dataset.with_options(decode=True, decode_threads=1)
        try:
            for i in range(delivered, min(delivered + self.config.prefetch + 1, len(plan))):
                host.get_batch(plan[i], companions=True)
        except FastdataError as found:
            return type(found)(f"DALI backend, batch {first + i}: {found}")
        finally:
            host.close()
        idx = plan[delivered].tolist() if delivered < len(plan) else []
        return LoaderWorkerError(f"DALI pipeline failed at batch {first + delivered} (samples {idx[:8]}"
                                 f"{' ...' if len(idx) > 8 else ''}): {type(e).__name__}: {msg}")

    def _release(self) -> None:
        """End a running pass and release the DALI pipeline (threads, buffers); the next pass builds one."""
        run = getattr(self, "_run", None)
        if run is not None:
            self._drop(run)


def _attach_augment(routes: list[Route], augment: Augment | None, region: bool = False) -> HostTargets | None:
    """Compile the spec for each augmented image field; with targets, their host-side transform. ``region``:
    an encoded field of one view whose chain starts with a crop decodes only its window."""
    if augment is None or not augment.enabled or augment.op_kind != "image":
        return None  # nothing to do, or sequence ops: the torch code runs them on DALI's output
    images = [r for r in routes if r.image]
    if augment.fields is not None:
        by_name = {r.name: r for r in routes}
        missing = [f for f in augment.fields if f not in by_name]
        if missing:
            raise UsageError(f"augment fields {missing} are not in the batch (fields: {sorted(by_name)})")
        images = [by_name[f] for f in augment.fields]
    bad = [r.name for r in images if not r.image]
    if bad or not images:
        what = f"{bad[0]!r} is not one" if bad else "this dataset has none"
        raise UsageError(f"the DALI backend augments image fields only, and {what}; use backend='torch' for others")
    for r in images:
        one = region and r.kind == "encoded" and len(augment.view_ops) == 1
        r.chain, *r.more = (compile_chain(ops, r.channels, region=one) for ops in augment.view_ops)
        if r.more and any(c.out_size is None for c in r.chains):
            raise UsageError("on the DALI backend every view must end in one size (a crop or Resize): add one to "
                             "each view, or use backend='torch'")
    if not augment.targets:
        return None
    if len(images) != 1:
        raise UsageError(f"augmentation with targets {sorted(augment.targets)} moves them with one image field, "
                         f"and this dataset has {[r.name for r in images]}; name it with Augment(..., fields=(name,))")
    names = {r.name for r in routes}
    missing = [t for t in augment.targets if t not in names]
    if missing:
        raise UsageError(f"target field {missing[0]!r} is not in the batch (fields: {sorted(names)})")
    inputs = tuple(n for t in augment.targets for n in (t, t + LENGTHS_SUFFIX) if n in names)
    key = tuple(sorted((n, type(t).__name__) for n, t in augment.targets.items()))
    _log_once(key, "DALI backend: the augmentation targets %s are transformed on the host by the torch backend's "
              "code, with the parameters DALI uses for the image (docs/augment.md)",
              ", ".join(f"{n} ({k})" for n, k in key))
    return HostTargets(augment, images[0], inputs)


@functools.cache  # once per process
def _log_once(key: Any, msg: str, *args: Any) -> None:
    log.info(msg, *args)


def _view_name(name: str, view: int) -> str:
    """The DALI output of one view of a field (view 0: the field's own name)."""
    return name if view == 0 else f"{name}\0view{view}"


def _graph(g: Graph, r: Route, data: list[Any], params: list[list[Any]], pad_hw: list[Any],
           channels_last: bool) -> list[Any]:
    """The DALI outputs of one route, one per view: decode once, augment each view, float output."""
    if r.kind == "plain":
        return [g.dev(data[0])]
    if r.kind == "encoded":
        files = g.fn.slice(data[0], start=[0], shape=data[1], axes=[0])  # each sample's stored bytes
        kw: dict[str, Any] = dict(device="mixed" if g.gpu else "cpu",
                                  output_type=g.types.RGB if r.channels == 3 else g.types.GRAY)
        if r.chain is not None and r.chain.region:  # only the drawn window (its first two params)
            node = g.fn.decoders.image_slice(files, start=params[0][0], end=params[0][1], axis_names="HW", **kw)
        else:
            node = g.fn.decoders.image(files, **kw)
    else:
        node = g.dev(data[0])
    if not r.chains:
        return [_output(g, r, Img(node), None, pad_hw, channels_last)]
    return [_output(g, r, c.apply(g, Img(node), p), c, pad_hw, channels_last) for c, p in zip(r.chains, params)]


def _output(g: Graph, r: Route, img: Img, chain: Chain | None, pad_hw: list[Any], channels_last: bool) -> Any:
    """An image route's output: uint8 HWC when not asked to become a float image, else the normalised floats."""
    if not r.image:  # decoded, but not asked to become a float image: uint8 HWC
        return g.fn.pad(img.node, axis_names="HW") if r.variable_size else img.node
    mean = chain.final_mean if chain is not None and chain.final_mean is not None else [0.0] * r.channels
    std = chain.final_std if chain is not None and chain.final_std is not None else [1.0] * r.channels
    pad: dict[str, Any] = {}
    if r.pads:  # crop the batch's largest (H, W) at the top-left: padding becomes a stored 0, normalised
        pad = dict(crop_h=pad_hw[0], crop_w=pad_hw[1], crop_pos_x=0.0, crop_pos_y=0.0, out_of_bounds_policy="pad",
                   fill_values=[-m / s for m, s in zip(mean, std)])
    return g.fn.crop_mirror_normalize(img.node, dtype=g.types.FLOAT, output_layout="HWC" if channels_last else "CHW",
                                      mean=[m * img.scale for m in mean], std=[s * img.scale for s in std], **pad)
