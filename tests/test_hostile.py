"""A crafted dataset cannot run code: pickle payloads wherever a dataset or a source has bytes
are never unpickled by open, get_batch, the loader, verify, info or --resume."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import h5py
import lmdb
import numpy as np
import pytest

import fastdata
from conftest import edit_manifest, make_class_folder
from fastdata.errors import CorruptShardError, DataError, FastdataError, FormatError, UsageError

ROOT = Path(__file__).resolve().parents[1]


class _Touch:
    """Unpickling this creates ``marker``: the proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def payload(marker: Path) -> bytes:
    return pickle.dumps(_Touch(marker), protocol=2)


def test_the_payload_is_live(tmp_path):
    """The control: unpickling the payload really does create its marker."""
    marker = tmp_path / "control"
    pickle.loads(payload(marker)).close()
    assert marker.exists()


def _everything(path: Path) -> None:
    """Every way fastdata reads a dataset; errors are fine, code execution is not."""
    for step in (
        lambda: fastdata.open(path).get_batch(np.arange(len(fastdata.open(path)))),
        lambda: fastdata.measure.verify.verify(path, deep=True),
        lambda: list(fastdata.loader(path, 4, device="cpu", num_workers=0)),
        lambda: fastdata.cli.main(["info", str(path)]),
    ):
        try:
            step()
        except FastdataError:
            pass


def test_pickle_payloads_in_a_dataset_are_never_unpickled(tmp_path, capsys):
    import fastdata.cli
    import fastdata.measure.verify

    marker = tmp_path / "pwned"
    evil = payload(marker)
    make_class_folder(tmp_path / "src", per_class=2)

    # 1. the manifest itself is a pickle
    fastdata.convert(tmp_path / "src", tmp_path / "a")
    (tmp_path / "a" / "manifest.json").write_bytes(evil)
    with pytest.raises(FormatError, match="unreadable manifest"):
        fastdata.open(tmp_path / "a")
    _everything(tmp_path / "a")

    # 2. a valid manifest carrying the payload in its free-form 'source'
    fastdata.convert(tmp_path / "src", tmp_path / "b")
    edit_manifest(tmp_path / "b", lambda m: m["source"].update(payload=evil.decode("latin-1")))
    _everything(tmp_path / "b")

    # 3. every LMDB record, and the shard description, replaced by the payload
    fastdata.convert(tmp_path / "src", tmp_path / "c", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="lmdb")))
    shard = tmp_path / "c" / "shard-00000.lmdb"
    env = lmdb.open(str(shard), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        keys = [k for k, _ in txn.cursor()]
        for k in keys:
            txn.put(k, evil)
    env.close()
    edit_manifest(tmp_path / "c", lambda m: m["shards"][0].update(bytes=shard.stat().st_size))
    with pytest.raises(CorruptShardError):
        fastdata.open(tmp_path / "c").get_batch([0])
    _everything(tmp_path / "c")

    # 4. HDF5 data that is the payload (read back as the bytes it is), and object-typed datasets
    np.save(tmp_path / "bytes.npy", np.frombuffer(evil * 4, dtype=np.uint8).reshape(4, -1))
    fastdata.convert(None, tmp_path / "d", arrays={"x": tmp_path / "bytes.npy"})
    got = fastdata.open(tmp_path / "d").get_batch([0, 1, 2, 3])["x"]
    assert got.tobytes() == evil * 4
    fastdata.convert(tmp_path / "src", tmp_path / "e")
    with h5py.File(tmp_path / "e" / "shard-00000.h5", "r+") as f:
        del f["x"]
        rows = np.empty(6, dtype=object)
        rows[:] = [np.frombuffer(evil, np.uint8)] * 6
        f.create_dataset("x", data=rows, dtype=h5py.vlen_dtype(np.uint8))
        f.attrs["note"] = np.void(evil)
    edit_manifest(tmp_path / "e", lambda m: m["shards"][0].update(bytes=(tmp_path / "e" / "shard-00000.h5").stat().st_size))
    with pytest.raises(CorruptShardError):
        fastdata.open(tmp_path / "e").get_batch([0])
    _everything(tmp_path / "e")

    # 5. an interrupted conversion whose journal is the payload
    dst = tmp_path / "f"
    dst.mkdir()
    (dst / ".fastdata-journal").write_bytes(evil)
    with pytest.raises(UsageError, match="not a journal"):
        fastdata.convert(tmp_path / "src", dst, fastdata.ConvertConfig(resume=True))

    # 6. sources: an object-dtype .npy sample and an object-dtype array
    objsrc = tmp_path / "objsrc"
    objsrc.mkdir()
    np.save(objsrc / "a.npy", np.array([_Touch(marker)], dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match="object arrays would need pickle"):
        fastdata.convert(objsrc, tmp_path / "g")
    with pytest.raises(DataError, match="object arrays would need pickle"):
        fastdata.convert(objsrc / "a.npy", tmp_path / "h")
    np.savez(tmp_path / "obj.npz", a=np.array([_Touch(marker)], dtype=object))
    (tmp_path / "npzsrc").mkdir()
    (tmp_path / "obj.npz").rename(tmp_path / "npzsrc" / "obj.npz")
    with pytest.raises(DataError):
        fastdata.convert(tmp_path / "npzsrc", tmp_path / "i")

    capsys.readouterr()
    assert not marker.exists(), "a crafted dataset ran code"


def test_no_unpickling_in_the_read_and_convert_code():
    """Nothing in fastdata can unpickle: no pickle module, no allow_pickle=True, and torch.load only
    with weights_only=True (training checkpoints hold tensors and plain data)."""
    banned = re.compile(r"^\s*(import pickle|from pickle)|pickle\.loads?\(|allow_pickle=True|marshal\.loads?\("
                        r"|torch\.load\((?![^\n]*weights_only=True)", re.M)
    files = list((ROOT / "fastdata").rglob("*.py")) + list((ROOT / "converters").rglob("*.py"))
    assert len(files) > 20
    offenders = [str(p.relative_to(ROOT)) for p in files if banned.search(p.read_text())]
    # Worker processes send a transform's own exception back to the training process over their private
    # socket: pickle between fastdata's own processes, never of bytes read from a file or a URL.
    # (transform.py only checks that a transform pickles, with pickle.dumps.) A conversion of the user's own
    # Python object into spawned workers pickles that object once into a private (0700, mkdtemp) folder that
    # the workers unpickle: the user's object, never bytes of a dataset, a source file or a URL.
    assert sorted(offenders) == ["converters/objects.py", "fastdata/loaders/procs.py", "fastdata/loaders/transform.py"]
    objects = (ROOT / "converters" / "objects.py").read_text()
    assert len(re.findall(r"pickle\.loads?\(", objects)) == 1 and "tempfile.mkdtemp(" in objects
    procs, transform = ((ROOT / "fastdata" / "loaders" / name).read_text() for name in ("procs.py", "transform.py"))
    assert len(re.findall(r"pickle\.loads\(", procs)) == 1 and "pickle.load" not in transform
    assert "allow_pickle" not in procs + transform
