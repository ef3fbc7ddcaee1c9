"""One cold pass of fastdata.loader over bench_cold's raw-image set (400 natural-looking 256x256x3 uint8
images, HDF5), page cache emptied for the shard first; prints samples/s. Run from two trees alternately
(PYTHONPATH=<tree>) to pair them: ``python benchmarks/pair_cold_images.py DIR make`` once, then
``PYTHONPATH=<tree> python benchmarks/pair_cold_images.py DIR pass`` per pass."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_cold  # noqa: E402

import fastdata  # noqa: E402
from fastdata.loaders import LoaderConfig  # noqa: E402


def make(root: Path) -> None:
    bench_cold.write_folder(root / "npy", 400, lambda rng, c: bench_cold.natural_image(rng, 256), seed=1)
    fastdata.convert(root / "npy", root / "img", fastdata.ConvertConfig(write=fastdata.WriteOptions(backend="hdf5")),
                     progress=None)
    os.sync()


def one_pass(root: Path) -> float:
    for p in sorted((root / "img").glob("*.h5")):
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    with fastdata.loader(root / "img", 64, shuffle=True, device="cpu", config=LoaderConfig(image_dtype="uint8")) as ld:
        t0 = time.perf_counter()
        n = sum(len(b["label"]) for b in ld)
        return n / (time.perf_counter() - t0)


if __name__ == "__main__":
    if sys.argv[2] == "make":
        make(Path(sys.argv[1]))
    else:
        print(f"{one_pass(Path(sys.argv[1])):.0f}")
