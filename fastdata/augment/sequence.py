"""Batched augmentation of sequences ``(B, T, ...)`` (padded with ``<name>_lengths`` or packed) and arrays
on the device; positions past a sample's length are never read nor written."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fastdata.augment.image_ops import Params, Tensor, _uniform, child_seed, seeded_noise
from fastdata.errors import UsageError


def valid_mask(lengths: Tensor, t: int) -> Tensor:
    """(B, T) bool: True at each sample's positions before its length."""
    return torch.arange(t, device=lengths.device).view(1, t) < lengths.view(-1, 1)


def _bcast(m: Tensor, x: Tensor) -> Tensor:
    """A (B, T) or (B, T, C) mask or factor shaped to broadcast over ``x`` (B, T, C, ...)."""
    return m.view(*m.shape, *([1] * (x.dim() - m.dim())))


def _fill(x: Tensor, masked: Tensor, fill: float, inplace: bool) -> Tensor:
    """``x`` with ``fill`` where the float 0/1 ``masked`` is 1, as multiply-adds (no bool kernels); unmasked
    values are kept exactly, a masked non-finite value becomes NaN, not ``fill``."""
    keep = 1.0 - masked
    out = x.mul_(keep) if inplace else x * keep
    return out.add_(masked * fill) if fill else out


def _take_time(x: Tensor, src: Tensor) -> Tensor:
    """(B, T', ...) with ``out[b, t] = x[b, src[b, t]]``: whole rows picked by one index_select."""
    b, t = x.shape[:2]
    rows = (src + torch.arange(b, device=x.device).view(-1, 1) * t).reshape(-1)
    return x.reshape(b * t, -1).index_select(0, rows).view(*src.shape, *x.shape[2:])


def _check(op: object, ok: bool, need: str) -> None:
    """A UsageError naming the op and its arguments unless ``ok`` (checked when the op is made, not mid-epoch)."""
    if not ok:
        raise UsageError(f"{op!r}: {need}")


def _count(v: object, least: int = 0) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= least


def _size(v: object) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and float(v) >= 0


class SeqOp:
    """A sequence op: ``draw`` the batch's parameters, then ``seq`` transforms ``(B, T, ...)`` with its lengths
    and returns both (``inplace``: ``x`` is a working copy the op may overwrite)."""

    needs_time: ClassVar[bool] = True  # False: elementwise, also for array fields

    def draw(self, g: torch.Generator, lengths: Tensor, shape: tuple[int, ...]) -> Params:
        return {}

    def seq(self, x: Tensor, lengths: Tensor, p: Params, inplace: bool = False) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def after(self, lengths: Tensor, p: Params, shape: tuple[int, ...]) -> tuple[Tensor, tuple[int, ...]]:
        """The lengths (CPU) and batch shape after the op, known from its parameters alone."""
        return lengths, shape

    def apply(self, x: Tensor, g: torch.Generator, lengths: Tensor | None = None) -> Tensor:
        """Draw and transform a padded batch (``lengths``: None means every sample fills T)."""
        return run_padded((self,), x, lengths, g, type(self).__name__, "sequence" if self.needs_time else "array")[0]


@dataclass(frozen=True)
class TimeCrop(SeqOp):
    """A random window of ``length`` steps of each sample; a shorter sample is kept whole. The output is
    ``(B, length, ...)`` with lengths ``min(length, own length)``."""

    length: int

    def __post_init__(self) -> None:
        _check(self, _count(self.length, 1), "length must be a positive whole number of steps")

    def draw(self, g: torch.Generator, lengths: Tensor, shape: tuple[int, ...]) -> Params:
        room = (lengths - self.length).clamp(min=0) + 1
        u = torch.rand(len(lengths), generator=g, device=g.device)
        return {"start": torch.minimum((u * room).long(), room - 1)}

    def after(self, lengths: Tensor, p: Params, shape: tuple[int, ...]) -> tuple[Tensor, tuple[int, ...]]:
        return lengths.clamp(max=self.length), (shape[0], self.length, *shape[2:])

    def seq(self, x: Tensor, lengths: Tensor, p: Params, inplace: bool = False) -> tuple[Tensor, Tensor]:
        start = p["start"].to(x.device)
        t = torch.arange(self.length, device=x.device).view(1, -1)
        new = lengths.clamp(max=self.length)
        src = (start.view(-1, 1) + t).clamp(max=x.shape[1] - 1)
        out = _take_time(x, src)
        return out.mul_(_bcast(valid_mask(new, self.length).to(out.dtype), out)), new


@dataclass(frozen=True)
class TimeShift(SeqOp):
    """Shift each sample in time by an integer ~ U[-max_shift, max_shift] steps (fractions of its length when
    ``max_shift`` < 1) within its own length, wrapping round (``rollover``) or filled with ``fill``."""

    max_shift: float
    rollover: bool = True
    fill: float = 0.0

    def __post_init__(self) -> None:
        _check(self, _size(self.max_shift), "max_shift must be a number >= 0 (steps; a fraction of the length when < 1)")

    def draw(self, g: torch.Generator, lengths: Tensor, shape: tuple[int, ...]) -> Params:
        u = _uniform(g, len(lengths), -1.0, 1.0)
        span = lengths.float() * self.max_shift if self.max_shift < 1 else torch.full_like(u, self.max_shift)
        return {"shift": torch.round(u * span).long()}

    def seq(self, x: Tensor, lengths: Tensor, p: Params, inplace: bool = False) -> tuple[Tensor, Tensor]:
        t = torch.arange(x.shape[1], device=x.device).view(1, -1)
        n = lengths.view(-1, 1).clamp(min=1)
        src = t - p["shift"].to(x.device).view(-1, 1)
        inside = valid_mask(lengths, x.shape[1])  # padding positions take themselves: left as they were
        if self.rollover:
            return _take_time(x, torch.where(inside, src.remainder(n), t)), lengths
        keep = (src >= 0) & (src < n)
        moved = _take_time(x, torch.where(inside & keep, src, t))
        return _fill(moved, _bcast((inside & ~keep).to(x.dtype), x), self.fill, True), lengths


@dataclass(frozen=True)
class TimeMask(SeqOp):
    """SpecAugment time masking: ``count`` spans per sample of width ~ U[0, max_width] steps (fractions of its
    length when < 1), at a uniform start inside the sample, set to ``fill``."""

    max_width: float
    count: int = 1
    fill: float = 0.0

    def __post_init__(self) -> None:
        _check(self, _size(self.max_width) and _count(self.count), "max_width must be a number >= 0 and count an "
               "integer >= 0")

    def draw(self, g: torch.Generator, lengths: Tensor, shape: tuple[int, ...]) -> Params:
        n = lengths.float().view(-1, 1)
        return _draw_spans(g, self.count, n * self.max_width if self.max_width < 1 else float(self.max_width), n)

    def seq(self, x: Tensor, lengths: Tensor, p: Params, inplace: bool = False) -> tuple[Tensor, Tensor]:
        masked = _spans(p["start"].to(x.device), p["width"].to(x.device), x.shape[1]) & valid_mask(lengths, x.shape[1])
        return _fill(x, _bcast(masked.to(x.dtype), x), self.fill, inplace), lengths


@dataclass(frozen=True)
class ChannelMask(SeqOp):
    """SpecAugment frequency masking on the channel axis (axis 2): ``count`` bands per sample of
    width ~ U[0, max_width] channels set to ``fill``, over the sample's steps only."""

    max_width: int
    count: int = 1
    fill: float = 0.0

    def __post_init__(self) -> None:
        _check(self, _count(self.max_width) and _count(self.count), "max_width and count must be integers >= 0")

    def draw(self, g: torch.Generator, lengths: Tensor, shape: tuple[int, ...]) -> Params:
        if len(shape) < 3:
            raise UsageError(f"ChannelMask needs a channel axis: (B, T, C), got a batch of shape {shape}")
        n = torch.full((len(lengths), 1), float(shape[2]), device=lengths.device)
        return _draw_spans(g, self.count, float(min(self.max_width, shape[2])), n)

    def seq(self, x: Tensor, lengths: Tensor, p: Params, inplace: bool = False) -> tuple[Tensor, Tensor]:
        bands = _spans(p["start"].to(x.device), p["width"].to(x.device), x.shape[2])  # (B, C)
        inside = valid_mask(lengths, x.shape[1]).unsqueeze(2).to(x.dtype)
        return _fill(x, _bcast(inside * bands.unsqueeze(1).to(x.dtype), x), self.fill, inplace), lengths


def _draw_spans(g: torch.Generator, count: int, cap: Tensor | float, n: Tensor) -> Params:
    """``count`` spans per sample: width ~ U{0 .. cap} (at most ``n``, (B, 1)), start uniform inside ``[0, n)``."""
    width = torch.minimum(torch.floor(torch.rand(len(n), count, generator=g, device=g.device) * (cap + 1)), n)
    start = torch.floor(torch.rand(len(n), count, generator=g, device=g.device) * (n - width + 1))
    return {"start": start.long(), "width": width.long()}


def _spans(start: Tensor, width: Tensor, n: int) -> Tensor:
    """(B, n) bool: inside any of the (B, K) spans [start, start + width)."""
    pos = torch.arange(n, device=start.device).view(1, 1, n)
    s = start.unsqueeze(2)
    return ((pos >= s) & (pos < s + width.unsqueeze(2))).any(1)


@dataclass(frozen=True)
class AmplitudeScale(SeqOp):
    """Multiply each sample by a factor ~ U(low, high) (``log=True``: log-uniform)."""

    low: float = 0.8
    high: float = 1.25
    log: bool = False
    needs_time: ClassVar[bool] = False

    def __post_init__(self) -> None:
        ok = _size(abs(self.low)) and _size(abs(self.high)) and self.low <= self.high
        _check(self, ok and (self.low > 0 or not self.log), "needs finite low <= high (low > 0 with log=True)")

    def draw(self, g: torch.Generator, lengths: Tensor, shape: tuple[int, ...]) -> Params:
        if self.log:
            return {"gain": torch.exp(_uniform(g, len(lengths), math.log(self.low), math.log(self.high)))}
        return {"gain": _uniform(g, len(lengths), self.low, self.high)}

    def seq(self, x: Tensor, lengths: Tensor, p: Params, inplace: bool = False) -> tuple[Tensor, Tensor]:
        gain = p["gain"].to(x.device, x.dtype)
        if x.dim() == 1:
            return (x.mul_(gain) if inplace else x * gain), lengths
        one = torch.ones((), dtype=x.dtype, device=x.device)
        factor = _bcast(torch.where(valid_mask(lengths, x.shape[1]), gain.view(-1, 1), one), x)  # 1: padding exact
        return (x.mul_(factor) if inplace else x * factor), lengths


@dataclass(frozen=True)
class AdditiveNoise(SeqOp):
    """Add N(0, std^2) noise at every position inside each sample (``std`` in the data's units;
    ``relative=True``: times each sample's own standard deviation)."""

    std: float
    relative: bool = False
    needs_time: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check(self, _size(self.std), "std must be a number >= 0")

    def draw(self, g: torch.Generator, lengths: Tensor, shape: tuple[int, ...]) -> Params:
        return {"seed": child_seed(g)}

    def seq(self, x: Tensor, lengths: Tensor, p: Params, inplace: bool = False) -> tuple[Tensor, Tensor]:
        noise = seeded_noise(x, p["seed"])
        if x.dim() == 1:
            return (x.add_(noise, alpha=self.std) if inplace else x + self.std * noise), lengths
        inside = valid_mask(lengths, x.shape[1])
        scale = inside.to(x.dtype) * self.std  # (B, T): 0 on the padding, which x + 0 * noise leaves as it was
        if self.relative:
            n = (lengths.clamp(min=1) * (x[0, 0].numel())).to(x.dtype)
            z = torch.where(_bcast(inside, x), x, torch.zeros((), dtype=x.dtype, device=x.device))
            dims = tuple(range(1, x.dim()))
            mean = z.sum(dims) / n
            var = (z.square().sum(dims) / n - mean.square()).clamp(min=0)
            scale = scale * var.sqrt().view(-1, 1)
        return (x.addcmul_(noise, _bcast(scale, x)) if inplace else torch.addcmul(x, noise, _bcast(scale, x))), lengths


@dataclass(frozen=True)
class TimeStretch(SeqOp):
    """Resample each sample in time by a speed factor ~ U(low, high) (log-uniform), linearly: its new length is
    ``round(length / factor)`` (capped at the batch's T), zeros past it."""

    low: float = 0.9
    high: float = 1.1

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high:
            raise UsageError(f"TimeStretch needs 0 < low <= high, got {self.low}, {self.high}")

    def draw(self, g: torch.Generator, lengths: Tensor, shape: tuple[int, ...]) -> Params:
        return {"factor": torch.exp(_uniform(g, len(lengths), math.log(self.low), math.log(self.high)))}

    @staticmethod
    def _new(lengths: Tensor, factor: Tensor, t_max: int) -> Tensor:
        new = torch.round(lengths.float() / factor.to(lengths.device)).long().clamp(min=1, max=t_max)
        return torch.where(lengths > 0, new, lengths)

    def after(self, lengths: Tensor, p: Params, shape: tuple[int, ...]) -> tuple[Tensor, tuple[int, ...]]:
        return self._new(lengths, p["factor"].cpu(), shape[1]), shape

    def seq(self, x: Tensor, lengths: Tensor, p: Params, inplace: bool = False) -> tuple[Tensor, Tensor]:
        f = p["factor"].to(x.device).view(-1, 1)
        t_max = x.shape[1]
        new = self._new(lengths, f.view(-1), t_max)
        last = (lengths - 1).clamp(min=0).view(-1, 1).float()
        pos = ((torch.arange(t_max, device=x.device).view(1, -1) + 0.5) * f - 0.5).clamp(min=0)
        pos = torch.minimum(pos, last)
        lo = pos.floor()
        w = _bcast((pos - lo), x).to(x.dtype)
        lo_i = lo.long()
        hi_i = torch.minimum(lo_i + 1, last.long())
        out = _take_time(x, lo_i).lerp_(_take_time(x, hi_i), w)
        return out.mul_(_bcast(valid_mask(new, t_max).to(out.dtype), out)), new


def ops_kind(ops: tuple[Any, ...]) -> str:
    """"sequence" when every op is a sequence op, "image" when none is; both in one list is an error."""
    seq = [isinstance(op, SeqOp) for op in ops]
    if any(seq) and not all(seq):
        raise UsageError("one Augment mixes image ops and sequence ops; use one kind of op per Augment "
                         f"(sequence ops: {[type(o).__name__ for o, s in zip(ops, seq) if s]})")
    return "sequence" if seq and all(seq) else "image"


def run_padded(ops: tuple[SeqOp, ...], x: Tensor, lengths: Tensor | None, g: torch.Generator,
               name: str, kind: str) -> tuple[Tensor, Tensor | None]:
    """Apply ``ops`` in order to a padded (B, T, ...) batch (``kind`` "sequence") or an array batch
    ((B, ...), ``kind`` "array": elementwise ops only); returns the batch and its lengths."""
    if not x.is_floating_point():
        raise UsageError(f"{kind} field {name!r} is {x.dtype}; sequence and array ops need floats (convert it as float)")
    if kind == "array":
        timed = [type(op).__name__ for op in ops if op.needs_time]
        if timed:
            raise UsageError(f"{timed[0]} needs a time axis, and {name!r} is an array field; declare it "
                             f"Augment(ops, fields={{{name!r}: 'sequence'}}) if axis 1 is time")
    elif x.dim() < 2:
        raise UsageError(f"sequence field {name!r} must be (batch, time, ...), got {tuple(x.shape)}")
    b = x.shape[0]
    full = x.shape[1] if x.dim() > 1 else 1
    n_cpu = lengths.cpu().long() if lengths is not None else torch.full((b,), full, dtype=torch.long)
    params, n, shape = [], n_cpu, tuple(x.shape)
    for op in ops:  # every draw first, in op order (later ops see the lengths earlier ones leave)
        params.append(op.draw(g, n.to(g.device), shape))
        n, shape = op.after(n, params[-1], shape)
    n = n_cpu.to(x.device)
    for k, (op, p) in enumerate(zip(ops, params)):
        x, n = op.seq(x, n, p, inplace=k > 0)  # the batch itself is never written: the first op copies
    changed = any(type(op) in (TimeCrop, TimeStretch) for op in ops)
    return x, (n if lengths is not None or changed else None)


def pack_to_padded(flat: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    """A packed batch ((sum T, ...), offsets (B + 1,)) as padded (B, max T, ...) with zeros, and lengths."""
    lengths = (offsets[1:] - offsets[:-1]).long()
    b, t = len(lengths), int(lengths.max()) if len(lengths) else 0
    out = flat.new_zeros((b, t, *flat.shape[1:]))
    inside = valid_mask(lengths.to(flat.device), t)
    out[inside] = flat
    return out, lengths


def padded_to_pack(x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """The inverse of :func:`pack_to_padded`: (sum lengths, ...) and offsets (B + 1,) int64."""
    inside = valid_mask(lengths.to(x.device), x.shape[1])
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths.cpu().long(), 0)
    return x[inside], offsets


__all__ = ["AdditiveNoise", "AmplitudeScale", "ChannelMask", "SeqOp", "TimeCrop", "TimeMask", "TimeShift",
           "TimeStretch", "ops_kind", "pack_to_padded", "padded_to_pack", "run_padded", "valid_mask"]
