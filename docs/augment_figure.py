"""Draw docs/augment.png: one synthetic image with its keypoints, box and mask, then each geometric op
and a chain, applied by ``fastdata.augment.Augment(ops, targets=...)``, with the transformed targets
drawn on the transformed image.

    PYTHONPATH=. python docs/augment_figure.py [--out docs/augment.png]

Keypoints: left points green, right points red, the nose white (a flip swaps the pairs, so left stays
green on the new left); invisible points (left the frame) are not drawn. Box: yellow. Mask: labels
tinted blue (1) and magenta (2); the pad/affine fill (label 0) is untinted.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from fastdata.augment import (
    Augment,
    CenterCrop,
    HorizontalFlip,
    Pad,
    RandomAffine,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    VerticalFlip,
    batch_generator,
)
from fastdata.augment.targets import Boxes, Keypoints, Mask

H, W = 160, 200
# a stick figure: nose, (left, right) eyes, shoulders, hands, feet
POINTS = [(100, 38), (92, 32), (108, 32), (80, 60), (120, 60), (66, 96), (134, 96), (88, 140), (112, 140)]
PAIRS = [(1, 2), (3, 4), (5, 6), (7, 8)]
SIDE = ["nose", "left", "right", "left", "right", "left", "right", "left", "right"]


def scene() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Image (1, 3, H, W) in [0, 1], keypoints (1, K, 3), box (1, 1, 4) xyxy, mask (1, H, W) uint8."""
    y, x = np.mgrid[0:H, 0:W]
    img = np.stack([0.25 + 0.5 * x / W, 0.3 + 0.4 * y / H, 0.55 - 0.3 * x / W], -1)
    pil = Image.fromarray((img * 255).astype(np.uint8))
    d = ImageDraw.Draw(pil)
    d.ellipse([84, 18, 116, 50], fill=(235, 200, 160))  # head
    d.rectangle([80, 54, 120, 110], fill=(60, 90, 170))  # body
    for a, b in ((3, 5), (4, 6), (3, 7), (4, 8)):
        d.line([POINTS[a], POINTS[b]], fill=(40, 40, 40), width=5)
    d.text((6, 4), "L", fill=(0, 0, 0))
    image = torch.from_numpy(np.array(pil)).permute(2, 0, 1).float().div(255).unsqueeze(0)
    kp = torch.tensor([[x_, y_, 2.0] for x_, y_ in POINTS]).unsqueeze(0)
    box = torch.tensor([[[62.0, 16.0, 138.0, 146.0]]])
    mask = np.zeros((H, W), np.uint8)
    mask[54:111, 80:121] = 1  # body
    mask[(x - 100) ** 2 + (y - 34) ** 2 <= 16 ** 2] = 2  # head
    return image, kp, box, torch.from_numpy(mask).unsqueeze(0)


def render(img: torch.Tensor, kp: torch.Tensor, box: torch.Tensor, valid: bool, mask: torch.Tensor) -> Image.Image:
    a = img.clamp(0, 1).permute(1, 2, 0).numpy()
    m = mask.numpy()
    tint = np.zeros_like(a)
    tint[m == 1] = (0.1, 0.3, 1.0)
    tint[m == 2] = (1.0, 0.1, 0.9)
    a = np.where((m > 0)[..., None], 0.6 * a + 0.4 * tint, a)
    pil = Image.fromarray((a * 255).round().astype(np.uint8)).resize((a.shape[1] * 2, a.shape[0] * 2), Image.NEAREST)
    d = ImageDraw.Draw(pil)
    if valid:  # edges: scale 2
        x0, y0, x1, y1 = (box * 2).tolist()
        d.rectangle([x0, y0, x1 - 1, y1 - 1], outline=(255, 230, 0), width=2)
    for (x, y, v), side in zip(kp.tolist(), SIDE):
        if v <= 0:
            continue
        cx, cy = 2 * x + 1, 2 * y + 1  # pixel centres at scale 2
        colour = {"nose": (255, 255, 255), "left": (0, 220, 0), "right": (255, 40, 40)}[side]
        d.ellipse([cx - 4, cy - 4, cx + 4, cy + 4], fill=colour, outline=(0, 0, 0))
    return pil


PANELS = [
    ("original", ()),
    ("HorizontalFlip", (HorizontalFlip(1.0),)),
    ("VerticalFlip", (VerticalFlip(1.0),)),
    ("RandomResizedCrop(128)", (RandomResizedCrop(128, scale=(0.35, 0.6)),)),
    ("RandomCrop(120, 150)", (RandomCrop((120, 150)),)),
    ("CenterCrop(110)", (CenterCrop(110),)),
    ("Resize(100, 200)", (Resize((100, 200)),)),
    ("Pad(top=20, left=30)", (Pad(top=20, left=30, bottom=5, right=5, fill=0.9),)),
    ("RandomAffine(30, 0.1, 0.8-1.2)", (RandomAffine(30, (0.1, 0.1), (0.8, 1.2)),)),
    ("RRC + flip + affine", (RandomResizedCrop(150, scale=(0.4, 0.9)), HorizontalFlip(), RandomAffine(20))),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "augment.png"))
    args = ap.parse_args()
    image, kp, box, mask = scene()
    targets = {"kp": Keypoints(flip_pairs=PAIRS, visibility=2), "box": Boxes("xyxy"), "mask": Mask()}
    tiles = []
    for k, (title, ops) in enumerate(PANELS):
        batch = {"image": image, "kp": kp, "box": box, "mask": mask}
        out = Augment(ops, targets=targets).run(batch, batch_generator(11, 0, k, torch.device("cpu")), "image") \
            if ops else {**batch, "box_valid": torch.ones(1, 1, dtype=torch.bool)}
        tile = render(out["image"][0], out["kp"][0], out["box"][0, 0], bool(out["box_valid"][0, 0]), out["mask"][0])
        tiles.append((title, tile))
    cell_w, cell_h, cols = 2 * W + 20, 2 * H + 40, 5
    rows = (len(tiles) + cols - 1) // cols
    sheet = Image.new("RGB", (cols * cell_w, rows * cell_h), (255, 255, 255))
    d = ImageDraw.Draw(sheet)
    for i, (title, tile) in enumerate(tiles):
        x, y = (i % cols) * cell_w + 10, (i // cols) * cell_h + 24
        d.text((x, y - 18), title, fill=(0, 0, 0))
        sheet.paste(tile, (x, y))
    sheet.save(args.out, optimize=True)
    print(f"wrote {args.out} ({sheet.size[0]}x{sheet.size[1]})")


if __name__ == "__main__":
    main()
