"""Head pose from face crops: random crop, mirror (yaw and roll negated, landmarks swapped left/right) and
brightness jitter in __getitem__; targets (yaw, pitch, roll, 68 landmarks) from meta.csv."""

import argparse
import csv
import json
import os
import random

import numpy as np
import torch
from PIL import Image, ImageEnhance
from torch import nn
from torch.utils.data import DataLoader, Dataset

CROP = 64
MIRROR = [67 - i for i in range(68)]  # landmark i's mirror image
MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


class HeadPose(Dataset):
    def __init__(self, root):
        self.root = root
        with open(os.path.join(root, "meta.csv"), newline="") as f:
            self.rows = list(csv.DictReader(f))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        r = self.rows[i]
        im = Image.open(os.path.join(self.root, r["path"])).convert("RGB")
        lm = np.array(json.loads(r["landmarks"]), dtype=np.float32)
        yaw, pitch, roll = float(r["yaw"]), float(r["pitch"]), float(r["roll"])
        ox, oy = random.randint(0, im.width - CROP), random.randint(0, im.height - CROP)
        im = im.crop((ox, oy, ox + CROP, oy + CROP))
        lm = lm - np.array([ox, oy], np.float32)
        if random.random() < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
            lm[:, 0] = CROP - 1 - lm[:, 0]
            lm = lm[MIRROR]
            yaw, roll = -yaw, -roll
        im = ImageEnhance.Brightness(im).enhance(random.uniform(0.8, 1.2))
        x = (np.asarray(im, np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(x.transpose(2, 0, 1).copy()), torch.tensor([yaw, pitch, roll]), torch.from_numpy(lm)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=8)
    a = p.parse_args()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                        nn.Linear(32, 3 + 136))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loader = DataLoader(HeadPose(a.data), batch_size=a.batch_size, shuffle=True, num_workers=a.workers)
    for _ in range(a.epochs):
        for x, angles, lm in loader:
            out = net(x)
            loss = nn.functional.mse_loss(out[:, :3], angles / 60) + nn.functional.mse_loss(out[:, 3:], lm.flatten(1) / CROP)
            opt.zero_grad()
            loss.backward()
            opt.step()
    print("final loss", float(loss))


if __name__ == "__main__":
    main()
