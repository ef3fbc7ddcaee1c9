"""Self-supervised pre-training in Lightning: two augmented views (random resized crop, blur, mirror, colour) of each
unlabelled photo, a tiny transformer encoder and a contrastive loss."""

import argparse
import glob
import os
import random

import lightning as L
import numpy as np
import torch
from PIL import Image, ImageEnhance, ImageFilter
from torch import nn
from torch.utils.data import DataLoader, Dataset

CROP = 64


class TwoViews(Dataset):
    def __init__(self, root):
        self.files = sorted(glob.glob(os.path.join(root, "*.jpg")))

    def __len__(self):
        return len(self.files)

    def view(self, im):
        side = random.randint(im.width // 2, im.width)
        ox, oy = random.randint(0, im.width - side), random.randint(0, im.height - side)
        v = im.crop((ox, oy, ox + side, oy + side)).filter(ImageFilter.GaussianBlur(random.uniform(0.1, 2.0)))
        v = v.resize((CROP, CROP), Image.BICUBIC)
        if random.random() < 0.5:
            v = v.transpose(Image.FLIP_LEFT_RIGHT)
        v = ImageEnhance.Brightness(v).enhance(random.uniform(0.7, 1.3))
        v = ImageEnhance.Color(v).enhance(random.uniform(0.7, 1.3))
        return torch.from_numpy((np.asarray(v, np.float32) / 255.0 - 0.5).transpose(2, 0, 1) / 0.25)

    def __getitem__(self, i):
        im = Image.open(self.files[i]).convert("RGB")
        return self.view(im), self.view(im)


class Ssl(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 32, 16, stride=16)
        self.encoder = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)

    def embed(self, x):
        return nn.functional.normalize(self.encoder(self.patch(x).flatten(2).transpose(1, 2)).mean(1), dim=1)

    def training_step(self, batch, i):
        a, b = batch
        logits = self.embed(a) @ self.embed(b).T / 0.1
        return nn.functional.cross_entropy(logits, torch.arange(len(a)))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=16)
    a = p.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(TwoViews(a.data), batch_size=a.batch_size, shuffle=True, num_workers=a.workers)
    trainer = L.Trainer(max_epochs=a.epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Ssl(), loader)


if __name__ == "__main__":
    main()
