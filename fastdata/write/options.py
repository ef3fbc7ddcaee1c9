"""What the write engine takes and gives: the Source it reads, the Progress it reports to, the
WriteOptions that decide the shards, and the ConvertReport of a finished conversion."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from fastdata._units import MAX_SIZE, fmt_bytes
from fastdata.errors import UsageError
from fastdata.format import FieldSpec, backend
from fastdata.format import codec as blosc_codec
from fastdata.format.manifest import SKIPPED_NAME
from fastdata.format.spec import LABEL_FIELD

DEFAULT_SHARD_SIZE = 256 << 20
__all__ = ["ConvertReport", "DEFAULT_SHARD_SIZE", "ENGINES", "Engine", "Progress", "Source", "WriteOptions"]


class Source(Protocol):
    """What the engine writes: a scanned, checked input of ``len()`` samples. ``part(start, stop)``: a picklable
    slice that opens its own files in the worker; it may add ``read_rows(i, n)`` (a block of rows, or None)."""

    kind: str
    fields: list[FieldSpec]
    classes: list[str] | None
    skipped: list[tuple[str, str]]  # (name, reason) of each bad sample left out

    def __len__(self) -> int: ...
    @property
    def bytes_in(self) -> int: ...  # the bytes read from the source files (the summary's "in")
    def sample_nbytes(self) -> np.ndarray: ...
    def ragged_rows(self, name: str) -> np.ndarray | None: ...  # None: known by reading (a part's load_rows())
    def part(self, start: int, stop: int) -> "Source": ...
    def read(self, i: int) -> dict[str, np.ndarray]: ...
    def describe(self) -> dict[str, Any]: ...  # for the manifest and the journal (what --resume compares)
    def sample_keys(self) -> list[str] | None: ...  # None: a sample's key is its index
    def inputs(self) -> tuple[list[str], list[np.ndarray]]: ...  # files read, per-sample values the scan found


class Progress(Protocol):
    """Progress of one phase (the CLI's bar); a conversion may have several (image folders: checking, then
    writing). ``unit``: what the samples are (an index counts files)."""

    def start(self, total_samples: int, total_bytes: int, desc: str = ..., unit: str = ...) -> None: ...
    def update(self, samples: int, nbytes: int) -> None: ...


Engine = Literal["local", "ray"]
ENGINES = ("local", "ray")


@dataclass(frozen=True)
class WriteOptions:
    """How to write shards; validated on construction. ``engine``: ``local`` (a process pool here) or ``ray``
    (a task per shard at ``ray_address``, else ``RAY_ADDRESS``, else a local Ray; ``workers`` caps them)."""

    backend: Literal["hdf5", "lmdb"] = "hdf5"
    shard_size: int = DEFAULT_SHARD_SIZE
    workers: int | None = None  # None: one per CPU
    compression: str | None = None
    engine: Engine = "local"
    ray_address: str | None = None

    def __post_init__(self) -> None:
        backend(self.backend).parse_compression(self.compression)
        if blosc_codec.parse(self.compression) is not None:
            blosc_codec.require()  # the packages are missing: say so before anything is written
        if self.shard_size <= 0:
            raise UsageError("%(shard_size) must be positive")
        if self.shard_size > MAX_SIZE:
            raise UsageError(f"%(shard_size) {self.shard_size} is over the limit of 1 EiB ({MAX_SIZE} bytes)")
        if self.workers is not None and self.workers < 1:
            raise UsageError("%(workers) must be at least 1")
        if self.engine not in ENGINES:
            raise UsageError(f"%(engine) {self.engine!r} is unknown (expected one of {', '.join(ENGINES)})")
        if self.ray_address is not None and self.engine != "ray":
            raise UsageError("%(ray_address) applies to %(engine=ray) only")

    def identity(self) -> dict[str, Any]:
        """The options that decide the output bytes (``workers`` and ``engine`` do not), for the journal."""
        return {"backend": self.backend, "shard_size": self.shard_size, "compression": self.compression or "none"}


@dataclass
class ConvertReport:
    dst: Path | str
    backend: str
    samples: int
    shards: int
    bytes_in: int
    bytes_out: int
    seconds: float
    skipped: list[tuple[str, str]] = field(default_factory=list)
    kept: int = 0  # shards of an interrupted conversion that --resume verified and kept
    part: tuple[int, int] | None = None  # (I, N) when this run converted part I of N
    engine: str = "local"
    fields: list[str] = field(default_factory=list)  # the fields written, in the manifest's order
    classes: int | None = None  # how many classes the label field has, when it has names

    def summary(self) -> str:
        rate = self.bytes_in / self.seconds if self.seconds > 0 else 0.0
        what = f"part {self.part[0]}/{self.part[1]}: " if self.part else ""
        via = " (Ray)" if self.engine == "ray" else ""
        line = (
            f"{what}{self.samples} samples -> {self.shards} {self.backend} shard(s) in {self.dst}{via}: "
            f"{fmt_bytes(self.bytes_in)} in, {fmt_bytes(self.bytes_out)} out, {self.seconds:.1f} s, {fmt_bytes(rate)}/s"
        )
        if self.fields:
            named = f" ({self.classes} classes)" if self.classes is not None else ""
            line += "; fields " + ", ".join(f + named if f == LABEL_FIELD else f for f in self.fields)
        if self.kept:
            line += f"; resumed: kept {self.kept} finished shard(s)"
        if self.skipped:
            where = "listed in the part record" if self.part else f"listed in {self.dst}/{SKIPPED_NAME}"
            line += f"; skipped {len(self.skipped)} bad file(s), {where}"
        if self.part:
            line += f"; when all {self.part[1]} parts are done, run: fastdata merge-parts {self.dst}"
        return line
