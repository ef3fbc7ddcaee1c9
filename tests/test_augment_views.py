"""Views, sequence and array ops, MixUp and CutMix: on both backends, resumable, padding untouched."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import fastdata
from fastdata import WriteOptions
from fastdata.augment import Augment, HorizontalFlip, RandomCrop, RandomResizedCrop, batch_generator
from fastdata.errors import UsageError
from fastdata.loaders import LoaderConfig
from fastdata.augment.mixing import Mix, MixDraw, mix_boxes
from fastdata.augment.sequence import (
    AdditiveNoise,
    AmplitudeScale,
    ChannelMask,
    TimeCrop,
    TimeMask,
    TimeShift,
    TimeStretch,
    pack_to_padded,
    padded_to_pack,
    run_padded,
)
from fastdata.augment.targets import Boxes, Keypoints, Mask
from fastdata.augment.pipeline import augment_batch

CPU = torch.device("cpu")
N = 21
try:
    import nvidia.dali  # noqa: F401
    BACKENDS = ["torch", "dali"]
except ImportError:
    BACKENDS = ["torch"]


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> Path:
    """N raw 12x16 RGB images (sample i has blue = i), labels i % 5, keypoints (2 points) and a ragged
    (t, 3) float sequence per sample."""
    tmp = tmp_path_factory.mktemp("views")
    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (N, 12, 16, 3), dtype=np.uint8)
    img[..., 2] = np.arange(N)[:, None, None]
    np.save(tmp / "image.npy", img)
    np.save(tmp / "y.npy", np.arange(N) % 5)
    np.save(tmp / "kp.npy", rng.uniform(0, 11, (N, 2, 2)).astype(np.float32))
    (tmp / "seq").mkdir()
    for i in range(N):
        np.save(tmp / "seq" / f"{i:03d}.npy", rng.standard_normal((5 + i % 7, 3)).astype(np.float32))
    fastdata.convert(None, tmp / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1, shard_size=3000)), labels=tmp / "y.npy", arrays={"image": tmp / "image.npy", "kp": tmp / "kp.npy"})
    fastdata.convert(tmp / "seq", tmp / "seqs", fastdata.ConvertConfig(write=WriteOptions(workers=1)))
    return tmp


def first(path: Path, aug: Augment, backend: str = "torch", **kw) -> dict[str, torch.Tensor]:
    with fastdata.loader(path, 6, device="cpu", augment=aug, backend=backend, seed=3, **kw) as ld:
        return next(iter(ld))


# ---- views ------------------------------------------------------------------------------------------


def test_views_differ_are_stacked_and_view0_is_the_single_view(ds):
    ops = (RandomResizedCrop(8, scale=(0.2, 1.0)), HorizontalFlip())
    two = first(ds / "ds", Augment(ops, views=2, fields=("image",), targets={"kp": Keypoints()}))
    one = first(ds / "ds", Augment(ops, fields=("image",), targets={"kp": Keypoints()}))
    assert two["image"].shape == (6, 2, 3, 8, 8) and two["kp"].shape == (6, 2, 2, 2)
    assert not torch.equal(two["image"][:, 0], two["image"][:, 1])  # each view has its own draw
    assert torch.equal(two["image"][:, 0], one["image"]) and torch.equal(two["kp"][:, 0], one["kp"])
    # a list of views of different sizes: one field per view, each with its own targets
    multi = first(ds / "ds", Augment(views=[ops, [RandomCrop(4)], [RandomCrop(4)]], targets={"kp": Keypoints()}))
    assert "image" not in multi and "kp" not in multi
    assert multi["image_view0"].shape == (6, 3, 8, 8) and multi["image_view2"].shape == (6, 3, 4, 4)
    assert torch.equal(multi["image_view0"], one["image"]) and multi["kp_view1"].shape == (6, 2, 2)
    assert not torch.equal(multi["image_view1"], multi["image_view2"])


def test_view0_of_encoded_images_is_the_single_view_without_crop_decode(tmp_path):
    """docs/augment.md said view 0 equals the single view; with encoded images the single view's crop is resampled
    while decoding (pixels off by up to 0.08 here), so the docs now say: equal with crop_decode="off"."""
    from PIL import Image
    rng = np.random.default_rng(1)
    for i in range(4):
        (tmp_path / "src" / "c").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (24, 30, 3), dtype=np.uint8)).save(tmp_path / "src" / "c" / f"{i}.png")
    fastdata.convert(tmp_path / "src", tmp_path / "png", fastdata.ConvertConfig(write=WriteOptions(workers=1)))
    ops = (RandomResizedCrop(16), HorizontalFlip())
    off = LoaderConfig(crop_decode="off")
    one = first(tmp_path / "png", Augment(ops), config=off)["image"]
    two = first(tmp_path / "png", Augment(ops, views=2))["image"]
    assert torch.equal(two[:, 0], one) and not torch.equal(two[:, 0], two[:, 1])
    assert torch.allclose(first(tmp_path / "png", Augment(ops))["image"], one, atol=0.25)  # resampled apart


@pytest.mark.parametrize("backend", BACKENDS)
def test_views_repeat_exactly_on_resume(ds, backend):
    aug = Augment((RandomCrop(8), HorizontalFlip()), views=3)
    kw = dict(device="cpu", augment=aug, backend=backend, seed=5)
    full = [b["image"] for b in fastdata.loader(ds / "ds", 6, **kw)]
    ld = fastdata.loader(ds / "ds", 6, **kw)
    ld.load_state_dict({**ld.state_dict(), "batches_done": 2})
    rest = [b["image"] for b in ld]
    assert len(rest) == len(full) - 2 and all(torch.equal(a, b) for a, b in zip(full[2:], rest))


@pytest.mark.skipif(len(BACKENDS) < 2, reason="NVIDIA DALI is not installed")
def test_both_backends_draw_the_same_views_mix_and_sequence_ops(ds):
    exact = Augment((RandomCrop(8), HorizontalFlip()), views=2, targets={"kp": Keypoints()}, fields=("image",))
    t, d = first(ds / "ds", exact), first(ds / "ds", exact, "dali")
    assert t.keys() == d.keys() and all(torch.equal(t[k], d[k]) for k in t)
    dino = Augment(views=[[RandomResizedCrop(10), HorizontalFlip()], [RandomResizedCrop(10)], [RandomResizedCrop(4)]])
    t, d = first(ds / "ds", dino), first(ds / "ds", dino, "dali")
    assert sorted(t) == sorted(d) == ["image_view0", "image_view1", "image_view2", "kp", "label"]
    for k in ("image_view0", "image_view1", "image_view2"):
        assert (t[k] - d[k]).abs().max() < 1e-4  # bilinear resampling rounding
    mix = Augment((RandomCrop(8),), mix=Mix(num_classes=5, label_smoothing=0.1))
    for seed in range(4):  # MixUp and CutMix both drawn
        t = next(iter(fastdata.loader(ds / "ds", 6, device="cpu", augment=mix, seed=seed)))
        d = next(iter(fastdata.loader(ds / "ds", 6, device="cpu", augment=mix, seed=seed, backend="dali")))
        assert torch.equal(t["image"], d["image"]) and torch.equal(t["label"], d["label"])
    seq = Augment((TimeMask(3), AmplitudeScale(), TimeShift(2), AdditiveNoise(0.1)))
    t, d = first(ds / "seqs", seq), first(ds / "seqs", seq, "dali")
    assert t.keys() == d.keys() and all(torch.equal(t[k], d[k]) for k in t)


def test_dali_views_need_one_size_per_view(ds):
    if len(BACKENDS) < 2:
        pytest.skip("NVIDIA DALI is not installed")
    with pytest.raises(UsageError, match="every view must end in one size"):
        fastdata.loader(ds / "ds", 6, device="cpu", backend="dali", augment=Augment((HorizontalFlip(),), views=2))


# ---- sequences and arrays ------------------------------------------------------------------------------


def padded(b: int = 8, t: int = 20, c: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A padded batch whose padding holds a marker value (never data), and its lengths (one empty sample)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, c, generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0], lengths[1] = 0, t
    pad = torch.arange(t).view(1, t) >= lengths.view(-1, 1)
    return x.masked_fill(pad.unsqueeze(-1), 1234.5), lengths


KEEP_LENGTH = [TimeShift(4), TimeShift(0.3, rollover=False, fill=-1.0), TimeMask(5, count=2), TimeMask(0.5),
               ChannelMask(3, count=2), AmplitudeScale(0.5, 2.0), AmplitudeScale(0.5, 2.0, log=True),
               AdditiveNoise(0.3), AdditiveNoise(0.3, relative=True)]


@pytest.mark.parametrize("op", KEEP_LENGTH, ids=lambda o: repr(o))
def test_sequence_ops_leave_every_padded_position_untouched(op):
    x, lengths = padded()
    y, n = run_padded((op,), x.clone(), lengths, batch_generator(1, 0, 0, CPU), "x", "sequence")
    assert torch.equal(n, lengths)
    pad = (torch.arange(x.shape[1]).view(1, -1) >= lengths.view(-1, 1)).unsqueeze(-1).expand_as(x)
    assert torch.equal(y[pad], x[pad])  # element by element
    assert not torch.equal(y[~pad], x[~pad])  # and the data did change
    assert (y[~pad] != 1234.5).all()  # no padding value moved into the data


@pytest.mark.parametrize("make", [
    lambda: TimeCrop(0), lambda: TimeCrop(-3), lambda: TimeCrop(2.5),  # empty batch; torch arange / index errors
    lambda: TimeShift(-1), lambda: TimeMask(-2),  # silently did nothing
    lambda: ChannelMask(2, count=-1),  # torch: negative dimension
    lambda: AmplitudeScale(0, 1, log=True), lambda: AmplitudeScale(2, 1),  # math domain error; low > high
    lambda: AdditiveNoise(float("nan")), lambda: AdditiveNoise(-0.1),  # every value NaN; a negative std
], ids=range(10))
def test_sequence_op_arguments_are_checked_when_made(make):
    with pytest.raises(UsageError, match=r"^\w+\(.*\): "):
        make()


def test_sequence_ops_do_what_they_say():
    x, lengths = padded()
    g = lambda: batch_generator(2, 0, 0, CPU)  # noqa: E731
    inside = (torch.arange(20).view(1, -1) < lengths.view(-1, 1))
    y, _ = run_padded((AmplitudeScale(0.5, 2.0),), x, lengths, g(), "x", "sequence")
    gain = y[2, 0, 0] / x[2, 0, 0]
    torch.testing.assert_close(y[2][inside[2]], x[2][inside[2]] * gain)
    y, _ = run_padded((TimeShift(4),), x, lengths, g(), "x", "sequence")
    for b in range(2, 8):  # a roll within each sample's own length
        k = int(lengths[b])
        assert any(torch.equal(y[b, :k], x[b, :k].roll(s, 0)) for s in range(-4, 5))
    y, _ = run_padded((TimeMask(5, count=1),), x, lengths, g(), "x", "sequence")
    zeroed = (y == 0).all(-1) & inside
    assert (zeroed.sum(1) <= 5).all() and zeroed.any()
    y, n = run_padded((TimeCrop(6),), x, lengths, g(), "x", "sequence")
    assert y.shape == (8, 6, 6) and torch.equal(n, lengths.clamp(max=6))
    for b in range(8):
        k = int(n[b])
        starts = [s for s in range(int(lengths[b]) - k + 1) if torch.equal(y[b, :k], x[b, s:s + k])]
        assert starts and (y[b, k:] == 0).all()
    y, n = run_padded((TimeStretch(2.0, 2.0),), x, lengths, g(), "x", "sequence")
    assert torch.equal(n[1:], torch.round(lengths[1:] / 2).long().clamp(min=1)) and n[0] == 0
    torch.testing.assert_close(y[1, :10], (x[1, 0:20:2] + x[1, 1:20:2]) / 2)  # halfway between steps
    assert (y[~(torch.arange(20).view(1, -1) < n.view(-1, 1))] == 0).all()
    y, n = run_padded((TimeStretch(1.0, 1.0),), x, lengths, g(), "x", "sequence")
    assert torch.equal(y[inside], x[inside]) and torch.equal(n, lengths)


def test_packed_sequences_give_what_padded_ones_give():
    x, lengths = padded()
    flat, offsets = padded_to_pack(x, lengths)
    ops = Augment((TimeMask(4), AdditiveNoise(0.2), TimeCrop(7)), fields={"x": "sequence"})
    a = augment_batch(ops, {"x": x.clone(), "x_lengths": lengths.clone()}, batch_generator(0, 0, 0, CPU))
    b = augment_batch(ops, {"x": flat.clone(), "x_offsets": offsets.clone()}, batch_generator(0, 0, 0, CPU))
    back, n = pack_to_padded(b["x"], b["x_offsets"])
    assert torch.equal(n, a["x_lengths"]) and torch.equal(back, a["x"][:, :back.shape[1]])


def test_sequence_fields_through_the_loader_padded_and_packed(ds):
    aug = Augment((TimeMask(2), AmplitudeScale(0.5, 0.6)))  # ragged fields are sequences (from the schema)
    plain = first(ds / "seqs", Augment(()))
    got = first(ds / "seqs", aug)
    pad = torch.arange(plain["x"].shape[1]).view(1, -1) >= plain["x_lengths"].view(-1, 1)
    assert torch.equal(got["x"][pad], plain["x"][pad]) and not torch.equal(got["x"], plain["x"])
    packed = first(ds / "seqs", aug, config=LoaderConfig(ragged="packed"))
    assert torch.equal(pack_to_padded(packed["x"], packed["x_offsets"])[0], got["x"])
    two = first(ds / "seqs", Augment((TimeCrop(4), TimeMask(2)), views=2))
    assert two["x"].shape == (6, 2, 4, 3) and two["x_lengths"].shape == (6, 2)


def test_a_field_kind_is_declared_or_from_the_schema_never_guessed(ds, tmp_path):
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((8, 10, 4)).astype(np.float32))
    fastdata.convert(None, tmp_path / "fixed", fastdata.ConvertConfig(write=WriteOptions(workers=1)), arrays={"x": tmp_path / "x.npy"})
    with pytest.raises(UsageError, match=r"an image \(H, W\) or a sequence \(T, C\)\? Declare it"):
        first(tmp_path / "fixed", Augment((HorizontalFlip(),)))
    chw = torch.arange(120.0).view(2, 3, 4, 5)  # float (C, H, W) samples and no image field: taken for an image
    out = augment_batch(Augment((HorizontalFlip(p=1.0),)), {"x": chw.clone(), "label": torch.arange(2)},
                        batch_generator(0, 0, 0, CPU))
    assert torch.equal(out["x"], chw.flip(-1)) and torch.equal(out["label"], torch.arange(2))
    with pytest.raises(UsageError, match=r"augment fields \['y'\] are not in the batch \(fields: \['label', 'x'\]\)"):
        augment_batch(Augment((HorizontalFlip(),), fields=("y",)), {"x": chw, "label": torch.arange(2)},
                      batch_generator(0, 0, 0, CPU))  # as the DALI backend says it (a UsageError, not a KeyError)
    with pytest.raises(UsageError, match="is axis 1 time"):
        first(tmp_path / "fixed", Augment((TimeMask(2),), fields=("x",)))
    as_seq = first(tmp_path / "fixed", Augment((TimeCrop(5),), fields={"x": "sequence"}))
    assert as_seq["x"].shape == (6, 5, 4)
    assert first(tmp_path / "fixed", Augment((AmplitudeScale(),), fields=("x",)))["x"].shape == (6, 10, 4)  # an array
    with pytest.raises(UsageError, match="needs a time axis"):
        first(tmp_path / "fixed", Augment((TimeMask(2),), fields={"x": "array"}))
    with pytest.raises(UsageError, match="is a sequence field and this Augment has image ops"):
        first(ds / "seqs", Augment((HorizontalFlip(),), fields=("x",)))
    with pytest.raises(UsageError, match="mixes image ops and sequence ops"):
        Augment((HorizontalFlip(), TimeMask(2)))
    with pytest.raises(UsageError, match="field kinds must be"):
        Augment((TimeMask(2),), fields={"x": "audio"})


# ---- MixUp and CutMix ---------------------------------------------------------------------------------


def constant_images(b: int = 8, h: int = 10, w: int = 14) -> torch.Tensor:
    """Image i is the value i everywhere: each output pixel says where it came from."""
    return torch.arange(b, dtype=torch.float32).view(b, 1, 1, 1).expand(b, 3, h, w).contiguous()


@pytest.mark.parametrize("seed", range(12))
def test_mix_labels_sum_to_one_and_match_the_pixel_areas(seed):
    mix = Mix(mixup_alpha=0.4, cutmix_alpha=1.0, switch_prob=0.5, label_smoothing=0.1, num_classes=8)
    aug = Augment((), fields=("image",), mix=mix)
    x = constant_images()
    batch = {"image": x.clone(), "label": torch.arange(8)}
    d = mix.draw(batch_generator(seed, 0, 0, CPU))
    out = augment_batch(aug, batch, batch_generator(seed, 0, 0, CPU))
    y, img = out["label"], out["image"]
    torch.testing.assert_close(y.sum(1), torch.ones(8))
    own = torch.tensor([y[i, i] for i in range(8)])
    partner = torch.tensor([y[i, (i - 1) % 8] for i in range(8)])
    off = 0.1 / 8
    if d.cutmix:
        kept = (img == torch.arange(8.0).view(8, 1, 1, 1)).float().mean((1, 2, 3))  # pixels still its own
        torch.testing.assert_close(own - off, kept * (1 - 0.1))
        torch.testing.assert_close(partner - off, (1 - kept) * (1 - 0.1))
        assert ((img == torch.arange(8.0).view(8, 1, 1, 1)) | (img == torch.arange(8.0).roll(1).view(8, 1, 1, 1))).all()
    else:
        torch.testing.assert_close(img, d.lam * x + (1 - d.lam) * x.roll(1, 0))
        torch.testing.assert_close(own - off, torch.full((8,), d.lam * 0.9))


def test_mix_draws_both_modes_and_soft_labels_and_prob():
    modes = {Mix(num_classes=3).draw(batch_generator(s, 0, 0, CPU)).cutmix for s in range(20)}
    assert modes == {True, False}
    mix = Mix(mixup_alpha=1.0, cutmix_alpha=0.0)
    soft = torch.softmax(torch.randn(4, 3), 1)
    out = augment_batch(Augment((), fields=("image",), mix=mix),
                        {"image": constant_images(4), "label": soft.clone()}, batch_generator(0, 0, 0, CPU))
    torch.testing.assert_close(out["label"].sum(1), torch.ones(4))
    never = Mix(num_classes=3, prob=0.0)
    out = augment_batch(Augment((), fields=("image",), mix=never),
                        {"image": constant_images(4), "label": torch.tensor([0, 1, 2, 0])}, batch_generator(0, 0, 0, CPU))
    assert torch.equal(out["image"], constant_images(4)) and torch.equal(out["label"], torch.eye(3)[[0, 1, 2, 0]])
    with pytest.raises(UsageError, match="num_classes"):
        augment_batch(Augment((), fields=("image",), mix=Mix()), {"image": constant_images(4), "label": torch.arange(4)},
                      batch_generator(0, 0, 0, CPU))


def test_cutmix_boxes_follow_the_documented_rules():
    d = MixDraw(True, True, 0.75, (0.0, 0.0, 0.5, 0.5))  # the top-left quarter of a 20x20 image is pasted
    boxes = torch.tensor([[[0.0, 0.0, 8.0, 8.0], [10.0, 10.0, 20.0, 20.0]],  # under the paste; untouched
                          [[2.0, 2.0, 14.0, 14.0], [0.0, 0.0, 0.0, 0.0]]])  # half under it; padding row
    batch = {"boxes": boxes, "boxes_lengths": torch.tensor([2, 1])}
    mix_boxes(batch, "boxes", Boxes(), d, (20, 20), min_visible=0.25)
    assert batch["boxes"].shape == (2, 4, 4) and "boxes_lengths" not in batch
    assert batch["boxes_valid"].tolist() == [[False, True, True, False], [True, False, True, False]]
    assert batch["boxes"][0, 2].tolist() == [2.0, 2.0, 10.0, 10.0]  # the partner's box, clipped to the paste
    assert batch["boxes"][1, 2].tolist() == [0.0, 0.0, 8.0, 8.0]
    assert (batch["boxes"][~batch["boxes_valid"]] == 0).all()


def test_packed_lengths_follow_the_offsets_when_an_op_changes_lengths(ds):
    """A packed batch carries x_lengths beside x_offsets: TimeStretch/TimeCrop left them as read (stale)."""
    for op in (TimeStretch(0.5, 0.6), TimeCrop(4)):
        b = first(ds / "seqs", Augment((op,)), config=LoaderConfig(ragged="packed"))
        plain = first(ds / "seqs", Augment(()), config=LoaderConfig(ragged="packed"))
        assert not torch.equal(b["x_offsets"], plain["x_offsets"])
        assert torch.equal(b["x_lengths"], b["x_offsets"].diff()), op


def test_a_fixed_length_sequence_whose_lengths_change_gets_lengths():
    x = torch.arange(1.0, 81.0).view(4, 10, 2)  # no x_lengths: every sample fills T
    aug = Augment((TimeStretch(1.5, 2.0),), fields={"x": "sequence"})  # faster: 5 or 6 steps of 10
    out = augment_batch(aug, {"x": x.clone()}, batch_generator(0, 0, 0, CPU))
    n = out["x_lengths"]
    assert out["x"].shape == (4, 10, 2) and ((n >= 5) & (n <= 7)).all()
    assert torch.equal((out["x"][:, :, 0] != 0).sum(1), n)  # zeros past the new lengths
    same = augment_batch(Augment((TimeStretch(0.5, 0.8),), fields={"x": "sequence"}), {"x": x.clone()},
                         batch_generator(0, 0, 0, CPU))
    assert "x_lengths" not in same  # slower: capped at T, every sample still fills it


def test_mixup_keeps_both_samples_boxes_through_augment():
    aug = Augment((), fields=("image",), mix=Mix(mixup_alpha=1.0, cutmix_alpha=0.0, num_classes=3),
                  targets={"boxes": Boxes()})
    boxes = torch.tensor([[[0.0, 0.0, 10.0, 10.0], [5.0, 5.0, 8.0, 8.0]]]).repeat(4, 1, 1)
    boxes[:, 0, 0] = torch.arange(4.0)  # which sample a box came from
    batch = {"image": constant_images(4), "label": torch.tensor([0, 1, 2, 0]), "boxes": boxes.clone(),
             "boxes_lengths": torch.tensor([2, 1, 2, 0])}
    out = augment_batch(aug, batch, batch_generator(0, 0, 0, CPU))
    assert out["boxes"].shape == (4, 4, 4) and "boxes_lengths" not in out
    assert out["boxes_valid"].tolist() == [[True, True, False, False], [True, False, True, True],
                                           [True, True, True, False], [False, False, True, True]]
    assert out["boxes"][1, 2].tolist() == [0.0, 0.0, 10.0, 10.0]  # the partner's (sample 0) box, whole
    assert (out["boxes"][~out["boxes_valid"]] == 0).all()


def test_mix_refuses_targets_it_cannot_carry_and_pastes_masks_with_cutmix():
    with pytest.raises(UsageError, match="Mix cannot carry target 'kp'"):
        Augment((), mix=Mix(num_classes=2), targets={"kp": Keypoints()})
    with pytest.raises(UsageError, match="only CutMix can paste it"):
        Augment((), mix=Mix(num_classes=2), targets={"m": Mask()})
    with pytest.raises(UsageError, match="several views"):
        Augment((RandomCrop(4),), views=2, mix=Mix(num_classes=2))
    aug = Augment((), fields=("image",), mix=Mix(mixup_alpha=0.0, num_classes=8), targets={"m": Mask()})
    mask = torch.arange(8, dtype=torch.uint8).view(8, 1, 1).expand(8, 10, 14).contiguous()
    out = augment_batch(aug, {"image": constant_images(), "m": mask, "label": torch.arange(8)},
                        batch_generator(0, 0, 0, CPU))
    assert torch.equal(out["m"].float(), out["image"][:, 0])


def test_mix_with_too_few_classes_names_the_label_not_a_torch_index_error(ds):
    """Labels 0..4 with num_classes=3: one_hot's scatter raised 'index 4 is out of bounds for dimension 1'."""
    with pytest.raises(UsageError, match="label 4 of field 'label' is not a class 0..2"):
        first(ds / "ds", Augment((), mix=Mix(num_classes=3)), fields=["image", "label"], shuffle=False)


@pytest.mark.parametrize("label,match", [
    (torch.tensor([0.3, 1.7, 2.2, 0.0]), r"must be \(batch,\) integers or \(batch, classes\) floats, got \(4,\) float32"),
    (torch.softmax(torch.randn(4, 5), 1), "soft labels of 'label' have 5 classes, and num_classes is 3"),
])
def test_mix_refuses_labels_it_would_misread(label, match):
    """Float (B,) labels were cast to classes (1.7 -> 1) and soft labels of 5 classes ignored num_classes=3."""
    batch = {"image": constant_images(4), "label": label}
    with pytest.raises(UsageError, match=match):
        augment_batch(Augment((), mix=Mix(num_classes=3), fields=("image",)), batch, batch_generator(0, 0, 0, CPU))


def test_mix_through_the_loader(ds):
    aug = Augment((RandomCrop(8),), mix=Mix(num_classes=5, label_smoothing=0.1))
    b = first(ds / "ds", aug)
    assert b["label"].shape == (6, 5) and b["label"].dtype == torch.float32
    torch.testing.assert_close(b["label"].sum(1), torch.ones(6))


@pytest.mark.skipif(len(BACKENDS) < 2, reason="NVIDIA DALI is not installed")
def test_dali_says_once_that_sequence_ops_and_mix_run_with_the_torch_code(ds, caplog, monkeypatch):
    import logging

    from fastdata.loaders import dali as fdali

    fdali._log_once.cache_clear()
    with caplog.at_level(logging.INFO, logger="fastdata.loader"):
        for _ in range(2):
            first(ds / "ds", Augment((RandomCrop(8),), mix=Mix(num_classes=5)), "dali")
            first(ds / "seqs", Augment((TimeMask(2),)), "dali")
    said = [r.getMessage() for r in caplog.records if "torch backend's code on DALI's output" in r.getMessage()]
    assert len(said) == 2 and "MixUp/CutMix" in said[0] and "sequence/array ops" in said[1]


def test_views_keep_the_image_layout_and_calling_needs_the_batch(ds):
    multi = first(ds / "ds", Augment(views=[[RandomCrop(8)], [RandomCrop(4)]]))
    assert multi["image_view0"].is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(UsageError, match="augment_batch"):
        Augment((RandomCrop(4),), views=2)(torch.rand(2, 3, 8, 8), batch_generator(0, 0, 0, CPU))


def test_fit_sees_fixed_shapes_when_every_view_crops(ds):
    from fastdata import train

    def fixed(path: Path, aug: Augment) -> bool:
        with fastdata.loader(path, 6, device="cpu", augment=aug) as ld:
            return train.fixed_shapes(ld)

    assert fixed(ds / "seqs", Augment((TimeCrop(4), TimeMask(2)), views=2))
    assert not fixed(ds / "seqs", Augment((TimeMask(2),)))


def test_stacked_channels_last_views_equal_a_plain_stack():
    from fastdata.augment.pipeline import _stack

    views = [torch.rand(4, 3, 5, 6).contiguous(memory_format=torch.channels_last) for _ in range(3)]
    got = _stack(views)
    assert torch.equal(got, torch.stack(views, 1))
    assert got.flatten(0, 1).is_contiguous(memory_format=torch.channels_last)


def test_views_ending_in_normalize_are_written_in_place_and_equal_the_plain_path(ds):
    from fastdata.augment import Normalize

    ops = (RandomResizedCrop(8), HorizontalFlip(), Normalize((0.5, 0.4, 0.3), (0.2, 0.3, 0.4)))
    two = first(ds / "ds", Augment(ops, views=2, fields=("image",)))
    one = first(ds / "ds", Augment(ops, fields=("image",)))
    listed = first(ds / "ds", Augment(views=[ops, ops[:2]], fields=("image",)))  # no Normalize in view 1: stacked
    assert two["image"].shape == (6, 2, 3, 8, 8) and torch.equal(two["image"][:, 0], one["image"])
    assert torch.equal(listed["image"][:, 0], one["image"]) and not torch.equal(two["image"][:, 0], two["image"][:, 1])
