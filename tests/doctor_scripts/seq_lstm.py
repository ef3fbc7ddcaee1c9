"""A CNN-LSTM over variable-length recordings (T, 16) in .npy files, labels in labels.csv, jitter and scaling
on the CPU in __getitem__, padded by a collate function."""

import argparse
import os

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Recordings(Dataset):
    def __init__(self, root):
        self.root = root
        self.labels = pd.read_csv(os.path.join(root, "labels.csv"))

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        row = self.labels.iloc[i]
        x = np.load(os.path.join(self.root, row["path"]))
        smooth = np.empty_like(x)
        for t in range(len(x)):  # a moving average, step by step
            smooth[t] = x[max(t - 4, 0):t + 5].mean(0)
        x = smooth * np.random.uniform(0.9, 1.1) + np.random.normal(0, 0.01, x.shape)
        return torch.from_numpy(x.astype(np.float32)), int(row["label"])


def pad(batch):
    xs, ys = zip(*batch)
    return nn.utils.rnn.pad_sequence(xs, batch_first=True), torch.tensor(ys)


class CnnLstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(16, 8, 8, stride=8)
        self.lstm = nn.LSTM(8, 8, batch_first=True)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)
        return self.head(self.lstm(h)[0][:, -1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    a = p.parse_args()
    torch.manual_seed(0)
    model = CnnLstm()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(Recordings(a.data), batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                        collate_fn=pad)
    for _ in range(a.epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    print("final loss", float(loss))


if __name__ == "__main__":
    main()
