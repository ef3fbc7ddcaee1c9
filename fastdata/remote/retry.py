"""Remote calls bounded in time: transient errors retried with backoff until a deadline (with warnings), errors
no retry can fix (credentials, access, no such bucket) fail at once naming the cause, the fix and the URL."""

from __future__ import annotations

import logging
import random
import re
import time
from typing import Callable, TypeVar

from fastdata.errors import FastdataError, NoSuchBucketError, RemoteError, RemoteNotFoundError

T = TypeVar("T")
log = logging.getLogger("fastdata.remote")

__all__ = ["NoSuchBucketError", "RemoteError", "RemoteNotFoundError", "with_retries"]

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
