"""The parts every augmentation op shares: per-sample draws, the op protocol, resampling, the batch generator."""

from __future__ import annotations

from typing import ClassVar, Sequence

import torch
import torch.nn.functional as F

from fastdata.augment.targets import Geometry
from fastdata.errors import UsageError
from fastdata.seeds import Stream, int_seed

Tensor = torch.Tensor
Params = dict[str, Tensor]


def _uniform(g: torch.Generator, b: int, lo: float, hi: float) -> Tensor:
    return torch.rand(b, generator=g, device=g.device) * (hi - lo) + lo


def child_seed(g: torch.Generator) -> Tensor:
    """One draw from ``g`` that seeds a generator elsewhere (noise ops', on the batch's device)."""
    return torch.randint(0, 2**62, (1,), generator=g, device=g.device)


def seeded_noise(x: Tensor, seed: Tensor) -> Tensor:
    """N(0, 1) noise like ``x`` from a generator on ``x``'s device seeded ``seed`` (a :func:`child_seed`)."""
    gn = torch.Generator(device=x.device)
    gn.manual_seed(int(seed))
    return torch.randn(x.shape, generator=gn, device=x.device, dtype=x.dtype)


def pair(v: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    h, w = v
    return (int(h), int(w))


def _as4d(x: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    lead = x.shape[:-2]
    return x.reshape(x.shape[0], -1, *x.shape[-2:]), lead


def _mask(sizes: Tensor, h: int, w: int, dtype: torch.dtype) -> Tensor:
    """(B, 1, H, W): 1 inside each image (top-left, ``sizes`` high and wide), 0 in the padding."""
    rows = torch.arange(h, device=sizes.device).view(1, h, 1) < sizes[:, 0].view(-1, 1, 1)
    cols = torch.arange(w, device=sizes.device).view(1, 1, w) < sizes[:, 1].view(-1, 1, 1)
    return (rows & cols).unsqueeze(1).to(dtype)


def check_fits(op: str, size: tuple[int, int], hw: Tensor) -> None:
    """A fixed-size crop ``size`` must fit inside every image of the batch (``hw``: (B, 2) sizes)."""
    small = [int(v) for v in hw.min(dim=0).values.tolist()] if len(hw) else size
    if size[0] > small[0] or size[1] > small[1]:
        raise UsageError(f"{op}{size} is larger than an image of the batch ({small[0]}x{small[1]}); "
                         "crop to at most the smallest image size")


def image_hw(x: Tensor, sizes: Tensor | None, device: torch.device) -> Tensor:
    """(B, 2) float32 (H, W) of each image on ``device``: ``sizes``, or the batch's own size."""
    if sizes is not None:
        return sizes.to(device).float()
    return torch.tensor([float(x.shape[-2]), float(x.shape[-1])], device=device).expand(x.shape[0], 2)


def _affine(rows: Sequence[Sequence[Tensor | float]], b: int) -> Tensor:
    """(B, 3, 3) float64 matrices from 2 rows of 3 per-sample values (tensors or numbers)."""
    m = torch.zeros(b, 3, 3, dtype=torch.float64)
    for i, row in enumerate(rows):
        for j, v in enumerate(row):
            m[:, i, j] = v.double().cpu() if isinstance(v, torch.Tensor) else float(v)
    m[:, 2, 2] = 1
    return m


class _Op:
    """A built-in op: ``draw`` the batch's parameters (on the generator's device), then ``image``."""

    def draw(self, g: torch.Generator, hw: Tensor) -> Params:
        """Per-sample parameters for images of sizes ``hw`` ((B, 2) float32 on ``g.device``)."""
        return {}

    def check(self, x: Tensor, sizes: Tensor | None) -> None:
        """Raise when the op cannot apply to this batch (before anything is drawn)."""

    def image(self, x: Tensor, p: Params, sizes: Tensor | None) -> Tensor:
        raise NotImplementedError

    def apply(self, x: Tensor, g: torch.Generator, sizes: Tensor | None = None) -> Tensor:
        """Draw and transform; ``sizes``: (B, 2) true (H, W) of top-left images in a padded batch."""
        self.check(x, sizes)
        return self.image(x, self.draw(g, image_hw(x, sizes, g.device)), sizes)


class _Geometric(_Op):
    """An op that moves pixels: the same parameters move masks (``warp`` by nearest neighbour) and
    coordinates (``geometry``)."""

    fixed_size: ClassVar[bool] = False  # every output image has one size (crops, Resize)

    def image(self, x: Tensor, p: Params, sizes: Tensor | None) -> Tensor:
        return self.warp(x, p, sizes, nearest=False, fill=float(getattr(self, "fill", 0.0)))

    def warp(self, x: Tensor, p: Params, sizes: Tensor | None, nearest: bool, fill: float) -> Tensor:
        raise NotImplementedError

    def geometry(self, p: Params, hw: Tensor) -> Geometry:
        """What the op did to each sample (``hw``: (B, 2) float64 input sizes, CPU)."""
        raise NotImplementedError

    def out_sizes(self, sizes: Tensor) -> Tensor:
        """Each image's (H, W) after the op ((B, 2), ``sizes``' dtype and device), from its (H, W) before; the one
        place both backends and the crop-decoding reader take it from."""
        return sizes


class _FixedSize(_Geometric):
    """A geometric op whose every output image is ``size`` (crops, Resize)."""

    size: int | tuple[int, int]
    fixed_size: ClassVar[bool] = True

    def out_sizes(self, sizes: Tensor) -> Tensor:
        return torch.tensor(pair(self.size), dtype=sizes.dtype, device=sizes.device).expand(len(sizes), 2)


def _resample(x4: Tensor, fw: Tensor, fh: Tensor, cx: Tensor, cy: Tensor, oh: int, ow: int,
              limit: tuple[Tensor, Tensor] | None = None, nearest: bool = False) -> Tensor:
    """Bilinear (or nearest) resampling of the boxes (centre, size as fractions of the canvas) to
    (oh, ow); ``limit``: the largest grid x, y per sample (sampling clamps there)."""
    b = x4.shape[0]
    lim = limit if limit is not None else (None, None)
    if nearest:  # separable: one source row per output row, one column per column (any dtype, exact)
        hc, wc = x4.shape[-2:]
        cols = _nearest_index(cx * 2 - 1, fw, ow, wc, lim[0])
        rows = _nearest_index(cy * 2 - 1, fh, oh, hc, lim[1])
        return _gather(x4, rows, cols)
    # the sampling grid is separable too: each output column's x and each row's y, broadcast into place
    grid = torch.empty(b, oh, ow, 2, device=x4.device, dtype=torch.float32)
    grid[..., 0] = _grid_line(cx * 2 - 1, fw, ow, lim[0]).view(b, 1, ow)
    grid[..., 1] = _grid_line(cy * 2 - 1, fh, oh, lim[1]).view(b, oh, 1)
    return _sample(x4, grid)


def _grid_line(centre: Tensor, extent: Tensor, n_out: int, limit: Tensor | None) -> Tensor:
    """(B, n_out) normalised grid positions ``centre + extent * o`` of the output pixels' centres along one axis
    (what affine_grid gives for an axis-aligned box), clamped at ``limit``."""
    o = (torch.arange(n_out, device=centre.device, dtype=torch.float32) + 0.5) * (2 / n_out) - 1
    g = centre.float().view(-1, 1) + extent.float().view(-1, 1) * o
    return g if limit is None else torch.minimum(g, limit.float().view(-1, 1))


def _nearest_index(centre: Tensor, extent: Tensor, n_out: int, n_in: int, limit: Tensor | None) -> Tensor:
    """(B, n_out) source pixel of each output pixel along one axis, as grid_sample's nearest mode picks it
    (normalised grid ``centre + extent * o``)."""
    g = _grid_line(centre, extent, n_out, limit)
    return torch.round((g + 1) / 2 * n_in - 0.5).clamp(0, n_in - 1).long()


def _gather(x4: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """(B, C, len(rows), len(cols)): per-sample rows (B, oh) and columns (B, ow) of a (B, C, H, W) batch, the
    rows gathered first, then the columns of those rows only."""
    b, c, _, w = x4.shape
    oh, ow = rows.shape[1], cols.shape[1]
    picked = x4.gather(2, rows.view(b, 1, oh, 1).expand(b, c, oh, w))
    return picked.gather(3, cols.view(b, 1, 1, ow).expand(b, c, oh, ow))


def _sample(x4: Tensor, grid: Tensor) -> Tensor:
    """Bilinear grid_sample in the batch's float dtype (integer images go through float32, rounded back)."""
    work = x4 if x4.is_floating_point() else x4.float()
    out = F.grid_sample(work, grid.to(work.dtype), mode="bilinear", padding_mode="border", align_corners=False)
    return out.to(x4.dtype) if x4.is_floating_point() else out.round().to(x4.dtype)


def batch_generator(seed: int, epoch: int, batch: int, device: torch.device, rank: int = 0) -> torch.Generator:
    """The generator for one batch, a pure function of (seed, epoch, rank, batch index): resumes repeat it
    and ranks draw differently; the loaders draw on the CPU, so both backends draw the same."""
    g = torch.Generator(device=device)
    g.manual_seed(int_seed(seed, epoch, Stream.AUGMENT, rank, batch))
    return g
