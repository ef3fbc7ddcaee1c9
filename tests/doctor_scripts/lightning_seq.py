"""A LightningModule over variable-length .npy sequences padded by a collate function (a CNN-LSTM user's script)."""

import argparse
import glob
import os
import time

import lightning as L
import numpy as np
import torch
from _direct import mark
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Sequences(Dataset):
    def __init__(self, root):
        self.files = sorted(glob.glob(os.path.join(root, "*", "*.npy")))
        self.classes = sorted(os.listdir(root))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        x = np.load(self.files[i]).astype(np.float32)
        return torch.from_numpy(x), self.classes.index(os.path.basename(os.path.dirname(self.files[i])))


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
        x, y = (batch["x"], batch["label"].long()) if isinstance(batch, dict) else batch
        h = torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        out, _ = self.lstm(h)
        return nn.functional.cross_entropy(self.head(out[:, -1]), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class DirectTiming(L.Callback):
    """With $DIRECT_TIMING: the wait before each batch reaches training_step (the benchmark's direct figure)."""

    def on_train_epoch_start(self, *_):
        self.pos, self.end, self.prev = 0, time.perf_counter(), None

    def on_train_batch_start(self, *_):
        now = time.perf_counter()
        mark(self.pos, now - self.end, now - self.prev if self.prev is not None else 0.0)
        self.prev, self.pos = now, self.pos + 1

    def on_train_batch_end(self, *_):
        self.end = time.perf_counter()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--fastdata", metavar="DATASET", help="read a converted dataset with fastdata.loader instead")
    a = p.parse_args()
    if a.fastdata:
        import fastdata

        loader = fastdata.loader(a.fastdata, batch_size=8, num_workers=2, device="cpu")
    else:
        loader = DataLoader(Sequences(a.data), batch_size=8, shuffle=True, num_workers=a.workers, collate_fn=pad)
    trainer = L.Trainer(max_epochs=a.epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[DirectTiming()] if os.environ.get("DIRECT_TIMING") else [])
    trainer.fit(CnnLstm(), loader)


if __name__ == "__main__":
    main()
