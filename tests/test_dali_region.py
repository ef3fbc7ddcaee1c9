"""Region decoding on the DALI backend (fastdata/loaders/dali_augment.py): the drawn crop window is decoded
alone (``fn.decoders.image_slice``), with the torch backend's draws, and gives the same images."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

pytest.importorskip("nvidia.dali")

from test_decode_crop import SIZES, photo  # noqa: E402

import fastdata  # noqa: E402
from fastdata.augment import CenterCrop, HorizontalFlip, RandomCrop, RandomResizedCrop  # noqa: E402
from fastdata.converters import ConvertConfig, ImageOptions  # noqa: E402
from fastdata.loaders import LoaderConfig  # noqa: E402
from fastdata.loaders.dali_augment import compile_chain  # noqa: E402


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("dali-region")
    (tmp / "src" / "c").mkdir(parents=True)
    for i, (h, w) in enumerate(SIZES * 2):
        Image.fromarray(photo(h, w, i)).save(tmp / "src" / "c" / f"{i:02d}.jpg", quality=92)
    fastdata.convert(tmp / "src", tmp / "ds", ConvertConfig(images=ImageOptions(images="encoded")))
    return tmp / "ds"


def _images(root: Path, backend: str, aug, crop: str = "off") -> list[torch.Tensor]:
    ld = fastdata.loader(root, 4, device="cpu", backend=backend, augment=aug, seed=3,  # type: ignore[arg-type]
                         config=LoaderConfig(crop_decode=crop))  # type: ignore[arg-type]
    return [b["image"].clone() for b in ld]


@pytest.mark.parametrize("op", [RandomResizedCrop(40), RandomCrop(50), CenterCrop((44, 60))])
def test_region_decoding_gives_the_torch_backends_images(mixed, op):
    """Same draws on both backends: DALI's region decode + resize equals the torch backend's full decode
    + crop (to a few 8-bit levels: another libjpeg-turbo build), and DALI's own full decode."""
    aug = [op, HorizontalFlip()]
    torch_full = _images(mixed, "torch", aug)
    dali_region, dali_full = _images(mixed, "dali", aug, "auto"), _images(mixed, "dali", aug, "off")
    assert len(torch_full) == len(dali_region) == 3
    for a, b, c in zip(torch_full, dali_region, dali_full):
        assert a.shape == b.shape
        diff = (a - b).abs() * 255
        assert diff.mean() < 1.0 and diff.max() <= 16
        assert torch.allclose(b, c, atol=2e-4)  # region vs whole image: the same bilinear taps


def test_only_crops_of_one_view_decode_regions():
    assert compile_chain([RandomResizedCrop(8), HorizontalFlip()], 3, region=True).region
    assert compile_chain([CenterCrop(8)], 3, region=True).region
    assert not compile_chain([HorizontalFlip(), RandomResizedCrop(8)], 3, region=True).region
    assert not compile_chain([RandomResizedCrop(8)], 3).region
