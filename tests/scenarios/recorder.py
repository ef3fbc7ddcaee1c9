"""A tiny Lightning module that records which samples each training step saw (importable, so
``ddp_spawn`` can pickle it)."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
import torch

import fastdata


class Recorder(pl.LightningModule):
    def __init__(self, record: list | None = None, data: str | None = None, out: str | None = None) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)
        self.seen: list = record if record is not None else []
        self.data, self.out = data, out

    def training_step(self, batch, batch_idx):
        self.seen.append([self.current_epoch, batch["label"].tolist()])
        return torch.nn.functional.mse_loss(self.lin(batch["x"]).squeeze(1), batch["label"].float() * 0.1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        if self.data is None:
            return super().train_dataloader()  # raises: pass the loader to fit()
        return fastdata.loader(self.data, 4, seed=11, device="cpu", num_workers=2)

    def on_train_end(self) -> None:
        if self.out is not None:
            ld = self.trainer.train_dataloader
            Path(self.out, f"rank-{self.global_rank}.json").write_text(
                json.dumps({"seen": self.seen, "len": len(ld), "world": self.trainer.world_size}))
