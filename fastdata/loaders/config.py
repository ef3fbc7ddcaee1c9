"""``LoaderConfig``: the loader's tuning knobs, one frozen, self-validating value shared by both backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fastdata.errors import UsageError

# sizes that moved into the shuffle modes: a config that names one is refused, naming the mode to pass instead
_MOVED = {"block": "Block({})", "window": "Block(window={})", "shard_window": "Shards(window={})"}

# the knobs that take one of a few names, and those names
_CHOICES = {"mode": ("threads", "processes"), "image_dtype": ("float32", "uint8"), "ragged": ("padded", "packed"),
            "crop_decode": ("auto", "off")}


@dataclass(frozen=True)
class LoaderConfig:
    """Tuning knobs of the torch backend (the DALI backend uses ``prefetch``, ``channels_last`` and ``images``).

    ``mode``: ``"threads"`` (recycled, pinned buffers) or ``"processes"`` (fastdata's worker processes and a
    shared-memory ring, for transforms that hold the GIL). ``prefetch``: batches read ahead. ``pin_memory``:
    None pins on CUDA. ``images``: uint8 HWC fields made float NCHW (None: detected); ``image_dtype``:
    ``"float32"`` in [0, 1] or ``"uint8"`` HWC (no ``augment``). ``ragged``: ``"padded"`` or ``"packed"``.
    ``readahead``: bytes hinted ahead (0: off). ``crop_decode``: ``"auto"`` decodes only an initial crop's
    window, ``"off"`` whole images. ``timeout``: seconds per batch (None: no limit).
    """

    mode: Literal["threads", "processes"] = "threads"
    prefetch: int = 4
    pin_memory: bool | None = None
    channels_last: bool = True
    images: tuple[str, ...] | None = None
    image_dtype: Literal["float32", "uint8"] = "float32"
    ragged: Literal["padded", "packed"] = "padded"
    readahead: int = 256 << 20
    crop_decode: Literal["auto", "off"] = "auto"
    timeout: float | None = None

    def __new__(cls, *args: Any, **kw: Any) -> "LoaderConfig":
        moved = sorted(_MOVED.keys() & kw.keys())
        if moved:
            key = moved[0]
            raise UsageError(f"LoaderConfig({key}=...) is gone: the shuffle mode carries its sizes, "
                             f"fastdata.loader(..., shuffle=fastdata.{_MOVED[key].format(kw[key])})")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if str(self.crop_decode) == "region":  # the Literal no longer has it: users of old code may pass it
            raise UsageError("crop_decode='region' was removed (no faster than 'auto': benchmarks/results/jpeg_crop.md); "
                             "use crop_decode='auto'")
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise UsageError(f"{name} must be {' or '.join(map(repr, choices))}, not {value!r}")
        if self.prefetch < 1:
            raise UsageError("prefetch must be at least 1")
        if isinstance(self.readahead, bool) or not isinstance(self.readahead, int) or self.readahead < 0:
            raise UsageError(f"readahead must be a number of bytes >= 0 (0: off), not {self.readahead!r}")
        if self.timeout is not None and (isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float))
                                         or not self.timeout > 0):
            raise UsageError(f"timeout must be a number of seconds > 0 (or None: no limit), not {self.timeout!r}")
