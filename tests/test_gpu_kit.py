"""benchmarks/gpu_kit.py: the plan that carries wheels to the GPU machine in calls of at most 64 MiB, the
parts it writes, and the device side that stores, joins and installs them. Fake payloads in tmp_path; no
network, no GPU."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import random
import re
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


@pytest.fixture(scope="module")
def kit():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module("gpu_kit")
    finally:
        sys.path.pop(0)


def fake_payloads(root: Path, sizes: dict[str, list[int]]) -> Path:
    """root/<group>/<i>.whl of the given sizes (sparse: nothing is written)."""
    for group, group_sizes in sizes.items():
        (root / group).mkdir(parents=True)
        for i, size in enumerate(group_sizes):
            with open(root / group / f"{group}_{i:02d}-1.0-py3-none-any.whl", "wb") as f:
                f.truncate(size)
    return root


def dry_run(kit, payloads: Path, tree: int, *extra: str) -> dict:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert kit.main(["plan", "--payloads", str(payloads), "--dry-run", "--tree-bytes", str(tree), *extra]) == 0
    return json.loads(out.getvalue())


SIZES = [
    {"base": [569_828, 407_547, 472_238]},  # plan A: lmdb, simplejpeg, xxhash
    {"base": [1_080_000], "dali": [186_660_000]},  # plan B, site format (one tar.xz per group)
    {"base": [569_828, 407_547, 472_238],  # plan B, wheels format: DALI, nvcomp, nvimgcodec and the small ones
     "dali": [198_655_209, 28_501_375, 25_044_224, 3_847_265, 4_269_503, 2_444_703, 3_050_476, 488_981, 12_732]},
    {"base": [61 * MIB - 64 * 1024, 1], "dali": [0, 3 * MIB]},  # one payload exactly fills a call; an empty one
    {"base": [random.Random(s).randrange(1, 90 * MIB) for s in range(7)], "dali": [5 * MIB] * 20},
]


@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("tree", [0, 3_132_752, 40 * MIB])
def test_every_call_stays_under_64_mib_and_every_byte_travels_exactly_once(kit, tmp_path, sizes, tree):
    plan = dry_run(kit, fake_payloads(tmp_path, sizes), tree)
    calls, budget = plan["calls"], 64 * MIB
    assert [c["number"] for c in calls] == list(range(1, len(calls) + 1))
    assert tree + plan["room_bytes"] <= budget - 2 * MIB  # the margin is kept
    for c in calls:
        assert sum(p["size"] for p in c["parts"]) <= plan["room_bytes"], c["number"]
    parts = [p for c in calls for p in c["parts"]]
    assert len({p["name"] for p in parts}) == len(parts)  # each part planned once, under its own name
    for group, group_sizes in sizes.items():
        for i, size in enumerate(group_sizes):
            name = f"{group}_{i:02d}-1.0-py3-none-any.whl"
            mine = sorted((p for p in parts if p["payload"] == name), key=lambda p: p["index"])
            assert [p["index"] for p in mine] == list(range(len(mine)))
            assert [p["offset"] for p in mine] == [sum(p["size"] for p in mine[:k]) for k in range(len(mine))]
            assert sum(p["size"] for p in mine) == size and all(p["group"] == group for p in mine)
    total = sum(sum(s) for s in sizes.values())
    assert len(calls) == max(1, -(-total // plan["room_bytes"]))  # the fewest calls: all full but the last
    ready = {g: max(c["number"] for c in calls for p in c["parts"] if p["group"] == g) for g in sizes}
    for c in calls:
        assert c["install"] == [g for g in ("base", "dali") if ready.get(g) == c["number"]]
    for r, c in zip(plan["run"], calls):
        assert len(r["command"]) < 2000 and r["carry"] == [f".whl/call{c['number']}"] and r["timeout_s"] <= 600


def test_no_room_for_parts_is_an_error_that_says_why(kit, tmp_path):
    with pytest.raises(ValueError, match="the working tree takes the budget"):
        dry_run(kit, fake_payloads(tmp_path, {"base": [MIB]}), 63 * MIB)


def make_wheel(path: Path, module: str, text: str) -> Path:
    """A minimal pure-Python wheel that pip installs."""
    dist = f"{module}-0.1.dist-info"
    files = {f"{module}/__init__.py": text, f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, body in {**files, f"{dist}/RECORD": record}.items():
            z.writestr(name, body)
    return path


def staged(kit, tmp_path: Path, room: int):  # type: ignore[no-untyped-def]
    """A repository folder with call folders written for a wheel and a site tar.xz (base) and a large random
    payload (dali) packed into calls of ``room`` bytes."""
    src = tmp_path / "src"
    (src / "base").mkdir(parents=True)
    (src / "dali").mkdir()
    make_wheel(src / "base" / "tinywheel-0.1-py3-none-any.whl", "tinywheel", "VALUE = 42\n")
    site = tmp_path / "site-src"
    (site / "sitepkg").mkdir(parents=True)
    (site / "sitepkg" / "__init__.py").write_text("X = 'from the site tarball'\n")
    kit.write_tar_xz(site, src / "base" / "base-site.tar.xz")
    blob = random.Random(0).randbytes(5 * room // 2)
    with tarfile.open(src / "dali" / "dali-site.tar.xz", "w:xz", preset=0) as t:
        info = tarfile.TarInfo("blob.bin")
        info.size = len(blob)
        t.addfile(info, io.BytesIO(blob))
    repo = tmp_path / "repo"
    payloads = kit.payloads_in(src)
    calls = kit.plan_calls(payloads, room, min_room=1000)
    kit.assign_work(calls, {"base": 60, "dali": 60})
    kit.write_calls(calls, payloads, repo / ".whl")
    return repo, calls, blob


def test_parts_stored_call_by_call_are_joined_checked_and_installed(kit, tmp_path):
    room = 200_000  # the random blob hardly compresses: its tar.xz needs three calls
    repo, calls, blob = staged(kit, tmp_path, room)
    assert len(calls) >= 3 and calls[0].install == ["base"] and calls[-1].install == ["dali"]
    store, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    for c in calls:
        assert kit.device(repo, c.number, store, out, run=False) == 0
    base, dali = store / "site" / "base", store / "site" / "dali"
    assert (base / "tinywheel" / "__init__.py").read_text() == "VALUE = 42\n"  # pip installed the wheel
    assert (base / "sitepkg" / "__init__.py").read_text() == "X = 'from the site tarball'\n"
    assert (dali / "blob.bin").read_bytes() == blob
    log = (out / "kit.log").read_text()
    assert "installed base" in log and "installed dali" in log


def test_a_damaged_part_and_a_machine_gone_cold_are_reported(kit, tmp_path):
    repo, calls, _ = staged(kit, tmp_path, 200_000)
    store, out = tmp_path / "store", tmp_path / "out"
    out.mkdir()
    part = repo / ".whl" / "call2" / calls[1].parts[0].name
    good = part.read_bytes()
    part.write_bytes(b"x" + good[1:])
    assert kit.device(repo, 2, store, out, run=False) == 1
    assert "arrived damaged" in (out / "kit.log").read_text()
    part.write_bytes(good)
    for c in calls[1:]:  # call 1's parts never arrived: the machine went back before call 2
        kit.device(repo, c.number, store, out, run=False)
    assert not (store / "site" / "dali").exists()
    assert "start again from call 1" in (out / "kit.log").read_text()
    kit.device(repo, 1, store, out, run=False)  # now every part is stored; then one changes while waiting
    stored = store / "parts" / calls[1].parts[0].name
    stored.write_bytes(stored.read_bytes()[::-1])
    assert kit.device(repo, calls[-1].number, store, out, run=False) == 1
    assert "differs from the one sent" in (out / "kit.log").read_text() and not (store / "site" / "dali").exists()


def test_the_kit_runs_every_gpu_test_and_carries_what_fastdata_imports(kit):
    marked = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")
              if re.search(r"pytest\.mark\.gpu\b", p.read_text(encoding="utf-8"))}
    listed = [args[:args.index("-m")] for group in kit.TESTS.values() for args in " ".join(group).split(" -- ")
              for args in [args.split()] if args[-2:] == ["-m", "gpu"]]
    assert marked and marked == {f for files in listed for f in files}  # every file with gpu tests, run with -m gpu
    pyproject = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.S | re.M).group(1)
    names = {re.match(r"[A-Za-z0-9_.-]+", d.strip().strip('"')).group(0).lower()
             for d in re.findall(r'"([^"]+)"', deps)}
    assert names <= kit.DEVICE_HAS | set(kit.GROUPS["base"])
    assert {"nvidia-dali-cuda130", "nvidia-nvimgcodec-cu13"} <= set(kit.GROUPS["dali"])  # fastdata[dali] and what DALI needs
    pinned = kit.pins(ROOT)
    assert [n for g in kit.GROUPS.values() for n in g if n not in pinned] == []
