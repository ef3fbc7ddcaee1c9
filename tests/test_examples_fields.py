"""The four example pipelines of docs/convert.md and docs/loader.md, run end to end: data made here,
converted from a metadata table, split train/val, loaded with a sampler and fed to fastdata.train.fit
for a few steps. Every field is checked bit for bit against the source (images, keypoints, angles,
strings, masks, keys)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata import train
from fastdata.reading.samplers import Episodic, Weighted

BACKENDS = ["hdf5", "lmdb"]


def _write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        a = np.asarray(im)
    return a if a.ndim == 3 else a[:, :, None]


def _check_all(ds: fastdata.Dataset, truth: dict[str, dict[str, object]]) -> None:
    """Every sample of ``ds``, field by field, equals ``truth[key][field]`` exactly."""
    assert len(ds) == len(truth)
    batch = ds.get_batch(np.arange(len(ds)))
    for i, key in enumerate(batch["key"]):
        for name, want in truth[key].items():
            got = batch[name][i]
            if isinstance(want, str):
                assert got == want, (key, name)
            else:
                want = np.asarray(want)
                if name + "_lengths" in batch:
                    got = got[: batch[name + "_lengths"][i]]
                if got.ndim == 3 and want.ndim == 3:  # padded image batch
                    got = got[: want.shape[0], : want.shape[1]]
                assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), (key, name)


def _fit(loader, model, loss_fn, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    res = train.fit(model, loader, opt, loss_fn, epochs=1, max_steps=steps, log_every=0)
    assert res.steps == min(steps, len(loader))
    return res


@pytest.mark.parametrize("backend", BACKENDS)
def test_pose_keypoints_episodic(tmp_path, backend):
    """Pose: image + 17 keypoints (x, y, visibility), trained episodically (N classes x K shots)."""
    src = tmp_path / "pose"
    (src / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows, truth = [], {}
    for i in range(24):
        img = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
        rel = f"images/{i:03d}.png"
        Image.fromarray(img).save(src / rel)
        kp = np.concatenate([rng.random((17, 2)) * 16, rng.integers(0, 3, (17, 1))], axis=1).astype(np.float32)
        species = ["cat", "dog", "horse", "cow"][i % 4]
        rows.append({"path": rel, "keypoints": json.dumps(kp.tolist()), "label": species})
        truth[rel] = {"image": img, "keypoints": kp}
    _write_csv(src / "train.csv", rows)
    (src / "README.txt").write_text("pose data")  # not a sample: skipped with a warning

    dst = tmp_path / "pose.fd"
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=1), meta_types={"keypoints": fastdata.converters.ColumnType("float32", (17, 3))}), meta=src / "train.csv")
    ds = fastdata.open(dst, fields=["image", "keypoints", "label", "key"])
    _check_all(ds, truth)
    assert ds.classes == ["cat", "cow", "dog", "horse"]

    parts = ds.split({"train": 0.75, "val": 0.25}, seed=0, stratify="label")
    assert len(parts["train"]) == 18 and len(parts["val"]) == 6
    assert not set(parts["train"].keys(range(18))) & set(parts["val"].keys(range(6)))
    ld = fastdata.loader(parts["train"], None, sampler=Episodic(n_way=2, k_shot=2, n_query=1, episodes_per_epoch=4),
                         fields=["image", "keypoints", "label"], device="cpu", num_workers=1)
    first = next(iter(ld))
    assert first["image"].shape == (6, 3, 16, 16) and first["keypoints"].shape == (6, 17, 3)
    support = first["label"][:4].tolist()
    assert support[0] == support[1] and support[2] == support[3] and support[0] != support[2]
    assert first["label"][4:].tolist() == [support[0], support[2]]  # queries in the support's class order

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 17 * 3))

    def loss(m, b):
        visible = (b["keypoints"][:, :, 2] > 0).unsqueeze(-1)
        err = (m(b["image"]).view(-1, 17, 3)[:, :, :2] - b["keypoints"][:, :, :2]) ** 2
        return (err * visible).mean()

    _fit(ld, model, loss)


@pytest.mark.parametrize("backend", BACKENDS)
def test_head_pose_angles_subject(tmp_path, backend):
    """Head pose: image + three float angles and the subject id (a string), evaluated per file."""
    src = tmp_path / "heads"
    src.mkdir()
    rng = np.random.default_rng(1)
    lines, truth = [], {}
    for i in range(25):
        img = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
        rel = f"s{i % 5}_{i:02d}.png"
        Image.fromarray(img).save(src / rel)
        angles = (rng.random(3) * 180 - 90).astype(np.float32)
        subject = f"subject-{i % 5}-é"  # non-ASCII survives
        lines.append(json.dumps({"path": rel, "angles": angles.tolist(), "subject": subject}))
        truth[rel] = {"image": img, "angles": angles, "subject": subject}
    (src / "meta.jsonl").write_text("\n".join(lines) + "\n")
    dst = tmp_path / "heads.fd"
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=1)), meta=src / "meta.jsonl")
    ds = fastdata.open(dst, fields=["image", "angles", "subject", "key"])
    _check_all(ds, truth)

    parts = ds.split({"train": 0.8, "val": 0.2}, seed=3, stratify="subject")
    val_subjects = parts["val"].column("subject")
    assert sorted(val_subjects.tolist()) == sorted(f"subject-{k}-é" for k in range(5))  # one per subject
    ld = fastdata.loader(parts["train"], 4, sampler=Weighted("balanced", by="subject"), device="cpu",
                         num_workers=1, fields=["image", "angles", "subject", "key"])
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 12 * 12, 3))
    _fit(ld, model, lambda m, b: torch.nn.functional.l1_loss(m(b["image"]), b["angles"]))
    # evaluation per file: every validation prediction names its file and its true angles
    evl = fastdata.loader(parts["val"], 2, shuffle=False, device="cpu", num_workers=0,
                          fields=["image", "angles", "key"])
    seen = []
    for b in evl:
        for key, a in zip(b["key"], b["angles"]):
            assert np.array_equal(a.numpy(), truth[key]["angles"])
            seen.append(key)
    assert sorted(seen) == sorted(parts["val"].keys(range(len(parts["val"]))))


@pytest.mark.parametrize("backend", BACKENDS)
def test_sequences_ragged_npy_parquet(tmp_path, backend):
    """Variable-length .npy sequences + label + recording id, from a Parquet table, with a sampler of
    your own (the protocol: a pure function of (n, world, seed, epoch) returning batches)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "seqs"
    (src / "rec").mkdir(parents=True)
    rng = np.random.default_rng(2)
    paths, labels, recs, truth = [], [], [], {}
    for i in range(16):
        x = rng.standard_normal((int(rng.integers(3, 11)), 8)).astype(np.float32)
        rel = f"rec/{i:02d}.npy"
        np.save(src / rel, x)
        paths.append(rel)
        labels.append(i % 2)
        recs.append(f"rec{i // 4}")
        truth[rel] = {"x": x, "label": np.int64(i % 2), "recording": f"rec{i // 4}"}
    pq.write_table(pa.table({"path": paths, "label": labels, "recording": recs}), src / "meta.parquet")
    dst = tmp_path / "seqs.fd"
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=1)), meta=src / "meta.parquet")
    ds = fastdata.open(dst, fields=["x", "label", "recording", "key"])
    assert ds.manifest.field("x").ragged
    _check_all(ds, truth)

    # a validation split by recording: whole recordings stay together (keys select the subset)
    keys = ds.keys(range(len(ds)))
    val = ds.subset([k for k, r in zip(keys, recs) if r == "rec3"])
    train_ds = ds.subset(np.array([r != "rec3" for r in recs]))
    assert len(val) == 4 and len(train_ds) == 12

    def short_first(n, world, seed, epoch):  # batches of 4, shortest sequences first, epoch-shuffled within
        order = np.random.default_rng([seed, epoch]).permutation(n)
        return [order[a : a + 4] for a in range(0, n, 4)]

    ld = fastdata.loader(train_ds, 4, sampler=short_first, device="cpu", num_workers=1, fields=["x", "label"])
    assert len(ld) == 3
    model = torch.nn.Linear(8, 2)

    def loss(m, b):
        lengths = b["x_lengths"].clamp(min=1).unsqueeze(1)
        return torch.nn.functional.cross_entropy(m(b["x"].sum(1) / lengths), b["label"])

    _fit(ld, model, loss)


@pytest.mark.parametrize("backend", BACKENDS)
def test_segmentation_masks(tmp_path, backend):
    """Segmentation: image + mask PNG (palette indices stay class indices)."""
    src = tmp_path / "seg"
    (src / "img").mkdir(parents=True)
    (src / "mask").mkdir()
    rng = np.random.default_rng(3)
    rows, truth = [], {}
    for i in range(12):
        h, w = 8 + i % 3, 10
        img = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        mask = rng.integers(0, 4, (h, w), dtype=np.uint8)
        Image.fromarray(img).save(src / f"img/{i}.png")
        m = Image.fromarray(mask, mode="L").convert("P") if i % 2 else Image.fromarray(mask, mode="L")
        if i % 2:
            m.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255] + [0] * (256 * 3 - 12))
        m.save(src / f"mask/{i}.png")
        rows.append({"path": f"img/{i}.png", "mask": f"mask/{i}.png"})
        truth[f"img/{i}.png"] = {"image": img, "mask": _pixels(src / f"mask/{i}.png")}
        assert np.array_equal(truth[f"img/{i}.png"]["mask"][:, :, 0], mask)
    _write_csv(src / "meta.csv", rows)
    dst = tmp_path / "seg.fd"
    fastdata.convert(src, dst, fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=1)), meta=src / "meta.csv")
    ds = fastdata.open(dst, fields=["image", "mask", "key"])
    _check_all(ds, truth)

    parts = ds.split({"train": 0.75, "val": 0.25}, seed=0)
    ld = fastdata.loader(parts["train"], 3, device="cpu", num_workers=1, fields=["image", "mask"],
                         config=fastdata.LoaderConfig(images=("image",)))  # the mask stays uint8 class indices
    b = next(iter(ld))
    assert b["mask"].dtype == torch.uint8 and b["image"].dtype == torch.float32
    model = torch.nn.Conv2d(3, 4, 1)

    def loss(m, b):
        target = b["mask"][..., 0].long()
        return torch.nn.functional.cross_entropy(m(b["image"]), target)

    _fit(ld, model, loss)
