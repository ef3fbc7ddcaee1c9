"""A 3D CNN over a folder of per-sample .npy volumes (class sub-folders), like a medical-imaging user's script."""

import argparse
import glob
import os

import numpy as np
import torch
from _direct import timed
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Volumes(Dataset):
    def __init__(self, root):
        self.files = sorted(glob.glob(os.path.join(root, "*", "*.npy")))
        self.classes = sorted(os.listdir(root))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        x = np.load(self.files[i]).astype(np.float32)
        x = (x - x.mean()) / (x.std() + 1e-6)  # per-volume normalisation
        y = self.classes.index(os.path.basename(os.path.dirname(self.files[i])))
        return torch.from_numpy(x), y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--fastdata", metavar="DATASET", help="read a converted dataset with fastdata.loader instead")
    a = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv3d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool3d(2), nn.Conv3d(8, 16, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if a.fastdata:
        import fastdata

        loader = fastdata.loader(a.fastdata, batch_size=a.batch_size, num_workers=2, device="cpu")
        batches = ((b["f0"] if "f0" in b else b["x"], b["f1"] if "f1" in b else b["label"]) for b in timed(loader))
    else:
        loader = DataLoader(Volumes(a.data), batch_size=a.batch_size, shuffle=True, num_workers=a.workers)
    for _ in range(a.epochs):
        for x, y in (batches if a.fastdata else timed(loader)):
            if x.dim() == 4:
                x = x.unsqueeze(1)
            loss = nn.functional.cross_entropy(model(x.float()), y.long().view(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    print("final loss", float(loss))


if __name__ == "__main__":
    main()
