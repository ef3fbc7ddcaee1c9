"""Augmentation ops: per-sample parameters within their ranges, seeded, batched; image conversion."""

from __future__ import annotations

import numpy as np
import pytest
import torch

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
    assert Normalize((0.5,), (0.5,)).apply(torch.ones(1, 3, 2, 2), gen()).eq(1.0).all()  # one mean: every channel
    for mean, std in (((0.5,) * 3, (1.0, 0.0, 1.0)), ((0.5,) * 3, (1.0,) * 2)):  # as the DALI backend refuses them
        with pytest.raises(fastdata.errors.UsageError, match="Normalize needs one std > 0 per mean"):
            Normalize(mean, std)
    with pytest.raises(fastdata.errors.UsageError, match="Normalize has 2 means and stds for images of 3 channels"):
        Augment((Normalize((0.5, 0.5), (1.0, 1.0)),))(torch.ones(1, 3, 2, 2), gen())


def test_pipeline_is_deterministic_per_batch_and_differs_across_batches():
    a = Augment((RandomResizedCrop(8), HorizontalFlip(), ColorJitter(0.3, 0.3, 0.3, 0.05), GaussianNoise(0.02)))
    x = torch.rand(16, 3, 12, 12)
    assert torch.equal(a(x, gen(1)), a(x, gen(1)))
    assert not torch.equal(a(x, gen(1)), a(x, gen(2)))


def test_loader_turns_uint8_images_into_float_nchw_and_augments(tmp_path):
    imgs = np.random.default_rng(0).integers(0, 256, (10, 6, 8, 3), dtype=np.uint8)
    np.save(tmp_path / "img.npy", imgs)
    fastdata.convert(None, tmp_path / "ds", arrays={"image": tmp_path / "img.npy"})
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


@pytest.mark.gpu  # needs CUDA: tests/conftest.py skips it without
def test_cuda_prefetcher_matches_cpu(tmp_path):
    imgs = np.random.default_rng(0).integers(0, 256, (40, 16, 16, 3), dtype=np.uint8)
    np.save(tmp_path / "img.npy", imgs)
    fastdata.convert(None, tmp_path / "ds", arrays={"image": tmp_path / "img.npy"})
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


# --- mixed-size batches: images top-left in a zero-padded canvas, true sizes given ---

def _padded(sizes, c=2, fill=None):
    """A canvas batch: sample i is a coordinate image (value 100*row + col + 1) of sizes[i], zeros around."""
    hmax, wmax = max(s[0] for s in sizes), max(s[1] for s in sizes)
    x = torch.zeros(len(sizes), c, hmax, wmax)
    for i, (h, w) in enumerate(sizes):
        img = (torch.arange(h)[:, None] * 100 + torch.arange(w)[None] + 1).float() if fill is None else torch.full((h, w), fill)
        x[i, :, :h, :w] = img
    return x, torch.tensor(sizes)


def test_sized_random_crop_and_center_crop_stay_inside_each_image():
    sizes = [(6, 9), (12, 7), (5, 5), (12, 12)] * 50
    x, s = _padded(sizes)
    y = RandomCrop((4, 5)).apply(x, gen(), s)
    assert y.shape == (200, 2, 4, 5) and (y > 0).all()  # no padding in any window
    top, left = ((y[:, 0, 0, 0] - 1) // 100).long(), ((y[:, 0, 0, 0] - 1) % 100).long()
    assert ((top + 4 <= s[:, 0]) & (left + 5 <= s[:, 1])).all()
    assert top[s[:, 0] == 12].max() == 8 and left[s[:, 1] == 9].max() == 4  # every position reachable
    c = CenterCrop((4, 5)).apply(x, gen(), s)
    assert c[1, 0, 0, 0].item() == (12 - 4) // 2 * 100 + (7 - 5) // 2 + 1
    with pytest.raises(fastdata.errors.UsageError, match="larger than an image"):
        RandomCrop(6).apply(x, gen(), s)


def test_sized_random_resized_crop_never_samples_the_padding():
    sizes = [(40, 64), (64, 24), (16, 16), (64, 64)] * 100
    x, s = _padded(sizes, c=3, fill=1.0)
    y = RandomResizedCrop(32, scale=(0.08, 1.0)).apply(x, gen(), s)
    assert y.shape == (400, 3, 32, 32)
    assert torch.allclose(y, torch.ones_like(y), atol=1e-5)  # bilinear weights never reach a zero
    # without the sizes the same op crops the canvas: padding shows (what the old torch backend did)
    z = RandomResizedCrop(32, scale=(0.08, 1.0)).apply(x, gen())
    assert (z < 0.5).any()


def test_sized_flips_mirror_each_image_in_place():
    x, s = _padded([(3, 4), (2, 2), (3, 3)], c=1)
    y = HorizontalFlip(1.0).apply(x, gen(), s)
    assert y[0, 0].tolist() == [[4, 3, 2, 1], [104, 103, 102, 101], [204, 203, 202, 201]]
    assert y[1, 0].tolist() == [[2, 1, 0, 0], [102, 101, 0, 0], [0, 0, 0, 0]]
    v = VerticalFlip(1.0).apply(x, gen(), s)
    assert v[1, 0, :, 0].tolist() == [101, 1, 0] and v[2, 0, :, 2].tolist() == [203, 103, 3]


def test_sized_contrast_and_noise_leave_the_padding_alone():
    x, s = _padded([(4, 4), (8, 6)], c=3, fill=0.25)
    x[1, :, :8, :3] = 0.75  # half dark, half bright: contrast moves them apart around 0.5
    y = ColorJitter(contrast=0.5).apply(x, gen(), s)
    assert (y[0, :, 4:, :] == 0).all() and (y[0, :, :, 4:] == 0).all()
    assert torch.allclose(y[0, :, :4, :4], x[0, :, :4, :4])  # a flat image keeps its value
    f = (y[1, 0, 0, 0] - 0.5) / 0.25  # the drawn contrast factor, about the image's own mean 0.5
    assert torch.allclose(y[1, 0, 0, 3], 0.5 - 0.25 * f, atol=1e-6)
    n = GaussianNoise(0.1).apply(x, gen(), s)
    assert (n[0, :, 4:, :] == 0).all() and (n[0, :, :4, :4] != 0.25).all()


def test_augment_passes_sizes_until_a_crop_and_not_to_ops_of_your_own():
    seen = []

    class Probe:
        def apply(self, x, g):
            seen.append(tuple(x.shape))
            return x

    x, s = _padded([(6, 9), (8, 7)], c=3, fill=0.5)
    out = Augment((HorizontalFlip(1.0), Probe(), RandomCrop(4), HorizontalFlip(1.0)))(x, gen(), s)
    assert out.shape == (2, 3, 4, 4) and (out == 0.5).all()
    assert seen == [(2, 3, 8, 9)]


def test_loader_augments_mixed_size_jpegs_at_their_own_size(tmp_path):
    from PIL import Image

    src = tmp_path / "imgs"
    for i, (h, w) in enumerate([(40, 64), (64, 30), (24, 24), (64, 64), (50, 36), (30, 60)]):
        (src / "c").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((h, w, 3), 250, np.uint8)).save(src / "c" / f"{i}.jpg", quality=95)
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(images=fastdata.ImageOptions(images="encoded")))
    aug = [RandomResizedCrop(16), HorizontalFlip(), ColorJitter(contrast=0.3)]
    for device_batch in fastdata.loader(tmp_path / "ds", 6, device="cpu", augment=aug):
        assert device_batch["image"].shape == (6, 3, 16, 16)
        assert device_batch["image"].min() > 0.9  # no black padding cropped in
    flips = [HorizontalFlip(1.0)]
    b = next(iter(fastdata.loader(tmp_path / "ds", 6, shuffle=False, device="cpu", augment=flips)))
    for img, (h, w, _) in zip(b["image"], b["image_shape"].tolist()):
        assert img[:, :h, :w].min() > 0.9 and (img[:, h:, :] == 0).all() and (img[:, :, w:] == 0).all()


def test_image_shape_describes_the_augmented_images(tmp_path):
    """After a crop every image has the crop's size, and <image>_shape says so (with or without targets);
    ops that keep sizes keep each image's own, and Pad grows them."""
    from PIL import Image

    from fastdata.augment import Pad
    from fastdata.augment.targets import Keypoints

    src = tmp_path / "imgs"
    sizes = [(40, 64), (64, 30), (24, 24)]
    for i, (h, w) in enumerate(sizes):
        (src / "c").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((h, w, 3), 200, np.uint8)).save(src / "c" / f"{i}.png")
    fastdata.convert(src, tmp_path / "ds")

    def first(augment):
        return next(iter(fastdata.loader(tmp_path / "ds", 3, shuffle=False, device="cpu", augment=augment)))

    assert first([RandomResizedCrop((16, 12))])["image_shape"].tolist() == [[16, 12, 3]] * 3
    assert first([HorizontalFlip(), Pad(top=1, left=2)])["image_shape"].tolist() == [[h + 1, w + 2, 3] for h, w in sizes]
    b = first([RandomCrop(8)])
    assert b["image"].shape == (3, 3, 8, 8) and b["image_shape"].tolist() == [[8, 8, 3]] * 3
    batch = {"image": torch.zeros(2, 3, 10, 10), "image_shape": torch.tensor([[10, 10, 3], [10, 10, 3]]),
             "kp": torch.zeros(2, 1, 2)}
    out = Augment((RandomCrop(4),), targets={"kp": Keypoints()}).run(batch, gen(), "image")
    assert out["image_shape"].tolist() == [[4, 4, 3]] * 2 and batch["image_shape"].tolist() == [[10, 10, 3]] * 2


def test_sizes_are_dropped_after_an_op_of_your_own_that_resizes_and_subclasses_keep_working():
    class Half:
        def apply(self, x, g):
            return x[..., ::2, ::2]

    class MyFlip(HorizontalFlip):  # overrides apply without sizes
        def apply(self, x, g):
            return x.flip(-1)

    x, s = _padded([(8, 6), (4, 10)], c=3)
    y = Augment((Half(), HorizontalFlip(1.0)))(x, gen(), s)  # the sizes no longer fit: treated as uniform
    assert torch.equal(y, x[..., ::2, ::2].flip(-1))
    assert torch.equal(Augment((MyFlip(),))(x, gen(), s), x.flip(-1))


def test_loader_flips_and_normalises_its_own_buffers_in_place_as_out_of_place(tmp_path, monkeypatch):
    """On the CPU the loader's flips and final Normalize write into its own float buffers: the same images as
    the ops applied to a copy, for one size and for padded batches of mixed sizes; the input stays as it was."""
    from PIL import Image

    rng = np.random.default_rng(3)
    imgs = rng.integers(0, 256, (12, 10, 14, 3), dtype=np.uint8)
    np.save(tmp_path / "img.npy", imgs)
    fastdata.convert(None, tmp_path / "one", arrays={"image": tmp_path / "img.npy"})
    src = tmp_path / "imgs" / "c"
    src.mkdir(parents=True)
    for i, (h, w) in enumerate([(10, 14), (7, 9), (12, 5), (6, 6), (9, 13), (11, 8)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(src / f"{i}.png")
    fastdata.convert(tmp_path / "imgs", tmp_path / "mixed",
                     fastdata.ConvertConfig(images=fastdata.ImageOptions(images="raw")))  # padded uint8 batches
    ops = [HorizontalFlip(), VerticalFlip(), Normalize((0.4, 0.5, 0.6), (0.2, 0.25, 0.3))]
    from fastdata.augment import pipeline

    calls = []
    real = pipeline._flip_samples
    monkeypatch.setattr(pipeline, "_flip_samples",
                        lambda x, f, axis, sizes, out: calls.append(sizes is not None) or real(x, f, axis, sizes, out))
    for name in ("one", "mixed"):
        plain = list(fastdata.loader(tmp_path / name, 6, shuffle=False, device="cpu"))
        done = list(fastdata.loader(tmp_path / name, 6, shuffle=False, device="cpu", augment=ops))
        for k, (p, d) in enumerate(zip(plain, done)):
            sizes = p["image_shape"][:, :2] if "image_shape" in p else None
            x = p["image"].clone()
            want = Augment(tuple(ops))(x, batch_generator(0, 0, k, CPU), sizes)
            assert torch.equal(x, p["image"])  # out of place: the input is untouched
            assert torch.allclose(d["image"], want, atol=1e-6), (name, k)
    assert set(calls) == {False, True}  # the in-place flips ran, on one-size and on padded batches
