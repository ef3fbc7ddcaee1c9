"""The DALI backend (``backend="dali"``): one pipeline kept across epochs, fed by fastdata's reader, decoding
and augmenting with DALI's operators; order, epochs and resume are the shared ``Loader``'s."""

from __future__ import annotations

import functools
import gc
import logging
from types import SimpleNamespace
from typing import Any, Iterator

import numpy as np
import torch

from fastdata.augment import Augment, shapes_after
from fastdata.augment.pipeline import augment_batch, join_views
from fastdata.errors import (
    BackendUnavailableError,
    FastdataError,
    LoaderWorkerError,
    UsageError,
)
from fastdata.format import LENGTHS_SUFFIX
from fastdata.format.spec import SHAPE_SUFFIX
from fastdata.loaders.base import Loader, LoaderConfig
from fastdata.loaders.buffers import torch_dtype
from fastdata.loaders.dali_augment import Chain, Graph, Img, compile_chain
from fastdata.loaders.dali_feed import GENERATOR_STATE, Feed, HostTargets, Pass, Route, plan_routes
from fastdata.reading.dataset import Dataset
from fastdata.seeds import Stream, int_seed

log = logging.getLogger("fastdata.loader")


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

