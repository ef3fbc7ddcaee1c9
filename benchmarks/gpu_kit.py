"""Carry what the lent GPU machine lacks, in as few calls as its 64 MiB per call allows, and run the GPU checks.

The device machine (Python 3.12, torch with CUDA 13, no network) lacks ``lmdb`` and ``simplejpeg``,
which fastdata imports, and DALI with its libraries. Here (with network), in the checkout the
device tool sends::

    python benchmarks/gpu_kit.py prepare            # plan A: fastdata's missing wheels, one call
    python benchmarks/gpu_kit.py prepare --dali     # plan B: the same, then DALI in the next calls

``prepare`` downloads the cp312 manylinux wheels at the versions of constraints-dev.txt into
``.whl/wheels/`` (``.whl/`` is added to ``.git/info/exclude``), packs each group into one payload
(``--format site``, the default: the group installed here with ``pip install --target`` for
cp312, extension modules of other Pythons dropped, as ``tar.xz``; ``--format wheels``: the wheels
as they are, installed there with ``pip install --no-index --no-deps --target``), splits payloads
so that each call's working tree plus its parts stays under the budget, writes the parts of call
``k`` to ``.whl/call<k>/`` with ``plan.json``, and prints the ``run`` calls to make in order.
``plan --payloads DIR --dry-run`` plans given files (``DIR/<group>/*``) without writing anything.

On the device each call runs ``python3 benchmarks/gpu_kit.py device --call K``: it copies its
parts to ``/tmp/fdkit/parts`` (kept while the machine stays warm: 30 s after a call) and checks
their SHA-256; the call where a group's last part arrives joins its payloads, checks them and
installs the group into ``/tmp/fdkit/site/<group>``; then it runs the call's tests and
``bench_gpu.py`` sections with ``PYTHONPATH`` = those folders + the repository (no pip resolve,
so the device's torch stays), each step bounded in time, logs and results under ``$OUT``.
Standard library only: the device runs it before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
KIT = ".whl"  # at the repository root, ignored through .git/info/exclude
STORE = Path("/tmp/fdkit")  # on the device: survives between calls while the machine stays warm
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]
# fastdata's runtime dependencies (pyproject.toml) that the device lacks; the device's list
# (/work/.library/device/KINDS.md, read 2026-11-17) shows torch, numpy, h5py, tqdm, pillow and xxhash.
# xxhash is carried anyway, at the tested version: it is 0.5 MB and that list gives no version.
GROUPS: dict[str, list[str]] = {
    "base": ["lmdb", "simplejpeg", "xxhash"],
    # fastdata[dali] and what it needs that the device lacks (six, packaging and numpy are there)
    "dali": ["nvidia-dali-cuda130", "nvidia-nvimgcodec-cu13", "nvidia-nvjpeg", "nvidia-nvjpeg2k-cu13",
             "nvidia-nvtiff-cu13", "nvidia-libnvcomp-cu13", "astunparse", "gast", "optree", "nvtx", "makefun",
             "libcst"],
}
DEVICE_HAS = {"torch", "numpy", "h5py", "tqdm", "pillow", "xxhash"}
# The CUDA-only tests (marked gpu; they skip without CUDA), without and with DALI; "--" starts another
# pytest run: docs/backends.md's DALI block runs only where CUDA and DALI are.
TESTS = {"base": ["tests/test_augment.py", "tests/test_train.py", "tests/test_doctor_h2d.py", "-m", "gpu"],
         "dali": ["tests/test_dali.py", "-m", "gpu", "--", "tests/test_doc_snippets.py", "-k", "backends"]}
# diag early: the ResNet wait it diagnoses is the open question of the first GPU run (2026-11-26); precision last
# (measured whole then, and the slowest)
SECTIONS = {"base": "h2d,diag,train,images,jpeg,views,precision", "dali": "jpeg,dali"}


@dataclass
class Part:
    """One piece of a payload file: bytes ``[offset, offset + size)`` of ``payload``, sent in one call."""

    group: str
    payload: str
    index: int
    offset: int
    size: int
    name: str
    sha256: str = ""


@dataclass
class Call:
    """One ``run`` call: the parts it carries, the groups it installs, what it runs."""

    number: int
    parts: list[Part] = field(default_factory=list)
    install: list[str] = field(default_factory=list)
    tests: list[str] = field(default_factory=list)
    sections: str = ""
    limit_s: int = 60

    @property
    def carried(self) -> int:
        return sum(p.size for p in self.parts)


# --- planning (host side) -------------------------------------------------------------------------------


def plan_calls(payloads: list[tuple[str, Path]], room: int, min_room: int = MIB) -> list[Call]:
    """Parts of ``payloads`` ((group, file), in sending order) packed into consecutive calls of at most
    ``room`` bytes each: a payload that does not fit the space left in a call fills it and goes on in
    the next ones. The fewest calls for that order: each is full but the last."""
    if room < min_room:
        raise ValueError(f"no room for wheels: {room} bytes per call (the working tree takes the budget)")
    calls = [Call(1)]
    for group, path in payloads:
        size, offset, index = path.stat().st_size, 0, 0
        while True:
            if calls[-1].carried >= room and (offset < size or size == 0):
                calls.append(Call(len(calls) + 1))
            take = min(room - calls[-1].carried, size - offset)
            name = path.name if take == size else f"{path.name}.part{index:03d}"
            calls[-1].parts.append(Part(group, path.name, index, offset, take, name))
            offset, index = offset + take, index + 1
            if offset >= size:
                break
    return calls


def assign_work(calls: list[Call], limits: dict[str, int]) -> None:
    """Each group is installed, tested and measured in the call that carries its last part."""
    for group in GROUPS:
        last = max((c.number for c in calls for p in c.parts if p.group == group), default=0)
        if last:
            c = calls[last - 1]
            c.install.append(group)
            c.tests = TESTS[group] if not c.tests else c.tests + ["--"] + TESTS[group]
            c.sections = ",".join(dict.fromkeys(s for s in (c.sections + "," + SECTIONS[group]).split(",") if s))
            c.limit_s = max(c.limit_s, limits[group])


def tree_bytes(root: Path) -> int:
    """Bytes of what travels with every call: tracked and untracked-not-ignored files, and shared/."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True).stdout
    seen = {root / p for p in out.decode().split("\0") if p}
    if (root / "shared").is_dir():
        seen |= {p for p in (root / "shared").rglob("*") if not p.is_dir()}
    return sum(p.lstat().st_size for p in seen if os.path.lexists(p))


def ensure_excluded(root: Path) -> None:
    """Add ``/.whl/`` to the repository's info/exclude (not .gitignore: the folder is this machine's)."""
    rel = subprocess.run(["git", "-C", str(root), "rev-parse", "--git-path", "info/exclude"], capture_output=True,
                         text=True, check=True).stdout.strip()
    path = Path(rel) if Path(rel).is_absolute() else root / rel
    lines = path.read_text().splitlines() if path.exists() else []
    if f"/{KIT}/" not in lines:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines + [f"/{KIT}/"]) + "\n")


def pins(root: Path) -> dict[str, str]:
    """constraints-dev.txt as {normalised name: version}."""
    out = {}
    for line in (root / "constraints-dev.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line.strip())
        if m:
            out[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return out


def download(root: Path, group: str, dest: Path) -> list[Path]:
    """The group's cp312 manylinux x86_64 wheels, at the pinned versions, into ``dest`` (kept between runs)."""
    versions = pins(root)
    missing = [n for n in GROUPS[group] if n not in versions]
    if missing:
        raise SystemExit(f"constraints-dev.txt pins no version of {', '.join(missing)}: pin it (one version travels)")
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "-d", str(dest)]
    cmd += [a for p in PLATFORMS for a in ("--platform", p)] + [f"{n}=={versions[n]}" for n in GROUPS[group]]
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob("*.whl"))
    names = {re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower() for w in wheels}
    if names != set(GROUPS[group]) or len(wheels) != len(names):
        raise SystemExit(f"{dest}: expected one wheel of each of {GROUPS[group]}, found {[w.name for w in wheels]}")
    return wheels


def pack_site(wheels: list[Path], group: str, dest: Path) -> Path:
    """The group installed for cp312 into a temporary folder, other Pythons' extension modules dropped, as tar.xz
    (minutes for DALI: kept, and made again only when the wheels change)."""
    out = dest / f"{group}-site.tar.xz"
    made_from = dest.parent / f"{group}-site.from"
    stamp = "\n".join(f"{w.name} {w.stat().st_size}" for w in wheels)
    if out.exists() and made_from.exists() and made_from.read_text() == stamp:
        return out
    with tempfile.TemporaryDirectory(prefix="fdkit-site-") as tmp:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target", tmp,
               "--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"]
        subprocess.run(cmd + [a for p in PLATFORMS for a in ("--platform", p)] + [str(w) for w in wheels], check=True)
        dropped = [p for p in Path(tmp).rglob("*") if re.search(r"\.cpython-3(?!12-)\d+t?-", p.name)]
        for p in dropped:
            p.unlink()
        print(f"{group}: dropped {len(dropped)} extension modules of other Pythons", flush=True)
        dest.mkdir(parents=True, exist_ok=True)
        write_tar_xz(Path(tmp), out)
    made_from.write_text(stamp)
    return out


def write_tar_xz(src: Path, out: Path) -> None:
    """``src``'s content as ``out`` (tar, xz -9: a third smaller than the wheels' deflate, one call less for
    DALI): through the ``xz`` program on all cores where there is one."""
    tmp = out.with_suffix(".tmp")
    if shutil.which("xz"):
        with open(tmp, "wb") as f:
            xz = subprocess.Popen(["xz", "-9", "-T0", "--memlimit-compress=40%", "-c"], stdin=subprocess.PIPE, stdout=f)
            assert xz.stdin is not None
            with tarfile.open(fileobj=xz.stdin, mode="w|") as t:
                t.add(str(src), arcname=".")
            xz.stdin.close()
            if xz.wait() != 0:
                raise SystemExit(f"xz failed writing {out}")
    else:
        with tarfile.open(tmp, "w:xz", preset=9) as t:
            t.add(str(src), arcname=".")
    os.replace(tmp, out)


def sha256(path: Path, offset: int = 0, size: int | None = None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        left = path.stat().st_size - offset if size is None else size
        while left > 0:
            chunk = f.read(min(left, 8 * MIB))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def write_calls(calls: list[Call], payloads: list[tuple[str, Path]], kit: Path) -> dict[str, object]:
    """Write each call's parts and plan.json into ``kit/call<k>/`` (older call folders removed)."""
    for old in kit.glob("call*"):
        shutil.rmtree(old)
    files = {p.name: p for _, p in payloads}
    plan = {"payloads": {g + "/" + p.name: {"group": g, "name": p.name, "size": p.stat().st_size, "sha256": sha256(p)}
                         for g, p in payloads},
            "calls": []}
    for c in calls:
        d = kit / f"call{c.number}"
        d.mkdir(parents=True)
        for part in c.parts:
            src = files[part.payload]
            with open(src, "rb") as f, open(d / part.name, "wb") as out:
                f.seek(part.offset)
                shutil.copyfileobj(_limited(f, part.size), out)
            part.sha256 = sha256(d / part.name)
    plan["calls"] = [asdict(c) for c in calls]
    for c in calls:
        (kit / f"call{c.number}" / "plan.json").write_text(json.dumps(plan, indent=1))
    return plan


class _limited:
    """A file object that reads at most ``n`` more bytes of ``f``."""

    def __init__(self, f, n: int) -> None:  # type: ignore[no-untyped-def]
        self.f, self.n = f, n

    def read(self, k: int = -1) -> bytes:
        k = self.n if k < 0 else min(k, self.n)
        data = self.f.read(k)
        self.n -= len(data)
        return data


def run_commands(calls: list[Call]) -> list[dict[str, object]]:
    """The ``run`` tool's arguments for each call, in order."""
    out = []
    for c in calls:
        cmd = f"PYTHONUNBUFFERED=1 python3 benchmarks/gpu_kit.py device --call {c.number}"
        out.append({"command": cmd, "carry": [f"{KIT}/call{c.number}"], "timeout_s": min(600, c.limit_s + 45)})
    return out


def describe(calls: list[Call], tree: int, budget: int) -> str:
    lines = [f"working tree that travels: {tree / MIB:.1f} MiB; budget per call {budget / MIB:.0f} MiB", ""]
    for c, r in zip(calls, run_commands(calls)):
        lines.append(f"call {c.number}: carries {c.carried / MIB:.1f} MiB in {len(c.parts)} parts "
                     f"(+ tree = {(c.carried + tree) / MIB:.1f} MiB)"
                     + (f"; installs {', '.join(c.install)}; tests {' '.join(c.tests)}; bench_gpu --sections "
                        f"{c.sections}; limit {c.limit_s} s" if c.install else "; stores its parts only"))
        for p in c.parts:
            lines.append(f"    {p.name}  {p.size / MIB:.2f} MiB")
        lines.append("  run(" + json.dumps(r) + ")")
    lines += ["", "Issue the calls back to back: the machine stays warm 30 s after each, and parts sent earlier "
              "live in its /tmp. Results: each call's $OUT (kit.log, tests.log, bench.log, gpu.json/.md, ...)."]
    return "\n".join(lines)


def payloads_in(directory: Path) -> list[tuple[str, Path]]:
    """``directory/<group>/*`` in sending order: base, dali, then any other group; files by name."""
    groups = sorted((d.name for d in directory.iterdir() if d.is_dir()),
                    key=lambda g: (list(GROUPS).index(g) if g in GROUPS else len(GROUPS), g))
    return [(g, p) for g in groups for p in sorted((directory / g).iterdir()) if p.is_file()]


# --- the device side ------------------------------------------------------------------------------------


def device(root: Path, number: int, store: Path, out: Path, run: bool = True) -> int:
    """Store this call's parts; install the groups complete now; run its tests and bench sections (``run``)."""
    log = open(out / "kit.log", "a", buffering=1)

    def say(msg: str) -> None:
        print(msg, flush=True)
        log.write(msg + "\n")

    plan = json.loads((root / KIT / f"call{number}" / "plan.json").read_text())
    call = plan["calls"][number - 1]
    parts = store / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    for p in call["parts"]:
        src = root / KIT / f"call{number}" / p["name"]
        shutil.copyfile(src, parts / p["name"])
        if sha256(parts / p["name"]) != p["sha256"]:
            say(f"FAILED: {p['name']} arrived damaged (SHA-256 differs): send call {number} again")
            return 1
    say(f"call {number}: stored {len(call['parts'])} parts in {parts}")
    for group in call["install"]:
        problem = install(plan, group, store)
        if problem:
            say(f"FAILED: {problem}")
            return 1
        say(f"installed {group} into {store / 'site' / group}")
    if not call["install"] or not run:
        return 0
    return run_checks(root, call, store, out, say)


def install(plan: dict[str, object], group: str, store: Path) -> str | None:
    """Join the group's parts, check each payload's SHA-256, install it; a problem as one line, else None."""
    site = store / "site" / group
    if (site / ".installed").exists():
        return None
    parts = [p for c in plan["calls"] for p in c["parts"] if p["group"] == group]  # type: ignore[index, union-attr]
    missing = [f"{p['name']} (call {c['number']})" for c in plan["calls"] for p in c["parts"]  # type: ignore[index, union-attr]
               if p["group"] == group and not (store / "parts" / p["name"]).exists()]
    if missing:
        return (f"parts of {group} are missing: {', '.join(missing)}; the machine went back between calls "
                "(its /tmp is gone): start again from call 1")
    joined = store / "payload"
    joined.mkdir(parents=True, exist_ok=True)
    files = []
    for meta in plan["payloads"].values():  # type: ignore[union-attr]
        if meta["group"] != group:
            continue
        target = joined / meta["name"]
        with open(target, "wb") as out:
            for p in sorted((p for p in parts if p["payload"] == meta["name"]), key=lambda p: p["index"]):
                with open(store / "parts" / p["name"], "rb") as f:
                    shutil.copyfileobj(f, out)
        if sha256(target) != meta["sha256"]:
            return f"{meta['name']} joined from its parts differs from the one sent (SHA-256): start again from call 1"
        files.append(target)
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    wheels = [f for f in files if f.suffix == ".whl"]
    if wheels:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--no-cache-dir", "--target", str(site)] + [str(w) for w in wheels])
        if r.returncode != 0:
            return f"pip install of {group}'s wheels exited with {r.returncode}"
    for f in files:
        if f.name.endswith(".tar.xz"):
            with tarfile.open(f, "r:xz") as t:
                t.extractall(site, filter="data") if hasattr(tarfile, "data_filter") else t.extractall(site)
    (site / ".installed").touch()
    return None


def run_checks(root: Path, call: dict[str, object], store: Path, out: Path, say) -> int:  # type: ignore[no-untyped-def]
    """Environment, the call's CUDA-only tests, then its bench_gpu sections, each bounded in time."""
    groups = [g for g in GROUPS if (store / "site" / g / ".installed").exists()]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(store / "site" / g) for g in groups] + [str(root)]),
               PYTHONUNBUFFERED="1")
    end = time.monotonic() + int(call["limit_s"])  # type: ignore[arg-type]
    py = sys.executable
    probe = ("import sys, torch, fastdata, lmdb, simplejpeg, xxhash; print(sys.version.split()[0], 'torch', "
             "torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() "
             "else 'no GPU', 'fastdata from', fastdata.__file__)")
    if "dali" in groups:
        probe += "; import nvidia.dali as d; print('DALI', d.__version__)"
    steps = [("env", [py, "-c", probe], "kit.log", 60),
             ("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm", "--format=csv"],
              "kit.log", 30)]
    tests = list(call["tests"])  # type: ignore[arg-type]
    while tests:
        chunk = tests[:tests.index("--")] if "--" in tests else tests
        tests = tests[len(chunk) + 1:]
        steps.append(("tests", [py, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *chunk], "tests.log", 240))
    steps.append(("bench", [py, "benchmarks/bench_gpu.py", "--sections", str(call["sections"]), "--out", str(out),
                            "--limit-s", "{left}"], "bench.log", 0))
    failed = []
    for name, cmd, logname, cap in steps:
        left = int(end - time.monotonic()) - 10
        budget = left if cap == 0 else min(cap, left)
        if budget < 20:
            say(f"{name}: not run, {left} s left of the call's limit")
            failed.append(name)
            continue
        cmd = [c.replace("{left}", str(budget - 15)) for c in cmd]
        say(f"$ {' '.join(cmd)}   (at most {budget} s)")
        with open(out / logname, "a") as f:
            try:
                r = subprocess.run(cmd, cwd=root, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=budget)
                code = r.returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
            except OSError as e:
                code = f"{type(e).__name__}: {e}"
        say(f"{name}: exit {code}")
        if code != 0:
            failed.append(name)
    say("failed steps: " + (", ".join(failed) if failed else "none"))
    return 1 if failed else 0


# --- command line ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("prepare", "plan"):
        s = sub.add_parser(name)
        s.add_argument("--repo", type=Path, default=ROOT, help="the checkout the device tool sends (default: this one)")
        s.add_argument("--budget-mib", type=float, default=64, help="what one call may carry, tree included")
        s.add_argument("--margin-mib", type=float, default=2, help="kept free for files that change before the calls")
        s.add_argument("--tree-bytes", type=int, default=None, help="the travelling tree's size (default: measured)")
        s.add_argument("--limit-base-s", type=int, default=None,
                       help="limit of the call that runs the base checks (default: 420 s, 330 s when DALI follows)")
        s.add_argument("--limit-dali-s", type=int, default=200, help="limit of the call that runs the DALI checks")
    sub.choices["prepare"].add_argument("--dali", action="store_true", help="plan B: carry DALI too")
    sub.choices["prepare"].add_argument("--format", choices=["site", "wheels"], default="site")
    sub.choices["plan"].add_argument("--payloads", type=Path, required=True, help="folder of <group>/<files>")
    sub.choices["plan"].add_argument("--dry-run", action="store_true", help="print and write the plan only (JSON)")
    d = sub.add_parser("device", help="on the device machine: store, install, run")
    d.add_argument("--call", type=int, required=True)
    d.add_argument("--repo", type=Path, default=ROOT)
    d.add_argument("--store", type=Path, default=STORE)
    d.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_kit_out")))
    d.add_argument("--no-run", action="store_true", help="store and install only (a rehearsal off the device)")
    a = ap.parse_args(argv)
    if a.cmd == "device":
        a.out.mkdir(parents=True, exist_ok=True)
        return device(a.repo.resolve(), a.call, a.store, a.out, run=not a.no_run)
    root = a.repo.resolve()
    kit = root / KIT
    if a.cmd == "prepare":
        ensure_excluded(root)
        payloads = []
        for group in ["base"] + (["dali"] if a.dali else []):
            wheels = download(root, group, kit / "wheels" / group)
            if a.format == "site":
                payloads.append((group, pack_site(wheels, group, kit / "payload" / group)))
            else:
                payloads += [(group, w) for w in wheels]
        for g, p in payloads:
            print(f"{g}: {p.name} {p.stat().st_size / MIB:.2f} MiB", flush=True)
    else:
        payloads = payloads_in(a.payloads)
    tree = tree_bytes(root) if a.tree_bytes is None else a.tree_bytes
    budget = int(a.budget_mib * MIB)
    room = budget - tree - int(a.margin_mib * MIB) - 64 * 1024  # 64 KiB: each call's plan.json
    calls = plan_calls(payloads, room)
    dali = any(g == "dali" for g, _ in payloads)
    assign_work(calls, {"base": a.limit_base_s or (330 if dali else 420), "dali": a.limit_dali_s})
    if a.cmd == "plan" and a.dry_run:
        print(json.dumps({"tree_bytes": tree, "budget_bytes": budget, "room_bytes": room,
                          "calls": [asdict(c) for c in calls], "run": run_commands(calls)}, indent=1))
        return 0
    write_calls(calls, payloads, kit)
    print(describe(calls, tree, budget))
    return 0


if __name__ == "__main__":
    sys.exit(main())
