"""Crop decoding (fastdata/loaders/host.py): the reader decodes only the first crop's
window, with the parameters the device stage draws; the result matches decoding first, then cropping."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.loaders import host
from fastdata.augment import (
    CenterCrop,
    ColorJitter,
    HorizontalFlip,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    VerticalFlip,
)
from fastdata.converters import ConvertConfig, ImageOptions
from fastdata.errors import CorruptShardError
from fastdata.loaders import LoaderConfig
from fastdata.augment.targets import Boxes, Keypoints

SIZES = [(120, 90), (64, 200), (150, 150), (90, 70), (200, 130), (100, 100)]


def photo(h: int, w: int, seed: int) -> np.ndarray:
    """Smooth gradients, edges and noise: texture JPEG keeps, so a wrong window shows."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    a = np.stack([127 + 100 * np.sin(x / (7 + seed)), 127 + 100 * np.cos(y / 11), (x + y) % 200], -1)
    a[(x // 23 + y // 17) % 3 == 0] += 40
    a += rng.normal(0, 6, a.shape)
    return np.clip(a, 0, 255).astype(np.uint8)


def _dataset(tmp_path: Path, mode: str = "encoded", sizes=SIZES) -> Path:
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for i, (h, w) in enumerate(sizes):
        Image.fromarray(photo(h, w, i)).save(src / f"{i}.jpg", quality=92)
    fastdata.convert(tmp_path / "src", tmp_path / "ds", ConvertConfig(images=ImageOptions(images=mode)))
    return tmp_path / "ds"


def _batches(root: Path, aug, crop: str, **kw) -> list[dict[str, torch.Tensor]]:
    cfg = LoaderConfig(crop_decode=crop)  # type: ignore[arg-type]
    ld = fastdata.loader(root, 3, device="cpu", augment=aug, config=cfg, seed=5, **kw)
    return [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in ld]


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a - b) ** 2).mean())
    return 99.0 if mse == 0 else 10 * np.log10(1 / mse)


@pytest.mark.parametrize("op", [RandomResizedCrop(48), RandomCrop(60), CenterCrop((50, 40)), Resize((40, 56))])
def test_crop_decoding_matches_decoding_first(tmp_path, op):
    """Same draws as the padded path: exact windows are equal to float rounding, resampled ones close."""
    root = _dataset(tmp_path)
    aug = [op, HorizontalFlip(), VerticalFlip(), ColorJitter(brightness=0.2)]
    ref, fast = _batches(root, aug, "off"), _batches(root, aug, "auto")
    assert len(ref) == len(fast) == 2
    for r, f in zip(ref, fast):
        assert r["image"].shape == f["image"].shape and r["image_shape"].tolist() == f["image_shape"].tolist()
        if isinstance(op, (RandomCrop, CenterCrop)):  # no resampling: the same pixels
            assert torch.allclose(r["image"], f["image"], atol=1e-5)
        else:
            assert _psnr(r["image"], f["image"]) > 30


def test_full_scale_windows_are_exact_and_the_scaled_ones_are_close(tmp_path, monkeypatch):
    """A window near the output's size decodes at full scale (without the fast IDCT: the same pixels as
    cropping a full decode, to float rounding; with it, close); a large window decodes at a DCT scale."""
    a = photo(240, 320, 3)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    full = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    spec = fastdata.format.ImageSpec(mode="RGB")
    jpeg = fastdata.format.spec.CODEC_JPEG
    exact, ref, fast = (np.empty((50, 60, 3), np.float32) for _ in range(3))
    box = (10.3, 20.7, 61.0, 49.5)
    host.resample_into(full, box, (240, 320), ref)
    assert host.decode_crop(data, jpeg, spec, (240, 320), box, fast) == "full"
    assert 40 < _psnr(torch.from_numpy(fast), torch.from_numpy(ref)) < 99  # the fast IDCT: close, not the same
    monkeypatch.setattr(host, "FAST", {})
    assert host.decode_crop(data, jpeg, spec, (240, 320), box, exact) == "full"
    assert np.abs(exact - ref).max() < 1e-5
    small = np.empty((50, 60, 3), np.float32)
    big = (0.0, 0.0, 320.0, 240.0)
    assert host.decode_crop(data, jpeg, spec, (240, 320), big, small) == "scaled"
    host.resample_into(full, big, (240, 320), ref)
    assert 10 * np.log10(1 / float(((small - ref) ** 2).mean())) > 25
    assert host.dct_scale(320, 240, 60, 50) == 4 and host.dct_scale(61, 49.5, 60, 50) == 1
    assert host.dct_scale(100, 80, 60, 50) == 1
    monkeypatch.setattr(host, "REACH", 0.75)  # windows down to 3/4 of the output at 1/2: the bench's A/B
    assert host.dct_scale(100, 80, 60, 50) == 2


def test_mixed_size_raw_pixels_are_cropped_per_image(tmp_path):
    root = _dataset(tmp_path, "raw")
    aug = [RandomResizedCrop(32), HorizontalFlip()]
    for r, f in zip(_batches(root, aug, "off"), _batches(root, aug, "auto")):
        assert torch.allclose(r["image"], f["image"], atol=1e-4)


def test_same_draws_resume_and_ranks(tmp_path):
    """Exact resume mid-epoch, and each rank's share drawn as on the padded path (rank 1 of 2)."""
    from fastdata.world import World

    root = _dataset(tmp_path)
    aug = [RandomResizedCrop(40), HorizontalFlip()]
    ld = fastdata.loader(root, 2, device="cpu", augment=aug, config=LoaderConfig(), seed=1)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    rest = [b["image"].clone() for b in it]
    again = fastdata.loader(root, 2, device="cpu", augment=aug, config=LoaderConfig(), seed=1)
    again.load_state_dict(state)
    resumed = [b["image"].clone() for b in again]
    assert len(rest) == len(resumed) == 2 and all(torch.equal(a, b) for a, b in zip(rest, resumed))
    shares = {}
    for crop in ("off", "auto"):
        ld = fastdata.loader(root, 2, device="cpu", augment=aug, config=LoaderConfig(crop_decode=crop), seed=1)
        ld._fixed_world = World(rank=1, size=2)  # as a torch.distributed rank would see it
        shares[crop] = [b["image"].clone() for b in ld]
    assert all(_psnr(a, b) > 30 for a, b in zip(shares["off"], shares["auto"]))  # another rank's windows: 9-10 dB
    assert not torch.equal(shares["auto"][0], resumed[0])


def test_keypoints_and_boxes_follow_the_reader_crop():
    """With the first op done by the reader (``done=1``), the op is drawn again from the stored sizes:
    targets and the image size come out as when the op runs on the padded batch."""
    hw = torch.tensor([[120.0, 90.0], [64.0, 200.0]])
    kp = torch.rand(2, 3, 2) * 60
    batch = {"image": torch.zeros(2, 3, 32, 32), "image_shape": torch.tensor([[120, 90, 3], [64, 200, 3]]),
             "kp": kp, "bx": torch.tensor([[[5.0, 5.0, 40.0, 30.0]]] * 2)}
    aug = fastdata.augment.Augment((RandomResizedCrop(32), HorizontalFlip()),
                                   targets={"kp": Keypoints(), "bx": Boxes()})
    done = aug.run(dict(batch), torch.Generator().manual_seed(3), "image", hw=hw, done=1)
    full = aug.run({**batch, "image": torch.zeros(2, 3, 120, 200)}, torch.Generator().manual_seed(3), "image",
                   sizes=hw.long())
    assert torch.allclose(done["kp"], full["kp"]) and torch.allclose(done["bx"], full["bx"])
    assert done["image_shape"].tolist() == full["image_shape"].tolist() == [[32, 32, 3]] * 2
    assert not torch.allclose(done["kp"], kp)


def test_bad_jpeg_names_the_sample(tmp_path):
    """A JPEG cut short inside the window: the error names the sample and field, not a decoder's trace."""
    from fastdata.loaders.host import CropStage

    root = _dataset(tmp_path)
    ds = fastdata.open(root, decode=False)
    raw = ds.get_batch(np.arange(len(ds)))
    field = next(f for f in ds.schema if f.name == "image")
    stage = CropStage(field, (RandomResizedCrop(48, scale=(1.0, 1.0), ratio=(1.0, 1.0)),), 0, False)
    bad = {**raw, "image": raw["image"].copy(), "image_lengths": raw["image_lengths"].copy()}
    bad["image_lengths"][1] = 320
    with pytest.raises(CorruptShardError, match="sample 7: field 'image'"):
        stage(bad, 0, 0, 0, lambda j: f"{root}: sample {j + 6}")


def test_crop_decoding_is_off_where_it_cannot_apply(tmp_path):
    from fastdata.loaders.host import crop_field

    root = _dataset(tmp_path)
    ds = fastdata.open(root)
    aug = fastdata.augment.Augment((RandomResizedCrop(8),))
    cfg = LoaderConfig()
    assert crop_field(ds, aug, ("image",), cfg, True) == "image"
    assert crop_field(ds, aug, ("image",), LoaderConfig(crop_decode="off"), True) is None
    assert crop_field(ds, aug, ("image",), cfg, False) is None  # worker processes
    assert crop_field(ds, fastdata.augment.Augment((HorizontalFlip(), RandomResizedCrop(8))), ("image",), cfg, True) is None
    assert crop_field(ds, fastdata.augment.Augment((RandomResizedCrop(8),), views=2), ("image",), cfg, True) is None
    with pytest.raises(fastdata.errors.UsageError, match="crop_decode"):
        LoaderConfig(crop_decode="yes")  # type: ignore[arg-type]
    with pytest.raises(fastdata.errors.UsageError, match="crop_decode='region' was removed.*use crop_decode='auto'"):
        LoaderConfig(crop_decode="region")  # type: ignore[arg-type]


def _resampled(src, box, hw, out_hw, flip=(False, False), exact=False):
    out = np.empty((*out_hw, src.shape[2]), np.float32)
    host.resample_into(src, box, hw, out, flip=flip, exact=exact)
    return out


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_uint8_resize_samples_where_the_exact_path_does(mode):
    """torch's uint8 resize (shifted by whole steps, stretched a little to line its grid up with the window's)
    gives the exact float interpolation's images to 8-bit rounding: downscaled, upscaled, at the image's
    edges, mirrored and on a DCT-scaled image."""
    rng = np.random.default_rng(0)
    a = photo(300, 400, 1)
    a = a if mode == "RGB" else a[..., :1].copy()
    boxes = [(10.3, 20.7, 300.2, 250.9), (0.0, 0.0, 400.0, 300.0), (371.5, 280.25, 28.5, 19.75), (0.2, 0.4, 61.0, 49.5),
             *[(x, y, w, h) for x, y, w, h in rng.uniform([0, 0, 20, 20], [200, 150, 200, 150], (12, 4))]]
    psnrs = []
    for i, box in enumerate(boxes):
        flip = (bool(i % 2), bool(i % 3 == 0))
        for size in ((50, 60), (224, 224)):
            exact = _resampled(a, box, (300, 400), size, flip, exact=True)
            fast = _resampled(a, box, (300, 400), size, flip)
            psnrs.append(_psnr(torch.from_numpy(fast), torch.from_numpy(exact)))
            assert np.abs(fast - exact).mean() < 1.5 / 255
    assert min(psnrs) > 45 and np.mean(psnrs) > 50
    half = a[::2, ::2].copy()  # as decoded at 1/2 scale: the same window mapped onto it
    box = (50.5, 30.25, 300.0, 250.0)
    exact, fast = (_resampled(half, box, (300, 400), (64, 64), exact=e) for e in (True, False))
    assert _psnr(torch.from_numpy(fast), torch.from_numpy(exact)) > 45


def test_resize_grid_lines_up_or_leaves_it_to_the_exact_path():
    """Every grid the uint8 resize uses samples within the tolerance of the window's, its first kept output
    at or past its input's first pixel; a grid it cannot line up (a half-pixel phase at a whole-pixel
    step) leaves the window to the exact path, which gives the exact values."""
    rng = np.random.default_rng(1)
    for c, s in rng.uniform([-0.5, 0.3], [300, 3.0], (300, 2)):
        got = host._grid(float(c), float(s), 224)
        if got is None:
            continue
        a, k, t = got
        j = np.arange(224)
        assert np.abs(a + (k + j + 0.5) * t - 0.5 - (c + j * s)).max() <= host._TOLERANCE + 1e-9
        assert a + (k + 0.5) * t - 0.5 >= a - 1e-9
    assert host._grid(10.5, 1.0, 224) is None
    a = photo(100, 120, 2)
    shifted = (10.5, 10.5, 60.0, 60.0)  # s = 1, phase 0.5 on both axes: cannot line up
    assert host._grid(*host._line(10.5, 60.0, 60, 1.0), 60) is None
    assert np.array_equal(_resampled(a, shifted, (100, 120), (60, 60)),
                          _resampled(a, shifted, (100, 120), (60, 60), exact=True))
    box = (10.0, 10.0, 30.0, 30.0)  # an exact window: the pixels themselves
    assert np.array_equal(_resampled(a, box, (100, 120), (30, 30)), a[10:40, 10:40] * np.float32(1 / 255))
