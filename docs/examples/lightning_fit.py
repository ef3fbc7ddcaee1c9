"""Lightning: pass fastdata loaders to Trainer.fit. Usage: python lightning_fit.py DATASET_DIR"""

import sys

import lightning.pytorch as pl
import torch

import fastdata


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        # batch: the loader's dict of tensors, already on the device
        return torch.nn.functional.mse_loss(self.net(batch["x"]).squeeze(1), batch["label"].float())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


if __name__ == "__main__":
    # Built here, before the trainer starts any process group: the rank share is read when
    # each epoch starts. Lightning saves and restores the loader's position in its checkpoints.
    train = fastdata.loader(sys.argv[1], batch_size=4, seed=0, num_workers=2)
    trainer = pl.Trainer(max_epochs=3, accelerator="auto", devices="auto", logger=False,
                         enable_progress_bar=False)
    trainer.fit(Model(), train_dataloaders=train)
    train.close()
    print(f"trained {trainer.current_epoch} epochs of {len(train)} batches")
