"""Typed errors, each naming the file and the problem; the CLI prints them without a traceback, exit code 2
for :class:`UsageError`, 1 for the others."""

from __future__ import annotations

import re
from typing import Callable

__all__ = [
    "BackendUnavailableError",
    "CacheFullError",
    "CorruptShardError",
    "DataError",
    "DestinationBusyError",
    "FastdataError",
    "FormatError",
    "IncompleteDatasetError",
    "LoaderWorkerError",
    "NoSuchBucketError",
    "RemoteError",
    "RemoteNotFoundError",
    "UsageError",
    "VersionError",
    "WriteError",
]


# A parameter named in a message: %(name), or %(name=value) (%(engine=ray), %(resume=True), %(keypoints=('kp',))).
_PARAM = re.compile(r"%\((\w+)(?:=((?:[^()]|\([^()]*\))*))?\)")


class FastdataError(Exception):
    """Base of every error fastdata raises on purpose. A parameter named ``%(name)`` or ``%(name=value)`` in the
    message reads as the parameter in ``str()`` and as its flag in the CLI (:meth:`said`)."""

    exit_code = 1

    def __init__(self, *args: object) -> None:
        first = args[0] if args else None
        self.template = first if isinstance(first, str) else None
        if isinstance(first, str):
            args = (_PARAM.sub(lambda m: m.group(1) if m.group(2) is None else f"{m.group(1)}={m.group(2)}", first),
                    *args[1:])
        super().__init__(*args)

    def said(self, say: Callable[[str, str | None], str]) -> str:
        """The message with each parameter said as ``say(name, value or None)``."""
        if self.template is None:
            return str(self)
        return _PARAM.sub(lambda m: say(m.group(1), m.group(2)), self.template)


class UsageError(FastdataError, ValueError):
    """The command was asked for something it cannot do (bad path, DST exists, ...); a ValueError too."""

    exit_code = 2


class BackendUnavailableError(UsageError):
    """The loader backend asked for cannot run here (not installed, or built for another CUDA)."""


class DestinationBusyError(UsageError):
    """Another conversion is writing the same destination folder right now."""


class WriteError(FastdataError):
    """Writing the destination failed: disk full, I/O error, permission denied, read-only disk."""


class DataError(FastdataError):
    """A source file cannot be converted: unreadable, truncated, wrong dtype or shape."""


class FormatError(FastdataError):
    """A dataset on disk does not follow the fastdata format (bad or hostile manifest)."""


class IncompleteDatasetError(FormatError):
    """The directory has no manifest: a conversion never finished there."""


class VersionError(FormatError):
    """The dataset was written by a newer fastdata with a format this one cannot read."""


class CorruptShardError(FormatError):
    """A shard is missing, has the wrong size, or holds a record that fails its checks."""


class LoaderWorkerError(FastdataError):
    """An unexpected error in a loader thread or worker; the message says where it happened."""


class RemoteError(FastdataError):
    """A remote dataset could not be read or written: the message names the URL (and the shard)."""


class RemoteNotFoundError(RemoteError):
    """The object (or its bucket) does not exist."""


class NoSuchBucketError(RemoteError):
    """The URL's bucket (or container) does not exist and must be created first; deliberately not a
    RemoteNotFoundError, which callers may treat as "nothing there yet"."""


class CacheFullError(RemoteError):
    """The shard cache cannot hold a shard: its limit is too small, or the disk is full."""
