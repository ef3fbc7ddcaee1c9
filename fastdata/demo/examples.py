"""Small models for the demo, benchmarks and the docs' examples (no torchvision needed): ``FlimCNN`` for
(B, 2, T >= 16, H, W) FLIM batches, ``TinyNet`` for samples of any shape (the quickstart's model), and the naive
baseline (from fastdata.demo) under the same documented path, ``from fastdata.demo.examples import TinyNet``."""

from __future__ import annotations

import torch
from torch import nn

from fastdata.demo import naive_loader, write_npy_folder
from fastdata.errors import UsageError


class FlimCNN(nn.Module):
    """3-D CNN for inputs of shape (B, 2, T, H, W): channels, time bins, pixels."""

    def __init__(self, num_classes: int = 4, width: int = 16, in_channels: int = 2) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv3d(cin, cout, kernel_size=(5, 3, 3), stride=(2, 1, 1), padding=(2, 1, 1)),
                                 nn.BatchNorm3d(cout), nn.ReLU(inplace=True))

        self.features = nn.Sequential(block(in_channels, width), block(width, 2 * width), block(2 * width, 2 * width),
                                      nn.MaxPool3d((2, 2, 2)))
        self.head = nn.Sequential(nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(2 * width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(torch.log1p(x.clamp_min(0)) / 10.0))  # the user's FLIM preprocessing


class TinyNet(nn.Module):
    """A small classifier for samples of any shape and dtype: each is flattened, pooled to ``bins`` means and maxima,
    and fed to a two-layer MLP, so one model runs on any dataset; a starting point, not tuned for accuracy."""

    def __init__(self, num_classes: int, bins: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.bins = bins
        self.head = nn.Sequential(nn.LayerNorm(2 * bins), nn.Linear(2 * bins, hidden), nn.ReLU(inplace=True),
                                  nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(len(x), 1, -1).float()  # adaptive pooling also stretches samples shorter than bins
        pooled = torch.cat([nn.functional.adaptive_avg_pool1d(flat, self.bins),
                            nn.functional.adaptive_max_pool1d(flat, self.bins)], dim=-1)
        return self.head(pooled.flatten(1))


def classification_loss(input_field: str = "x", label_field: str = "label"):  # type: ignore[no-untyped-def]
    """``loss_fn(model, batch)`` for ``fastdata.train.fit``: cross-entropy of ``model(batch[input])``."""

    def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        missing = [f for f in (input_field, label_field) if f not in batch]
        if missing:  # a KeyError from inside the training loop named neither the batch's fields nor the fix
            raise UsageError(f"classification_loss({input_field!r}, {label_field!r}): the batch has no field "
                             f"{missing[0]!r} (its fields: {', '.join(batch)}); name the fields the dataset has")
        return nn.functional.cross_entropy(model(batch[input_field]), batch[label_field])

    return loss_fn


__all__ = ["FlimCNN", "TinyNet", "classification_loss", "naive_loader", "write_npy_folder"]
