"""``Dataset.get_batch(ragged="packed")``: ragged fields and mixed-size images back to back, no padding.

Checked against the padded batch of the same indices (which the rest of the suite checks against
the source files), on both backends, with repeats, empty samples and reused ``out=`` buffers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import fastdata
import imagegen as g
from scenarios.kit import quiet_trainer
from fastdata.errors import UsageError

BACKENDS = ("hdf5", "lmdb")


def _unpack(batch: dict, name: str, k: int, pixels: bool = True) -> np.ndarray:
    o = batch[name + "_offsets"]
    x = batch[name][o[k] : o[k + 1]]
    return x.reshape(batch[name + "_shape"][k]) if pixels and name + "_shape" in batch else x


def _seq_dataset(tmp_path: Path, backend: str) -> tuple[Path, list[np.ndarray]]:
    rng = np.random.default_rng(3)
    src = tmp_path / "seqs"
    src.mkdir()
    seqs = []
    for i in range(30):
        a = rng.standard_normal((int(rng.integers(0, 9)), 4)).astype("<f4")  # empty samples too
        np.save(src / f"{i:03d}.npy", a)
        seqs.append(a)
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=1, shard_size=300), no_labels=True))
    return tmp_path / "ds", seqs


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_sequences_equal_the_source_in_batch_order(tmp_path, backend):
    root, seqs = _seq_dataset(tmp_path, backend)
    ds = fastdata.open(root)
    assert len(ds.manifest.shards) > 1  # batches cross shards
    idx = [29, 3, 3, 0, 17, 8, 22, 1]  # any order, a repeat
    b = ds.get_batch(idx, ragged="packed")
    assert b["x"].shape == (sum(len(seqs[i]) for i in idx), 4)
    np.testing.assert_array_equal(b["x_lengths"], [len(seqs[i]) for i in idx])
    assert b["x_offsets"][0] == 0 and b["x_offsets"][-1] == len(b["x"])
    for k, i in enumerate(idx):
        np.testing.assert_array_equal(_unpack(b, "x", k), seqs[i])
    padded = ds.get_batch(idx)
    np.testing.assert_array_equal(padded["x_lengths"], b["x_lengths"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_mixed_size_images_equal_the_padded_batch(tmp_path, backend):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    sizes = [(9, 7), (5, 11), (12, 4), (6, 6), (9, 7)]
    pixels = [g.png_rgb(src / "a" / f"{i:03d}.png", h=h, w=w, seed=i) for i, (h, w) in enumerate(sizes)]
    fastdata.convert(src, tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=1), images=fastdata.ImageOptions(images="raw")))
    ds = fastdata.open(tmp_path / "ds")
    idx = [4, 1, 2, 0, 1]
    b = ds.get_batch(idx, ragged="packed")
    assert b["image"].dtype == np.uint8 and b["image"].ndim == 1  # bytes, back to back
    assert b["image"].size == sum(int(np.prod(pixels[i].shape)) for i in idx)
    np.testing.assert_array_equal(b["label"], ds.get_batch(idx)["label"])
    for k, i in enumerate(idx):
        np.testing.assert_array_equal(_unpack(b, "image", k), pixels[i])


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_batches_reuse_out_buffers_and_leave_no_stale_bytes(tmp_path, backend):
    root, seqs = _seq_dataset(tmp_path, backend)
    ds = fastdata.open(root)
    buf = np.full(10_000, np.nan, dtype="<f4")
    out = {"x": buf}
    for idx in ([5, 6, 7, 8], [9, 2], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]):
        b = ds.get_batch(idx, out=out, ragged="packed")
        assert np.shares_memory(b["x"], buf)
        for k, i in enumerate(idx):
            np.testing.assert_array_equal(_unpack(b, "x", k), seqs[i])
    b = ds.get_batch(list(range(30)), out={"x": np.empty(3, dtype="<f4")}, ragged="packed")  # too small: a new array
    for i in range(30):
        np.testing.assert_array_equal(_unpack(b, "x", i), seqs[i])


def test_packed_refuses_what_it_cannot_do(tmp_path):
    root, _ = _seq_dataset(tmp_path, "hdf5")
    with pytest.raises(UsageError, match="'padded' or 'packed'"):
        fastdata.open(root).get_batch([0], ragged="flat")  # type: ignore[arg-type]
    src = tmp_path / "jpg"
    (src / "a").mkdir(parents=True)
    for i in range(3):
        g.jpeg(src / "a" / f"{i}.jpg", h=8 + i, w=6, seed=i)
    fastdata.convert(src, tmp_path / "enc", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)))
    with pytest.raises(UsageError, match="decode=False"):
        fastdata.open(tmp_path / "enc").get_batch([0, 1], ragged="packed")
    raw = fastdata.open(tmp_path / "enc", decode=False).get_batch([2, 0], ragged="packed")  # stored bytes, packed
    stored = [(src / "a" / f"{i}.jpg").read_bytes() for i in (2, 0)]
    assert [_unpack(raw, "image", k, pixels=False).tobytes() for k in range(2)] == stored


@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_loader_packed_batches_make_nested_tensors(tmp_path, mode):
    import torch

    from fastdata.loaders import LoaderConfig

    root, seqs = _seq_dataset(tmp_path, "lmdb")
    cfg = LoaderConfig(ragged="packed", mode=mode)  # type: ignore[arg-type]
    seen = []
    with fastdata.loader(root, 7, device="cpu", num_workers=1, fields=["x"], config=cfg) as ld:
        plan = ld.plan(0)
        for k, b in enumerate(ld):
            assert b["x"].dim() == 2 and b["x_offsets"].shape == (len(b["x_lengths"]) + 1,)
            nt = torch.nested.nested_tensor_from_jagged(b["x"], b["x_offsets"])
            for j, i in enumerate(plan[k].tolist()):
                np.testing.assert_array_equal(nt[j].numpy(), seqs[i])
                seen.append(i)
    assert sorted(seen) == list(range(30))


def test_loader_packed_refusals(tmp_path):
    from fastdata.loaders import LoaderConfig

    with pytest.raises(UsageError, match="'padded' or 'packed'"):
        LoaderConfig(ragged="jagged")  # type: ignore[arg-type]
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    pixels = [g.png_rgb(src / "a" / f"{i}.png", h=5 + i, w=7, seed=i) for i in range(4)]
    fastdata.convert(src, tmp_path / "mixed", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1), images=fastdata.ImageOptions(images="raw")))
    with pytest.raises(UsageError, match="image_dtype='uint8'"):
        fastdata.loader(tmp_path / "mixed", 2, device="cpu", config=LoaderConfig(ragged="packed"))
    cfg = LoaderConfig(ragged="packed", image_dtype="uint8")
    with fastdata.loader(tmp_path / "mixed", 4, device="cpu", shuffle=False, config=cfg) as ld:
        b = next(iter(ld))
        for k in range(4):
            o = b["image_offsets"]
            np.testing.assert_array_equal(b["image"][o[k] : o[k + 1]].reshape(*b["image_shape"][k]).numpy(), pixels[k])
    jpg = tmp_path / "jpg"
    (jpg / "a").mkdir(parents=True)
    for i in range(2):
        g.jpeg(jpg / "a" / f"{i}.jpg", h=8 + i, w=6, seed=i)
    fastdata.convert(jpg, tmp_path / "enc", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)))
    with pytest.raises(UsageError, match="decode=False"):
        fastdata.loader(tmp_path / "enc", 2, device="cpu", backend="torch", config=LoaderConfig(ragged="packed"))


def test_dali_backend_refuses_packed_batches(tmp_path):
    pytest.importorskip("nvidia.dali")
    from fastdata.loaders import LoaderConfig

    root, _ = _seq_dataset(tmp_path, "hdf5")
    with pytest.raises(UsageError, match="padded batches only"):
        fastdata.loader(root, 2, device="cpu", backend="dali", config=LoaderConfig(ragged="packed"))


def test_lightning_trains_on_packed_sequences_as_nested_tensors(tmp_path):
    """Lightning passes packed batches through unchanged: a jagged nested tensor per batch, every
    sample once per epoch (the step logs with batch_size=B: a packed field's first dimension is rows)."""
    L = pytest.importorskip("lightning")
    import torch

    from fastdata.loaders import LoaderConfig

    root, seqs = _seq_dataset(tmp_path, "hdf5")
    ld = fastdata.loader(root, 8, device="cpu", num_workers=1, fields=["x"], config=LoaderConfig(ragged="packed"))
    seen: list[float] = []
    sizes: list[int] = []

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            nt = torch.nested.nested_tensor_from_jagged(batch["x"], batch["x_offsets"])
            sums = torch.stack([t.sum() for t in nt.unbind()])  # one value per sample, empty ones 0
            seen.extend(sums.tolist())
            sizes.append(len(batch["x_lengths"]))
            loss = self.lin(batch["x"]).pow(2).mean() if len(batch["x"]) else self.lin.weight.sum() * 0
            self.log("loss", loss, batch_size=len(batch["x_lengths"]))
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    quiet_trainer(max_epochs=2, default_root_dir=tmp_path).fit(Model(), train_dataloaders=ld)
    ld.close()
    expect = sorted([float(s.sum()) for s in seqs] * 2)
    np.testing.assert_allclose(sorted(seen), expect, rtol=1e-5, atol=1e-5)
    assert sum(sizes) == 60
