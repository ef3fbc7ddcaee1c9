"""Fuzzing with hypothesis: manifest parsing, LMDB record decoding and .npy/.npz header handling
let only fastdata's own error types escape, whatever the bytes.

Each target runs a few hundred examples in the default suite (derandomized, so CI is
reproducible). Longer, randomized runs: ``FASTDATA_FUZZ_EXAMPLES=20000 pytest tests/test_fuzz.py``,
or ``pytest -m slow tests/test_fuzz.py`` (10000 examples each).
"""

from __future__ import annotations

import io
import json
import os
import struct
import zipfile
from pathlib import Path
from typing import Any, Callable

import lmdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastdata.converters.arrays import parse_header, read_npy_header, read_npz_headers
from fastdata.errors import CorruptShardError, DataError, FormatError
from fastdata.format import ShardInfo, make_field, read_manifest
from fastdata.format import lmdb as lmdb_format
from fastdata.format.manifest import parse_manifest

CI_EXAMPLES = int(os.environ.get("FASTDATA_FUZZ_EXAMPLES", "200"))
LONG_EXAMPLES = 10_000


def _settings(n: int) -> settings:
    return settings(max_examples=n, deadline=None, database=None, derandomize="FASTDATA_FUZZ_EXAMPLES" not in os.environ
                    and n <= CI_EXAMPLES, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- strategies --------------------------------------------------------------------------

_scalars = (st.none() | st.booleans() | st.integers() | st.integers(-(2**70), 2**70) | st.floats()
            | st.text(max_size=20) | st.sampled_from(["<f4", "|O", "|u1", "raw", "image", "pixels", "RGB", "HWC", "..", "/"]))
json_values = st.recursive(_scalars, lambda c: st.lists(c, max_size=6) | st.dictionaries(st.text(max_size=12), c, max_size=6),
                           max_leaves=25)

VALID_MANIFEST: dict[str, Any] = {
    "format": "fastdata", "version": 1, "backend": "lmdb", "num_samples": 5,
    "fields": [
        {"name": "image", "dtype": "|u1", "shape": [None], "encoding": "image", "image": {"mode": "RGB", "layout": "HWC"}},
        {"name": "image_shape", "dtype": "<i8", "shape": [3], "encoding": "raw"},
        {"name": "image_codec", "dtype": "|u1", "shape": [], "encoding": "raw"},
        {"name": "x", "dtype": "<f4", "shape": [None, 3], "encoding": "raw"},
        {"name": "label", "dtype": "<i8", "shape": [], "encoding": "raw"},
    ],
    "classes": ["a", "b"],
    "shards": [{"file": "shard-00000.lmdb", "start": 0, "count": 3, "bytes": 100, "sha256": "0" * 64},
               {"file": "shard-00001.lmdb", "start": 3, "count": 2, "bytes": 100, "sha256": "f" * 64}],
    "source": {"kind": "test"},
}


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    return out


_MANIFEST_PATHS = _paths(VALID_MANIFEST)[1:]


@st.composite
def mutated_manifests(draw: st.DrawFn) -> Any:
    m = json.loads(json.dumps(VALID_MANIFEST))
    for _ in range(draw(st.integers(1, 4))):
        path = draw(st.sampled_from(_MANIFEST_PATHS))
        parent = m
        try:
            for k in path[:-1]:
                parent = parent[k]
            if draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(json_values)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier mutation removed or replaced the parent
    return m


# --- targets -----------------------------------------------------------------------------


def manifest_target(obj: Any) -> None:
    try:
        m = parse_manifest(obj)
    except FormatError:
        return
    assert m.num_samples == sum(s.count for s in m.shards)


def manifest_bytes_target(scratch: Path, data: bytes) -> None:
    (scratch / "manifest.json").write_bytes(data)
    try:
        read_manifest(scratch)
    except FormatError:
        pass


FIXED = [make_field("x", "<f4", (3,)), make_field("label", "<i8", ())]
RAGGED = [make_field("x", "<f4", (None, 2)), make_field("y", "<u2", (4,))]


def _record(fields: list, rows: int) -> bytes:
    sample = {f.name: (np.ones((rows, *f.trailing), f.np_dtype) if f.ragged else np.ones(f.shape, f.np_dtype)) for f in fields}
    return lmdb_format.encode_record(fields, sample)


@st.composite
def records(draw: st.DrawFn, fields: list) -> bytes:
    if draw(st.booleans()):
        return draw(st.binary(max_size=200))
    blob = bytearray(_record(fields, draw(st.integers(0, 5))))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "grow", "u64"]))
        if kind == "flip" and blob:
            blob[draw(st.integers(0, len(blob) - 1))] = draw(st.integers(0, 255))
        elif kind == "cut":
            blob = blob[: draw(st.integers(0, len(blob)))]
        elif kind == "grow":
            blob += draw(st.binary(max_size=40))
        elif len(blob) >= 16:
            pos = draw(st.integers(4, len(blob) - 8))
            struct.pack_into("<Q", blob, pos, draw(st.sampled_from([0, 1, 2**31, 2**63 - 1, 2**64 - 1, 12, 24])))
    return bytes(blob)


def layout_target(fields: list, buf: bytes) -> None:
    reader = lmdb_format.ShardReader(Path("x.lmdb"), ShardInfo("x.lmdb", 0, 1, 0, "sha256:" + "0" * 64), fields)
    try:
        layout = reader._layout(memoryview(buf), 0)
    except CorruptShardError as e:
        assert "sample 0" in str(e)
        return
    assert sum(size for _, size in layout) + 8 + 8 * len(fields) == len(buf)


def lmdb_read_target(scratch: Path, fields: list, values: list[bytes]) -> None:
    """Records written into a real LMDB shard and read back through every read path."""
    n = len(values)
    path = scratch / "shard-00000.lmdb"
    path.unlink(missing_ok=True)
    env = lmdb.open(str(path), subdir=False, map_size=1 << 22, lock=False)
    with env.begin(write=True) as txn:
        for i, v in enumerate(values):
            txn.put(lmdb_format.key(i), v)
        txn.put(lmdb_format.SHARD_KEY, lmdb_format.shard_record(fields, 0, n))
    env.close()
    info = ShardInfo(path.name, 0, n, path.stat().st_size, "sha256:" + "0" * 64)
    reader = lmdb_format.ShardReader(path, info, fields)
    local = np.arange(n)
    try:
        outs = {}
        for f in fields:
            if f.ragged:
                lengths = reader.lengths(f.name, local)
                assert lengths.min() >= 0
                outs[f.name] = np.zeros((n, int(lengths.max()), *f.trailing), f.np_dtype)
            else:
                outs[f.name] = np.zeros((n, *f.shape), f.np_dtype)
        reader.read_into(local, local, outs)
    except CorruptShardError:
        pass
    finally:
        reader.close()


def _npy(shape: tuple, dtype: str = "<f4") -> bytes:
    b = io.BytesIO()
    np.save(b, np.zeros(shape, dtype))
    return b.getvalue()


@st.composite
def npy_bytes(draw: st.DrawFn) -> bytes:
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return draw(st.binary(max_size=300))
    if choice == 1:  # a real header dict with hostile values
        descr = draw(st.sampled_from(["'<f4'", "'|O'", "[('a', '<f4')]", "'<U3'", "'>i8'", "'V8'", "None", "'<f4' * 3",
                                      "(" * 300 + ")" * 300, "'<M8[s]'", "1e999"]))
        shape = draw(st.sampled_from(["(3,)", "()", "(-1,)", "(" + "9" * 30 + ",)", "(9223372036854775807, 4)",
                                      "(4294967296, 4294967296, 4294967296)", "('a',)", "[1]", "(1," * 40 + ")" * 40,
                                      "(0, 5)", "(True,)"]))
        fortran = draw(st.sampled_from(["False", "True", "1", "'no'"]))
        text = "{'descr': %s, 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)
        header = text.encode("latin-1")
        pad = (64 - (10 + len(header) + 1) % 64) % 64
        data = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header) + pad + 1) + header + b" " * pad + b"\n"
        return data + draw(st.binary(max_size=64))
    blob = bytearray(_npy(draw(st.sampled_from([(3,), (2, 3), (), (0,), (4, 1, 2)]))))
    for _ in range(draw(st.integers(1, 3))):
        if blob and draw(st.booleans()):
            blob[draw(st.integers(0, len(blob) - 1))] = draw(st.integers(0, 255))
        else:
            blob = blob[: draw(st.integers(0, len(blob)))]
    return bytes(blob)


def npy_target(scratch: Path, data: bytes) -> None:
    try:
        h = parse_header(io.BytesIO(data), "f.npy")
        assert h.dtype.kind in "biufc" and all(d >= 0 for d in h.shape)
    except DataError:
        pass
    path = scratch / "f.npy"
    path.write_bytes(data)
    try:
        h, size = read_npy_header(str(path))
        assert size == h.offset + h.nbytes
    except DataError:
        pass


@st.composite
def npz_bytes(draw: st.DrawFn) -> bytes:
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", compression=draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))) as z:
        for i in range(draw(st.integers(0, 2))):
            z.writestr(draw(st.sampled_from([f"a{i}.npy", f"b{i}.txt", f"../x{i}.npy"])), draw(npy_bytes()))
    blob = bytearray(b.getvalue())
    for _ in range(draw(st.integers(0, 3))):
        if blob:
            blob[draw(st.integers(0, len(blob) - 1))] = draw(st.integers(0, 255))
    return bytes(blob)


def npz_target(scratch: Path, data: bytes) -> None:
    path = scratch / "f.npz"
    path.write_bytes(data)
    try:
        headers, _ = read_npz_headers(str(path))
        assert headers
    except DataError:
        pass


# name -> (target(scratch folder, example), strategy)
TARGETS: dict[str, tuple[Callable[[Path, Any], None], Any]] = {
    "manifest-json": (lambda _, m: manifest_target(m), json_values),
    "manifest-mutated": (lambda _, m: manifest_target(m), mutated_manifests()),
    "manifest-bytes": (manifest_bytes_target, st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode())),
    "lmdb-layout-fixed": (lambda _, b: layout_target(FIXED, b), records(FIXED)),
    "lmdb-layout-ragged": (lambda _, b: layout_target(RAGGED, b), records(RAGGED)),
    "lmdb-read-fixed": (lambda d, v: lmdb_read_target(d, FIXED, v), st.lists(records(FIXED), min_size=1, max_size=4)),
    "lmdb-read-ragged": (lambda d, v: lmdb_read_target(d, RAGGED, v), st.lists(records(RAGGED), min_size=1, max_size=4)),
    "npy-header": (npy_target, npy_bytes()),
    "npz-headers": (npz_target, npz_bytes()),
}


def _run(name: str, examples: int, scratch: Path) -> None:
    target, strategy = TARGETS[name]
    _settings(examples)(given(strategy)(lambda example: target(scratch, example)))()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz(name: str, tmp_path: Path) -> None:
    _run(name, CI_EXAMPLES, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz_long(name: str, tmp_path: Path) -> None:
    _run(name, LONG_EXAMPLES, tmp_path)


def test_fuzz_targets_catch_untyped_errors() -> None:
    """The harness can fail: a target that lets a non-fastdata error out is reported."""
    boom = given(st.integers())(lambda i: (_ for _ in ()).throw(KeyError(i)))
    with pytest.raises(KeyError):
        _settings(5)(boom)()


@pytest.mark.parametrize("dtype", ["0{", "(1)", "i4,", "f8["])
def test_a_dtype_numpy_cannot_parse_is_a_format_error(dtype: str) -> None:
    """Found by test_fuzz_long[manifest-mutated]: numpy raises SyntaxError or ValueError for some strings."""
    from fastdata.format.spec import FieldSpec, _check_field

    with pytest.raises(FormatError, match="unsupported dtype"):
        _check_field(FieldSpec(name="x", dtype=dtype, shape=(1,)))
