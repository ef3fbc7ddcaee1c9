"""``RemoteOptions``: how a remote dataset is reached and cached (one frozen, self-checking value)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from fastdata._units import parse_size
from fastdata.errors import UsageError
from fastdata.fileio import user_cache_dir

DEFAULT_CACHE_LIMIT = "50GB"
ENV_CACHE_DIR = "FASTDATA_REMOTE_CACHE"
ENV_CACHE_LIMIT = "FASTDATA_CACHE_LIMIT"
ENV_TIMEOUT = "FASTDATA_REMOTE_TIMEOUT"  # what ``fastdata --remote-timeout`` sets
DEFAULT_TIMEOUT = 300.0


def default_cache_dir() -> Path:
    """``$FASTDATA_REMOTE_CACHE``, else ``remote/`` in fastdata's user cache directory
    (``$FASTDATA_CACHE_DIR``, ``$XDG_CACHE_HOME/fastdata`` or ``~/.cache/fastdata``)."""
    env = os.environ.get(ENV_CACHE_DIR)
    return Path(env) if env else user_cache_dir() / "remote"


def default_timeout() -> float:
    """``$FASTDATA_REMOTE_TIMEOUT`` (seconds), else 300."""
    raw = os.environ.get(ENV_TIMEOUT)
    if raw is None or not raw.strip():
        return DEFAULT_TIMEOUT
    try:
        return float(raw)
    except ValueError:
        raise UsageError(f"${ENV_TIMEOUT}={raw!r}: not a number of seconds") from None


@dataclass(frozen=True)
class RemoteOptions:
    """Options for datasets given as URLs (``fastdata.open(url, remote=...)``, ``fastdata.loader``).

    ``cache_dir``: the node's shard cache (default :func:`default_cache_dir`). ``cache_limit``: bytes, e.g.
    ``"50GB"`` (default ``$FASTDATA_CACHE_LIMIT`` or 50GB). ``storage_options``: for fsspec (never logged).
    ``prefetch_shards``: shards downloaded ahead by ``download_threads`` threads. ``timeout``: seconds per
    remote operation, retries included (default ``$FASTDATA_REMOTE_TIMEOUT`` or 300).
    """

    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | str | None = None
    storage_options: Mapping[str, Any] | None = field(default=None, hash=False)
    prefetch_shards: int = 2
    download_threads: int = 2
    timeout: float = field(default_factory=default_timeout)

    def __post_init__(self) -> None:
        if self.prefetch_shards < 0:
            raise UsageError("prefetch_shards must be >= 0")
        if self.download_threads < 1:
            raise UsageError("download_threads must be >= 1")
        if not self.timeout > 0 or self.timeout == float("inf"):
            raise UsageError(f"timeout must be a positive number of seconds, not {self.timeout}")
        self.limit_bytes()  # a bad size fails here, not at the first download

    def cache_path(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir is not None else default_cache_dir()

    def limit_bytes(self) -> int:
        raw = self.cache_limit if self.cache_limit is not None else os.environ.get(ENV_CACHE_LIMIT, DEFAULT_CACHE_LIMIT)
        if isinstance(raw, int) and not isinstance(raw, bool):
            if raw <= 0:
                raise UsageError(f"cache_limit must be positive, not {raw}")
            return raw
        try:
            return parse_size(str(raw))
        except ValueError as e:
            raise UsageError(f"cache_limit: {e}") from None
