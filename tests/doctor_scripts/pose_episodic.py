"""Episodic few-shot pose (CAPE-like): JPEGs of any size resized to 128 px, 15 keypoints each from a JSON file,
5-way 1-shot episodes (one support and one query per class) from a batch sampler."""

import argparse
import json
import os
import random

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

WAY, SHOT, QUERY, SIZE = 5, 1, 1, 128


class PoseDataset(Dataset):
    def __init__(self, root):
        self.root = root
        with open(os.path.join(root, "ann.json")) as f:
            self.ann = json.load(f)
        self.classes = sorted({a["path"].split("/")[0] for a in self.ann})
        self.labels = [self.classes.index(a["path"].split("/")[0]) for a in self.ann]

    def __len__(self):
        return len(self.ann)

    def __getitem__(self, i):
        a = self.ann[i]
        im = Image.open(os.path.join(self.root, a["path"])).convert("RGB")
        w, h = im.size
        im = im.resize((SIZE, SIZE), Image.BILINEAR)
        kp = torch.tensor(a["keypoints"], dtype=torch.float32) * torch.tensor([SIZE / w, SIZE / h])
        x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)
        return x, kp, self.labels[i]


class Episodes(Sampler):
    def __init__(self, labels, episodes):
        self.by_class = {}
        for i, c in enumerate(labels):
            self.by_class.setdefault(c, []).append(i)
        self.episodes = episodes

    def __len__(self):
        return self.episodes

    def __iter__(self):
        for _ in range(self.episodes):
            classes = random.sample(sorted(self.by_class), WAY)
            yield [i for c in classes for i in random.sample(self.by_class[c], SHOT + QUERY)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--workers", type=int, default=1)
    a = p.parse_args()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                        nn.Linear(128, 30))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    ds = PoseDataset(a.data)
    loader = DataLoader(ds, batch_sampler=Episodes(ds.labels, a.episodes), num_workers=a.workers)
    for x, kp, _ in loader:
        loss = nn.functional.mse_loss(net(x).view(-1, 15, 2), kp / SIZE)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("final loss", float(loss))


if __name__ == "__main__":
    main()
