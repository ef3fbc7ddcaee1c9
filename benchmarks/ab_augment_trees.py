"""Two source trees' augmentation, paired in one run: the same batches through ``Augment`` from each tree,
the trees alternating in every round (A B, B A, ...).

Usage::

    python benchmarks/ab_augment_trees.py --before DIR --after DIR [--rounds 5] [--out DIR] [--name NAME]

Each round runs one child process per tree (``PYTHONPATH`` = that tree only) that times every case: a
warm-up call, then the median of ``--calls`` timed calls (new draws each call, one batch generator seed per
call, the same in both trees). Cases, on two batch sizes each:

* targets: float RGB images + a uint8 mask (4 labels, 16-pixel blocks) + 17 keypoints, RandomResizedCrop +
  horizontal flip + RandomAffine (the ops of bench_augment_targets.py), the mask resampled nearest;
* crop: float RGB images alone, RandomCrop (a per-sample window gathered, no resampling);
* image: float RGB images alone through the targets case's ops (bilinear crop-resize, flip, affine).

Ratio: before's ms over after's in each round (above 1: after is faster); median and quartiles over rounds.
Written to ``<out>/<name>.{json,md}`` (default name: augment_trees_ab).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CASES = {  # name: (batch, side, output side, with targets: True, False (RandomCrop), None (the ops alone))
    "targets, 64 x 256 px -> 224": (64, 256, 224, True),
    "targets, 16 x 512 px -> 384": (16, 512, 384, True),
    "crop, 64 x 256 px -> 224": (64, 256, 224, False),
    "crop, 16 x 512 px -> 384": (16, 512, 384, False),
    "image, 64 x 256 px -> 224": (64, 256, 224, None),
    "image, 16 x 512 px -> 384": (16, 512, 384, None),
}
PAIRS = [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12), (13, 14), (15, 16)]


def child(calls: int) -> None:
    """Time every case with the fastdata on ``sys.path``; print {case: median ms} as JSON."""
    import time

    import torch

    from fastdata.augment import Augment, HorizontalFlip, RandomAffine, RandomCrop, RandomResizedCrop
    from fastdata.augment.targets import Keypoints, Mask

    torch.set_num_threads(2)
    out = {}
    for name, (b, side, size, targets) in CASES.items():
        g = torch.Generator().manual_seed(0)
        batch = {"image": torch.rand(b, 3, side, side, generator=g)}
        if targets:
            blocks = torch.randint(0, 4, (b, side // 16, side // 16), generator=g, dtype=torch.uint8)
            batch["mask"] = blocks.repeat_interleave(16, 1).repeat_interleave(16, 2).contiguous()
            xy = torch.rand(b, 17, 2, generator=g) * (side - 1)
            batch["kp"] = torch.cat([xy, torch.full((b, 17, 1), 2.0)], -1)
            aug = Augment((RandomResizedCrop(size), HorizontalFlip(), RandomAffine(10, (0.05, 0.05), (0.9, 1.1))),
                          targets={"kp": Keypoints(flip_pairs=PAIRS, visibility=2), "mask": Mask()})
        elif targets is None:
            aug = Augment((RandomResizedCrop(size), HorizontalFlip(), RandomAffine(10, (0.05, 0.05), (0.9, 1.1))))
        else:
            aug = Augment((RandomCrop(size),))
        times = []
        for i in range(calls + 1):
            gen = torch.Generator().manual_seed(i)
            t0 = time.perf_counter()
            aug.run(dict(batch), gen, "image")
            if i:
                times.append((time.perf_counter() - t0) * 1e3)
        out[name] = statistics.median(times)
    print(json.dumps(out))


def run_tree(tree: Path, calls: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, __file__, "--child", str(calls)], env=env, cwd=tree,
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", type=Path)
    p.add_argument("--after", type=Path)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=8)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    p.add_argument("--name", default="augment_trees_ab")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        child(a.child)
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _harness import ratio_quartiles  # here, not at the top: a child imports only its own tree's fastdata

    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    ms: dict[str, dict[str, list[float]]] = {k: {c: [] for c in CASES} for k in trees}
    for r in range(a.rounds):
        for side in (["before", "after"] if r % 2 == 0 else ["after", "before"]):
            for c, v in run_tree(trees[side], a.calls).items():
                ms[side][c].append(v)
    lines = ["# Augment: two trees paired in one run", "",
             f"Before: {trees['before']}; after: {trees['after']}. {a.rounds} rounds, trees alternating; each figure "
             f"a child process's median of {a.calls} calls (torch 2 threads, CPU).", "",
             "| case | before ms (median) | after ms (median) | before/after per round | median (quartiles) |",
             "|---|---:|---:|---|---|"]
    for c in CASES:
        ratios = [x / y for x, y in zip(ms["before"][c], ms["after"][c])]
        q1, med, q3 = ratio_quartiles(ms["before"][c], ms["after"][c])
        lines.append(f"| {c} | {statistics.median(ms['before'][c]):.1f} | {statistics.median(ms['after'][c]):.1f} | "
                     f"{' '.join(f'{x:.2f}' for x in ratios)} | {med:.2f} ({q1:.2f}-{q3:.2f}) |")
    text = "\n".join(lines) + "\n"
    print(text)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.name}.md").write_text(text)
    (a.out / f"{a.name}.json").write_text(json.dumps({"trees": {k: str(v) for k, v in trees.items()},
                                                                "ms": ms}, indent=1))


if __name__ == "__main__":
    main()
