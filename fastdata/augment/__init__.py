"""Batched augmentation on the device: per-sample random parameters from a seeded generator.

A pipeline is a tuple of small frozen dataclasses (the declarative spec), so the DALI backend
can map the same spec to its own operators. Every op takes a float batch ``(B, C, H, W)``
(more leading axes are folded into C) and a ``torch.Generator``, and draws one set of parameters
per sample (``draw``, on the generator's device: the loaders draw on the CPU, so both backends
draw the same parameters) before transforming the batch (``image``). Images arrive as floats in [0, 1].

Geometric ops (crops, flips, Resize, Pad, RandomAffine) also say what they did as a
:class:`fastdata.augment.targets.Geometry`, so ``Augment(ops, targets={...})`` moves keypoints, boxes,
masks and targets of your own with the image, with the same draw (docs/augment.md).

A batch of images of mixed sizes arrives padded to its largest (H, W), each image at the
top-left, with ``sizes`` ((B, 2) true heights and widths): the built-in ops then treat each
image at its own size (crops and flips stay inside it, contrast and noise ignore the padding), as
the DALI backend does. After a crop or a Resize every image has the same size.
The package: ``base`` (op protocol, resampling, the batch generator), ``geometric`` (crops,
Resize, flips), ``affine`` (Pad, RandomAffine), ``color``, ``follow`` (targets) and ``pipeline``
(:class:`Augment`). Every public name is importable from ``fastdata.augment``.
"""

from fastdata.augment.affine import Pad, RandomAffine
from fastdata.augment.base import Params, Tensor, batch_generator, image_hw, pair
from fastdata.augment.color import RGB2YIQ, YIQ2RGB, ColorJitter, GaussianNoise, Normalize, child_seed
from fastdata.augment.color import _gray as _gray  # noqa: F401 - tests compare the DALI colour maths with these
from fastdata.augment.color import _rotate_hue as _rotate_hue  # noqa: F401
from fastdata.augment.geometric import CenterCrop, HorizontalFlip, RandomCrop, RandomResizedCrop, Resize, VerticalFlip
from fastdata.augment.pipeline import CROPS, IMAGENET_MEAN, IMAGENET_STD, Augment, Op, shapes_after

__all__ = [
    "Augment", "CROPS", "CenterCrop", "ColorJitter", "GaussianNoise", "HorizontalFlip", "IMAGENET_MEAN",
    "IMAGENET_STD", "Normalize", "Op", "Pad", "Params", "RGB2YIQ", "RandomAffine", "RandomCrop", "RandomResizedCrop",
    "Resize", "Tensor", "VerticalFlip", "YIQ2RGB", "batch_generator", "child_seed", "image_hw", "pair",
    "shapes_after",
]
