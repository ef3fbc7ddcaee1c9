"""Augmentation ops: per-sample parameters within their ranges, seeded, batched; image conversion."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import converters
import fastdata
from fastdata.augment import (
    Augment, CenterCrop, ColorJitter, GaussianNoise, HorizontalFlip, Normalize, RandomCrop, RandomResizedCrop,
    VerticalFlip, batch_generator,
)

CPU = torch.device("cpu")


def gen(k: int = 0) -> torch.Generator:
    return batch_generator(7, 0, k, CPU)


def test_flip_rates_and_per_sample_choice():
    x = torch.arange(4.0).expand(4000, 1, 1, 4).clone()
    y = HorizontalFlip(0.3).apply(x, gen())
    flipped = (y[:, 0, 0, 0] == 3).float()
    assert abs(flipped.mean().item() - 0.3) < 0.03
    assert torch.equal(y[flipped == 1], x[flipped == 1].flip(-1))
    v = VerticalFlip(1.0).apply(torch.arange(3.0).view(1, 1, 3, 1).expand(2, 1, 3, 1), gen())
    assert v[:, 0, :, 0].tolist() == [[2, 1, 0], [2, 1, 0]]


def test_random_crop_windows_are_in_bounds_and_exact():
    h, w = 9, 11
    x = (torch.arange(h)[:, None] * 100 + torch.arange(w)[None]).float().expand(500, 2, h, w).clone()
    y = RandomCrop((4, 5)).apply(x, gen())
    assert y.shape == (500, 2, 4, 5)
    top, left = (y[:, 0, 0, 0] // 100).long(), (y[:, 0, 0, 0] % 100).long()
    assert top.min() >= 0 and top.max() == h - 4 and left.min() == 0 and left.max() == w - 5
    for i in range(0, 500, 50):
        t, l = int(top[i]), int(left[i])
        assert torch.equal(y[i], x[i, :, t : t + 4, l : l + 5])
    assert CenterCrop(3).apply(x, gen())[0, 0, 0, 0].item() == 3 * 100 + 4


def test_random_resized_crop_area_and_ratio():
    # Crop of a coordinate ramp: the output's value range tells the crop box in the input.
    h = w = 64
    ramp_x = torch.linspace(0, 1, w).view(1, 1, 1, w).expand(800, 1, h, w)
    ramp_y = torch.linspace(0, 1, h).view(1, 1, h, 1).expand(800, 1, h, w)
    x = torch.cat([ramp_x, ramp_y], 1)
    op = RandomResizedCrop(32, scale=(0.2, 0.6), ratio=(0.5, 2.0))
    y = op.apply(x, gen())
    assert y.shape == (800, 2, 32, 32)
    fw = y[:, 0].amax((1, 2)) - y[:, 0].amin((1, 2))
    fh = y[:, 1].amax((1, 2)) - y[:, 1].amin((1, 2))
    area, ratio = fw * fh, fw / fh
    assert area.min() > 0.2 * 0.85 and area.max() < 0.6 * 1.05
    assert ratio.min() > 0.5 * 0.85 and ratio.max() < 2.0 * 1.15
    assert y.min() >= 0 and y.max() <= 1  # inside the image


def test_color_jitter_ranges():
    x = torch.full((2000, 3, 4, 4), 0.5)
    x[:, 0] = 0.2
    b = ColorJitter(brightness=0.4).apply(x, gen())
    f = b[:, 1, 0, 0] / 0.5
    assert f.min() >= 0.6 - 1e-5 and f.max() <= 1.4 + 1e-5 and f.std() > 0.2
    gray = ColorJitter(saturation=1.0).apply(x, gen(1))
    assert gray.min() >= 0 and gray.max() <= 1
    hue = ColorJitter(hue=0.5).apply(x, gen(2))
    assert torch.allclose(_luma(hue), _luma(x), atol=1e-4)  # a hue rotation keeps luma
    with pytest.raises(ValueError):
        ColorJitter(hue=0.7)
    with pytest.raises(ValueError, match="RGB"):
        ColorJitter(brightness=0.1).apply(torch.rand(2, 1, 4, 4), gen())


def _luma(x):
    return 0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]


def test_noise_and_normalize():
    x = torch.zeros(200, 3, 16, 16)
    n = GaussianNoise(0.1).apply(x, gen())
    assert abs(n.std().item() - 0.1) < 0.005 and abs(n.mean().item()) < 0.005
    z = Normalize((0.5, 0.5, 0.5), (0.25, 0.5, 1.0)).apply(torch.full((1, 3, 2, 2), 1.0), gen())
    assert z[0, :, 0, 0].tolist() == [2.0, 1.0, 0.5]


def test_pipeline_is_deterministic_per_batch_and_differs_across_batches():
    a = Augment((RandomResizedCrop(8), HorizontalFlip(), ColorJitter(0.3, 0.3, 0.3, 0.05), GaussianNoise(0.02)))
    x = torch.rand(16, 3, 12, 12)
    assert torch.equal(a(x, gen(1)), a(x, gen(1)))
    assert not torch.equal(a(x, gen(1)), a(x, gen(2)))


def test_loader_turns_uint8_images_into_float_nchw_and_augments(tmp_path):
    imgs = np.random.default_rng(0).integers(0, 256, (10, 6, 8, 3), dtype=np.uint8)
    np.save(tmp_path / "img.npy", imgs)
    converters.convert(None, tmp_path / "ds", arrays={"image": tmp_path / "img.npy"})
    ld = fastdata.loader(tmp_path / "ds", 5, shuffle=False, device="cpu")
    b = next(iter(ld))
    assert b["image"].dtype == torch.float32 and b["image"].shape == (5, 3, 6, 8)
    assert b["image"].is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(b["image"], torch.from_numpy(imgs[:5]).permute(0, 3, 1, 2).float() / 255)
    aug = [HorizontalFlip(1.0), Normalize((0.5,) * 3, (0.5,) * 3)]
    b2 = next(iter(fastdata.loader(tmp_path / "ds", 5, shuffle=False, device="cpu", augment=aug)))
    assert torch.allclose(b2["image"], (b["image"].flip(-1) - 0.5) / 0.5, atol=1e-6)
    # the same (seed, epoch, batch) gives the same augmentation after a resume
    noisy = [GaussianNoise(0.1)]
    l1 = fastdata.loader(tmp_path / "ds", 5, shuffle=False, device="cpu", augment=noisy)
    first = [x["image"] for x in l1]
    l2 = fastdata.loader(tmp_path / "ds", 5, shuffle=False, device="cpu", augment=noisy)
    l2.load_state_dict({**l2.state_dict(), "batches_done": 1})
    assert torch.equal(next(iter(l2))["image"], first[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_prefetcher_matches_cpu(tmp_path):
    imgs = np.random.default_rng(0).integers(0, 256, (40, 16, 16, 3), dtype=np.uint8)
    np.save(tmp_path / "img.npy", imgs)
    converters.convert(None, tmp_path / "ds", arrays={"image": tmp_path / "img.npy"})
    # CPU and CUDA generators draw different streams: compare with ops that need no randomness
    aug = [HorizontalFlip(1.0), Normalize((0.5,) * 3, (0.25,) * 3)]
    cpu = [b["image"] for b in fastdata.loader(tmp_path / "ds", 8, device="cpu", augment=aug)]
    gpu = [b["image"] for b in fastdata.loader(tmp_path / "ds", 8, device="cuda", augment=aug)]
    assert all(g.is_cuda for g in gpu) and len(cpu) == len(gpu) == 5
    assert max((c - g.cpu()).abs().max().item() for c, g in zip(cpu, gpu)) < 1e-5


def test_ranks_draw_different_augmentation_and_rank0_keeps_its_stream():
    x = torch.rand(64, 3, 8, 8)
    op = HorizontalFlip(0.5)
    r0 = op.apply(x, batch_generator(1, 2, 3, CPU))
    assert torch.equal(r0, op.apply(x, batch_generator(1, 2, 3, CPU, rank=0)))
    assert not torch.equal(r0, op.apply(x, batch_generator(1, 2, 3, CPU, rank=1)))
