"""Few-shot episodes (N-way K-shot) from a batch sampler over per-sample .npy spectrograms, like a meta-learning script."""

import argparse
import glob
import os
import random

import numpy as np
import torch
from _direct import timed
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

WAY, SHOT, QUERY = 5, 2, 2


class Clips(Dataset):
    def __init__(self, root):
        self.classes = sorted(os.listdir(root))
        self.files = sorted(glob.glob(os.path.join(root, "*", "*.npy")))
        self.labels = [self.classes.index(os.path.basename(os.path.dirname(f))) for f in self.files]

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        x = np.load(self.files[i])
        spec = np.abs(np.fft.rfft(x.reshape(-1, 256), axis=-1)).astype(np.float32)  # a per-sample spectrogram
        return torch.from_numpy(np.log1p(spec)), self.labels[i]


class Episodes(Sampler):
    """WAY classes a batch, SHOT + QUERY samples of each."""

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


def episode_from_fastdata(x):
    """fastdata's episodes hold the raw clips, supports then queries: the spectrogram runs on the batch here."""
    spec = torch.log1p(torch.fft.rfft(x.view(x.shape[0], -1, 256), dim=-1).abs())
    support, query = spec[:WAY * SHOT], spec[WAY * SHOT:]
    return torch.cat([support.view(WAY, SHOT, *spec.shape[1:]), query.view(WAY, QUERY, *spec.shape[1:])], 1).flatten(0, 1)


def proto_loss(encoder, x):
    z = encoder(x.unsqueeze(1)).view(WAY, SHOT + QUERY, -1)
    protos = z[:, :SHOT].mean(1)
    q = z[:, SHOT:].reshape(WAY * QUERY, -1)
    target = torch.arange(WAY).repeat_interleave(QUERY)
    return nn.functional.cross_entropy(-torch.cdist(q, protos), target)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--fastdata", metavar="DATASET", help="read a converted dataset with fastdata.loader instead")
    a = p.parse_args()
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, padding=1),
                            nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten())
    opt = torch.optim.Adam(encoder.parameters(), lr=1e-3)
    if a.fastdata:
        import fastdata
        from fastdata.reading.samplers import Episodic

        loader = fastdata.loader(a.fastdata, None, num_workers=2, device="cpu",
                                 sampler=Episodic(WAY, SHOT, QUERY, episodes_per_epoch=a.episodes))
        batches = (episode_from_fastdata(b["x"]) for b in timed(loader))
    else:
        ds = Clips(a.data)
        loader = DataLoader(ds, batch_sampler=Episodes(ds.labels, a.episodes), num_workers=a.workers)
        batches = (x for x, _ in timed(loader))
    for x in batches:
        loss = proto_loss(encoder, x)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("final loss", float(loss))


if __name__ == "__main__":
    main()
