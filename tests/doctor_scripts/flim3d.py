"""A 3D CNN regressing three lifetime parameters from FLIM decays (2, T, 21, 21) per .npy file, targets in a CSV."""

import argparse
import os

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class FlimDataset(Dataset):
    def __init__(self, root):
        self.root = root
        self.table = pd.read_csv(os.path.join(root, "targets.csv"))

    def __len__(self):
        return len(self.table)

    def __getitem__(self, i):
        row = self.table.iloc[i]
        x = np.load(os.path.join(self.root, row["path"])).astype(np.float64)
        x = x / (x.sum(axis=1, keepdims=True) + 1e-6)  # each pixel's decay sums to one
        x = np.log1p(1000.0 * x)
        y = torch.tensor([row["tau1"], row["tau2"], row["fraction"]], dtype=torch.float32)
        return torch.from_numpy(x.astype(np.float32)), y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    a = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv3d(2, 4, 3, stride=(4, 2, 2)), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(),
                          nn.Linear(4, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = DataLoader(FlimDataset(a.data), batch_size=a.batch_size, shuffle=True, num_workers=a.workers)
    for _ in range(a.epochs):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    print("final loss", float(loss))


if __name__ == "__main__":
    main()
