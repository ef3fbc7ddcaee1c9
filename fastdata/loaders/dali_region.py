"""Region decoding on the DALI backend: when a chain starts with RandomResizedCrop, RandomCrop or
CenterCrop on encoded images, ``fn.decoders.image_slice`` decodes only the drawn window (libjpeg-turbo's
cropped decoding on the CPU, nvJPEG's ROI on the GPU) instead of ``fn.decoders.image`` then a crop.

The draws are the chain's own (the same generator calls as ``dali_augment``'s steps, so the same
parameters as the torch backend); the step turns them into the window's pixels. A RandomResizedCrop
region grows by one pixel on each side (clamped to the image), so the bilinear taps at its edges
read the same pixels as on the whole image; the resize then maps the window inside the region.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fastdata.loaders.dali_augment import Chain, Graph, Img, Step, _ResizedCrop, _Window


class _RegionResizedCrop(_ResizedCrop):
    """RandomResizedCrop whose decoder decoded its region: params are the region (absolute start and end,
    (y, x)) for the decoder, then the window inside it for the resize."""

    params: tuple[np.dtype, ...] = (np.dtype(np.int32), np.dtype(np.int32), np.dtype(np.float32),  # type: ignore[assignment]
                                    np.dtype(np.float32))

    def draw(self, rng: Any, hw: np.ndarray) -> list[np.ndarray]:
        start, end = super().draw(rng, hw)  # relative (y, x), float32: the torch op's window
        size = hw.astype(np.float64)
        lo, hi = start.astype(np.float64) * size, end.astype(np.float64) * size
        r0 = np.maximum(np.floor(lo) - 1, 0)
        r1 = np.minimum(np.ceil(hi) + 1, size)
        return [r0.astype(np.int32), r1.astype(np.int32), (lo - r0).astype(np.float32), (hi - r0).astype(np.float32)]

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        node = g.fn.resize(img.node, size=list(self.size), roi_start=params[2], roi_end=params[3],
                           roi_relative=False, interp_type=g.types.INTERP_LINEAR, antialias=False,
                           dtype=g.types.FLOAT)
        return Img(node, True, img.scale)


class _RegionWindow(_Window):
    """RandomCrop / CenterCrop decoded as exactly the window: nothing left to do after the decoder."""

    params: tuple[np.dtype, ...] = (np.dtype(np.int32), np.dtype(np.int32))  # type: ignore[assignment]

    def draw(self, rng: Any, hw: np.ndarray) -> list[np.ndarray]:
        (start,) = super().draw(rng, hw)
        return [start, (start + np.array(self.size, dtype=np.int32)).astype(np.int32)]

    def apply(self, g: Graph, img: Img, params: list[Any]) -> Img:
        return img


def with_region(chain: Chain) -> Chain:
    """``chain`` with its first step decoding its window, when that step is a crop (else unchanged)."""
    if not chain.steps:
        return chain
    first: Step = chain.steps[0]
    if type(first) is _ResizedCrop:
        first = _RegionResizedCrop(first.op)
    elif type(first) is _Window:
        first = _RegionWindow(first.op)
    else:
        return chain
    return Chain([first, *chain.steps[1:]], chain.final_mean, chain.final_std)


def decodes_region(chain: Chain | None) -> bool:
    """The chain's first step takes its window from the decoder (its first two parameters)."""
    return chain is not None and bool(chain.steps) and isinstance(chain.steps[0], (_RegionResizedCrop, _RegionWindow))


def decode(g: Graph, files: Any, channels: int, chain: Chain | None, params: list[Any]) -> Any:
    """The decoder node for one route: the window only when the chain starts with a region step."""
    kw: dict[str, Any] = dict(device="mixed" if g.gpu else "cpu", output_type=g.types.RGB if channels == 3 else g.types.GRAY)
    if decodes_region(chain):
        return g.fn.decoders.image_slice(files, start=params[0], end=params[1], axis_names="HW", **kw)
    return g.fn.decoders.image(files, **kw)

