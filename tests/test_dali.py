"""The DALI backend (CPU mode): the torch backend's contract, sample for sample; augmentation mapping; errors.

Skipped as a whole when NVIDIA DALI is not installed (``pip install "fastdata[dali]"``).
GPU-only tests are skipped without CUDA.
"""

from __future__ import annotations

import logging
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("nvidia.dali")

import fastdata  # noqa: E402
import imagegen  # noqa: E402
from conftest import free_port, gloo_group  # noqa: E402
from fastdata import ImageOptions, WriteOptions  # noqa: E402
from fastdata.augment import (  # noqa: E402
    Augment, CenterCrop, ColorJitter, GaussianNoise, HorizontalFlip, Normalize, RandomCrop, RandomResizedCrop,
    VerticalFlip,
)
from fastdata.errors import BackendUnavailableError, CorruptShardError, UsageError  # noqa: E402
from fastdata.format import read_manifest  # noqa: E402
from fastdata.loaders import LoaderConfig  # noqa: E402
from fastdata.loaders import dali as fdali  # noqa: E402
from fastdata.world import World  # noqa: E402

N = 37  # prime: a partial last batch and uneven rank shares
CUDA = pytest.mark.gpu  # needs CUDA: tests/conftest.py skips it without


def both(path: Path, batch: int, **kw):
    """The same loader on both backends, CPU mode."""
    return (fastdata.loader(path, batch, device="cpu", backend="torch", **kw),
            fastdata.loader(path, batch, device="cpu", backend="dali", **kw))


def labels(ld) -> list[list[int]]:
    return [b["label"].tolist() for b in ld]


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> Path:
    """N encoded JPEGs of two sizes (a batch mixes them), label = sample index, LMDB shards of a few samples."""
    tmp = tmp_path_factory.mktemp("dali-jpeg")
    (tmp / "src").mkdir()
    for i in range(N):
        imagegen.jpeg(tmp / "src" / f"{i:03d}.jpg", h=24 if i % 4 else 30, w=32, seed=i)
    (tmp / "labels.csv").write_text("".join(f"{i:03d}.jpg,{i}\n" for i in range(N)))
    fastdata.convert(tmp / "src", tmp / "ds", fastdata.ConvertConfig(write=WriteOptions(backend="lmdb", shard_size=20_000, workers=1), images=ImageOptions(images="encoded")), labels=tmp / "labels.csv")
    return tmp / "ds"


@pytest.fixture(scope="module")
def pixels(tmp_path_factory) -> Path:
    """N images of two sizes stored as raw ragged pixels (encoding "pixels"), HDF5."""
    tmp = tmp_path_factory.mktemp("dali-pixels")
    for i in range(N):
        (tmp / "src" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        imagegen.png_rgb(tmp / "src" / f"c{i % 2}" / f"{i:03d}.png", h=20 if i % 3 else 26, w=28, seed=i)
    fastdata.convert(tmp / "src", tmp / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1), images=ImageOptions(images="raw")))
    return tmp / "ds"


def ramps(n: int, h: int, w: int) -> np.ndarray:
    """uint8 (n, h, w, 3): red = column, green = row (both 0..255), blue = the sample number."""
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([np.round(x * 255 / (w - 1)), np.round(y * 255 / (h - 1)), np.zeros_like(x)], -1)
    a = np.broadcast_to(a, (n, h, w, 3)).copy()
    a[..., 2] = np.arange(n)[:, None, None] % 256
    return a.astype(np.uint8)


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    """Raw fixed-size image field + float, uint16 and complex fields + labels, HDF5, several shards."""
    tmp = tmp_path_factory.mktemp("dali-raw")
    rng = np.random.default_rng(0)
    np.save(tmp / "image.npy", ramps(N, 12, 16))
    np.save(tmp / "x.npy", rng.standard_normal((N, 2, 3)).astype(np.float32))
    np.save(tmp / "u.npy", rng.integers(0, 65535, (N, 4)).astype(np.uint16))
    np.save(tmp / "z.npy", (rng.standard_normal(N) + 1j * rng.standard_normal(N)).astype(np.complex64))
    np.save(tmp / "y.npy", np.arange(N, dtype=np.int64))
    fastdata.convert(None, tmp / "ds", fastdata.ConvertConfig(write=WriteOptions(shard_size=4000, workers=1)), labels=tmp / "y.npy", arrays={k: tmp / f"{k}.npy" for k in ("image", "x", "u", "z")})
    return tmp / "ds"


@pytest.fixture(scope="module")
def big_ramps(tmp_path_factory) -> Path:
    """512 ramp images of 32x32: for augmentation statistics."""
    tmp = tmp_path_factory.mktemp("dali-ramps")
    np.save(tmp / "image.npy", ramps(512, 32, 32))
    np.save(tmp / "y.npy", np.arange(512, dtype=np.int64))
    fastdata.convert(None, tmp / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1)), labels=tmp / "y.npy", arrays={"image": tmp / "image.npy"})
    return tmp / "ds"


# ---- the torch backend's contract ------------------------------------------------------------


def assert_same_batches(ta, da, *, image_tol: tuple[float, float] | None = None) -> None:
    assert len(ta) == len(da)
    for a, b in zip(ta, da):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
            assert a[k].is_contiguous(memory_format=torch.channels_last) == b[k].is_contiguous(
                memory_format=torch.channels_last), k
            if image_tol is not None and k == "image":
                diff = (a[k] - b[k]).abs() * 255  # in 8-bit levels
                assert diff.mean() < image_tol[0] and diff.max() <= image_tol[1]
            else:
                assert torch.equal(a[k], b[k]), k


def test_raw_fields_equal_torch_backend(raw):
    t, d = both(raw, 8, seed=4)
    tb, db = list(t), list(d)
    assert_same_batches(tb, db)
    assert db[0]["image"].dtype == torch.float32 and db[0]["image"].shape == (8, 3, 12, 16)
    assert db[0]["u"].dtype == torch.uint16 and db[0]["z"].dtype == torch.complex64
    cl = fastdata.loader(raw, 8, seed=4, device="cpu", backend="dali", config=LoaderConfig(channels_last=False))
    first = next(iter(cl))["image"]
    assert first.is_contiguous() and torch.equal(first, db[0]["image"])


def test_decoded_jpegs_equal_torch_backend(jpegs):
    # Measured: DALI's CPU decoder (libjpeg-turbo in nvImageCodec) gives the same pixels as
    # simplejpeg and PIL (libjpeg-turbo too): 0 levels apart. The bound allows another
    # libjpeg-turbo build (IDCT/upsampling variants differ by a few levels), not a wrong decode.
    t, d = both(jpegs, 8, seed=1)
    tb, db = list(t), list(d)
    assert_same_batches(tb, db, image_tol=(1.0, 16))
    assert {tuple(b["image"].shape[2:]) for b in db} == {(30, 32)}  # mixed sizes padded, as torch pads
    sizes = torch.cat([b["image_shape"] for b in db])
    assert set(sizes[:, 0].tolist()) == {24, 30}
    # the padding is a stored 0, normalised like the pixels (as the torch backend pads, then normalises)
    norm = [Normalize((0.4, 0.5, 0.6), (0.2, 0.3, 0.5))]
    t, d = both(jpegs, 8, seed=1, augment=norm)
    corners = []
    for a, b in zip(t, d):
        assert torch.allclose(a["image"], b["image"], atol=1e-5)
        corners.append(b["image"][b["image_shape"][:, 0] == 24][:, :, -1, -1])  # padded corner of short images
    corners = torch.cat(corners)
    assert len(corners) > 0 and torch.allclose(corners, torch.tensor([-2.0, -5 / 3, -1.2]).expand_as(corners))


def test_batches_that_mix_sizes_are_padded_to_their_largest_image(tmp_path):
    (tmp_path / "src").mkdir()
    for i in range(21):
        imagegen.jpeg(tmp_path / "src" / f"{i:03d}.jpg", h=24 if i < 16 or i % 2 else 20, w=32, seed=i)
    (tmp_path / "labels.csv").write_text("".join(f"{i:03d}.jpg,{i}\n" for i in range(21)))
    fastdata.convert(tmp_path / "src", tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1)), labels=tmp_path / "labels.csv")
    t, d = both(tmp_path / "ds", 4, shuffle=False)
    first = list(d)
    assert labels(d) == [b["label"].tolist() for b in first]
    assert_same_batches(list(t), first)
    assert [tuple(b["image"].shape[2:]) for b in first] == [(24, 32)] * 5 + [(20, 32)]  # batch 4 mixes: padded


def test_ragged_pixels_equal_torch_backend(pixels):
    t, d = both(pixels, 6, shuffle=False)
    assert_same_batches(list(t), list(d))


def test_ragged_non_image_fields_are_padded_with_lengths(tmp_path):
    src = tmp_path / "seq"
    src.mkdir()
    for i in range(11):
        np.save(src / f"{i:02d}.npy", np.full((i % 4 + 1, 3), i, np.int16))
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1)))
    t, d = both(tmp_path / "ds", 4, seed=2)
    db = list(d)
    assert_same_batches(list(t), db)
    assert "x_lengths" in db[0] and db[0]["x"].shape[1] == int(db[0]["x_lengths"].max())


def test_fields_dali_cannot_type_cross_it_bit_for_bit(tmp_path):
    # no image field: every field goes through DALI (in CPU mode, plain fields of image datasets go around it)
    rng = np.random.default_rng(1)
    np.save(tmp_path / "u.npy", rng.integers(0, 2**32, (9, 3), dtype=np.uint64).astype(np.uint32))
    np.save(tmp_path / "z.npy", (rng.standard_normal((9, 2)) + 1j).astype(np.complex128))
    fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1)), arrays={"u": tmp_path / "u.npy",
                                                                               "z": tmp_path / "z.npy"})
    t, d = both(tmp_path / "ds", 4, seed=3)
    db = list(d)
    assert_same_batches(list(t), db)
    assert db[0]["u"].dtype == torch.uint32 and db[0]["z"].dtype == torch.complex128


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_once_per_epoch(jpegs, drop_last):
    ld = fastdata.loader(jpegs, 8, drop_last=drop_last, device="cpu", backend="dali")
    for _ in range(2):
        batches = labels(ld)
        assert len(batches) == len(ld) == (N // 8 if drop_last else -(-N // 8))
        assert all(len(b) == 8 for b in batches[:-1])
        assert len(batches[-1]) == (8 if drop_last else N % 8)
        flat = [i for b in batches for i in b]
        assert max(Counter(flat).values()) == 1 and len(flat) == (N - N % 8 if drop_last else N)


def test_same_permutation_as_torch_backend(raw):
    for seed, shuffle in ((0, True), (7, True), (3, fastdata.Block(4, window=2))):
        t, d = both(raw, 5, seed=seed, shuffle=shuffle)
        t_epochs = [labels(t) for _ in range(3)]  # a complete pass moves to the next epoch
        d_epochs = [labels(d) for _ in range(3)]
        assert t_epochs == d_epochs and t_epochs[0] != t_epochs[1]
        assert d_epochs[0] == [b.tolist() for b in d.plan(0)]
        d.set_epoch(1)
        assert labels(d) == t_epochs[1]


@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_partition_is_the_torch_backends(raw, monkeypatch, drop_last):
    world = 3
    shares = []
    for rank in range(world):
        monkeypatch.setattr(World, "detect", classmethod(lambda cls, r=rank: World(r, world)))
        t, d = both(raw, 4, drop_last=drop_last, seed=9)
        got = labels(d)
        assert got == labels(t) and len(got) == len(d) == len(t)
        shares.append([i for b in got for i in b])
    per = N // world if drop_last else -(-N // world)
    assert all(len(s) == (per - per % 4 if drop_last else per) for s in shares)
    flat = [i for s in shares for i in s]
    if drop_last:
        assert len(flat) == len(set(flat))
    else:
        assert set(flat) == set(range(N)) and len(flat) - len(set(flat)) == per * world - N


def _ddp_worker(rank: int, world: int, port: int, path: str, out: str) -> None:
    with gloo_group(rank, world, port) as dist:
        ld = fastdata.loader(path, 4, seed=9, device="cpu", backend="dali", num_workers=1)
        got = labels(ld)
        n = torch.tensor([len(got)])
        dist.all_reduce(n, op=dist.ReduceOp.MAX)  # would hang if the ranks disagreed on batch counts
        np.save(f"{out}-{rank}.npy", np.array([i for b in got for i in b] + [-1, len(got), len(ld)]))


def test_ddp_two_processes_gloo(raw, tmp_path):
    torch.multiprocessing.spawn(_ddp_worker, args=(2, free_port(), str(raw), str(tmp_path / "r")), nprocs=2, join=True)
    shares, per_rank = [], -(-N // 2)
    for r in range(2):
        a = np.load(tmp_path / f"r-{r}.npy").tolist()
        sep = a.index(-1)
        shares.append(a[:sep])
        assert a[sep + 1] == a[sep + 2] == -(-per_rank // 4)  # batches seen == len(loader), on both ranks
    assert len(shares[0]) == len(shares[1]) == per_rank
    assert set(shares[0] + shares[1]) == set(range(N))  # one sample twice: the documented wrap-around pad


def test_resume_mid_epoch_gives_exactly_the_rest(jpegs):
    aug = [RandomResizedCrop(16), HorizontalFlip(), ColorJitter(0.3, 0.3, 0.3, 0.05), Normalize((0.5,) * 3, (0.2,) * 3)]
    full = fastdata.loader(jpegs, 8, seed=5, device="cpu", backend="dali", augment=aug)
    full.set_epoch(2)
    expected = list(full)
    ld = fastdata.loader(jpegs, 8, seed=5, device="cpu", backend="dali", augment=aug)
    ld.set_epoch(2)
    for k, b in enumerate(ld):
        if k == 1:
            state = ld.state_dict()
            break
    fresh = fastdata.loader(jpegs, 8, seed=5, device="cpu", backend="dali", augment=aug)
    fresh.load_state_dict(state)
    rest = list(fresh)
    assert len(rest) == len(expected) - 2
    for a, b in zip(expected[2:], rest):  # same samples, same order, same augmentation
        assert torch.equal(a["label"], b["label"]) and torch.equal(a["image"], b["image"])
    assert fresh.state_dict()["epoch"] == 3 and fresh.state_dict()["batches_done"] == 0
    # a torch-backend state resumes on the DALI backend (the order is shared)
    t = fastdata.loader(jpegs, 8, seed=5, device="cpu", backend="torch")
    t.load_state_dict({**t.state_dict(), "epoch": 2, "batches_done": 3})
    d = fastdata.loader(jpegs, 8, seed=5, device="cpu", backend="dali")
    d.load_state_dict(t.state_dict())
    assert labels(d) == [b["label"].tolist() for b in expected[3:]]


def test_partial_pass_then_new_epoch_starts_clean(raw):
    d = fastdata.loader(raw, 4, seed=1, device="cpu", backend="dali")
    it = iter(d)
    next(it)  # DALI has prefetched more batches of epoch 0 ...
    d.set_epoch(5)
    assert labels(d) == [b.tolist() for b in d.plan(5)]  # ... none of which leak into epoch 5
    d.close()
    assert labels(d) == [b.tolist() for b in d.plan(6)]  # a closed loader starts a new pass on demand


def test_stats_and_held_batches(raw):
    d = fastdata.loader(raw, 4, shuffle=False, device="cpu", backend="dali")
    held = list(d)  # keep every batch: DALI's buffers must not be reused under us
    s = d.stats()
    assert s["batches"] == len(d) and s["samples"] == N and s["samples_per_s"] > 0
    assert 0 <= s["wait_fraction"] <= 1 + 1e-6 and s["wait_ms_p95"] >= s["wait_ms_median"] >= 0
    expect = torch.from_numpy(ramps(N, 12, 16)).permute(0, 3, 1, 2).float() / 255
    assert torch.allclose(torch.cat([b["image"] for b in held]), expect, rtol=0, atol=1e-6)


def test_read_and_decode_errors_name_the_sample_after_the_good_batches(jpegs, tmp_path):
    import shutil

    root = tmp_path / "ds"
    shutil.copytree(jpegs, root)
    shard = root / read_manifest(root).shards[-1].file  # the last shard: early batches stay good
    blob = bytearray(shard.read_bytes())
    sof = bytes(blob).find(b"\xff\xc0")
    assert sof > 0
    blob[sof : sof + 2] = b"\xff\x01"  # no frame header any more: the JPEG cannot decode
    shard.write_bytes(bytes(blob))
    ld = fastdata.loader(root, 8, shuffle=False, device="cpu", backend="dali")
    got = []
    with pytest.raises(CorruptShardError, match=r"DALI backend, batch \d+: .*sample \d+.*cannot decode"):
        for b in ld:
            got.append(b["label"])
    assert len(got) >= 1  # the batches before the bad one arrived
    # a read error (a broken record) surfaces from the DALI source with its type, after the good batches
    for pos in range(len(blob) - 4):
        if blob[pos : pos + 4] == b"FDR1":
            blob[pos + 4] ^= 0x7F
    shard.write_bytes(bytes(blob))
    ld = fastdata.loader(root, 8, shuffle=False, device="cpu", backend="dali")
    got = []
    with pytest.raises(CorruptShardError, match=rf"DALI source, batch \d+: .*{shard.name}"):
        for b in ld:
            got.append(b)
    assert len(got) >= 1


# ---- augmentation: the spec's meaning and ranges ----------------------------------------------


def dali_images(path: Path, aug, batch: int = 64, **kw) -> torch.Tensor:
    ld = fastdata.loader(path, batch, shuffle=False, device="cpu", backend="dali", augment=aug, **kw)
    return torch.cat([b["image"] for b in ld])


def test_deterministic_ops_equal_torch_backend(raw):
    # ops without randomness (or p=1) must give the torch backend's pixels; a Normalize that is
    # not last is a separate colour transform, a final one is fused into crop_mirror_normalize
    for aug in ([HorizontalFlip(1.0), VerticalFlip(1.0), CenterCrop((6, 9)),
                 Normalize((0.4, 0.5, 0.6), (0.2, 0.3, 0.5))],
                [Normalize((0.5,) * 3, (0.25,) * 3), HorizontalFlip(1.0), CenterCrop(5)],
                [ColorJitter(brightness=0.0), Normalize((0.1, 0.2, 0.3), (1.0, 2.0, 4.0))]):
        t, d = both(raw, 8, shuffle=False, augment=aug)
        for a, b in zip(t, d):
            assert a["image"].shape == b["image"].shape
            assert torch.allclose(a["image"], b["image"], atol=1e-5), aug


def test_flip_rate(big_ramps):
    x = dali_images(big_ramps, [HorizontalFlip(0.3), VerticalFlip(1.0)])
    flipped = x[:, 0, 0, 0] > x[:, 0, 0, -1]  # red is the column: a flipped image decreases
    assert abs(flipped.float().mean().item() - 0.3) < 0.06  # 3 sigma for 512 samples
    assert (x[:, 1, 0, 0] == 1.0).all()  # green is the row: every image is upside down
    plain = dali_images(big_ramps, [])
    assert torch.equal(x[flipped], plain[flipped].flip(-1).flip(-2))


def test_random_resized_crop_area_and_ratio_like_torch(big_ramps):
    op = RandomResizedCrop(16, scale=(0.2, 0.6), ratio=(0.5, 2.0))
    boxes = {}
    for backend in ("dali", "torch"):
        ld = fastdata.loader(big_ramps, 64, shuffle=False, device="cpu", backend=backend, augment=[op])
        y = torch.cat([b["image"] for b in ld])
        assert y.shape == (512, 3, 16, 16) and y.min() >= 0 and y.max() <= 1 + 1e-5
        fw = (y[:, 0].amax((1, 2)) - y[:, 0].amin((1, 2)))
        fh = (y[:, 1].amax((1, 2)) - y[:, 1].amin((1, 2)))
        boxes[backend] = (fw * fh, fw / fh)
    area, ratio = boxes["dali"]
    assert area.min() > 0.2 * 0.8 and area.max() < 0.6 * 1.05
    assert ratio.min() > 0.5 * 0.8 and ratio.max() < 2.0 * 1.2
    for a, b in zip(boxes["dali"], boxes["torch"]):  # the same distribution as the torch op
        assert abs(a.mean().item() - b.mean().item()) < 0.03 and abs(a.std().item() - b.std().item()) < 0.03


def test_resized_crop_resamples_like_torch(tmp_path):
    # scale=ratio=1 on square images: the whole image, no randomness left, so the pixels must match
    # the torch op's bilinear grid_sample (pixel centres, no antialiasing), down- and upscaling
    np.save(tmp_path / "noise.npy", np.random.default_rng(0).integers(0, 256, (6, 20, 20, 3), dtype=np.uint8))
    fastdata.convert(None, tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1)), arrays={"image": tmp_path / "noise.npy"})
    for size in (8, 28):
        aug = [RandomResizedCrop(size, scale=(1.0, 1.0), ratio=(1.0, 1.0))]
        t, d = both(tmp_path / "ds", 6, shuffle=False, augment=aug)
        a, b = next(iter(t))["image"], next(iter(d))["image"]
        assert a.shape == b.shape == (6, 3, size, size) and torch.allclose(a, b, atol=1e-4)


def test_random_crop_windows_are_in_bounds_and_exact(big_ramps):
    y = dali_images(big_ramps, [RandomCrop((8, 12))])
    plain = dali_images(big_ramps, [])
    step = 1 / 31
    left = torch.round(y[:, 0, 0, 0] / step).long()
    top = torch.round(y[:, 1, 0, 0] / step).long()
    assert left.min() == 0 and left.max() == 32 - 12 and top.min() == 0 and top.max() == 32 - 8
    for i in range(0, 512, 37):
        t, l = int(top[i]), int(left[i])
        assert torch.equal(y[i], plain[i, :, t : t + 8, l : l + 12])
    with pytest.raises(UsageError, match=r"RandomCrop\(40, 40\) is larger"):
        dali_images(big_ramps, [RandomCrop(40)])


def test_color_jitter_ranges(raw):
    x = dali_images(raw, [])
    b = dali_images(raw, [ColorJitter(brightness=0.4)], batch=8)
    per_sample = (b[:, 0, :, 1:10] / x[:, 0, :, 1:10]).flatten(1)  # red in (0, 0.6]: never clamped
    assert torch.allclose(per_sample.min(1).values, per_sample.max(1).values, atol=1e-3)  # one factor per image
    assert per_sample.min() >= 0.6 - 1e-3 and per_sample.max() <= 1.4 + 1e-3 and per_sample[:, 0].std() > 0.15
    c = dali_images(raw, [ColorJitter(contrast=0.5)], batch=8)
    luma = 0.299 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]
    m = luma.mean((1, 2))[:, None, None, None]
    inside = (c > 0.01) & (c < 0.99) & ((x - m).abs() > 0.05)
    fc = ((c - m) / (x - m))[inside]
    assert fc.min() >= 0.5 - 1e-3 and fc.max() <= 1.5 + 1e-3
    s = dali_images(raw, [ColorJitter(saturation=1.0)], batch=8)
    assert s.min() >= 0 and s.max() <= 1
    h = dali_images(raw, [ColorJitter(hue=0.5)], batch=8)
    hl = 0.299 * h[:, 0] + 0.587 * h[:, 1] + 0.114 * h[:, 2]
    unclamped = (h > 0).all(1) & (h < 1).all(1)
    assert torch.allclose(hl[unclamped], luma[unclamped], atol=1e-4)  # a hue rotation keeps luma
    assert not torch.allclose(h, x)


def test_jitter_parameters_mean_what_the_torch_op_means():
    # The host-drawn matrices must transform pixels exactly as the torch op does with the same factors
    # (brightness, saturation around luma, hue rotation of the YIQ plane in turns, same direction).
    from fastdata.augment.image_ops import _gray
    from fastdata.loaders.dali_augment import _Jitter

    b, op = 6, ColorJitter(0.4, 0.3, 0.5, 0.2)
    brightness, contrast, saturation, hue = _Jitter(op).draw(torch.Generator().manual_seed(1), np.zeros((b, 2)))
    p = op.draw(torch.Generator().manual_seed(1), torch.zeros(b, 2))  # the torch op's factors, replayed
    fb, fc, fs, angle = p["brightness"], p["contrast"], p["saturation"], p["hue"]
    assert fb.min() >= 0.6 and fb.max() <= 1.4 and angle.abs().max() <= 0.2 * 2 * np.pi
    x = torch.rand(b, 3, 5, 5)

    def apply(m: np.ndarray) -> torch.Tensor:
        return torch.einsum("bij,bjhw->bihw", torch.from_numpy(m), x)

    view = (b, 1, 1, 1)
    assert torch.allclose(apply(brightness), x * fb.view(view), atol=1e-6)
    assert np.allclose(contrast, fc.numpy())
    g = _gray(x)
    assert torch.allclose(apply(saturation), (x - g) * fs.view(view) + g, atol=1e-6)
    assert torch.allclose(apply(hue).clamp(0, 1), ColorJitter(hue=0.2).image(x, {"hue": angle}, None), atol=1e-5)


def test_noise_and_normalize(big_ramps):
    x = dali_images(big_ramps, [])
    n = dali_images(big_ramps, [GaussianNoise(0.1)])
    e = n - x
    assert abs(e.std().item() - 0.1) < 0.005 and abs(e.mean().item()) < 0.005
    assert n.min() < 0  # no clamping, as the torch op
    z = dali_images(big_ramps, [Normalize((0.5, 0.25, 0.0), (0.25, 0.5, 1.0))])
    ref = (x - torch.tensor([0.5, 0.25, 0.0]).view(1, 3, 1, 1)) / torch.tensor([0.25, 0.5, 1.0]).view(1, 3, 1, 1)
    assert torch.allclose(z, ref, atol=1e-5)


def test_a_chain_that_starts_with_color_jitter_on_jpegs_runs_as_on_the_torch_backend(jpegs):
    # A colour op first on encoded images (nothing to decode as a window) used to fail inside DALI's graph
    # with AttributeError: '_Jitter' object has no attribute 'region'.
    aug = [ColorJitter(0.3, 0.3, 0.3, 0.1), HorizontalFlip()]
    assert_same_batches(*both(jpegs, 8, seed=1, augment=aug), image_tol=(1.0, 16.0))


def test_augmentation_is_a_function_of_seed_epoch_and_batch(jpegs):
    aug = [RandomResizedCrop(12), HorizontalFlip(), ColorJitter(0.3, 0.3, 0.3, 0.1)]
    a = [b["image"] for b in fastdata.loader(jpegs, 8, seed=2, device="cpu", backend="dali", augment=aug)]
    b = [b["image"] for b in fastdata.loader(jpegs, 8, seed=2, device="cpu", backend="dali", augment=aug,
                                             num_workers=1, config=LoaderConfig(prefetch=1))]
    assert all(torch.equal(x, y) for x, y in zip(a, b))  # threads and prefetch depth change nothing
    ld = fastdata.loader(jpegs, 8, seed=2, device="cpu", backend="dali", augment=aug)
    ld.set_epoch(1)
    c = [b["image"] for b in ld]
    assert not torch.equal(a[0], c[0])


def test_unmappable_or_misapplied_augmentation_is_a_clear_error(raw, tmp_path):
    class Posterize:
        def apply(self, x, g):
            return x

    with pytest.raises(UsageError, match="cannot map the augmentation op .*Posterize"):
        fastdata.loader(raw, 4, device="cpu", backend="dali", augment=[Posterize()])
    with pytest.raises(UsageError, match="image fields only"):
        fastdata.loader(raw, 4, device="cpu", backend="dali",
                        augment=fastdata.augment.Augment((HorizontalFlip(),), ("x",)))
    with pytest.raises(UsageError, match="2 means"):
        fastdata.loader(raw, 4, device="cpu", backend="dali", augment=[Normalize((0.5, 0.5), (1.0, 1.0))])
    grey = tmp_path / "grey.npy"
    np.save(grey, np.zeros((4, 8, 8, 1), np.uint8))
    fastdata.convert(None, tmp_path / "g", fastdata.ConvertConfig(write=WriteOptions(workers=1)), arrays={"image": grey})
    with pytest.raises(UsageError, match="ColorJitter needs RGB"):
        fastdata.loader(tmp_path / "g", 4, device="cpu", backend="dali", augment=[ColorJitter(0.1)])
    ok = fastdata.loader(tmp_path / "g", 4, device="cpu", backend="dali",
                         augment=[HorizontalFlip(), Normalize((0.5,), (0.5,))])
    assert next(iter(ok))["image"].shape == (4, 1, 8, 8)


# ---- availability, auto, arguments -----------------------------------------------------------


def test_missing_dali_is_a_clear_error_with_the_pip_command(raw, monkeypatch, caplog):
    for name in [m for m in sys.modules if m == "nvidia.dali" or m.startswith("nvidia.dali.")]:
        monkeypatch.setitem(sys.modules, name, None)  # `import nvidia.dali` now raises ImportError
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    with pytest.raises(BackendUnavailableError, match=r'pip install "fastdata\[dali\]"') as e:
        fastdata.loader(raw, 4, device="cpu", backend="dali")
    assert isinstance(e.value, UsageError)
    from fastdata.loaders import _pick_backend

    with caplog.at_level(logging.DEBUG, logger="fastdata.loader"):
        assert _pick_backend(torch.device("cuda")) == "torch"  # no DALI: torch, and it says why
    assert "backend='auto': torch" in caplog.text and "fastdata[dali]" in caplog.text


def test_auto_backend(raw, caplog):
    with caplog.at_level(logging.DEBUG, logger="fastdata.loader"):
        ld = fastdata.loader(raw, 4, device="cpu", backend="auto")
    assert ld.backend == "torch" and "backend='auto': torch (device cpu" in caplog.text
    if torch.cuda.is_available() and fdali.dali_problem(torch.device("cuda")) is None:
        assert fastdata.loader(raw, 4, device="cuda", backend="auto").backend == "torch"  # nothing to decode


def test_auto_backend_picks_dali_for_encoded_images_it_can_serve(raw, jpegs, monkeypatch, caplog):
    from fastdata.loaders import _pick_backend

    class Mine:  # an augmentation op DALI cannot express
        def apply(self, x, g):
            return x

    monkeypatch.setattr(fdali, "dali_problem", lambda device: None)  # as if CUDA and DALI were both here
    cuda = torch.device("cuda")
    with caplog.at_level(logging.DEBUG, logger="fastdata.loader"):
        assert _pick_backend(cuda, fastdata.open(jpegs), None) == "dali"
        assert _pick_backend(cuda, fastdata.open(raw), None) == "torch"
        assert "no encoded images" in caplog.text
        assert _pick_backend(cuda, fastdata.open(jpegs), Augment((Mine(),))) == "torch"
        assert "cannot map the augmentation op" in caplog.text


def test_cuda_version_mismatch_reports_both_versions(monkeypatch):
    assert fdali.cuda_mismatch(13492, "13.0") is None and fdali.cuda_mismatch(12893, "12.8") is None
    assert fdali.cuda_mismatch(9200, "9.2") is None
    msg = fdali.cuda_mismatch(13492, "12.8")
    assert "CUDA 13" in msg and "CUDA 12.8" in msg and "nvidia-dali-cuda120" in msg
    assert "CPU-only" in fdali.cuda_mismatch(13492, None)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    version = fdali.import_dali().dali.__cuda_version__
    with pytest.raises(BackendUnavailableError, match=r"CUDA 13 .*CUDA 12\.4") if fdali.cuda_mismatch(
            version, "13.0") is None else pytest.raises(BackendUnavailableError):
        fdali.import_dali(torch.device("cuda:0"))
    fdali.import_dali(torch.device("cpu"))  # CPU mode needs no matching CUDA


def test_bad_arguments(raw):
    with pytest.raises(UsageError, match="backend must be"):
        fastdata.loader(raw, 4, backend="jax")
    with pytest.raises(UsageError):
        fastdata.loader(raw, 4, device="cpu", backend="dali", num_workers=-1)
    with pytest.raises(UsageError):
        fastdata.loader(raw, 0, device="cpu", backend="dali")
    with pytest.raises(UsageError, match="not a uint8 HWC image field"):
        fastdata.loader(raw, 4, device="cpu", backend="dali", config=LoaderConfig(images=("x",)))
    assert len(list(fastdata.loader(raw, 64, drop_last=True, device="cpu", backend="dali"))) == 0


# ---- GPU (skipped without CUDA) --------------------------------------------------------------


@CUDA
def test_gpu_mixed_decode_and_augmentation(jpegs):
    # nvJPEG's IDCT and chroma upsampling differ from libjpeg-turbo's by a few levels: a mean of
    # 2.01 levels on an H200 with DALI 2.4.0 (2026-11-26), over a bound of 2 set before any GPU run
    cpu = list(fastdata.loader(jpegs, 8, seed=1, device="cpu", backend="dali"))
    gpu = list(fastdata.loader(jpegs, 8, seed=1, device="cuda", backend="dali"))
    assert len(cpu) == len(gpu)
    for a, b in zip(cpu, gpu):
        assert all(v.is_cuda for v in b.values())
        assert torch.equal(a["label"], b["label"].cpu())
        diff = (a["image"] - b["image"].cpu()).abs() * 255
        assert diff.mean() < 3 and diff.max() < 40
    aug = [RandomResizedCrop(16), HorizontalFlip(), ColorJitter(0.3, 0.3, 0.3, 0.1), GaussianNoise(0.02),
           Normalize((0.5,) * 3, (0.25,) * 3)]
    b = next(iter(fastdata.loader(jpegs, 8, device="cuda", backend="dali", augment=aug)))
    assert b["image"].is_cuda and b["image"].shape == (8, 3, 16, 16)
    assert b["image"].is_contiguous(memory_format=torch.channels_last)


def test_image_shape_after_augmentation_matches_the_torch_backend(jpegs):
    """<image>_shape describes the images each backend delivers: crop sizes after a crop, grown by Pad."""
    from fastdata.augment import Pad

    for aug in ([RandomResizedCrop((16, 12))], [HorizontalFlip(), Pad(top=1, left=2)]):
        t, d = (next(iter(ld)) for ld in both(jpegs, 8, shuffle=False, augment=aug))
        assert d["image"].shape == t["image"].shape
        assert d["image_shape"].tolist() == t["image_shape"].tolist()
    assert t["image_shape"][:, :2].tolist() == [[25, 34] if i % 4 else [31, 34] for i in range(8)]
