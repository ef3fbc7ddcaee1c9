"""Benchmark views, sequence ops and MixUp/CutMix (issue 30), each against its baseline, side by side.

Usage::

    python benchmarks/bench_augment_views.py [--quick] [--device cpu|cuda] [--threads N] [--out DIR]

Three tables, each timed per call (one batch, new random parameters each time), methods interleaved
in rounds so that load drift hits them alike (benchmarks/_harness.py):

1. **Views**: ``Augment(ops, views=2)`` against ``Augment(ops)`` (one view) on 64 RGB 128x128 images; ops
   RandomResizedCrop 112 + flip + ColorJitter + Normalize: the augmentation alone
   (``fastdata.augment.pipeline.augment_batch`` on float images), and the loader's device stage (``DeviceStage.transform``:
   the uint8 batch as read, converted to float once, then augmented). Goal: two views at most 2.2x one view.
2. **Sequence ops** on a padded (64, 1000, 16) float batch, lengths ~ U[500, 1000]: TimeShift, 2 time
   masks, 2 channel masks, amplitude scaling, additive noise, TimeStretch. torchaudio is not installed
   here (and has no CPU wheel for this torch), so the baseline is **a plain torch loop per sample**
   doing the same ops on each sample's own length (what per-sample transforms in a Dataset do).
3. **MixUp / CutMix** on 64 float RGB 224x224 images + integer labels (1000 classes). torchvision is not
   installed here, so the baseline is **a plain-torch copy of what torchvision.transforms.v2's MixUp and
   CutMix do per batch** (one-hot labels; ``roll(1, 0).mul_(1 - lam).add_(x.mul(lam))`` for MixUp;
   ``clone()`` and the rolled box pasted for CutMix), timed with the same lambda and box as fastdata's.

Results go to stdout (markdown) and to ``<out>/augment_views[_quick|_cuda].{json,md}``.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

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

from fastdata.augment import (  # noqa: E402
    Augment,
    ColorJitter,
    HorizontalFlip,
    Normalize,
    RandomResizedCrop,
    batch_generator,
)
from fastdata.loaders.torch_backend import DeviceStage  # noqa: E402
from fastdata.augment.mixing import Mix, MixDraw, kept_fraction, mix_images  # noqa: E402
from fastdata.augment.sequence import (  # noqa: E402
    AdditiveNoise,
    AmplitudeScale,
    ChannelMask,
    TimeMask,
    TimeShift,
    TimeStretch,
    run_padded,
)
from fastdata.augment.pipeline import augment_batch  # noqa: E402

CPU = torch.device("cpu")
B = 64


def views_fns(device: torch.device, quick: bool) -> dict[str, Callable[[int], Any]]:
    side, crop = (64, 56) if quick else (128, 112)
    image = seeded_images(B, side, side).to(device)
    ops = (RandomResizedCrop(crop), HorizontalFlip(), ColorJitter(0.4, 0.4, 0.4, 0.1),
           Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)))
    one, two = Augment(ops, fields=("image",)), Augment(ops, fields=("image",), views=2)
    u8 = (image * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()  # as read: uint8 (B, H, W, C)
    stages = {n: DeviceStage(device, a, 0, True, ("image",)) for n, a in (("one", one), ("two", two))}
    return {
        "one view": lambda i: augment_batch(one, {"image": image}, batch_generator(0, 0, i, CPU))["image"],
        "two views": lambda i: augment_batch(two, {"image": image}, batch_generator(0, 0, i, CPU))["image"],
        "one view, device stage": lambda i: stages["one"].transform({"image": u8}, 0, i)["image"],
        "two views, device stage": lambda i: stages["two"].transform({"image": u8}, 0, i)["image"],
    }


SEQ_OPS = (TimeShift(100), TimeMask(50, count=2), ChannelMask(4, count=2), AmplitudeScale(0.8, 1.25),
           AdditiveNoise(0.05), TimeStretch(0.9, 1.1))


def per_sample_loop(x: torch.Tensor, lengths: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """The baseline: the same ops, one sample at a time on its own length, as a Dataset's transform would."""
    out = torch.zeros_like(x)
    # the noise is drawn where the sample is (a generator on the CPU cannot fill a CUDA tensor)
    noise_g = g if x.device.type == "cpu" else torch.Generator(device=x.device).manual_seed(g.initial_seed())
    for b in range(x.shape[0]):
        n = int(lengths[b])
        s = x[b, :n]
        s = s.roll(int(torch.randint(-100, 101, (1,), generator=g)), 0)
        s = s.clone()
        for _ in range(2):
            w = int(torch.randint(0, 51, (1,), generator=g))
            t0 = int(torch.randint(0, n - w + 1, (1,), generator=g))
            s[t0:t0 + w] = 0
        for _ in range(2):
            w = int(torch.randint(0, 5, (1,), generator=g))
            c0 = int(torch.randint(0, s.shape[1] - w + 1, (1,), generator=g))
            s[:, c0:c0 + w] = 0
        s = s * float(torch.empty(1).uniform_(0.8, 1.25, generator=g))
        s = s + 0.05 * torch.randn(s.shape, generator=noise_g, device=s.device)
        factor = math.exp(float(torch.empty(1).uniform_(math.log(0.9), math.log(1.1), generator=g)))
        m = min(max(1, round(n / factor)), x.shape[1])
        s = F.interpolate(s.T.unsqueeze(0), size=m, mode="linear", align_corners=False)[0].T
        out[b, :m] = s
    return out


def seq_fns(device: torch.device, quick: bool) -> dict[str, Callable[[int], Any]]:
    t = 250 if quick else 1000
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(t // 2, t + 1, (B,), generator=gen)
    x = torch.randn(B, t, 16, generator=gen)
    x = x.masked_fill((torch.arange(t).view(1, -1) >= lengths.view(-1, 1)).unsqueeze(-1), 0).to(device)
    dev_lengths = lengths.to(device)
    return {
        "fastdata, batched": lambda i: run_padded(SEQ_OPS, x, dev_lengths, batch_generator(0, 0, i, CPU), "x",
                                                  "sequence")[0],
        "plain torch loop per sample": lambda i: per_sample_loop(x, lengths, torch.Generator().manual_seed(i)),
    }


def v2_reference(images: torch.Tensor, labels: torch.Tensor, num_classes: int, d: MixDraw) -> tuple[torch.Tensor, ...]:
    """What torchvision.transforms.v2's MixUp / CutMix do to a batch (plain torch, the same lambda and box)."""
    y = F.one_hot(labels, num_classes=num_classes).to(images.dtype)
    if d.cutmix:
        h, w = images.shape[-2:]
        x1, y1, x2, y2 = d.pixel_box(h, w)
        rolled = images.roll(1, 0)
        out = images.clone()
        out[..., y1:y2, x1:x2] = rolled[..., y1:y2, x1:x2]
        lam = 1.0 - (x2 - x1) * (y2 - y1) / (w * h)
    else:
        lam = d.lam
        out = images.roll(1, 0).mul_(1.0 - lam).add_(images.mul(lam))
    return out, y.roll(1, 0).mul_(1.0 - lam).add_(y.mul(lam))


def mix_fns(device: torch.device, quick: bool) -> dict[str, Callable[[int], Any]]:
    side = 112 if quick else 224
    gen = torch.Generator().manual_seed(0)
    images = seeded_images(B, side, side, gen).to(device)
    labels = torch.randint(0, 1000, (B,), generator=gen).to(device)
    mix = Mix(num_classes=1000)
    mixup, cutmix = MixDraw(True, False, 0.7), MixDraw(True, True, 0.7, (0.2, 0.3, 0.75, 0.85))
    work = images.clone()  # fastdata's loader mixes its own batch in place (CutMix): refreshed by a copy below

    def ours(d: MixDraw) -> Callable[[int], Any]:
        def run(i: int) -> Any:
            work.copy_(images) if d.cutmix else None  # the loader's batch is fresh each time; not timed apart
            out = mix_images(work, d)
            return out, mix.labels(labels, kept_fraction(d, side, side))
        return run

    def ref(d: MixDraw) -> Callable[[int], Any]:
        return lambda i: v2_reference(images, labels, 1000, d)

    return {"fastdata MixUp": ours(mixup), "v2 reference MixUp": ref(mixup),
            "fastdata CutMix (incl. a batch copy)": ours(cutmix), "v2 reference CutMix": ref(cutmix)}


def paired_ratio(fns: dict[str, Callable[[int], Any]], one: str, two: str, pairs: int) -> float:
    """Median over ``pairs`` of time(two) / time(one) measured back to back on the same batch index: load
    drift on a shared machine hits both calls of a pair alike."""
    ratios = []
    for i in range(pairs):
        t0 = time.perf_counter()
        fns[one](i)
        t1 = time.perf_counter()
        fns[two](i)
        ratios.append((time.perf_counter() - t1) / (t1 - t0))
    return statistics.median(ratios)


def check_same(device: torch.device) -> dict[str, bool]:
    """The fastdata results equal the references' (so the timings compare the same work)."""
    fns = mix_fns(device, quick=True)
    same = {}
    for kind in ("MixUp", "CutMix"):
        ours = [f for k, f in fns.items() if k.startswith(f"fastdata {kind}")][0](0)
        ref = fns[f"v2 reference {kind}"](0)
        same[kind] = bool(torch.allclose(ours[0], ref[0], atol=1e-6) and torch.allclose(ours[1], ref[1], atol=1e-6))
    return same


def main(argv: list[str] | None = None) -> int:
    ap = device_parser(__doc__, "small batches, few repeats (a smoke run)")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads (0: torch's default); 1 is steadier on a loaded machine")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats, rounds = (3, 1) if args.quick else (40, 8)
    sections = {"views": views_fns(device, args.quick), "sequence": seq_fns(device, args.quick),
                "mix": mix_fns(device, args.quick)}
    res = {name: time_on_device(fns, device, repeats=repeats, warmup=1, rounds=rounds) for name, fns in sections.items()}
    med = {s: {k: v["median"] for k, v in r.items()} for s, r in res.items()}
    pairs = 3 if args.quick else 30
    paired = {"augmentation": paired_ratio(sections["views"], "one view", "two views", pairs),
              "device stage": paired_ratio(sections["views"], "one view, device stage", "two views, device stage", pairs)}
    ratios = {
        "two_views_over_one": med["views"]["two views"] / med["views"]["one view"],
        "two_views_over_one_device_stage": med["views"]["two views, device stage"] / med["views"]["one view, device stage"],
        "loop_over_batched_sequence": med["sequence"]["plain torch loop per sample"] / med["sequence"]["fastdata, batched"],
        "v2_over_fastdata_mixup": med["mix"]["v2 reference MixUp"] / med["mix"]["fastdata MixUp"],
        "v2_over_fastdata_cutmix": med["mix"]["v2 reference CutMix"] / med["mix"]["fastdata CutMix (incl. a batch copy)"],
    }
    same = check_same(device)

    def table(section: str) -> str:
        return markdown_table(["method", "ms/batch (median)", "p10–p90 ms", "min ms"], [
            [k, f"{r['median'] * 1e3:.2f}", f"{r['p10'] * 1e3:.2f}–{r['p90'] * 1e3:.2f}", f"{r['min'] * 1e3:.2f}"]
            for k, r in res[section].items()])

    info = machine_info()
    t, side, mside = (250, 56, 112) if args.quick else (1000, 112, 224)
    md = "\n\n".join([
        f"# Views, sequence ops, MixUp/CutMix ({'quick' if args.quick else 'full'} run, device {device})",
        torch_machine_line(info) + f"; {rounds} rounds, {repeats} timed calls per method.",
        f"## 1. Views (batch {B}, crops of {side}; goal: two views <= 2.2x one view)", table("views"),
        f"Two views / one view: **{ratios['two_views_over_one']:.2f}x** for the augmentation alone, "
        f"**{ratios['two_views_over_one_device_stage']:.2f}x** for the loader's device stage (uint8 batch to float, "
        "then augmentation: the conversion is shared by the views). Median of back-to-back pairs "
        f"(steadier under load): **{paired['augmentation']:.2f}x** and **{paired['device stage']:.2f}x**.",
        f"## 2. Sequence ops on a padded ({B}, {t}, 16) batch (goal: at least as fast as the baseline)",
        "torchaudio is not installed (no CPU wheel for this torch): the baseline is a plain torch loop per sample.",
        table("sequence"),
        f"Loop / batched: **{ratios['loop_over_batched_sequence']:.1f}x**.",
        f"## 3. MixUp / CutMix on {B} RGB {mside}x{mside} + 1000-class labels (goal: at least as fast as v2)",
        "torchvision is not installed: the baseline is a plain-torch copy of v2's MixUp/CutMix per batch, with "
        f"the same lambda and box (outputs equal: MixUp {same['MixUp']}, CutMix {same['CutMix']}). fastdata's "
        "CutMix row includes copying a fresh batch (the loader's own batch is written in place).",
        table("mix"),
        f"v2 reference / fastdata: MixUp **{ratios['v2_over_fastdata_mixup']:.2f}x**, CutMix "
        f"**{ratios['v2_over_fastdata_cutmix']:.2f}x**.",
    ])
    results = {"machine": info, "device": str(device), "timings_s": res, "ratios": ratios, "same_output": same,
               "two_views_over_one_paired": paired,
               "title": f"Views, sequence ops, MixUp/CutMix, {device} (batches/s)",
               "rows": [{"name": f"{s}: {k}", "samples_per_s": 1.0 / v} for s, r in med.items() for k, v in r.items()]}
    save_device_run("augment_views", args.quick, device, results, md, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
