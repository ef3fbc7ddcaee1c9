"""ConvertConfig: every setting of a conversion in one frozen value, checked when it is made; ImageOptions, its
settings for images."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping

from fastdata.converters.table_read import ColumnType
from fastdata.errors import UsageError
from fastdata.format.spec import CHANNELS
from fastdata.remote import RemoteOptions
from fastdata.write import WriteOptions


@dataclass(frozen=True)
class ImageOptions:
    """How to store images (the CLI's ``--images``, ``--size``, ``--max-side``, ``--quality``, ``--mode``)."""

    images: Literal["encoded", "raw", "jpeg"] = "encoded"
    size: tuple[int, int] | None = None  # (H, W): resize the shorter side, then centre-crop
    max_side: int | None = None
    quality: int | None = None
    mode: Literal["RGB", "L"] = "RGB"

    def __post_init__(self) -> None:
        if self.images not in ("encoded", "raw", "jpeg"):
            raise UsageError(f"%(images) must be encoded, raw or jpeg, not {self.images!r}")
        if self.mode not in CHANNELS:
            raise UsageError(f"%(mode) must be RGB or L, not {self.mode!r}")
        if self.size is not None and (len(self.size) != 2 or min(self.size) < 1):
            raise UsageError(f"%(size) needs two positive integers H W, not {self.size!r}")
        if self.max_side is not None and self.max_side < 1:
            raise UsageError("%(max_side) must be a positive integer")
        if self.size is not None and self.max_side is not None:
            raise UsageError("%(size) and %(max_side) contradict each other; give one")
        if self.images == "encoded" and (self.size is not None or self.max_side is not None):
            raise UsageError("%(images=encoded) keeps the original files; %(size) and %(max_side) resize images and "
                             "need %(images=raw) or %(images=jpeg) (a source without images takes no image options)")
        if self.quality is not None:
            if self.images == "raw":
                raise UsageError("%(quality) applies to %(images=jpeg) or %(images=encoded), not raw")
            if not 1 <= self.quality <= 100:
                raise UsageError(f"%(quality) must be between 1 and 100, not {self.quality}")

    @property
    def channels(self) -> int:
        return CHANNELS[self.mode]

    @property
    def resizes(self) -> bool:
        """Whether images may change size (``size`` or ``max_side``): pixel coordinates then move."""
        return self.size is not None or self.max_side is not None


@dataclass(frozen=True)
class ConvertConfig:
    """How to convert (``fastdata.convert``; the CLI maps its flags to these fields).

    ``write``: the shards. ``images``: how to store images (None: the original files). ``meta_types``: forced
    table column types. ``no_labels``: no class-folder labels. ``skip_bad``: skip bad samples (listed in
    DST/skipped.json). ``strict``: non-sample files are an error. ``allow_nan``: keep NaN/infinite labels.
    ``overwrite``/``resume``: replace/finish a dataset at DST. ``part`` = (I, N): part I of N (then
    ``fastdata.write.merge_parts``). ``remote``: URL storage options. ``keypoints``/``boxes``: pixel-coordinate
    columns; ``not_coordinates``: look-alikes that are not. ``labels_columns``: (path, label) of a labels file.
    """

    write: WriteOptions = field(default_factory=WriteOptions)
    images: ImageOptions | None = None
    meta_types: Mapping[str, ColumnType] = field(default_factory=dict)
    no_labels: bool = False
    skip_bad: bool = False
    strict: bool = False
    allow_nan: bool = False
    overwrite: bool = False
    resume: bool = False
    part: tuple[int, int] | None = None
    remote: RemoteOptions | None = None
    keypoints: tuple[str, ...] = ()
    boxes: tuple[str, ...] = ()
    not_coordinates: tuple[str, ...] = ()
    labels_columns: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.write, WriteOptions):
            raise UsageError(f"%(write) must be a WriteOptions, not {type(self.write).__name__}")
        if self.images is not None and not isinstance(self.images, ImageOptions):
            raise UsageError(f"%(images) must be an ImageOptions or None, not {type(self.images).__name__}")
        bad = [k for k, v in self.meta_types.items() if not isinstance(k, str) or not isinstance(v, ColumnType)]
        if bad:
            raise UsageError(f"%(meta_types) maps column names to ColumnType values; {bad[0]!r} does not")
        part = self.part
        if part is not None and not (isinstance(part, tuple) and len(part) == 2
                                     and all(isinstance(v, int) for v in part) and 0 <= part[0] < part[1]):
            raise UsageError(f"%(part) {part!r}: expected (I, N) with 0 <= I < N")
        if self.overwrite and self.resume:
            raise UsageError("%(overwrite=True) and %(resume=True) contradict each other: %(resume=True) continues, "
                             "%(overwrite=True) starts over")
        if self.remote is not None and not isinstance(self.remote, RemoteOptions):
            raise UsageError(f"%(remote) must be a RemoteOptions, not {type(self.remote).__name__}")
        object.__setattr__(self, "meta_types", dict(self.meta_types))  # a copy the caller cannot change
        seen: dict[str, str] = {}
        for name in ("keypoints", "boxes", "not_coordinates"):
            v = getattr(self, name)
            if isinstance(v, str) or not all(isinstance(c, str) and c for c in v):
                raise UsageError(f"%({name}) takes a tuple of column names, not {v!r}")
            object.__setattr__(self, name, tuple(v))
            for c in v:
                if seen.setdefault(c, name) != name:
                    raise UsageError(f"column {c!r} is given both as %({seen[c]}) and as %({name}); give one")
        lc = self.labels_columns
        if lc is not None:
            if isinstance(lc, str) or len(lc) != 2 or not all(isinstance(c, str) and c for c in lc) or lc[0] == lc[1]:
                raise UsageError(f"%(labels_columns) takes (path column, label column), two names, not {lc!r}")
            object.__setattr__(self, "labels_columns", tuple(lc))
