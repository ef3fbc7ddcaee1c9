"""URLs versus local paths (a string with a scheme is a URL, never a local path), and the fsspec
filesystem behind a URL."""

from __future__ import annotations

import logging
import math
import os
import re
from typing import Any, Mapping

from fastdata.errors import UsageError

log = logging.getLogger("fastdata.remote")

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# Packages users must install for common schemes (fsspec's own hint is less direct).
_PACKAGES = {"s3": "s3fs (pip install 'fastdata[s3]')", "s3a": "s3fs (pip install 'fastdata[s3]')",
             "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs", "abfss": "adlfs",
             "http": "aiohttp", "https": "aiohttp"}
# botocore's config for S3: every call bounded in time
_S3_CONFIG: dict[str, Any] = {"connect_timeout": 10, "read_timeout": 30, "retries": {"max_attempts": 2, "mode": "standard"}}


def is_url(path: str | os.PathLike[str]) -> bool:
    """True for ``scheme://...`` strings (never a local path)."""
    return isinstance(path, str) and _URL.match(path) is not None


# Schemes whose URLs name no bucket or host: everything after "://" is a path.
_HOSTLESS = {"file", "local", "memory"}


def scheme(url: str) -> str:
    """The URL's scheme, lower-cased; a UsageError when ``url`` is no URL or names no bucket or host."""
    m = _URL.match(url)
    if m is None:
        raise UsageError(f"{url}: not a URL")
    proto = m.group(1).lower()
    if proto not in _HOSTLESS and not url[m.end():].split("/", 1)[0]:
        raise UsageError(f"{url}: no bucket or host after '{m.group(0)}' (write {m.group(0)}BUCKET/PATH)")
    return proto


def root(url: str) -> str:
    """``url`` checked (a scheme, and a bucket or host where the scheme needs one) and without trailing
    slashes: the form every remote store keeps. Checked first: "s3://" trimmed would read "s3:"."""
    scheme(url)
    return url.rstrip("/")


def join(url: str, name: str) -> str:
    return url.rstrip("/") + "/" + name


def _quiet_orphans(loop: Any) -> None:
    """On an async filesystem's event loop, a task that failed after its call gave up ("Task exception was never
    retrieved") is logged at debug level, not as a traceback above the error the call reported."""
    if loop is None or loop.get_exception_handler() is not None:  # ours already, or the user's own
        return

    def handler(lp: Any, context: dict[str, Any]) -> None:
        if context.get("message") == "Task exception was never retrieved":
            log.debug("a remote call's abandoned task failed: %r", context.get("exception"))
        else:
            lp.default_exception_handler(context)

    loop.set_exception_handler(handler)


def filesystem(url: str, storage_options: Mapping[str, Any] | None, timeout: float | None = None) -> Any:
    """The fsspec filesystem for ``url``; a UsageError names the package a scheme needs. With ``timeout``
    (the calls' time bound), S3's connect and read timeouts are at most that: one attempt cannot outlast it."""
    proto = scheme(url)
    try:
        import fsspec
        from fsspec.registry import known_implementations
    except ImportError:
        raise UsageError(f"{url}: reading URLs needs fsspec (pip install 'fastdata[s3]' for S3)") from None
    if proto not in known_implementations and proto not in fsspec.available_protocols():
        raise UsageError(f"{url}: unknown URL scheme {proto!r} (fsspec knows no filesystem for it; "
                         "local paths are written without a scheme)")
    opts = dict(storage_options or {})
    if proto in ("s3", "s3a"):
        bounded = {t: min(_S3_CONFIG[t], max(1, math.ceil(timeout))) for t in ("connect_timeout", "read_timeout")} \
            if timeout is not None else {}
        opts["config_kwargs"] = {**_S3_CONFIG, **bounded, **opts.get("config_kwargs", {})}
    try:
        # url_to_fs also takes what the URL itself says (an ftp/sftp/http host and port, for example)
        fs = fsspec.core.url_to_fs(url, **opts)[0]
        _quiet_orphans(getattr(fs, "loop", None))
        return fs
    except ImportError as e:
        need = _PACKAGES.get(proto) or str(e).splitlines()[0]
        raise UsageError(f"{url}: the {proto!r} scheme needs {need}, which is not installed") from None
    except (TypeError, ValueError) as e:
        raise UsageError(f"{url}: bad storage_options for {proto!r}: {e}") from None
    except OSError as e:  # filesystems that connect when they are made (ftp, sftp)
        raise UsageError(f"{url}: cannot connect: {e.strerror or e}") from None
