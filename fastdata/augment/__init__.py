"""Batched augmentation on the device (docs/augment.md): ops are frozen dataclasses that draw per-sample
parameters from the batch's generator (on the CPU, so both backends draw the same), then transform the batch."""

from fastdata.augment.image_ops import (
    RGB2YIQ,
    CenterCrop,
    ColorJitter,
    GaussianNoise,
    HorizontalFlip,
    Normalize,
    Pad,
    RandomAffine,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    VerticalFlip,
    batch_generator,
    pair,
)
from fastdata.augment.pipeline import CROPS, IMAGENET_MEAN, IMAGENET_STD, Augment, Op, shapes_after

__all__ = [
    "Augment", "CROPS", "CenterCrop", "ColorJitter", "GaussianNoise", "HorizontalFlip", "IMAGENET_MEAN",
    "IMAGENET_STD", "Normalize", "Op", "Pad", "RGB2YIQ", "RandomAffine", "RandomCrop", "RandomResizedCrop",
    "Resize", "VerticalFlip", "batch_generator", "pair", "shapes_after",
]
