"""Targets that move with the image (issue 15): keypoints, boxes, masks and Custom hooks, every geometric
op and random chains, torch backend (unit and loader) and DALI backend (CPU mode).

The bright-dot tests draw one dot per keypoint (each in its own channel) before augmenting: after the
op, the brightest pixel of that channel must lie within 1 pixel of where the op moved the keypoint.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest
import torch

import fastdata
from fastdata import WriteOptions
from fastdata.augment import (
    Augment,
    CenterCrop,
    ColorJitter,
    GaussianNoise,
    HorizontalFlip,
    Normalize,
    Pad,
    RandomAffine,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    VerticalFlip,
    batch_generator,
)
from fastdata.errors import UsageError
from fastdata.augment.targets import Boxes, Custom, Keypoints, Mask

CPU = torch.device("cpu")


def gen(k: int = 0, seed: int = 3) -> torch.Generator:
    return batch_generator(seed, 0, k, CPU)


GEOMETRIC = [
    RandomResizedCrop((40, 44), scale=(0.3, 1.0)), RandomCrop((36, 40)), CenterCrop((30, 34)), HorizontalFlip(),
    VerticalFlip(), Resize((70, 52)), Pad(top=3, bottom=5, left=7, right=2), RandomAffine(35, (0.1, 0.15), (0.8, 1.2)),
]
PHOTOMETRIC = [ColorJitter(0.2, 0.2, 0.2, 0.05), GaussianNoise(0.01)]


def random_chains(n: int, seed: int = 0) -> list[tuple]:
    rng = np.random.default_rng(seed)
    chains = []
    for _ in range(n):
        k = int(rng.integers(2, 5))
        chains.append(tuple(GEOMETRIC[i] for i in rng.choice(len(GEOMETRIC), k, replace=False)))
    return chains


def dots(b: int, k: int, h: int | list[tuple[int, int]], w: int = 0, seed: int = 0):
    """Float images (b, k, H, W), channel j holding a 3x3 dot (peak 1) at keypoint j; keypoints (b, k, 3)
    (x, y, visible=2) inside each image (``h`` a list of sizes: a padded mixed-size batch)."""
    sizes = h if isinstance(h, list) else [(h, w)] * b
    hmax, wmax = max(s[0] for s in sizes), max(s[1] for s in sizes)
    rng = np.random.default_rng(seed)
    x = torch.zeros(b, k, hmax, wmax)
    kp = torch.zeros(b, k, 3)
    for i, (hi, wi) in enumerate(sizes):
        for j in range(k):
            r, c = int(rng.integers(4, hi - 4)), int(rng.integers(4, wi - 4))
            x[i, j, r - 1 : r + 2, c - 1 : c + 2] = 0.4
            x[i, j, r, c] = 1.0
            kp[i, j] = torch.tensor([c, r, 2.0])
    return x, kp, torch.tensor(sizes)


def peak_errors(img: torch.Tensor, kp: torch.Tensor, sizes: torch.Tensor | None = None,
                strict: bool = True) -> list[float]:
    """Per visible keypoint whose dot is fully inside its image: distance (max norm) from the brightest
    pixel of its channel to the keypoint. Checks that visible points are inside the frame and, when
    ``strict`` (one op: nothing was cut away before), that points inside are visible."""
    errs = []
    b, k, h, w = img.shape
    for i in range(b):
        hi, wi = (int(sizes[i, 0]), int(sizes[i, 1])) if sizes is not None else (h, w)
        for j in range(k):
            x, y, v = kp[i, j].tolist()
            inside = -0.5 <= x < wi - 0.5 and -0.5 <= y < hi - 0.5
            assert inside if v > 0 else not (strict and inside), (i, j, x, y, v)  # out of the frame: invisible
            if v == 0 or not (1.5 <= x < wi - 2.5 and 1.5 <= y < hi - 2.5):
                continue  # the dot may be cut by the border
            r, c = divmod(int(img[i, j, :hi, :wi].argmax()), wi)
            errs.append(max(abs(c - x), abs(r - y)))
    return errs


@pytest.mark.parametrize("op", GEOMETRIC, ids=lambda o: type(o).__name__)
def test_dots_follow_keypoints_for_each_op(op):
    x, kp, _ = dots(24, 4, 48, 56)
    aug = Augment((op,), targets={"kp": Keypoints(visibility=2)})
    for k in range(3):
        out = aug.run({"image": x, "kp": kp}, gen(k), "image")
        errs = peak_errors(out["image"], out["kp"])
        assert len(errs) > 25 and max(errs) <= 1.0, (op, max(errs))


@pytest.mark.parametrize("chain", random_chains(12), ids=lambda c: "+".join(type(o).__name__ for o in c))
def test_dots_follow_keypoints_for_random_chains(chain):
    x, kp, _ = dots(16, 4, 50, 60, seed=1)
    aug = Augment(chain, targets={"kp": Keypoints(visibility=2)})
    out = aug.run({"image": x, "kp": kp}, gen(5), "image")
    errs = peak_errors(out["image"], out["kp"], strict=False)
    assert errs and max(errs) <= 1.0, max(errs)


@pytest.mark.parametrize("op", [o for o in GEOMETRIC if not isinstance(o, (RandomCrop, CenterCrop))] +
                         [RandomCrop(24), CenterCrop((20, 26))], ids=lambda o: type(o).__name__)
def test_mixed_size_batches_move_keypoints_with_each_image(op):
    sizes = [(40, 60), (60, 30), (28, 28), (60, 60)] * 4
    x, kp, s = dots(len(sizes), 3, sizes, seed=2)
    out = Augment((op,), targets={"kp": Keypoints(visibility=2)}).run({"image": x, "kp": kp}, gen(1), "image", s)
    y = out["image"]
    if isinstance(op, (HorizontalFlip, VerticalFlip, RandomAffine)):
        after = s
    elif isinstance(op, Pad):
        after = s + torch.tensor([op.top + op.bottom, op.left + op.right])
    else:
        after = None
    errs = peak_errors(y, out["kp"], after)
    assert len(errs) > 10 and max(errs) <= 1.0


def boxes_with_corner_dots(b: int, h: int, w: int, seed: int = 0):
    """One box per sample with corners at pixel centres (half-integer edges) and a dot at each of its
    4 corners (channels 0-3)."""
    rng = np.random.default_rng(seed)
    x = torch.zeros(b, 4, h, w)
    boxes = torch.zeros(b, 1, 4)
    for i in range(b):
        c0, c1 = sorted(rng.choice(np.arange(6, w - 6), 2, replace=False))
        r0, r1 = sorted(rng.choice(np.arange(6, h - 6), 2, replace=False))
        for j, (r, c) in enumerate([(r0, c0), (r0, c1), (r1, c0), (r1, c1)]):
            x[i, j, r - 1 : r + 2, c - 1 : c + 2] = 0.4
            x[i, j, r, c] = 1.0
        boxes[i, 0] = torch.tensor([c0 + 0.5, r0 + 0.5, c1 + 0.5, r1 + 0.5])
    return x, boxes


@pytest.mark.parametrize("chain", [(op,) for op in GEOMETRIC] + random_chains(6, seed=1),
                         ids=lambda c: "+".join(type(o).__name__ for o in c))
def test_box_edges_touch_the_corner_dots(chain):
    x, boxes = boxes_with_corner_dots(48, 48, 56)
    out = Augment(chain, targets={"boxes": Boxes("xyxy")}).run({"image": x, "boxes": boxes}, gen(2), "image")
    y, bx, valid = out["image"], out["boxes"], out["boxes_valid"]
    h, w = y.shape[-2:]
    checked = 0
    for i in range(len(y)):
        peaks = []
        for j in range(4):
            if y[i, j].max() < 0.5:
                break  # a corner left the frame (its dot's ring may show): the box is clipped there
            r, c = divmod(int(y[i, j].argmax()), w)
            peaks.append((c, r))
        if len(peaks) < 4 or not valid[i, 0]:
            continue
        cs, rs = [p[0] for p in peaks], [p[1] for p in peaks]
        if min(cs) < 2 or min(rs) < 2 or max(cs) > w - 3 or max(rs) > h - 3:
            continue
        x0, y0, x1, y1 = (bx[i, 0] - 0.5).tolist()  # edges at the corner pixels' centres
        assert max(abs(x0 - min(cs)), abs(y0 - min(rs)), abs(x1 - max(cs)), abs(y1 - max(rs))) <= 1.0
        checked += 1
    assert checked >= 8


def test_boxes_are_clipped_and_empty_ones_flagged_in_every_format():
    xyxy = torch.tensor([[[2.0, 2.0, 10.0, 10.0], [30.0, 30.0, 38.0, 36.0], [0.0, 0.0, 40.0, 40.0]]])
    for fmt, b in (("xyxy", xyxy), ("xywh", torch.cat([xyxy[..., :2], xyxy[..., 2:] - xyxy[..., :2]], -1)),
                   ("cxcywh", torch.cat([(xyxy[..., :2] + xyxy[..., 2:]) / 2, xyxy[..., 2:] - xyxy[..., :2]], -1))):
        aug = Augment((CenterCrop(20),), targets={"b": Boxes(fmt)})
        out = aug.run({"image": torch.zeros(1, 1, 40, 40), "b": b}, gen(), "image")
        assert out["b_valid"].tolist() == [[False, False, True]]
        back = Boxes(fmt).to_xyxy(out["b"])
        assert back[0, 0].tolist() == [0, 0, 0, 0] and back[0, 2].tolist() == [0, 0, 20, 20]
    lengths = torch.tensor([2])  # rows past the sample's length are padding: never valid
    out = Augment((HorizontalFlip(1.0),), targets={"b": Boxes()}).run(
        {"image": torch.zeros(1, 1, 40, 40), "b": xyxy, "b_lengths": lengths}, gen(), "image")
    assert out["b_valid"].tolist() == [[True, True, False]]
    assert out["b"][0, 0].tolist() == [30, 2, 38, 10]  # pixel edges: x -> W - x


def test_flip_swaps_the_named_pairs_and_a_double_mirror_does_not():
    x, kp, _ = dots(64, 5, 32, 32)
    pairs = [(1, 2), (3, 4)]
    aug = Augment((HorizontalFlip(0.5),), targets={"kp": Keypoints(flip_pairs=pairs, visibility=2)})
    out = aug.run({"image": x, "kp": kp}, gen(), "image")
    flipped = out["image"].flatten(2).argmax(-1)[:, 0] != x.flatten(2).argmax(-1)[:, 0]  # point 0 moved
    assert 10 < int(flipped.sum()) < 54
    perm = [0, 2, 1, 4, 3]
    expect = kp.clone()
    expect[..., 0] = 31 - kp[..., 0]
    assert torch.equal(out["kp"][flipped], expect[flipped][:, perm])
    assert torch.equal(out["kp"][~flipped], kp[~flipped])
    # the dot of channel j now shows point perm[j]'s coordinates: channel 1 (left eye's dot) is the right eye
    errs = peak_errors(out["image"][flipped][:, perm], out["kp"][flipped])
    assert max(errs) == 0
    both = Augment((HorizontalFlip(1.0), VerticalFlip(1.0)), targets={"kp": Keypoints(flip_pairs=pairs)})
    k2 = both.run({"image": x, "kp": kp}, gen(), "image")["kp"]
    assert torch.equal(k2[..., 0], 31 - kp[..., 0]) and torch.equal(k2[..., 1], 31 - kp[..., 1])  # rotation 180


def test_points_pushed_out_of_the_frame_become_invisible_not_clamped():
    kp = torch.tensor([[[2.0, 2.0, 2.0], [20.0, 20.0, 1.0], [39.0, 1.0, 2.0], [5.0, 5.0, 0.0]]])
    out = Augment((CenterCrop(20),), targets={"kp": Keypoints(visibility=2)}).run(
        {"image": torch.zeros(1, 1, 40, 40), "kp": kp}, gen(), "image")["kp"]
    assert out.tolist() == [[[-8.0, -8.0, 0.0], [10.0, 10.0, 1.0], [29.0, -9.0, 0.0], [-5.0, -5.0, 0.0]]]
    with pytest.raises(UsageError, match="visibility=5"):
        Augment((HorizontalFlip(),), targets={"kp": Keypoints(visibility=5)}).run(
            {"image": torch.zeros(1, 1, 4, 4), "kp": kp}, gen(), "image")


def test_ragged_keypoints_keep_their_zero_padding():
    # keypoints of categories with different K (MP-100 style) come padded with keypoints_lengths: the padding
    # rows are not points, so no op may move them (a flip made them (W - 1, 0)); the real rows move as without it
    kp = torch.tensor([[[3.0, 4.0, 2.0], [10.0, 20.0, 1.0], [30.0, 5.0, 2.0]], [[7.0, 8.0, 2.0], [0.0, 0.0, 0.0],
                                                                             [0.0, 0.0, 0.0]]])
    lengths = torch.tensor([3, 1])
    for chain in [(HorizontalFlip(1.0),), (Resize((20, 50)), RandomAffine(30, (0.1, 0.1)))]:
        aug = Augment(chain, targets={"kp": Keypoints(visibility=2)})
        out = aug.run({"image": torch.zeros(2, 1, 40, 40), "kp": kp, "kp_lengths": lengths}, gen(), "image")
        plain = aug.run({"image": torch.zeros(2, 1, 40, 40), "kp": kp}, gen(), "image")["kp"]
        assert torch.equal(out["kp"][1, 1:], torch.zeros(2, 3)), out["kp"][1]
        assert torch.equal(out["kp"][0], plain[0]) and torch.equal(out["kp"][1, 0], plain[1, 0])
        assert torch.equal(out["kp_lengths"], lengths)


@pytest.mark.parametrize("layout", ["HW", "HWC", "CHW"])
def test_masks_keep_only_their_labels_and_move_with_the_image(layout):
    b, h, w = 16, 40, 48
    x, kp, _ = dots(b, 1, h, w)
    labels = torch.tensor([0, 3, 7, 200], dtype=torch.uint8)
    mask = labels[torch.randint(0, 4, (b, h // 4, w // 4), generator=torch.Generator().manual_seed(0))]
    mask = mask.repeat_interleave(4, 1).repeat_interleave(4, 2)  # blocks: nearest must keep them blocky
    # label 9 marks keypoint 0's pixel: after the chain it must lie at the moved keypoint
    for i in range(b):
        c, r = int(kp[i, 0, 0]), int(kp[i, 0, 1])
        mask[i, r, c] = 9
    m = {"HW": mask, "HWC": mask.unsqueeze(-1), "CHW": mask.unsqueeze(1)}[layout]
    chain = (RandomResizedCrop((44, 44), scale=(0.5, 1.0)), HorizontalFlip(), RandomAffine(20, scale=(0.9, 1.1)),
             Pad(top=2, left=3), ColorJitter(0.3))
    x3 = x.expand(b, 3, h, w) * 0 + x  # RGB (for the jitter)
    out = Augment(chain, targets={"mask": Mask(fill=255), "kp": Keypoints(visibility=2)}).run(
        {"image": x3, "mask": m, "kp": kp}, gen(4), "image")
    om = out["mask"]
    assert om.dtype == torch.uint8 and om.shape == {"HW": (b, 46, 47), "HWC": (b, 46, 47, 1),
                                                    "CHW": (b, 1, 46, 47)}[layout]
    assert set(om.unique().tolist()) <= {0, 3, 7, 200, 9, 255}
    assert (om == 255).any()  # the pad and the affine's outside
    flat = om.reshape(b, 46, 47) if layout != "CHW" else om[:, 0]
    found = 0
    for i in range(b):
        hits = (flat[i] == 9).nonzero()
        if out["kp"][i, 0, 2] > 0 and len(hits):
            r, c = hits.float().mean(0).tolist()
            assert abs(c - out["kp"][i, 0, 0]) <= 1.0 and abs(r - out["kp"][i, 0, 1]) <= 1.0
            found += 1
    assert found >= 4


def test_custom_hooks_see_exactly_the_flipped_samples_batched():
    b = 40
    x = torch.arange(8.0).expand(b, 1, 4, 8).clone()  # a left-to-right ramp: a flipped image decreases
    seen: dict[str, list] = {"h": [], "r": [], "t": []}

    def on_hflip(v):
        seen["h"].append(v.clone())
        return v * torch.tensor([-1.0, 1.0, -1.0])

    def on_rotate(v, deg):
        seen["r"].append(deg.clone())
        return v + torch.stack([0 * deg, 0 * deg, deg], 1).float()

    def on_transform(v, m, hw):
        seen["t"].append(m.shape)
        return v

    pose = torch.stack([torch.arange(b).float(), torch.ones(b), torch.zeros(b)], 1)  # yaw = sample index
    aug = Augment((HorizontalFlip(), RandomAffine(10)),
                  targets={"pose": Custom(on_hflip=on_hflip, on_rotate=on_rotate, on_transform=on_transform)})
    out = aug.run({"image": x, "pose": pose}, gen(), "image")
    flipped = Augment((HorizontalFlip(),))(x, gen())[:, 0, 0, 0] > 0
    assert len(seen["h"]) == 1 and seen["h"][0][:, 0].tolist() == torch.arange(b)[flipped].float().tolist()
    assert torch.equal(out["pose"][:, 0].abs(), torch.arange(b).float())
    assert ((out["pose"][:, 0] < 0) == (flipped & (torch.arange(b) > 0))).all()
    assert len(seen["r"]) == 1 and seen["r"][0].abs().max() <= 10 and seen["r"][0].std() > 1
    assert torch.allclose(out["pose"][:, 2], seen["r"][0].float())
    assert seen["t"] == [(b, 3, 3), (b, 3, 3)]
    with pytest.raises(UsageError, match="hook returned"):
        Augment((HorizontalFlip(1.0),), targets={"pose": Custom(on_hflip=lambda v: v[:, :2])}).run(
            {"image": x, "pose": pose}, gen(), "image")


def test_same_draws_with_or_without_targets_and_photometric_ops_leave_targets_alone():
    x, kp, _ = dots(8, 3, 40, 40)
    x = x[:, :3]
    chain = (RandomResizedCrop(24), ColorJitter(0.3, 0.3, 0.3, 0.1), HorizontalFlip(), GaussianNoise(0.05),
             RandomAffine(15), Normalize((0.5,) * 3, (0.2,) * 3))
    plain = Augment(chain)(x, gen(7))
    out = Augment(chain, targets={"kp": Keypoints(visibility=2)}).run({"image": x, "kp": kp}, gen(7), "image")
    assert torch.equal(plain, out["image"])  # declaring targets does not change the image's draws
    alone = Augment(chain, targets={"kp": Keypoints(visibility=2)}).run(
        {"kp": kp}, gen(7), None, hw=torch.tensor([[40, 40]] * 8))
    assert torch.equal(alone["kp"], out["kp"])  # the targets alone (the DALI backend's host side)
    still = Augment((ColorJitter(0.4), GaussianNoise(0.1)), targets={"kp": Keypoints()}).run(
        {"image": x, "kp": kp}, gen(), "image")["kp"]
    assert torch.equal(still, kp)


def test_ops_of_your_own_that_move_pixels_are_refused_with_targets():
    class Half:
        def apply(self, x, g):
            return x[..., ::2, ::2]

    x, kp, _ = dots(2, 1, 16, 16)
    with pytest.raises(UsageError, match="Half changed the image size"):
        Augment((Half(),), targets={"kp": Keypoints()}).run({"image": x, "kp": kp}, gen(), "image")
    with pytest.raises(UsageError, match="not in the batch"):
        Augment((HorizontalFlip(),), targets={"kq": Keypoints()}).run({"image": x, "kp": kp}, gen(), "image")
    with pytest.raises(TypeError, match="must be Keypoints"):
        Augment((HorizontalFlip(),), targets={"kp": "keypoints"})  # type: ignore[dict-item]


# ---- through the loaders -------------------------------------------------------------------------

N = 40
H, W = 48, 56


@pytest.fixture(scope="module")
def posed(tmp_path_factory):
    """Fixed-shape arrays: uint8 RGB images with 3 keypoint dots (one per channel), keypoints (3, 3),
    one box spanning the keypoints, a uint8 (H, W) mask and a pose (3,) whose yaw is the sample index + 1
    (negated on every mirror by the Custom hooks below: its sign says which samples are mirrored)."""
    tmp = tmp_path_factory.mktemp("posed")
    x, kp, _ = dots(N, 3, H, W, seed=4)
    img = (x.permute(0, 2, 3, 1) * 255).round().to(torch.uint8).numpy()
    mask = np.zeros((N, H, W), np.uint8)
    mask[:, H // 4 : H // 2, W // 3 : W // 2] = 5
    mask[:, H // 2 :, : W // 4] = 2
    boxes = torch.stack([kp[:, :, :2].amin(1) + 0.5, kp[:, :, :2].amax(1) + 0.5], 1).reshape(N, 1, 4)
    pose = np.stack([np.arange(N) + 1, np.zeros(N), np.zeros(N)], 1).astype(np.float32)
    arrays = {"image": img, "kp": kp.numpy(), "mask": mask, "boxes": boxes.numpy(), "pose": pose}
    for k, v in arrays.items():
        np.save(tmp / f"{k}.npy", v)
    fastdata.convert(None, tmp / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1, shard_size=20_000)), arrays={k: tmp / f"{k}.npy" for k in arrays})
    return tmp / "ds"


def _pose_aug(chain):
    return Augment(tuple(chain), targets={"kp": Keypoints(flip_pairs=[(0, 1)], visibility=2), "mask": Mask(),
                                          "boxes": Boxes(), "pose": Custom(on_hflip=lambda v: -v, on_vflip=lambda v: -v)})


LOADER_CHAINS = [(op,) for op in GEOMETRIC] + random_chains(4, seed=7)


def _check_loader_batch(b, chain):
    img, kp = b["image"], b["kp"]
    assert b["mask"].dtype == torch.uint8 and set(b["mask"].unique().tolist()) <= {0, 2, 5}
    assert b["boxes_valid"].dtype == torch.bool
    # channel j's dot is keypoint j, or its flip partner on the mirrored samples (pose < 0 marks them;
    # a horizontal and a vertical flip together mirror twice: no swap)
    mirrored = b["pose"][:, 0] < 0
    ch = img.clone()
    ch[mirrored] = img[mirrored][:, [1, 0, 2]]
    errs = peak_errors(ch, kp, strict=len(chain) == 1)
    assert errs and max(errs) <= 1.0, (chain, max(errs))


@pytest.mark.parametrize("chain", LOADER_CHAINS, ids=lambda c: "+".join(type(o).__name__ for o in c))
def test_loader_torch_backend_moves_targets(posed, chain):
    ld = fastdata.loader(posed, 8, device="cpu", augment=_pose_aug(chain), num_workers=1, seed=1)
    for b in ld:
        assert b["image"].shape[1] == 3 and b["image"].dtype == torch.float32
        _check_loader_batch(b, chain)


def test_loader_resume_mid_epoch_repeats_the_rest_of_the_augmentation(posed):
    aug = _pose_aug([RandomResizedCrop(32), HorizontalFlip(), RandomAffine(10, (0.05, 0.05))])
    full = list(fastdata.loader(posed, 8, device="cpu", augment=aug, num_workers=2, seed=5))
    again = list(fastdata.loader(posed, 8, device="cpu", augment=aug, num_workers=0, seed=5))
    ld = fastdata.loader(posed, 8, device="cpu", augment=aug, num_workers=1, seed=5)
    it = iter(ld)
    next(it), next(it)
    state = ld.state_dict()
    resumed = fastdata.loader(posed, 8, device="cpu", augment=aug, num_workers=1, seed=5)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(full) - 2
    for a, b in itertools.chain(zip(full, again), zip(full[2:], rest)):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k
    other = next(iter(fastdata.loader(posed, 8, device="cpu", augment=aug, seed=6)))
    assert not torch.equal(other["kp"], full[0]["kp"])


def _dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


DALI = pytest.mark.skipif(not _dali_available(), reason="NVIDIA DALI is not installed")


@DALI
@pytest.mark.parametrize("chain", LOADER_CHAINS, ids=lambda c: "+".join(type(o).__name__ for o in c))
def test_dali_backend_moves_targets_with_the_torch_backends_parameters(posed, chain):
    aug = _pose_aug(chain)
    t = fastdata.loader(posed, 8, device="cpu", augment=aug, num_workers=1, seed=2, backend="torch")
    d = fastdata.loader(posed, 8, device="cpu", augment=aug, num_workers=1, seed=2, backend="dali")
    for a, b in zip(t, d):
        _check_loader_batch(b, chain)  # DALI's pixels agree with the host-side targets
        for k in ("kp", "boxes", "boxes_valid", "mask", "pose"):
            assert torch.equal(a[k], b[k]), k  # the same parameters on both backends
        assert a["image"].shape == b["image"].shape
        assert (a["image"] - b["image"]).abs().mean() < 0.01


@DALI
def test_dali_backend_logs_the_host_side_targets_once_and_resumes(posed, caplog, monkeypatch):
    from fastdata.loaders import dali as fdali

    fdali._log_once.cache_clear()
    aug = _pose_aug([RandomResizedCrop(32), HorizontalFlip(), RandomAffine(10)])
    with caplog.at_level(logging.INFO, logger="fastdata.loader"):
        full = list(fastdata.loader(posed, 8, device="cpu", augment=aug, seed=3, backend="dali"))
        ld = fastdata.loader(posed, 8, device="cpu", augment=aug, seed=3, backend="dali")
    logged = [r.message for r in caplog.records if "transformed on the host" in r.message]
    assert len(logged) == 1 and "kp (Keypoints)" in logged[0] and "mask (Mask)" in logged[0]
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    ld.close()
    resumed = fastdata.loader(posed, 8, device="cpu", augment=aug, seed=3, backend="dali")
    resumed.load_state_dict(state)
    for a, b in zip(full[1:], resumed):
        for k in ("image", "kp", "mask", "boxes", "pose"):
            assert torch.equal(a[k], b[k]), k


@DALI
def test_dali_backend_refuses_targets_it_cannot_take(posed, tmp_path):
    with pytest.raises(UsageError, match="not in the batch"):
        fastdata.loader(posed, 8, device="cpu", backend="dali",
                        augment=Augment((HorizontalFlip(),), targets={"nope": Keypoints()}))


@pytest.mark.slow
def test_benchmark_script_runs_quick(tmp_path):
    pytest.importorskip("kornia")
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_augment_targets.py"), "--quick", "--out",
                        str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "augment_targets_quick.json").read_text())
    assert set(data["kornia_over_fastdata"]) == {"targets", "image_only"}
    assert "| fastdata, image + mask + keypoints |" in (tmp_path / "augment_targets_quick.md").read_text()


def test_targets_alone_follow_each_images_own_size():
    # the DALI backend's host side: no image, only the sizes; the same targets as with the image
    sizes = [(40, 60), (60, 30), (28, 28), (60, 60)] * 3
    x, kp, s = dots(len(sizes), 2, sizes, seed=5)
    chain = (HorizontalFlip(), RandomAffine(20, (0.1, 0.1)), Pad(top=2, left=5), RandomResizedCrop(24))
    aug = Augment(chain, targets={"kp": Keypoints(visibility=2)})
    with_image = aug.run({"image": x, "kp": kp}, gen(9), "image", s)
    alone = aug.run({"kp": kp}, gen(9), None, hw=s)
    assert torch.equal(with_image["kp"], alone["kp"])
    assert peak_errors(with_image["image"], with_image["kp"], strict=False)


@DALI
def test_dali_new_ops_on_mixed_sizes_match_the_torch_backend(tmp_path):
    import imagegen

    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for i in range(12):
        imagegen.png_rgb(src / f"{i:02d}.png", h=20 if i % 3 else 26, w=28 if i % 2 else 22, seed=i)
    fastdata.convert(tmp_path / "src", tmp_path / "ds", fastdata.ConvertConfig(write=WriteOptions(workers=1), images=fastdata.ImageOptions(images="raw")))
    aug = [RandomAffine(20, (0.1, 0.1), (0.9, 1.1)), Pad(top=2, bottom=1, left=3, right=4, fill=0.5), HorizontalFlip()]
    t = fastdata.loader(tmp_path / "ds", 6, shuffle=False, device="cpu", augment=aug, backend="torch")
    d = fastdata.loader(tmp_path / "ds", 6, shuffle=False, device="cpu", augment=aug, backend="dali")
    for a, b in zip(t, d):
        assert a["image"].shape == b["image"].shape
        for img_a, img_b, (h, w, _) in zip(a["image"], b["image"], a["image_shape"].tolist()):
            inner_a, inner_b = img_a[:, : h + 3, : w + 7], img_b[:, : h + 3, : w + 7]  # each padded image
            assert (inner_a - inner_b).abs().mean() < 0.02  # the same draws; resampling differs in rounding
            assert (img_a[:, h + 3 :] == 0).all() and (img_a[:, :, w + 7 :] == 0).all()
