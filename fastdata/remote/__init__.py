"""Datasets on object storage through fsspec (docs/remote.md), and reaching a URL: ``RemoteOptions``, the fsspec
filesystem behind a URL (a string with a scheme is a URL, never a local path), and remote calls bounded in time:
transient errors retried until a deadline, errors no retry can fix failing at once naming the cause and the fix."""

from __future__ import annotations

import logging
import math
import os
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

from fastdata._units import parse_size
from fastdata.errors import FastdataError, NoSuchBucketError, RemoteError, RemoteNotFoundError, UsageError
from fastdata.fileio import user_cache_dir

__all__ = ["RemoteOptions", "is_url"]

T = TypeVar("T")
log = logging.getLogger("fastdata.remote")

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
        if self.cache_dir is not None and not os.fspath(self.cache_dir).strip():  # Path("") is the working folder
            raise UsageError("cache_dir is empty: give a folder, or leave it unset for the default cache")
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
        raw, what = self.cache_limit, "cache_limit"
        if raw is None:  # the environment's, named in the error (set but empty: unset, as the other variables)
            env = os.environ.get(ENV_CACHE_LIMIT, "").strip()
            raw, what = (env, f"${ENV_CACHE_LIMIT}") if env else (DEFAULT_CACHE_LIMIT, what)
        if isinstance(raw, int) and not isinstance(raw, bool):
            if raw <= 0:
                raise UsageError(f"cache_limit must be positive, not {raw}")
            return raw
        try:
            return parse_size(str(raw))
        except ValueError as e:
            raise UsageError(f"{what}: {e}") from None


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


WARN_EVERY_S = 30.0  # while a call keeps failing, a warning this often (the first at once)
BOUND_HINT = "--remote-timeout SECONDS, $FASTDATA_REMOTE_TIMEOUT or RemoteOptions(timeout=...)"
CREDENTIALS_HINT = ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or pass them in "
                    "RemoteOptions.storage_options (docs/remote.md)")

_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
# botocore's exceptions, by class name (botocore itself is an optional dependency)
_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}
_BAD_CONFIG = {"InvalidEndpointConfigurationError", "ParamValidationError", "NoRegionError",
               "UnknownSignatureVersionError", "InvalidRegionError"}
_UNREACHABLE = {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ClientConnectorError"}
_URL_ROOT = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://[^/\s:]+)")


def _names(e: BaseException) -> set[str]:
    return {c.__name__ for c in type(e).__mro__}


def _text(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else ""


def _is_missing_bucket(e: BaseException) -> bool:
    text = _text(e).lower()
    return isinstance(e, FileNotFoundError) and ("bucket does not exist" in text or "nosuchbucket" in text
                                                 or "container does not exist" in text)


def _is_bad_endpoint(e: BaseException) -> bool:
    return isinstance(e, ValueError) and _text(e).lower().startswith("invalid endpoint")


def describe(e: BaseException) -> str:
    """One line about a remote failure, without the library's traceback (and never credentials)."""
    text = _text(e)
    names = _names(e)
    if _is_missing_bucket(e):
        return "no such bucket"
    if isinstance(e, FileNotFoundError):
        return "no such object"
    if isinstance(e, PermissionError):
        return f"access denied{f' ({text})' if text else ''}: check the credentials and the bucket's policy"
    if names & _NO_CREDENTIALS:
        return f"no credentials ({text}): {CREDENTIALS_HINT}"
    if names & _UNREACHABLE:
        return f"cannot reach the endpoint ({text or type(e).__name__}): check AWS_ENDPOINT_URL (or storage_options) and the network"
    if _is_bad_endpoint(e) or names & _BAD_CONFIG:
        return f"{text or type(e).__name__}: check AWS_ENDPOINT_URL or storage_options"
    return f"{type(e).__name__}: {text}"[:300] if text else type(e).__name__


def permanent_error(e: BaseException, what: str) -> RemoteError:
    """The one-line error for a permanent failure of ``what`` (a URL, maybe with ': upload'); no '; ' in
    it (converters/__init__.py cuts a message there to replace its advice)."""
    if _is_missing_bucket(e):
        m = _URL_ROOT.match(what)
        bucket = m.group(1) if m else "the bucket"
        return NoSuchBucketError(f"{what}: no such bucket: create {bucket} first (e.g. aws s3 mb {bucket}, "
                                 "with --endpoint-url for an S3-compatible server), or check the URL and "
                                 "AWS_ENDPOINT_URL")
    cls = RemoteNotFoundError if isinstance(e, FileNotFoundError) else RemoteError
    return cls(f"{what}: {describe(e)}")


# this process's remote calls in trouble: what -> (when, why, still retrying), named by whoever waits on one
_troubles: dict[str, tuple[float, str, bool]] = {}


def gave_up(what: str, why: str) -> None:
    """Record that this process's call ``what`` failed for good, saying ``why``."""
    _troubles[what] = (time.monotonic(), why, False)


def trouble(prefix: str, since: float) -> str | None:
    """Why a call of this process whose ``what`` starts with ``prefix`` (a URL) failed after ``since``, else
    what one is retrying now; None when neither."""
    found = {retrying: why for what, (when, why, retrying) in list(_troubles.items())
             if what.startswith(prefix) and (retrying or when >= since)}
    if False in found:
        return found[False]
    if True in found:
        return (f"{found[True]}; gave up at the time bound while this process's own download of it (another "
                f"thread) was still retrying ({BOUND_HINT})")
    return None


def with_retries(fn: Callable[[], T], what: str, deadline: float, *, first_delay: float = 0.2,
                 max_delay: float = 5.0) -> T:
    """``fn()``, retried on transient errors with jittered exponential backoff until the monotonic
    ``deadline``; then (or on a permanent error) a RemoteError saying ``what`` failed and why."""
    delay = first_delay
    attempt = 0
    start = time.monotonic()
    warned = 0.0  # when the last warning was logged (0: not yet)
    try:
        while True:
            attempt += 1
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 - fsspec backends raise anything; classified below
                if isinstance(e, FastdataError):
                    raise
                if isinstance(e, _PERMANENT) or isinstance(e, (TypeError, AttributeError)) or _is_bad_endpoint(e) \
                        or _names(e) & (_NO_CREDENTIALS | _BAD_CONFIG):  # no retry gets past these
                    raise permanent_error(e, what) from None
                now = time.monotonic()
                _troubles[what] = (now, f"{what}: {describe(e)}", True)
                left = deadline - now
                if left <= 0:
                    raise RemoteError(f"{what}: {describe(e)}, gave up after {attempt} attempt(s) in {now - start:.0f} s "
                                      f"(the time bound: {BOUND_HINT})") from None
                if not warned or now - warned >= WARN_EVERY_S:
                    log.warning("%s: %s; %s until %s (%.0f s more; bound: %s)", what, describe(e),
                                "retrying" if not warned else f"still retrying after {attempt} attempt(s)",
                                time.strftime("%H:%M:%S", time.localtime(time.time() + left)), left, BOUND_HINT)
                    warned = now
                else:
                    log.info("%s: attempt %d failed (%s); retrying in %.1fs", what, attempt, describe(e), delay)
                time.sleep(min(delay * (0.5 + random.random()), left))
                delay = min(delay * 2, max_delay)
    finally:
        _troubles.pop(what, None)
