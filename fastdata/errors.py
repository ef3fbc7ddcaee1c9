"""Typed errors. Every error a user can cause or meet names the file and the problem.

The CLI maps :class:`UsageError` to exit code 2 and every other :class:`FastdataError`
to exit code 1, and prints the message without a traceback (``--debug`` shows it).
"""

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


_PARAM = re.compile(r"%\((\w+)\)")  # a parameter named in a UsageError's message
_PARAM_VALUE = re.compile(r"%\((\w+)\)(=)?")


class FastdataError(Exception):
    """Base of every error fastdata raises on purpose."""

    exit_code = 1


class UsageError(FastdataError, ValueError):
    """The command was asked for something it cannot do (bad path, DST exists, ...).

    A ``ValueError`` too, so ordinary ``except ValueError`` code catches bad arguments. A parameter
    the message names is written ``%(name)`` in it: ``str()`` says it as the parameter (``name``), and
    the CLI as the flag that sets it (:meth:`said`, fastdata/cli_convert.py)."""

    exit_code = 2

    def __init__(self, message: str = "") -> None:
        super().__init__(_PARAM.sub(r"\1", message))
        self.template = message

    def said(self, say: Callable[[str, bool], str]) -> str:
        """The message with each parameter said as ``say(name, a value follows)`` (``%(engine)=ray``)."""
        return _PARAM_VALUE.sub(lambda m: say(m.group(1), bool(m.group(2))), self.template)


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
    """The URL's bucket (or container) does not exist: it must be created first. Not a
    RemoteNotFoundError: code that treats a missing object as "nothing there yet" must not
    treat a missing bucket so."""


class CacheFullError(RemoteError):
    """The shard cache cannot hold a shard: its limit is too small, or the disk is full."""
