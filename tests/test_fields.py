"""Issue 14: metadata tables, string fields, keys, subsets and splits, samplers, float labels, bad input."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import edit_manifest, make_class_folder

import fastdata
from fastdata.errors import DataError, UsageError
from fastdata.reading.samplers import Episodic, Weighted, rank_batches
from fastdata.world import World


def _table_folder(root: Path, n: int = 8, kp_len: int | None = None) -> Path:
    root.mkdir(parents=True)
    rows = []
    for i in range(n):
        np.save(root / f"s{i}.npy", np.full((2,), i, np.float32))
        rows.append({"path": f"s{i}.npy", "kp": json.dumps([[i, 1, 2]] * (kp_len or 4)), "name": f"n{i}",
                     "score": str(i / 2), "ok": "true" if i % 2 else "false", "cls": str(i % 3)})
    _csv(root / "meta.csv", rows)
    return root


def _csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _edit_row(path: Path, row: int, column: str, value: str) -> None:
    rows = list(csv.DictReader(open(path)))
    rows[row][column] = value
    _csv(path, rows)


def test_table_types_are_inferred_and_round_trip(tmp_path):
    src = _table_folder(tmp_path / "src")
    fastdata.convert(src, tmp_path / "ds", meta=src / "meta.csv")
    ds = fastdata.open(tmp_path / "ds", fields=["x", "kp", "name", "score", "ok", "cls", "key"])
    m = ds.manifest
    assert (m.field("kp").dtype, m.field("kp").shape) == ("<i8", (4, 3))
    assert m.field("score").dtype == "<f4" and m.field("ok").dtype == "|b1" and m.field("cls").dtype == "<i8"
    assert m.field("name").encoding == "utf8"
    b = ds.get_batch([3, 0])
    assert b["name"] == ["n3", "n0"] and b["key"] == ["s3.npy", "s0.npy"]
    assert b["score"].tolist() == [1.5, 0.0] and b["ok"].tolist() == [True, False]
    assert ds[5]["name"] == "n5" and ds.index_of("s5.npy") == 5 and ds.key(-1) == "s7.npy"
    with pytest.raises(KeyError):
        ds.index_of("nope.npy")


def test_table_as_the_whole_source_and_forced_types(tmp_path, run_cli):
    src = _table_folder(tmp_path / "src")
    code, _, err = run_cli("convert", src / "meta.csv", tmp_path / "ds", "--meta-type", "kp=float64:12",
                           "--meta-type", "cls=str", "--quiet")
    assert code == 0, err
    ds = fastdata.open(tmp_path / "ds", fields=["kp", "cls"])
    assert ds.manifest.field("kp").shape == (12,) and ds.manifest.field("kp").dtype == "<f8"
    assert ds.get_batch([4])["cls"] == ["1"]


@pytest.mark.parametrize("edit,expect", [
    (lambda src: _edit_row(src / "meta.csv", 2, "score", "abc"), r"meta.csv: row 3 \(line 4\), column 'score': 'abc' is not a number"),
    (lambda src: _edit_row(src / "meta.csv", 1, "path", "s0.npy"), r"row 2 \(line 3\), column 'path': duplicate path 's0.npy'"),
    (lambda src: _edit_row(src / "meta.csv", 4, "path", "../x.npy"), r"row 5 \(line 6\), column 'path': path '../x.npy' leads out of"),
    (lambda src: _edit_row(src / "meta.csv", 4, "path", "/etc/passwd"), r"row 5 \(line 6\), column 'path': path '/etc/passwd' is not relative"),
    (lambda src: _edit_row(src / "meta.csv", 3, "path", "gone.npy"), r"row 4 \(line 5\), column 'path': file 'gone.npy' not found"),
    (lambda src: np.save(src / "extra.npy", np.zeros(2, np.float32)), r"extra.npy: a sample file that .*meta.csv does not list"),
    (lambda src: _csv(src / "meta.csv", [{**r, "label": "" if r["path"] == "s3.npy" else "cat"}
                                         for r in csv.DictReader(open(src / "meta.csv"))]),
     r"row 4 \(line 5\), column 'label': empty cell: every sample needs a label"),
    (lambda src: _edit_row(src / "meta.csv", 6, "kp", "[[1, 2, 3]]"), r"row 7 \(line 8\), column 'kp': has 3 values \(shape \[1, 3\]\), the column's shape \[4, 3\] needs 12"),
])
def test_bad_table_rows_are_one_line_errors_and_nothing_is_written(tmp_path, run_cli, edit, expect):
    import re

    src = _table_folder(tmp_path / "src")
    edit(src)
    types = ["--meta-type", "kp=float32:4,3"]
    code, out, err = run_cli("convert", src, tmp_path / "ds", "--meta", src / "meta.csv", *types, "--quiet")
    assert code == 1 and re.search(expect, err), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "ds").exists()
    code, out, err = run_cli("convert", src, tmp_path / "ds", "--meta", src / "meta.csv", *types, "--skip-bad",
                             "--quiet")
    assert code == 0, err
    skipped = json.loads((tmp_path / "ds" / "skipped.json").read_text())
    assert any(re.search(expect, e["reason"]) for e in skipped)  # (a row moved off a file leaves it unlisted too)
    assert len(fastdata.open(tmp_path / "ds")) == (8 if "extra" in expect else 7)


def test_parquet_and_jsonl_lists_become_ragged_fields(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    src = _table_folder(tmp_path / "src", n=4)
    boxes = [[[0, 0, 1, 1]] * k for k in range(4)]
    pq.write_table(pa.table({"path": [f"s{i}.npy" for i in range(4)], "boxes": boxes}), src / "m.parquet")
    (src / "meta.csv").unlink()
    fastdata.convert(src, tmp_path / "ds", meta=src / "m.parquet")
    ds = fastdata.open(tmp_path / "ds", fields=["boxes"])
    assert ds.manifest.field("boxes").shape == (None, 4)
    b = ds.get_batch([0, 3])
    assert b["boxes_lengths"].tolist() == [0, 3] and b["boxes"].shape == (2, 3, 4)


def test_float_and_vector_labels_without_a_table(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        np.save(src / f"{i}.npy", np.zeros(3, np.float32))
    (src / "..").resolve()
    (tmp_path / "reg.csv").write_text("path,label\n" + "".join(f"{i}.npy,{i * 0.25}\n" for i in range(4)))
    fastdata.convert(src, tmp_path / "a", labels=tmp_path / "reg.csv")
    a = fastdata.open(tmp_path / "a")
    assert a.manifest.field("label").dtype == "<f4" and a.get_batch([3])["label"].tolist() == [0.75]
    (tmp_path / "vec.json").write_text(json.dumps({f"{i}.npy": [i, 0.5, -1.0] for i in range(4)}))
    fastdata.convert(src, tmp_path / "b", labels=tmp_path / "vec.json")
    b = fastdata.open(tmp_path / "b")
    assert b.manifest.field("label").shape == (3,) and b.get_batch([2])["label"].tolist() == [[2.0, 0.5, -1.0]]


def test_stray_files_next_to_class_folders(tmp_path):
    src = tmp_path / "src"
    make_class_folder(src, per_class=2)
    (src / "README.txt").write_text("about")
    (src / "manifest.json").write_text("{}")
    fastdata.convert(src, tmp_path / "ok")  # ImageFolder-like: ignored
    assert fastdata.open(tmp_path / "ok").classes == ["cat", "dog", "eel"]
    np.save(src / "stray.npy", np.zeros((2, 6, 3, 3), np.float32))
    with pytest.raises(DataError, match="mixed layout.*stray.npy.*move it into a class folder"):
        fastdata.convert(src, tmp_path / "bad")


def test_format_v1_datasets_still_open(tmp_path):
    src = tmp_path / "src"
    make_class_folder(src, per_class=2)
    fastdata.convert(src, tmp_path / "ds")
    (tmp_path / "ds" / "keys.bin").unlink()

    def to_v1(m):  # what an older fastdata wrote: no keys, SHA-256 shard checksums
        import hashlib

        m["version"] = 1
        m.pop("keys")
        for sh in m["shards"]:
            sh.pop("checksum")
            sh["sha256"] = hashlib.sha256((tmp_path / "ds" / sh["file"]).read_bytes()).hexdigest()

    edit_manifest(tmp_path / "ds", to_v1)
    ds = fastdata.open(tmp_path / "ds")
    assert len(ds) == 6 and ds.get_batch([1])["label"].tolist() == [0]
    with pytest.raises(UsageError, match=r"no sample keys \(format version 1"):
        ds.key(0)
    with pytest.raises(UsageError, match="has no sample keys"):
        fastdata.open(tmp_path / "ds", fields=["x", "key"])


def test_keys_file_is_checked(tmp_path):
    src = tmp_path / "src"
    make_class_folder(src, per_class=2)
    fastdata.convert(src, tmp_path / "ds")
    kb = tmp_path / "ds" / "keys.bin"
    kb.write_bytes(kb.read_bytes()[:-3])
    from fastdata.measure.verify import verify

    assert not verify(tmp_path / "ds").ok
    with pytest.raises(fastdata.errors.CorruptShardError, match="keys.bin.*truncated or replaced"):
        fastdata.open(tmp_path / "ds").key(0)


def test_array_sources_are_keyed_by_row(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(10.0).reshape(5, 2))
    fastdata.convert(tmp_path / "x.npy", tmp_path / "ds")
    ds = fastdata.open(tmp_path / "ds", fields=["x", "key"])
    assert ds.get_batch([4, 1])["key"] == ["4", "1"] and ds.index_of("3") == 3


# --- subsets and splits ---------------------------------------------------------------------------


@pytest.fixture
def labelled(tmp_path):
    src = tmp_path / "src"
    make_class_folder(src, per_class=10, shape=(2,))
    fastdata.convert(src, tmp_path / "ds")
    return fastdata.open(tmp_path / "ds", fields=["x", "label", "key"])


def test_subset_by_indices_keys_and_mask(labelled):
    ds = labelled
    v = ds.subset([5, 2, 29])
    assert len(v) == 3 and v.keys([0, 1, 2]) == ds.keys([5, 2, 29])
    assert np.array_equal(v.get_batch([2, 0])["x"], ds.get_batch([29, 5])["x"])
    assert v.index_of(ds.key(2)) == 1
    with pytest.raises(KeyError):
        v.index_of(ds.key(3))
    assert ds.subset([ds.key(7), ds.key(1)]).keys([0, 1]) == [ds.key(7), ds.key(1)]
    mask = np.zeros(len(ds), bool)
    mask[[1, 3]] = True
    vv = ds.subset(mask).subset([1])  # a subset of a subset
    assert vv.key(0) == ds.key(3)
    for bad in ([1, 1], [30], np.zeros(3, bool), ["missing.npy"]):
        with pytest.raises(UsageError):
            ds.subset(bad)


def test_split_is_deterministic_disjoint_and_stratified(labelled):
    a = labelled.split({"train": 0.7, "val": 0.3}, seed=5, stratify="label")
    b = labelled.split({"train": 0.7, "val": 0.3}, seed=5, stratify="label")
    ka = {k: set(v.keys(range(len(v)))) for k, v in a.items()}
    assert ka == {k: set(v.keys(range(len(v)))) for k, v in b.items()}
    assert not ka["train"] & ka["val"] and len(ka["train"] | ka["val"]) == 30
    assert np.bincount(a["val"].column("label")).tolist() == [3, 3, 3]
    c = labelled.split({"train": 0.7, "val": 0.3}, seed=6)
    assert {k: set(v.keys(range(len(v)))) for k, v in c.items()} != ka
    with pytest.raises(UsageError):
        labelled.split({"a": 0.8, "b": 0.8})


def test_loader_on_a_subset_ranks_and_resume(labelled):
    val = labelled.split({"train": 0.6, "val": 0.4}, seed=1)["val"]
    shares = []
    for rank in range(2):
        ld = fastdata.loader(val, 3, device="cpu", num_workers=0, seed=4)
        ld._fixed_world = World(rank=rank, size=2)  # as a torch.distributed rank would see it
        shares.append([k for b in ld for k in b["key"]])
    assert len(shares[0]) == len(shares[1]) == 6
    assert set(shares[0]) | set(shares[1]) == set(val.keys(range(12)))
    ld = fastdata.loader(val, 3, device="cpu", num_workers=1, seed=4)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    rest = [k for b in it for k in b["key"]]
    ld2 = fastdata.loader(val, 3, device="cpu", num_workers=1, seed=4)
    ld2.load_state_dict(state)
    assert [k for b in ld2 for k in b["key"]] == rest
    other = labelled.split({"train": 0.6, "val": 0.4}, seed=2)["val"]
    with pytest.raises(UsageError, match="samples"):
        fastdata.loader(other, 3, device="cpu", num_workers=0, seed=4).load_state_dict(state)


# --- samplers ---------------------------------------------------------------------------------------


def test_weighted_draws_follow_the_weights_and_are_deterministic(labelled):
    w = np.zeros(len(labelled))
    w[[0, 1]] = [1.0, 3.0]
    s = Weighted(w, num_samples=4000).bind(labelled, 100)
    batches = s(len(labelled), World(0, 1), 0, 0)
    idx = np.concatenate(batches)
    assert set(idx.tolist()) == {0, 1} and 0.7 < (idx == 1).mean() < 0.8
    assert all(np.array_equal(x, y) for x, y in zip(batches, s(len(labelled), World(0, 1), 0, 0)))
    assert not np.array_equal(idx, np.concatenate(s(len(labelled), World(0, 1), 0, 1)))
    nr = Weighted(np.ones(len(labelled)), num_samples=30, replacement=False).bind(labelled, 7)
    got = np.concatenate(nr(len(labelled), World(0, 1), 3, 0))
    assert sorted(got.tolist()) == list(range(30))
    bal = Weighted("balanced", num_samples=3000).bind(labelled, 50)
    labels = labelled.column("label")[np.concatenate(bal(30, World(0, 1), 0, 0))]
    assert np.all(np.abs(np.bincount(labels) / 3000 - 1 / 3) < 0.05)


@pytest.mark.parametrize("weights,match", [
    (np.full(30, -1.0), "negative"), (np.full(30, np.nan), "not a finite"), (np.zeros(30), "every weight is zero"),
    (np.ones(5), "5 weights for a dataset of 30"), ("heavy", "'balanced'"),
])
def test_bad_weights_fail_when_the_loader_is_built(labelled, weights, match):
    with pytest.raises(UsageError, match=match):
        fastdata.loader(labelled, 4, sampler=Weighted(weights), device="cpu", num_workers=0)


def test_episodic_checks_and_episodes(labelled):
    with pytest.raises(UsageError, match="needs 4 classes of 'label' with at least 3 samples.*has 3 such"):
        fastdata.loader(labelled, None, sampler=Episodic(4, 2, 1), device="cpu", num_workers=0)
    with pytest.raises(UsageError, match="at least 12 samples.*has 0 such"):
        fastdata.loader(labelled, None, sampler=Episodic(2, 11, 1), device="cpu", num_workers=0)
    with pytest.raises(UsageError, match="batch_size is 5"):
        fastdata.loader(labelled, 5, sampler=Episodic(2, 2, 1), device="cpu", num_workers=0)
    ld = fastdata.loader(labelled, None, sampler=Episodic(3, 2, 2, episodes_per_epoch=5), device="cpu", num_workers=0)
    assert len(ld) == 5
    labels = labelled.column("label")
    for b in ld.plan():
        assert len(b) == 12 and len(set(b.tolist())) == 12
        sup, qry = labels[b[:6]].reshape(3, 2), labels[b[6:]].reshape(3, 2)
        assert (sup == sup[:, :1]).all() and (qry == sup).all() and len(set(sup[:, 0])) == 3


@pytest.mark.parametrize("sampler", [Weighted("balanced", num_samples=50), Episodic(2, 2, 1, episodes_per_epoch=7)])
def test_samplers_split_ranks_equally_and_resume_exactly(labelled, sampler):
    bs = None if isinstance(sampler, Episodic) else 4
    counts = []
    for rank in range(3):
        ld = fastdata.loader(labelled, bs, sampler=sampler, device="cpu", num_workers=0, seed=9)
        ld._fixed_world = World(rank=rank, size=3)
        counts.append(len(ld.plan()))
    assert len(set(counts)) == 1
    ld = fastdata.loader(labelled, bs, sampler=sampler, device="cpu", num_workers=1, seed=9, fields=["x", "key"])
    ld.set_epoch(2)
    it = iter(ld)
    next(it)
    next(it)
    state = ld.state_dict()
    rest = [b["key"] for b in it]
    ld2 = fastdata.loader(labelled, bs, sampler=sampler, device="cpu", num_workers=1, seed=9, fields=["x", "key"])
    ld2.load_state_dict(state)
    assert [b["key"] for b in ld2] == rest


@pytest.mark.parametrize("shuffle", [False, fastdata.Block(4), "shards"])
def test_a_shuffle_the_sampler_overrides_is_refused(labelled, shuffle):
    """shuffle=False with sampler=Weighted(...) used to be ignored silently: the batches came in the sampler's order."""
    with pytest.raises(UsageError, match="cannot be honoured with sampler="):
        fastdata.loader(labelled, 4, sampler=Weighted("balanced"), shuffle=shuffle, device="cpu", num_workers=0)


def test_weighted_keeps_drop_last(labelled):
    """Weighted(num_samples=30) in batches of 4 with drop_last=True gave a last batch of 2."""
    for drop_last, sizes in ((True, [4] * 7), (False, [4] * 7 + [2])):
        ld = fastdata.loader(labelled, 4, sampler=Weighted("balanced"), drop_last=drop_last, device="cpu", num_workers=0)
        assert [len(b["x"]) for b in ld] == sizes and len(ld) == len(sizes)


def test_user_sampler_protocol_and_rank_batches():
    batches = [np.array([i]) for i in range(5)]
    assert [len(rank_batches(batches, World(r, 2), False)) for r in range(2)] == [3, 3]
    assert [len(rank_batches(batches, World(r, 2), True)) for r in range(2)] == [2, 2]


def test_user_sampler_bad_output_is_a_usage_error(labelled):
    ld = fastdata.loader(labelled, 4, sampler=lambda n, world, seed, epoch: [np.array([0, n])], device="cpu",
                         num_workers=0)
    with pytest.raises(UsageError, match="batch 0 of epoch 0"):
        list(ld)


# --- clients: DALI, fastdata bench, Lightning ---------------------------------------------------------


def _image_dataset(tmp_path: Path) -> Path:
    from PIL import Image

    src = tmp_path / "imgs"
    for i in range(12):
        (src / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8, 3), i * 20, np.uint8)).save(src / f"c{i % 3}" / f"{i:02d}.png")
    fastdata.convert(src, tmp_path / "ids", fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1)))
    return tmp_path / "ids"


def test_dali_backend_takes_a_subset_and_refuses_text(tmp_path):
    pytest.importorskip("nvidia.dali")
    ds = fastdata.open(_image_dataset(tmp_path))
    val = ds.split({"a": 0.5, "b": 0.5}, seed=1, stratify="label")["b"]
    kw = dict(device="cpu", seed=3, num_workers=1)
    torch_labels = [b["label"].tolist() for b in fastdata.loader(val, 4, backend="torch", **kw)]
    dali_labels = [b["label"].tolist() for b in fastdata.loader(val, 4, backend="dali", **kw)]
    assert torch_labels == dali_labels and sum(map(len, dali_labels)) == 6
    with pytest.raises(UsageError, match="DALI backend carries tensors only.*'key'"):
        fastdata.loader(val, 4, backend="dali", fields=["image", "key"], **kw)


def test_fastdata_bench_on_a_subset(tmp_path, run_cli):
    root = _image_dataset(tmp_path)
    keys = fastdata.open(root).keys(range(0, 12, 2))
    (tmp_path / "keys.txt").write_text("\n".join(keys) + "\n")
    code, out, err = run_cli("bench", root, "--subset", tmp_path / "keys.txt", "--batches", "3", "--no-ceiling",
                             "--batch-size", "2", "--workers", "1", "--json")
    assert code == 0, err
    (tmp_path / "bad.txt").write_text("c0/00.png\nnope.png\n")
    code, _, err = run_cli("bench", root, "--subset", tmp_path / "bad.txt", "--batches", "3", "--no-ceiling")
    assert code == 2 and "no sample keyed 'nope.png'" in err


def test_lightning_trains_on_a_sampled_subset_with_keys(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    import torch

    ds = fastdata.open(_image_dataset(tmp_path), fields=["image", "label", "key"])
    train = ds.split({"train": 0.75, "val": 0.25}, seed=0, stratify="label")["train"]
    ld = fastdata.loader(train, None, sampler=Episodic(3, 1, 1, episodes_per_epoch=5), device="cpu", num_workers=1)
    seen: list[list[str]] = []

    class Model(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(3 * 8 * 8, 3)

        def training_step(self, batch, _i):
            seen.append(batch["key"])
            return torch.nn.functional.cross_entropy(self.net(batch["image"].flatten(1)), batch["label"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), ld)
    assert len(seen) == 10 and all(len(k) == 6 for k in seen)
    assert set(k for ks in seen for k in ks) <= set(train.keys(range(len(train))))


def test_worker_processes_carry_strings_keys_and_subsets(tmp_path):
    src = _table_folder(tmp_path / "src")
    fastdata.convert(src, tmp_path / "ds", meta=src / "meta.csv")
    ds = fastdata.open(tmp_path / "ds", fields=["x", "name", "key"]).subset([7, 1, 4, 2])
    ld = fastdata.loader(ds, 2, shuffle=False, device="cpu", num_workers=2,
                         config=fastdata.LoaderConfig(mode="processes"))
    got = [(b["key"], b["name"], b["x"][:, 0].tolist()) for b in ld]
    ld.close()
    assert got == [(["s7.npy", "s1.npy"], ["n7", "n1"], [7.0, 1.0]), (["s4.npy", "s2.npy"], ["n4", "n2"], [4.0, 2.0])]


def test_info_shows_string_fields_and_keys(tmp_path, run_cli):
    src = _table_folder(tmp_path / "src")
    fastdata.convert(src, tmp_path / "ds", meta=src / "meta.csv")
    code, out, _ = run_cli("info", tmp_path / "ds")
    assert code == 0 and "name         str" in out and "keys      relative source paths (keys.bin" in out


def test_info_says_the_labels_came_from_the_table(tmp_path, run_cli):
    """A table's 'label' column labels the dataset: ``fastdata info`` said ``labels=none`` beside its classes."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        np.save(src / f"s{i}.npy", np.full((2,), i, np.float32))
    _csv(src / "meta.csv", [{"path": f"s{i}.npy", "label": "ab"[i % 2]} for i in range(4)])
    fastdata.convert(src, tmp_path / "ds", meta=src / "meta.csv")
    code, out, _ = run_cli("info", tmp_path / "ds")
    assert code == 0 and "classes   2: 0=a, 1=b" in out and "kind=table, path=" in out and "labels=table," in out
    _csv(src / "meta.csv", [{"path": f"s{i}.npy", "weight": i} for i in range(4)])
    fastdata.convert(src, tmp_path / "ds2", meta=src / "meta.csv")
    assert "labels=none," in run_cli("info", tmp_path / "ds2")[1]


def test_table_conversion_resumes_exactly_and_notices_a_changed_table(tmp_path):
    from crashkit import cli, kill, same_dataset, start_paused

    src = _table_folder(tmp_path / "src", n=12)
    args = ["convert", src, None, "--meta", src / "meta.csv", "--shard-size", "300", "--workers", "1", "--quiet"]
    whole = tmp_path / "whole"
    assert cli(*[whole if a is None else a for a in args]).returncode == 0
    dst = tmp_path / "dst"
    proc = start_paused([dst if a is None else a for a in args], "pause:between_shards:2", tmp_path / "ready")
    kill(proc)
    assert not (dst / "manifest.json").exists()
    r = cli(*[dst if a is None else a for a in args], "--resume")
    assert r.returncode == 0 and "resumed" in r.stdout, r.stderr
    same_dataset(whole, dst)
    proc = start_paused([tmp_path / "d2" if a is None else a for a in args], "pause:between_shards:2",
                        tmp_path / "ready2")
    kill(proc)
    _edit_row(src / "meta.csv", 0, "name", "changed")
    r = cli(*[tmp_path / "d2" if a is None else a for a in args], "--resume")
    assert r.returncode == 2 and "changed" in r.stderr


def test_parquet_without_pyarrow_and_bad_meta_type(tmp_path, monkeypatch):
    import sys

    src = _table_folder(tmp_path / "src", n=2)
    (src / "m.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(UsageError, match=r"m.parquet: Parquet tables need pyarrow: pip install 'fastdata\[parquet\]'"):
        fastdata.convert(src, tmp_path / "a", meta=src / "m.parquet")
    with pytest.raises(UsageError, match="meta_types names 'nope', which is not a column"):
        fastdata.convert(src, tmp_path / "b", fastdata.ConvertConfig(meta_types={"nope": fastdata.converters.ColumnType("float32")}), meta=src / "meta.csv")
    with pytest.raises(UsageError, match="expected NAME=DTYPE"):
        fastdata.converters.parse_meta_type("kp=double:3")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_verify_deep_reads_string_fields(tmp_path):
    from fastdata.measure.verify import verify

    src = _table_folder(tmp_path / "src", n=4)
    fastdata.convert(src, tmp_path / "ds", meta=src / "meta.csv")
    report = verify(tmp_path / "ds", deep=True)
    assert report.ok, [str(p) for p in report.problems]


def _ddp_sampled(rank: int, world: int, port: int, path: str, out: str) -> None:
    import torch
    from conftest import gloo_group

    with gloo_group(rank, world, port) as dist:
        ds = fastdata.open(path, fields=["x", "label", "key"])
        train = ds.split({"train": 0.8, "val": 0.2}, seed=0, stratify="label")["train"]
        ld = fastdata.loader(train, 5, sampler=Weighted("balanced", num_samples=23), seed=2, device="cpu",
                             num_workers=1)
        keys = [k for b in ld for k in b["key"]]
        n = torch.tensor([len(ld)])
        dist.all_reduce(n, op=dist.ReduceOp.MAX)  # would hang if the ranks disagreed on batch counts
        Path(f"{out}-{rank}.json").write_text(json.dumps({"keys": keys, "batches": len(ld), "max": int(n)}))


def test_ddp_ranks_share_a_sampled_subset_equally(tmp_path):
    import torch
    from conftest import free_port

    src = tmp_path / "src"
    make_class_folder(src, per_class=10, shape=(2,))
    fastdata.convert(src, tmp_path / "ds")
    world = 2
    torch.multiprocessing.spawn(_ddp_sampled, args=(world, free_port(), str(tmp_path / "ds"), str(tmp_path / "r")),
                                nprocs=world, join=True)
    got = [json.loads((tmp_path / f"r-{r}.json").read_text()) for r in range(world)]
    assert got[0]["batches"] == got[1]["batches"] == got[0]["max"] == 3  # 23 draws -> 5 batches -> 3 per rank
    ds = fastdata.open(tmp_path / "ds", fields=["x", "label", "key"])
    train = ds.split({"train": 0.8, "val": 0.2}, seed=0, stratify="label")["train"]
    ld = fastdata.loader(train, 5, sampler=Weighted("balanced", num_samples=23), seed=2, device="cpu", num_workers=0)
    whole = [b["key"] for b in ld]  # the single-process plan of the same epoch: ranks take contiguous shares
    assert got[0]["keys"] == [k for b in whole[:3] for k in b]
    assert got[1]["keys"] == [k for b in whole[3:] + whole[:1] for k in b]  # wrapped around to fill the share


def test_hostile_keys_files_are_refused(tmp_path):
    import struct

    src = tmp_path / "src"
    make_class_folder(src, per_class=2)
    fastdata.convert(src, tmp_path / "ds")
    kb = tmp_path / "ds" / "keys.bin"
    good = kb.read_bytes()
    bad_offsets = bytearray(good)
    bad_offsets[24 + 8 : 24 + 16] = struct.pack("<Q", 10**12)  # offsets[1] beyond the text
    kb.write_bytes(bytes(bad_offsets))
    with pytest.raises(fastdata.errors.CorruptShardError, match="inconsistent offsets"):
        fastdata.open(tmp_path / "ds").key(0)
    kb.write_bytes(b"NOTKEYS!" + good[8:])
    with pytest.raises(fastdata.errors.CorruptShardError, match="header does not match"):
        fastdata.open(tmp_path / "ds").keys([0, 1])
    outside = tmp_path / "elsewhere.bin"
    outside.write_bytes(good)
    kb.unlink()
    kb.symlink_to(outside)
    with pytest.raises(fastdata.errors.CorruptShardError, match="points outside the dataset directory"):
        fastdata.open(tmp_path / "ds")


@pytest.mark.parametrize("n", [1, 2, 7, 500])
def test_alias_table_gives_every_sample_its_exact_probability(n):
    from fastdata.reading.samplers import alias_table

    rng = np.random.default_rng(n)
    for _ in range(10):
        w = rng.random(n) ** 3 * (rng.random(n) < 0.6)
        w[0] += 1e-3
        p = w / w.sum()
        t = alias_table(p)
        mass = t["p"].astype(np.float64)
        np.add.at(mass, t["a"], 1 - t["p"].astype(np.float64))
        assert np.abs(mass / n - p).max() < 1e-7 and t["a"].min() >= 0 and t["a"].max() < n
