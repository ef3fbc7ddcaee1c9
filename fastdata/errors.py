"""Typed errors. Every error a user can cause or meet names the file and the problem.

The CLI maps :class:`UsageError` to exit code 2 and every other :class:`FastdataError`
to exit code 1, and prints the message without a traceback (``--debug`` shows it).
"""

from __future__ import annotations

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
    "RemoteError",
    "RemoteNotFoundError",
    "UsageError",
    "VersionError",
    "WriteError",
]


class FastdataError(Exception):
    """Base of every error fastdata raises on purpose."""

    exit_code = 1


class UsageError(FastdataError):
    """The command was asked for something it cannot do (bad path, DST exists, ...)."""

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


class CacheFullError(RemoteError):
    """The shard cache cannot hold a shard: its limit is too small, or the disk is full."""
