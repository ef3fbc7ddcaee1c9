"""Benchmark augmentation that carries its targets: fastdata's ``Augment(ops, targets=...)`` against kornia's
``AugmentationSequential(data_keys=...)``, the same ops on the same batch, in one run.

Usage::

    pip install kornia -c constraints-dev.txt   # a benchmark-only dependency; the constraints file pins
                                                 # torch (torch==2.13.0 here) so pip cannot replace it
    python benchmarks/bench_augment_targets.py [--quick] [--device cpu|cuda] [--out DIR]

The batch: 64 float32 RGB images of 256x256 in [0, 1], a uint8 (64, 256, 256) mask with 4 labels and
17 keypoints per image (x, y, visibility). The ops: RandomResizedCrop to 224 (scale 0.08-1, ratio
3/4-4/3), horizontal flip (p=0.5) and a small affine (rotation +-10 degrees, translation +-5%, scale
0.9-1.1, always applied), bilinear for the image, nearest for the mask. Timed per call (one batch,
new random parameters each time; kornia draws its own), methods interleaved in rounds:

* fastdata, image + targets: ``Augment(ops, targets={"kp": Keypoints(flip_pairs, visibility=2),
  "mask": Mask()}).run(batch, g, "image")``;
* kornia, image + targets: ``AugmentationSequential(..., data_keys=["input", "mask", "keypoints"])``
  (the mask as float (B, 1, H, W), which kornia needs; keypoints (B, 17, 2));
* both again for the image alone.

kornia differences worth knowing: it swaps no keypoint pairs on a flip and marks no point invisible;
fastdata does both (so it does a little more work). Results go to stdout (markdown) and to
``<out>/augment_targets[_quick|_cuda].{json,md}``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import (  # noqa: E402
    device_parser,
    machine_info,
    markdown_table,
    save_device_run,
    seeded_images,
    time_on_device,
    torch_machine_line,
)

from fastdata.augment import Augment, HorizontalFlip, RandomAffine, RandomResizedCrop, batch_generator  # noqa: E402
from fastdata.augment.targets import Keypoints, Mask  # noqa: E402

B, H, W, K, SIZE = 64, 256, 256, 17, 224
# COCO's 17 keypoints: nose, then (left, right) eyes, ears, shoulders, elbows, wrists, hips, knees, ankles
PAIRS = [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12), (13, 14), (15, 16)]


def make_batch(device: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    image = seeded_images(B, H, W, g)
    blocks = torch.randint(0, 4, (B, H // 16, W // 16), generator=g, dtype=torch.uint8)
    mask = blocks.repeat_interleave(16, 1).repeat_interleave(16, 2).contiguous()
    kp = torch.cat([torch.rand(B, K, 2, generator=g) * torch.tensor([W - 1.0, H - 1.0]), torch.full((B, K, 1), 2.0)], -1)
    return {"image": image.to(device), "mask": mask.to(device), "kp": kp.to(device)}


def fastdata_fns(batch: dict[str, torch.Tensor]) -> dict[str, Callable[[int], Any]]:
    ops = (RandomResizedCrop(SIZE), HorizontalFlip(), RandomAffine(10, (0.05, 0.05), (0.9, 1.1)))
    with_targets = Augment(ops, targets={"kp": Keypoints(flip_pairs=PAIRS, visibility=2), "mask": Mask()})
    alone = Augment(ops)
    cpu = torch.device("cpu")  # the loaders draw parameters on the CPU on every device
    return {
        "fastdata, image + mask + keypoints": lambda i: with_targets.run(batch, batch_generator(0, 0, i, cpu), "image"),
        "fastdata, image only": lambda i: alone(batch["image"], batch_generator(0, 0, i, cpu)),
    }


def kornia_fns(batch: dict[str, torch.Tensor]) -> dict[str, Callable[[int], Any]]:
    import kornia.augmentation as KA

    def ops() -> list[Any]:
        return [KA.RandomResizedCrop((SIZE, SIZE), scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
                KA.RandomHorizontalFlip(p=0.5),
                KA.RandomAffine(10.0, translate=(0.05, 0.05), scale=(0.9, 1.1), p=1.0)]

    with_targets = KA.AugmentationSequential(*ops(), data_keys=["input", "mask", "keypoints"])
    alone = KA.AugmentationSequential(*ops(), data_keys=["input"])
    mask = batch["mask"].unsqueeze(1).float()  # kornia resamples masks as float (B, 1, H, W), nearest
    kp = batch["kp"][..., :2].contiguous()
    return {
        "kornia, image + mask + keypoints": lambda i: with_targets(batch["image"], mask, kp),
        "kornia, image only": lambda i: alone(batch["image"]),
    }


def main(argv: list[str] | None = None) -> int:
    args = device_parser(__doc__, "few repeats (a smoke run)").parse_args(argv)
    device = torch.device(args.device)
    try:
        import kornia
    except ImportError:
        print("kornia is not installed: pip install kornia -c constraints-dev.txt (torch pinned)", file=sys.stderr)
        return 2
    batch = make_batch(device)
    fns = {**fastdata_fns(batch), **kornia_fns(batch)}
    repeats, rounds = (4, 2) if args.quick else (30, 5)
    res = time_on_device(fns, device, repeats=repeats, warmup=2, rounds=rounds)
    shapes = {k: [tuple(t.shape) for t in (v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple))
                                             else [v])] for k, v in ((k, f(0)) for k, f in fns.items())}

    def row(name: str) -> list[Any]:
        r = res[name]
        return [name, f"{r['median'] * 1e3:.1f}", f"{r['p10'] * 1e3:.1f}–{r['p90'] * 1e3:.1f}", f"{B / r['median']:,.0f}"]

    names = list(fns)
    table = markdown_table(["method", "ms/batch (median)", "p10–p90 ms", "images/s"], [row(n) for n in names])
    m = {n: res[n]["median"] for n in names}
    ratio_t = m["kornia, image + mask + keypoints"] / m["fastdata, image + mask + keypoints"]
    ratio_i = m["kornia, image only"] / m["fastdata, image only"]
    extra_f = m["fastdata, image + mask + keypoints"] - m["fastdata, image only"]
    extra_k = m["kornia, image + mask + keypoints"] - m["kornia, image only"]
    info = machine_info()
    md = "\n\n".join([
        f"# Augmentation with targets: fastdata vs kornia ({'quick' if args.quick else 'full'} run, device {device})",
        torch_machine_line(info, f"kornia {kornia.__version__}") + ".",
        f"Batch of {B} RGB {H}x{W} float images + uint8 mask + {K} keypoints; RandomResizedCrop {SIZE} + "
        "horizontal flip + affine (±10°, ±5%, 0.9–1.1); "
        f"{rounds} rounds, {repeats} timed calls per method in all, 2 warm-up calls per method and round.",
        table,
        f"kornia / fastdata time: with targets {ratio_t:.2f}x, image only {ratio_i:.2f}x. "
        f"Cost of the targets (with minus image only): fastdata {extra_f * 1e3:.1f} ms/batch, "
        f"kornia {extra_k * 1e3:.1f} ms/batch.",
    ])
    results = {"machine": info, "device": str(device), "timings_s": res, "output_shapes": shapes,
               "title": f"Augmentation, batch of {B} 256x256 + mask + {K} keypoints, {device} (images/s)",
               "rows": [{"name": n, "samples_per_s": B / res[n]["median"]} for n in names],
               "kornia_over_fastdata": {"targets": ratio_t, "image_only": ratio_i},
               "target_cost_s": {"fastdata": extra_f, "kornia": extra_k}}
    save_device_run("augment_targets", args.quick, device, results, md, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
