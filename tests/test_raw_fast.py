"""Issue 16: raw images and variable-size samples at memory speed (behaviour, never timing).

Fixed-shape storage of same-size raw images, ragged reads into reused buffers with the padding
zeroed, mixed-size pixels placed straight into the image batch, the uint8 / float loader outputs,
the XXH3 checksums of format version 2 next to version 1 (SHA-256) datasets, and the ceilings
that ``fastdata bench`` reports ratios to.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import fastdata
import imagegen as g
from fastdata.measure import bench
from fastdata.errors import FormatError, UsageError
from fastdata.format import read_manifest
from fastdata.loaders import LoaderConfig
from fastdata.loaders.torch_backend import to_unit_float
from fastdata.measure.verify import check_shards

BACKENDS = ("hdf5", "lmdb")


def _images(src: Path, sizes: list[tuple[int, int]]) -> list[np.ndarray]:
    (src / "a").mkdir(parents=True)
    return [g.png_rgb(src / "a" / f"{i:03d}.png", h=h, w=w, seed=i) for i, (h, w) in enumerate(sizes)]


def _seqs(src: Path, n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    src.mkdir(parents=True)
    out = []
    for i in range(n):
        a = rng.standard_normal((int(rng.integers(0, 12)), 3)).astype("<f4")  # empty samples too
        np.save(src / f"{i:03d}.npy", a)
        out.append(a)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_size_raw_images_become_a_fixed_shape_field(tmp_path, backend):
    pixels = _images(tmp_path / "src", [(9, 7)] * 5)
    fastdata.convert(tmp_path / "src", tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=1), images=fastdata.ImageOptions(images="raw")))
    ds = fastdata.open(tmp_path / "ds")
    f = ds.manifest.fields[0]
    assert (f.name, f.shape, f.encoding, f.image.mode) == ("image", (9, 7, 3), "raw", "RGB")
    assert [x.name for x in ds.manifest.fields] == ["image", "label"]  # no shape companion needed
    np.testing.assert_array_equal(ds.get_batch([4, 0])["image"], np.stack([pixels[4], pixels[0]]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_size_raw_images_stay_ragged_and_read_padded_into_reused_buffers(tmp_path, backend):
    sizes = [(9, 7), (4, 11), (9, 7), (12, 3), (1, 1)]
    pixels = _images(tmp_path / "src", sizes)
    fastdata.convert(tmp_path / "src", tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=1), images=fastdata.ImageOptions(images="raw")))
    ds = fastdata.open(tmp_path / "ds")
    assert ds.manifest.fields[0].encoding == "pixels"
    idx = [3, 1, 4, 0]
    garbage = np.full(10_000, 0xAB, np.uint8)  # a reused buffer holds old bytes: padding must be zeroed
    for out in (None, {"image": garbage}):
        b = ds.get_batch(idx, out=out)
        img = b["image"]
        assert img.shape == (4, 12, 11, 3) and "image_lengths" not in b
        if out is not None:
            assert np.shares_memory(img, garbage)  # the padded batch lives in the caller's buffer
        for row, i in enumerate(idx):
            h, w = sizes[i]
            assert b["image_shape"][row].tolist() == [h, w, 3]
            np.testing.assert_array_equal(img[row, :h, :w], pixels[i])
            assert not img[row, h:].any() and not img[row, :h, w:].any()
    # a buffer too small is not used (a new array is made)
    b = ds.get_batch(idx, out={"image": np.zeros(10, np.uint8)})
    np.testing.assert_array_equal(b["image"][2, :1, :1], pixels[4])


@pytest.mark.parametrize("backend", BACKENDS)
def test_ragged_sequences_read_the_same_with_and_without_reused_buffers(tmp_path, backend):
    seqs = _seqs(tmp_path / "src", 40)
    fastdata.convert(tmp_path / "src", tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=1,
                                                                                   shard_size=300), no_labels=True))
    ds = fastdata.open(tmp_path / "ds")
    assert len(ds.manifest.shards) > 2
    rng = np.random.default_rng(1)
    buf = np.full(4096, np.nan, "<f4")
    for _ in range(5):
        idx = rng.integers(0, 40, 16)  # repeats and several shards
        fresh = ds.get_batch(idx)
        reused = ds.get_batch(idx, out={"x": buf})
        for b in (fresh, reused):
            assert b["x"].shape == (16, int(b["x_lengths"].max()), 3)
            for row, i in enumerate(idx.tolist()):
                n = len(seqs[i])
                assert b["x_lengths"][row] == n
                np.testing.assert_array_equal(b["x"][row, :n], seqs[i])
                assert not b["x"][row, n:].any()  # padding is zero, not the buffer's NaNs


@pytest.mark.parametrize("backend", BACKENDS)
def test_loader_reuses_ragged_buffers_without_touching_batches_kept(tmp_path, backend):
    seqs = _seqs(tmp_path / "src", 50, seed=2)
    fastdata.convert(tmp_path / "src", tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=1), no_labels=True))
    ld = fastdata.loader(tmp_path / "ds", 8, shuffle=False, device="cpu", num_workers=2)
    for _ in range(2):  # the second epoch reads into recycled buffers
        kept = [b for b in ld]
    for k, b in enumerate(kept):
        for row in range(len(b["x"])):
            want = seqs[8 * k + row]
            assert int(b["x_lengths"][row]) == len(want)
            np.testing.assert_array_equal(b["x"][row, : len(want)].numpy(), want)
            assert not b["x"][row, len(want):].any()
    ld.close()


def test_uint8_and_float_image_outputs(tmp_path):
    pixels = _images(tmp_path / "src", [(6, 5)] * 8)
    fastdata.convert(tmp_path / "src", tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1), images=fastdata.ImageOptions(images="raw")))
    raw = np.stack(pixels)
    u8 = fastdata.loader(tmp_path / "ds", 8, shuffle=False, device="cpu", num_workers=1,
                         config=LoaderConfig(image_dtype="uint8"))
    b = next(iter(u8))
    assert b["image"].dtype == torch.uint8 and tuple(b["image"].shape) == (8, 6, 5, 3)
    np.testing.assert_array_equal(b["image"].numpy(), raw)
    fl = fastdata.loader(tmp_path / "ds", 8, shuffle=False, device="cpu", num_workers=1)
    b = next(iter(fl))
    assert b["image"].dtype == torch.float32 and tuple(b["image"].shape) == (8, 3, 6, 5)
    torch.testing.assert_close(b["image"], torch.from_numpy(raw).permute(0, 3, 1, 2).float() / 255)
    with pytest.raises(UsageError, match="image_dtype"):
        LoaderConfig(image_dtype="float16")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="augmentation needs float"):
        fastdata.loader(tmp_path / "ds", 8, device="cpu", augment=[fastdata.augment.HorizontalFlip()],
                        config=LoaderConfig(image_dtype="uint8"))
    u8.close()
    fl.close()


def test_to_unit_float_matches_division():
    x = torch.randint(0, 256, (3, 70_001), dtype=torch.uint8)
    out = torch.full(x.shape, -1.0)
    to_unit_float(x, out)
    torch.testing.assert_close(out, x.float() / 255)


def _as_version_1(root: Path) -> None:
    """Rewrite a dataset's manifest as format version 1 wrote it: SHA-256 under "sha256"."""
    m = json.loads((root / "manifest.json").read_text())
    m["version"] = 1
    for s in m["shards"]:
        del s["checksum"]
        s["sha256"] = hashlib.sha256((root / s["file"]).read_bytes()).hexdigest()
    (root / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("backend", BACKENDS)
def test_version_2_checksums_and_version_1_datasets_still_open_and_verify(tmp_path, backend):
    seqs = _seqs(tmp_path / "src", 12)
    fastdata.convert(tmp_path / "src", tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend=backend, workers=1), no_labels=True))
    m = read_manifest(tmp_path / "ds")
    assert m.version >= 2 and all(s.checksum.startswith("xxh3_128:") and len(s.checksum) == 9 + 32 for s in m.shards)
    assert check_shards(tmp_path / "ds", m) == []
    _as_version_1(tmp_path / "ds")
    old = read_manifest(tmp_path / "ds")
    assert old.version == 1 and old.shards[0].checksum_algorithm == "sha256"
    assert check_shards(tmp_path / "ds", old) == []
    np.testing.assert_array_equal(fastdata.open(tmp_path / "ds")[5]["x"], seqs[5])
    shard = tmp_path / "ds" / old.shards[0].file
    blob = bytearray(shard.read_bytes())
    blob[len(blob) // 2] ^= 0x01  # one flipped bit: SHA-256 (version 1) catches it
    shard.write_bytes(bytes(blob))
    problems = check_shards(tmp_path / "ds", old)
    assert len(problems) == 1 and "checksum is sha256:" in problems[0].message


def test_flipped_byte_is_caught_by_the_xxh3_checksum(tmp_path):
    _seqs(tmp_path / "src", 12)
    fastdata.convert(tmp_path / "src", tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1), no_labels=True))
    m = read_manifest(tmp_path / "ds")
    shard = tmp_path / "ds" / m.shards[0].file
    blob = bytearray(shard.read_bytes())
    for pos in (0, len(blob) // 3, len(blob) - 1):
        damaged = bytearray(blob)
        damaged[pos] ^= 0x80
        shard.write_bytes(bytes(damaged))
        problems = check_shards(tmp_path / "ds", m)
        assert len(problems) == 1 and "checksum is xxh3_128:" in problems[0].message
    shard.write_bytes(bytes(blob))
    assert check_shards(tmp_path / "ds", m) == []


@pytest.mark.parametrize("checksum", ["md5:" + "0" * 32, "xxh3_128:" + "0" * 31, "0" * 64, None])
def test_version_2_manifest_with_a_bad_checksum_is_refused(tmp_path, checksum):
    _seqs(tmp_path / "src", 3)
    fastdata.convert(tmp_path / "src", tmp_path / "ds", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1), no_labels=True))
    m = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    m["shards"][0]["checksum"] = checksum
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FormatError, match="bad checksum"):
        fastdata.open(tmp_path / "ds")


def test_bench_ceiling_is_a_gather_for_raw_data_and_decoding_for_encoded_images(tmp_path, run_cli):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    for i in range(6):
        g.jpeg(src / "a" / f"{i}.jpg", seed=i)
    fastdata.convert(src, tmp_path / "enc", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1), images=fastdata.ImageOptions(images="encoded")))
    fastdata.convert(src, tmp_path / "raw", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1), images=fastdata.ImageOptions(images="raw")))
    dec = bench.measure_ceiling(fastdata.open(tmp_path / "enc"), 4, threads=2, max_seconds=0.1)
    gat = bench.measure_ceiling(fastdata.open(tmp_path / "raw"), 4, threads=2, max_seconds=0.1)
    assert dec.settings["kind"] == "decode" and dec.samples_per_s > 0
    assert gat.settings["kind"] == "memcpy gather" and gat.samples_per_s > 0
    code, out, _ = run_cli("bench", tmp_path / "raw", "--batches", "3", "--seconds", "1", "--batch-size", "2")
    assert code == 0 and "x ceiling" in out and "memcpy gather" in out
    code, out, _ = run_cli("bench", tmp_path / "enc", "--batches", "3", "--seconds", "1", "--batch-size", "2", "--json")
    rows = json.loads(out)["results"]
    assert code == 0 and rows[-1]["ceiling_ratio"] == 1.0 and rows[0]["ceiling_ratio"] > 0


def test_ceiling_rate_counts_parallel_batches_once():
    """Batches run ``threads`` at a time: the rate is samples over wall time, not over the sum of
    per-batch times (which would multiply it by the thread count). Sleeping jobs: a slower machine
    only lowers the rate, so the upper bound holds under any load."""
    import time

    def job(k: int) -> int:
        time.sleep(0.05)
        return 10

    r = bench._run_batches("sleep", job, 2, 0.3, 1.0, {})
    assert 0 < r.samples_per_s <= 2 * 10 / 0.05 * 1.02  # 400/s at most; the old sum gave 800/s
    assert r.batch_ms_median >= 0.05 / 2 * 1e3 * 0.98  # a batch's share of its round

