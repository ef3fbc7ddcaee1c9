"""Every code block of README.md and docs/*.md runs as written (tests/snippets.py says how blocks are read).

Each page that has code gets a setup below that makes, in tmp_path, the small data its commands and
Python blocks name (a class folder of .npy, images, tables, ...); then its blocks run in page order in
one working directory, the Python blocks in one namespace, each ``fastdata ...`` line through the CLI
(in-process). ``REWRITES`` lists the few changes made to a command before it runs (placeholder paths
such as ``/shared/raw`` mapped into tmp_path, a benchmark's time shortened); each must match. S3 pages
run against the local moto server of tests/conftest.py.

In an ``alternatives`` block each command is an alternative to the others: a convert's destination is
removed before it runs, and after the block the first command runs again, so the page's later blocks
see what its first line made. Blocks marked ``slow`` (a local Ray) run in a test marked slow instead,
``gpu``/``dali`` blocks only where CUDA (and DALI) is present.
"""

from __future__ import annotations

import fastdata

import contextlib
import importlib.util
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import snippets
from PIL import Image
from fastdata import cli

Setup = Callable[[Path, pytest.MonkeyPatch, pytest.FixtureRequest], None]
RNG = np.random.default_rng(0)


# --- data the pages name ------------------------------------------------------------------------------------


def npy_classes(root: Path, n: int = 24, shape: tuple[int, ...] = (2, 4, 3), classes: tuple[str, ...] = ("cat", "dog"),
                stem: str = "") -> None:
    """root/<class>/<i>.npy, ``n`` float32 samples in all."""
    rng = np.random.default_rng(len(str(root)))
    for i in range(n):
        d = root / classes[i % len(classes)]
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / f"{stem}{i:03d}.npy", rng.standard_normal(shape).astype(np.float32))


def image(path: Path, hw: tuple[int, int] = (16, 20), mode: str = "RGB", seed: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
    Image.fromarray(a).convert(mode).save(path)


def image_classes(root: Path, n: int = 6, ext: str = "png", sizes: tuple[tuple[int, int], ...] = ((16, 20),)) -> None:
    """root/<class>/<i>.<ext>: ``n`` small RGB images in two classes."""
    for i in range(n):
        image(root / ("cat", "dog")[i % 2] / f"{i:03d}.{ext}", sizes[i % len(sizes)], seed=i)


def keypoints(seed: int) -> list[list[float]]:
    r = np.random.default_rng(seed)
    return [[float(r.uniform(0, 15)), float(r.uniform(0, 15)), 2.0] for _ in range(17)]


def pose_source(root: Path, n: int = 12) -> None:
    """pose/images/*.png and pose/train.csv (path, keypoints (17, 3), label): convert.md's pose example."""
    rows = ["path,keypoints,label"]
    for i in range(n):
        image(root / "images" / f"{i:03d}.png", seed=i)
        rows.append(f'images/{i:03d}.png,"{json.dumps(keypoints(i))}",{("cat", "dog")[i % 2]}')
    (root / "train.csv").write_text("\n".join(rows) + "\n")


def heads_source(root: Path, n: int = 15) -> None:
    """heads/*.png and heads/meta.jsonl (path, angles (3,), subject): convert.md's head-pose example."""
    lines = []
    for i in range(n):
        image(root / f"s{i % 3}_{i:02d}.png", seed=i)
        lines.append(json.dumps({"path": f"s{i % 3}_{i:02d}.png", "angles": [i * 1.5, -3.0, 0.25],
                                 "subject": f"subject-{i % 3}"}))
    (root / "meta.jsonl").write_text("\n".join(lines) + "\n")


def seqs_source(root: Path) -> None:
    """seqs/rec/<r>/<i>.npy, (t, 8) recordings of varying length, and seqs/meta.parquet (path, label, recording)."""
    rows = []
    for r in range(5):
        for i in range(4):
            rel = f"rec/{r}/{i}.npy"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            np.save(root / rel, RNG.standard_normal((3 + i, 8)).astype(np.float32))
            rows.append({"path": rel, "label": (r + i) % 2, "recording": f"rec-{r}"})
    parquet(root / "meta.parquet", {k: [row[k] for row in rows] for k in rows[0]})


def seg_source(root: Path, n: int = 6) -> None:
    """seg/img/*.png, seg/mask/*.png (one channel of class indices) and seg/meta.csv: convert.md's segmentation."""
    rows = ["path,mask"]
    for i in range(n):
        image(root / "img" / f"{i}.png", seed=i)
        (root / "mask").mkdir(parents=True, exist_ok=True)
        Image.fromarray(RNG.integers(0, 3, (16, 20), dtype=np.uint8), "L").save(root / "mask" / f"{i}.png")
        rows.append(f"img/{i}.png,mask/{i}.png")
    (root / "meta.csv").write_text("\n".join(rows) + "\n")


def parquet(path: Path, columns: dict[str, list]) -> None:
    pq = pytest.importorskip("pyarrow.parquet")  # fastdata[parquet], in the dev extra
    pq.write_table(pytest.importorskip("pyarrow").table(columns), path)


def convert(src: Path | str, dst: Path | str, **kw) -> None:
    fastdata.convert(Path(src), Path(dst), fastdata.ConvertConfig(write=fastdata.WriteOptions(workers=1), **kw))


def run_fastdata(args: list[str]) -> tuple[int, str]:
    """``fastdata ARGS`` in this process: (exit code, stdout + stderr)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = cli.main(args)
        except SystemExit as e:  # argparse usage errors
            code = e.code if isinstance(e.code, int) else 2
    return code, out.getvalue()


# --- each page's setup ----------------------------------------------------------------------------------------


def readme(tmp: Path, mp: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    npy_classes(tmp / "train", n=100)  # the Python block reads sample 99
    np.save(tmp / "X.npy", RNG.standard_normal((20, 4)).astype(np.float32))
    np.save(tmp / "y.npy", np.arange(20) % 3)
    np.save(tmp / "F.npy", RNG.standard_normal((20, 5)).astype(np.float32))
    np.save(tmp / "Y.npy", RNG.standard_normal(20).astype(np.float32))
    (tmp / "seqs").mkdir()
    for i in range(4):
        np.save(tmp / "seqs" / f"{i}.npy", RNG.standard_normal((2 + i, 3)).astype(np.float32))
    (tmp / "labels.csv").write_text("".join(f"{i}.npy,{'ab'[i % 2]}\n" for i in range(4)))
    image_classes(tmp / "photos", ext="jpg")
    pose_source(tmp / "pose", n=4)
    image_classes(tmp / "pets", ext="jpg")
    parquet(tmp / "pets" / "table.parquet", {"path": [f"{('cat', 'dog')[i % 2]}/{i:03d}.jpg" for i in range(6)],
                                             "angle": [i * 1.5 for i in range(6)]})


def quickstart(tmp: Path, mp: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    npy_classes(tmp / "train", n=24, shape=(3, 8, 8))
    np.save(tmp / "X.npy", RNG.standard_normal((20, 4)).astype(np.float32))
    np.save(tmp / "y.npy", np.arange(20) % 3)
    image_classes(tmp / "images")


def image_shards(tmp: Path, mp: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """shards/: 8 PNG images of two sizes in two classes."""
    image_classes(tmp / "photos", n=8, sizes=((16, 20), (20, 14)))
    convert(tmp / "photos", tmp / "shards")


def loader_page(tmp: Path, mp: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    image_shards(tmp, mp, request)
    convert_md(tmp, mp, request)
    for src, dst, table in (("pose", "pose.fd", "train.csv"), ("heads", "heads.fd", "meta.jsonl"),
                            ("seqs", "seqs.fd", "meta.parquet"), ("seg", "seg.fd", "meta.csv")):
        code, out = run_fastdata(["convert", src, dst, "--meta", f"{src}/{table}", "--quiet", "--workers", "1"])
        assert code == 0, out


def convert_md(tmp: Path, mp: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    pose_source(tmp / "pose")
    heads_source(tmp / "heads")
    seqs_source(tmp / "seqs")
    seg_source(tmp / "seg")
    image_classes(tmp / "train", sizes=((16, 20), (20, 14)))
    (tmp / "faces").mkdir()
    for i in range(4):
        image(tmp / "faces" / f"{i}.png", seed=i)
    (tmp / "labels.csv").write_text("".join(f"{i}.png,{i % 2}\n" for i in range(4)))


def augment_page(tmp: Path, mp: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """An image dataset with every target kind of the example: keypoints, boxes (ragged), a mask, a pose."""
    rows = ["path,keypoints,boxes,mask,pose"]
    for i in range(8):
        image(tmp / "src" / "img" / f"{i}.png", seed=i)
        (tmp / "src" / "mask").mkdir(parents=True, exist_ok=True)
        Image.fromarray(RNG.integers(0, 3, (16, 20), dtype=np.uint8), "L").save(tmp / "src" / "mask" / f"{i}.png")
        boxes = [[1.0, 2.0, 8.0, 9.0]] * (1 + i % 3)
        rows.append(f'img/{i}.png,"{keypoints(i)}","{boxes}",mask/{i}.png,"[{i}.0, 1.0, -2.0]"')
    (tmp / "src" / "meta.csv").write_text("\n".join(rows) + "\n")
    code, out = run_fastdata(["convert", "src", "shards", "--meta", "src/meta.csv", "--quiet", "--workers", "1"])
    assert code == 0, out
    image_classes(tmp / "pet-photos", n=8)  # the MixUp/CutMix example: images with class labels
    convert(tmp / "pet-photos", tmp / "pets")
    for i in range(8):  # the sequence example: (t, 16) recordings of different lengths, in two classes
        d = tmp / "rec" / ("a", "b")[i % 2]
        d.mkdir(parents=True, exist_ok=True)
        np.save(d / f"{i}.npy", RNG.standard_normal((20 + 3 * i, 16)).astype(np.float32))
    convert(tmp / "rec", tmp / "recordings")


def training(tmp: Path, mp: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    npy_classes(tmp / "src", n=16, shape=(2, 4, 3), classes=("a", "b", "c", "d"))
    convert(tmp / "src", tmp / "shards")


def reliability(tmp: Path, mp: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    npy_classes(tmp / "src", n=8)
    convert(tmp / "src", tmp / "shards")


def scale(tmp: Path, mp: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    npy_classes(tmp / "shared" / "raw", n=12)
    for year in ("2024", "2025"):
        npy_classes(tmp / "src" / year, n=6, stem=f"{year}-")  # file names differ: the merged keys stay unique
        convert(tmp / "src" / year, tmp / "data" / f"ds_{year}")


def remote(tmp: Path, mp: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """train/ to upload, and a bucket named ``bucket`` on the local S3 server (emptied first)."""
    s3 = request.getfixturevalue("s3")
    mp.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    fs = s3.fs()
    if fs.exists("bucket"):
        fs.rm("bucket", recursive=True)
    fs.mkdir("bucket")
    npy_classes(tmp / "train", n=12)


def doctor_page(tmp: Path, mp: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """train.py: the image-classifier script of tests/doctor_scripts (with its timing helper), over a few JPEGs."""
    scripts = snippets.ROOT / "tests" / "doctor_scripts"
    shutil.copy(scripts / "_direct.py", tmp)
    train = (scripts / "image_folder.py").read_text()  # smaller batches and more epochs: enough steps for --steps 12
    train = train.replace('"--batch-size", type=int, default=32', '"--batch-size", type=int, default=4')
    (tmp / "train.py").write_text(train.replace('"--epochs", type=int, default=1', '"--epochs", type=int, default=8'))
    image_classes(tmp / "images", n=40, ext="jpg", sizes=((48, 64),))


def inplace_page(tmp: Path, mp: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """data.h5 and runs/*.h5 with /images and /labels, x.npy + y.npy, store.zarr with images and labels."""
    import h5py
    import zarr

    x = RNG.standard_normal((40, 2, 16, 16)).astype(np.float32)
    y = np.arange(40)
    (tmp / "runs").mkdir()
    for path, sl in ((tmp / "data.h5", slice(0, 40)), (tmp / "runs" / "a.h5", slice(0, 15)),
                     (tmp / "runs" / "b.h5", slice(15, 40))):
        with h5py.File(path, "w") as f:
            f.create_dataset("images", data=x[sl], chunks=(8, 2, 16, 16), compression="gzip", shuffle=True)
            f["labels"] = y[sl]
    np.save(tmp / "x.npy", x)
    np.save(tmp / "y.npy", y)
    g = zarr.open_group(str(tmp / "store.zarr"), mode="w")
    g.create_array("images", shape=x.shape, chunks=(8, 2, 16, 16), dtype="f4")[:] = x
    g.create_array("labels", shape=y.shape, chunks=(16,), dtype=y.dtype)[:] = y


SETUPS: dict[str, Setup] = {
    "README.md": readme,
    "docs/quickstart.md": quickstart,
    "docs/convert.md": convert_md,
    "docs/loader.md": loader_page,
    "docs/augment.md": augment_page,
    "docs/backends.md": image_shards,
    "docs/training.md": training,
    "docs/reliability.md": reliability,
    "docs/scale.md": scale,
    "docs/remote.md": remote,
    "docs/doctor.md": doctor_page,
    "docs/in-place.md": inplace_page,
}

# (page, text in a command, what runs instead): placeholder paths into tmp_path, benchmarks shortened.
REWRITES: list[tuple[str, str, str]] = [
    ("docs/quickstart.md", "--naive train/", "--naive train/ --seconds 0.5"),
    ("docs/quickstart.md", "--budget 60s", "--budget 1s"),
    ("docs/scale.md", "/shared/", "shared/"),
    ("docs/scale.md", "/data/", "data/"),
    ("docs/remote.md", "--seconds 20", "--seconds 0.5"),
    ("docs/doctor.md", "--seconds 20", "--seconds 2"),
]


def rewrite(page: str, command: str, used: set[int]) -> str:
    for k, (p, old, new) in enumerate(REWRITES):
        if p == page and old in command:
            command = command.replace(old, new)
            used.add(k)
    return command


def runnable(block: snippets.Block) -> bool:
    """Blocks the runner executes (Python not copied from docs/examples/, shell with commands)."""
    if block.marker == "skip" or block.lang in snippets.TEXT:
        return False
    if block.lang == "python":
        return snippets.example_file(block) is None
    return any(not snippets.is_benchmark(c) for _, c in block.commands())


def all_blocks() -> list[snippets.Block]:
    return [b for page in snippets.PAGES for b in snippets.blocks(page)]


PAGES_WITH_CODE = sorted({b.page for b in all_blocks() if runnable(b)})


# --- the runner ------------------------------------------------------------------------------------------------


def run_shell(block: snippets.Block, used: set[int]) -> None:
    commands = [(line, rewrite(block.page, c, used)) for line, c in block.commands()
                if not snippets.is_benchmark(c)]
    for line, command in commands:
        if block.marker == "alternatives":
            remove_destination(command)
        run_command(block.page, line, command)
    if block.marker == "alternatives" and len(commands) > 1:
        remove_destination(commands[0][1])
        run_command(block.page, *commands[0])


def remove_destination(command: str) -> None:
    args = cli.build_parser().parse_args(snippets.argv(command))
    if args.command == "convert" and Path(args.dst).is_dir():
        shutil.rmtree(args.dst)


def run_command(page: str, line: int, command: str) -> None:
    code, out = run_fastdata(snippets.argv(command))
    assert code == 0, f"{page}:{line}: `{command}` exited with {code}:\n{out[-3000:]}"


def run_page(page: str, tmp: Path, mp: pytest.MonkeyPatch, request: pytest.FixtureRequest, slow: bool = False) -> None:
    """Set the page's data up in ``tmp``, then run its blocks in order (``slow``: only the blocks marked slow)."""
    import torch

    mp.chdir(tmp)
    mp.setenv("FASTDATA_CACHE_DIR", str(tmp / "cache"))
    mp.setenv("FASTDATA_REMOTE_CACHE", str(tmp / "remote-cache"))
    SETUPS[page](tmp, mp, request)
    namespace: dict = {"__name__": "__snippet__"}
    used: set[int] = set()
    for block in snippets.blocks(snippets.ROOT / page):
        if not runnable(block) or (block.marker == "slow") != slow \
                or block.marker in ("gpu", "dali") and not torch.cuda.is_available() \
                or block.marker == "dali" and importlib.util.find_spec("nvidia.dali") is None:
            continue
        if block.lang == "python":
            exec(compile(block.code, block.where, "exec"), namespace)  # noqa: S102 - our own documentation
        else:
            run_shell(block, used)
    stale = [r for k, r in enumerate(REWRITES) if r[0] == page and k not in used]
    assert slow or not stale, f"rewrites that match no command of {page} any more: {stale}"


# pages whose snippets take long and whose commands have tests of their own: in the slow set (the default
# suite has a 10-minute budget); docs/doctor.md runs a training script under the doctor (~30 s; tests/test_doctor.py)
SLOW_PAGES = {"docs/doctor.md"}


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PAGES else p for p in PAGES_WITH_CODE])
def test_page_snippets_run(page, tmp_path, monkeypatch, request):
    run_page(page, tmp_path, monkeypatch, request)


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted({b.page for b in all_blocks() if b.marker == "slow"}))
def test_slow_page_snippets_run(page, tmp_path, monkeypatch, request):
    """The blocks marked slow (a local Ray: seconds to start), on the page's fresh data."""
    if "--engine ray" in "".join(b.code for b in snippets.blocks(snippets.ROOT / page) if b.marker == "slow"):
        pytest.importorskip("ray")
    run_page(page, tmp_path, monkeypatch, request, slow=True)


@pytest.mark.parametrize("source", ["images", "arrays (2, 8, 8, 8)", "X.npy --labels y.npy"])
def test_quickstart_trains_on_any_dataset(source, tmp_path, monkeypatch):
    """Step 3 of the quickstart, as written, on the other kinds of data the page names (the page test trains
    on .npy samples of (3, 8, 8))."""
    monkeypatch.chdir(tmp_path)
    if source == "images":
        image_classes(tmp_path / "src", n=8, sizes=((16, 20), (20, 14)))
        args = ["src/", "shards/train/"]
    elif source.startswith("arrays"):
        npy_classes(tmp_path / "src", n=8, shape=(2, 8, 8, 8))
        args = ["src/", "shards/train/"]
    else:
        np.save(tmp_path / "X.npy", RNG.standard_normal((8, 5)).astype(np.float32))
        np.save(tmp_path / "y.npy", np.arange(8) % 3)
        args = ["X.npy", "shards/train/", "--labels", "y.npy"]
    code, out = run_fastdata(["convert", *args, "--quiet", "--workers", "1"])
    assert code == 0, out
    train = next(b for b in snippets.blocks(snippets.ROOT / "docs/quickstart.md") if b.lang == "python")
    assert "fit(" in train.code
    namespace: dict = {}
    exec(compile(train.code, train.where, "exec"), namespace)  # noqa: S102 - our own documentation
    assert [m.samples for m in namespace["result"].epochs] == [8] * 10


# --- every block is covered ------------------------------------------------------------------------------------


def test_every_block_is_run_or_marked_with_a_reason():
    problems = []
    for b in all_blocks():
        if b.marker and b.marker not in snippets.KINDS:
            problems.append(f"{b.where}: unknown snippet marker {b.marker!r} (known: {sorted(snippets.KINDS)})")
        if b.marker in ("skip", "slow") and len(b.why.split()) < 3:
            problems.append(f"{b.where}: a {b.marker} block must say why (<!-- snippet: {b.marker} WHY -->)")
        if b.marker == "skip" or b.lang in snippets.TEXT:
            continue
        if b.lang == "python":
            name = snippets.example_file(b)
            if name is not None and not (snippets.ROOT / name).is_file():
                problems.append(f"{b.where}: shows {name}, which does not exist")
        elif b.lang == "shell":
            for line, c in b.commands():
                if not c.startswith("fastdata ") and not snippets.is_benchmark(c):
                    problems.append(f"{b.where}: line {line} `{c}` is neither a fastdata command nor a benchmark: "
                                    "mark the block (<!-- snippet: skip WHY -->) or tag it ```text")
        else:
            problems.append(f"{b.where}: a ```{b.lang} block: the runner knows python, shell and {sorted(snippets.TEXT)}")
    assert not problems, "\n".join(problems)


def test_every_page_with_code_has_a_setup():
    assert set(PAGES_WITH_CODE) <= set(SETUPS), f"pages with code but no setup here: {set(PAGES_WITH_CODE) - set(SETUPS)}"
    assert {p for p, _, _ in REWRITES} <= set(PAGES_WITH_CODE)


def test_the_reader_sees_every_kind_of_block(tmp_path):
    """The block reader itself: fences with and without a language, indented blocks, markers."""
    page = tmp_path / "page.md"
    page.write_text("text\n\n    fastdata info a/\n    fastdata info b/   # comment\n\nmore\n"
                    "<!-- snippet: skip needs a cluster here -->\n```\nray start\n```\n"
                    "```python\nx = 1\n```\n```text\nout\n```\n  - a list item\n    continued\n")
    got = snippets.blocks(page, "page.md")
    assert [(b.lang, b.marker) for b in got] == [("shell", ""), ("shell", "skip"), ("python", ""), ("text", "")]
    assert got[0].commands() == [(3, "fastdata info a/"), (4, "fastdata info b/")]
    assert got[1].why == "needs a cluster here"

