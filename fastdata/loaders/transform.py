"""User transforms run by the readers (threads or worker processes) on each host batch, with a generator
drawn from ``(seed, epoch, rank, batch index)`` so a resumed run repeats each batch's draws."""

from __future__ import annotations

import pickle
from typing import Any, Callable

import numpy as np

from fastdata.errors import UsageError
from fastdata.seeds import Stream, numpy_rng

_TENSOR_KINDS = "biufc"  # numpy kinds torch.from_numpy takes (bool, integers, floats, complex)
HostArrays = dict[str, Any]  # field -> numpy array (or list of str)
TransformFn = Callable[[HostArrays, np.random.Generator], "HostArrays | None"]


def batch_len(batch: Any) -> int:
    """Samples in a batch, for fastdata's and other loaders' batches alike: a dict (its first array or tensor;
    lists of strings, such as keys, count by length) or tuple of arrays/tensors (first entry), or one array."""
    if isinstance(batch, dict):
        values = list(batch.values())
        batch = next((v for v in values if hasattr(v, "shape")), values[0] if values else None)
        if isinstance(batch, list):
            return len(batch)
    elif isinstance(batch, (list, tuple)):
        batch = batch[0]
    return int(batch.shape[0]) if hasattr(batch, "shape") and len(batch.shape) else 1


class TransformError(Exception):
    """The user's transform raised: the original is the ``__cause__`` (readers add where it ran)."""


class PerSample:
    """A batch transform from ``fn(sample, rng)``, called once per sample with the batch's generator. ``sample``
    maps each field to its row (a view; ragged rows padded, length in ``<name>_lengths``) or list item. ``fn``
    returns None (changed in place) or a dict: same-shaped rows are written back, other arrays stacked."""

    def __init__(self, fn: Callable[[HostArrays, np.random.Generator], "HostArrays | None"]) -> None:
        if not callable(fn):
            raise UsageError(f"PerSample takes a function (sample, rng) -> dict or None, not {type(fn).__name__}")
        self.fn = fn

    def __repr__(self) -> str:
        return f"PerSample({getattr(self.fn, '__qualname__', self.fn)!r})"

    def __call__(self, batch: HostArrays, rng: np.random.Generator) -> HostArrays:
        b = batch_len(batch)
        rows = {n: v for n, v in batch.items() if isinstance(v, (np.ndarray, list)) and len(v) == b}
        stacked: dict[str, list[Any]] = {}
        for i in range(b):
            sample = {n: v[i, ...] if isinstance(v, np.ndarray) else v[i] for n, v in rows.items()}  # 0-d views too
            got = self.fn(sample, rng)
            if got is None:
                continue
            if not isinstance(got, dict):
                raise TypeError(f"the per-sample function must return a dict or None, not {type(got).__name__}")
            for n, v in got.items():
                row = sample.get(n)
                if isinstance(row, np.ndarray) and n not in stacked and isinstance(v, np.ndarray) \
                        and v.shape == row.shape and v.dtype == row.dtype:
                    if v is not row:
                        rows[n][i] = v  # written back into the batch (the reader's buffer)
                    continue
                if i and n not in stacked:
                    raise ValueError(f"field {n!r}: sample {i} returned a new value but earlier samples did not")
                stacked.setdefault(n, []).append(v)
        out = dict(batch)
        for n, vs in stacked.items():
            if len(vs) != b:
                raise ValueError(f"field {n!r}: {len(vs)} of {b} samples returned a value for it")
            shapes = {np.shape(v) for v in vs}
            if len(shapes) > 1:
                raise ValueError(f"field {n!r}: the samples returned arrays of different shapes {sorted(shapes)[:3]}; "
                                 "return one shape per field (pad or crop to a fixed size)")
            out[n] = vs if isinstance(vs[0], str) else np.stack(vs)
        return out


class BatchTransform:
    """The user's transform bound to the loader's seed; the readers call it with (epoch, rank, k).
    Pickles whenever the user's function does."""

    def __init__(self, fn: TransformFn, seed: int) -> None:
        if not callable(fn):
            raise UsageError(f"transform must be a function (batch, rng) -> dict or None (or fastdata.PerSample(fn)), "
                             f"not {type(fn).__name__}")
        self.fn = fn
        self.seed = seed

    def __call__(self, batch: HostArrays, epoch: int, rank: int, k: int) -> HostArrays:
        """The transformed batch; any error becomes a :class:`TransformError` (caused by the original)."""
        rng = numpy_rng(self.seed, epoch, Stream.TRANSFORM, rank, k)
        try:
            got = self.fn(batch, rng)
        except Exception as e:
            raise TransformError(f"transform {_name(self.fn)} raised {type(e).__name__}: {e}") from e
        out = batch if got is None else got
        if not isinstance(out, dict):
            raise TransformError(f"transform {_name(self.fn)} must return the batch (a dict) or None, "
                                 f"not {type(out).__name__}")
        for n, v in out.items():
            if not isinstance(v, (np.ndarray, list)):
                raise TransformError(f"transform {_name(self.fn)} returned field {n!r} as {type(v).__name__}: "
                                     "fields must be numpy arrays (or lists of str)")
            if isinstance(v, np.ndarray) and v.dtype.kind not in _TENSOR_KINDS:  # torch takes numbers only
                raise TransformError(f"transform {_name(self.fn)} returned field {n!r} as an array of dtype "
                                     f"{v.dtype}: fields must be numeric arrays (or lists of str)")
        return out

    def check_pickles(self, why: str) -> None:
        """Refuse now, with what to do, a function that cannot reach a process that is not forked."""
        try:
            pickle.dumps(self.fn)
        except Exception as e:
            raise UsageError(f"transform {_name(self.fn)} cannot be pickled ({type(e).__name__}: {e}), and {why} "
                             "needs that: define it at module level (not a lambda or a local function), or "
                             "make it a picklable object") from None


def _name(fn: Any) -> str:
    return repr(fn) if isinstance(fn, PerSample) else getattr(fn, "__qualname__", type(fn).__name__)
