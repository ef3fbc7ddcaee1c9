"""Batched augmentation on the device: per-sample random parameters from a seeded generator.

Ops are small frozen dataclasses (a declarative spec the DALI backend maps to its own operators). Each
takes a float batch ``(B, C, H, W)`` in [0, 1] and a ``torch.Generator``, draws one set of parameters per
sample (``draw``, on the CPU in the loaders, so both backends draw the same), then transforms the batch.
Geometric ops also describe what they did (:class:`fastdata.augment.targets.Geometry`), so declared
targets move with the image. A mixed-size batch arrives padded, each image at the top-left, with its
``sizes``; the ops treat each image at its own size. Every public name is importable from here.
"""

from fastdata.augment.affine import Pad, RandomAffine
from fastdata.augment.base import Params, Tensor, batch_generator, image_hw, pair
from fastdata.augment.color import RGB2YIQ, YIQ2RGB, ColorJitter, GaussianNoise, Normalize, child_seed
from fastdata.augment.geometric import CenterCrop, HorizontalFlip, RandomCrop, RandomResizedCrop, Resize, VerticalFlip
from fastdata.augment.pipeline import CROPS, IMAGENET_MEAN, IMAGENET_STD, Augment, Op, shapes_after

__all__ = [
    "Augment", "CROPS", "CenterCrop", "ColorJitter", "GaussianNoise", "HorizontalFlip", "IMAGENET_MEAN",
    "IMAGENET_STD", "Normalize", "Op", "Pad", "Params", "RGB2YIQ", "RandomAffine", "RandomCrop", "RandomResizedCrop",
    "Resize", "Tensor", "VerticalFlip", "YIQ2RGB", "batch_generator", "child_seed", "image_hw", "pair",
    "shapes_after",
]
