"""``LoaderConfig``: the loader's tuning knobs, one frozen, self-validating value shared by both backends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fastdata.errors import UsageError

# sizes that moved into the shuffle modes: a config that names one is refused, naming the mode to pass instead
_MOVED = {"block": "Block({})", "window": "Block(window={})", "shard_window": "Shards(window={})"}


@dataclass(frozen=True)
class LoaderConfig:
    """Tuning knobs of the torch backend; the defaults were chosen by measurement (docs/tuning.md).

    ``mode``: ``"threads"`` reads batches in threads of this process into recycled (pinned)
    buffers; ``"processes"`` reads them in DataLoader worker processes. ``prefetch``: batches
    read ahead. ``pin_memory``: ``None`` pins when the device is CUDA. ``images``: names of
    uint8 HWC fields to turn into float NCHW (``None``: detected). ``image_dtype``: ``"float32"``
    gives images as float NCHW in [0, 1]; ``"uint8"`` keeps them as stored, uint8 ``(B, H, W, C)``:
    the choice when your model converts on the GPU (a quarter of the bytes to copy and move, no
    CPU pass; no ``augment`` then). The DALI backend uses ``prefetch`` (its queue depth),
    ``channels_last`` and ``images``.
    ``readahead``: bytes of shard file ranges hinted to the kernel beyond the batches being read,
    following the epoch plan (fastdata/reading/readahead.py; docs/loader.md, "Larger than RAM"); 0: off.
    ``ragged``: ``"padded"`` pads ragged fields (and mixed-size images) to the batch's largest
    sample; ``"packed"`` gives them back to back with ``<name>_offsets`` (``Dataset.get_batch``),
    e.g. for ``torch.nested.nested_tensor_from_jagged(x, x_offsets)``; torch backend only, and
    mixed-size images then stay flat uint8 bytes (``image_dtype="uint8"``, no ``augment``).
    ``crop_decode``: when ``augment`` starts with a crop or ``Resize``, the reader threads decode
    each image's window only (a JPEG at the smallest DCT scale that keeps the output's resolution)
    straight into the fixed-size batch (fastdata/loaders/crop.py, docs/backends.md); ``"off"``:
    decode whole images into a padded batch and crop after (bit-exact with decoding first).
    ``"auto"``: simplejpeg (PIL without it), DCT-scaled when the window allows, else the whole image.
    ``timeout``: seconds to wait for each batch from the readers (like DataLoader's ``timeout``); a batch
    whose read or transform takes longer raises ``LoaderWorkerError`` naming it (a hung worker process is
    killed; a hung reader thread cannot be stopped). ``None``: wait as long as it takes. Torch backend only.
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
        if self.mode not in ("threads", "processes"):
            raise UsageError(f"mode must be 'threads' or 'processes', not {self.mode!r}")
        if self.prefetch < 1:
            raise UsageError("prefetch must be at least 1")
        if self.image_dtype not in ("float32", "uint8"):
            raise UsageError(f"image_dtype must be 'float32' or 'uint8', not {self.image_dtype!r}")
        if self.ragged not in ("padded", "packed"):
            raise UsageError(f"ragged must be 'padded' or 'packed', not {self.ragged!r}")
        if isinstance(self.readahead, bool) or not isinstance(self.readahead, int) or self.readahead < 0:
            raise UsageError(f"readahead must be a number of bytes >= 0 (0: off), not {self.readahead!r}")
        if str(self.crop_decode) == "region":  # the Literal no longer has it: users of old code may pass it
            raise UsageError("crop_decode='region' was removed (no faster than 'auto': benchmarks/results/jpeg_crop.md); "
                             "use crop_decode='auto'")
        if self.crop_decode not in ("auto", "off"):
            raise UsageError(f"crop_decode must be 'auto' or 'off', not {self.crop_decode!r}")
        if self.timeout is not None and (isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float))
                                         or not self.timeout > 0):
            raise UsageError(f"timeout must be a number of seconds > 0 (or None: no limit), not {self.timeout!r}")
