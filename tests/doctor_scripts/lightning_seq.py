"""A LightningModule over variable-length .npy sequences padded by a collate function (a CNN-LSTM user's script)."""

import argparse
import glob
import os

import lightning as L
import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Sequences(Dataset):
    def __init__(self, root):
        self.files = sorted(glob.glob(os.path.join(root, "*.npy")))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        x = np.load(self.files[i]).astype(np.float32)
        return torch.from_numpy(x), i % 2


def pad(batch):
    xs, ys = zip(*batch)
    return nn.utils.rnn.pad_sequence(xs, batch_first=True), torch.tensor(ys)


class CnnLstm(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(8, 16, 5, padding=2)
        self.lstm = nn.LSTM(16, 32, batch_first=True)
        self.head = nn.Linear(32, 2)

    def training_step(self, batch, _):
        x, y = batch
        h = torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        out, _ = self.lstm(h)
        return nn.functional.cross_entropy(self.head(out[:, -1]), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args()
    loader = DataLoader(Sequences(a.data), batch_size=8, shuffle=True, num_workers=a.workers, collate_fn=pad)
    trainer = L.Trainer(max_epochs=a.epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(CnnLstm(), loader)


if __name__ == "__main__":
    main()
