"""An image classifier over a folder of JPEGs (class sub-folders) with PIL transforms, like a vision user's script."""

import argparse
import glob
import os
import random

import numpy as np
import torch
from _direct import timed
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


def train_transform(im, size=112):
    """Random resized crop, horizontal flip, to a normalised CHW float tensor (what torchvision would do)."""
    w, h = im.size
    s = random.uniform(0.5, 1.0)
    cw, ch = int(w * s), int(h * s)
    x0, y0 = random.randint(0, w - cw), random.randint(0, h - ch)
    im = im.crop((x0, y0, x0 + cw, y0 + ch)).resize((size, size), Image.BILINEAR)
    if random.random() < 0.5:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    a = (np.asarray(im, np.float32) / 255 - MEAN) / STD
    return torch.from_numpy(a.transpose(2, 0, 1).copy())


class Folder(Dataset):
    def __init__(self, root):
        self.classes = sorted(os.listdir(root))
        self.files = sorted(glob.glob(os.path.join(root, "*", "*.jpg")))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        im = Image.open(self.files[i]).convert("RGB")
        return train_transform(im), self.classes.index(os.path.basename(os.path.dirname(self.files[i])))


def from_fastdata(batch):
    """fastdata batches: images resized once at conversion, flipped and normalised by the loader's reader
    threads (its augment ops, as a user switching to fastdata moves the per-sample transforms)."""
    return batch["image"], batch["label"].long()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--fastdata", metavar="DATASET", help="read a converted dataset with fastdata.loader instead")
    a = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 4, stride=4), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if a.fastdata:
        import fastdata

        from fastdata.augment import HorizontalFlip, Normalize

        loader = fastdata.loader(a.fastdata, batch_size=a.batch_size, num_workers=2, device="cpu",
                                 augment=[HorizontalFlip(), Normalize(tuple(map(float, MEAN)), tuple(map(float, STD)))])
    else:
        loader = DataLoader(Folder(a.data), batch_size=a.batch_size, shuffle=True, num_workers=a.workers)
    for _ in range(a.epochs):
        for batch in timed(loader):
            x, y = from_fastdata(batch) if a.fastdata else batch
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    print("final loss", float(loss))


if __name__ == "__main__":
    main()
