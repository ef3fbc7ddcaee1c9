"""Remote calls bounded in time: transient errors are retried with backoff until a deadline,
permanent ones (missing object, access denied) fail at once. Every failure names the URL."""

from __future__ import annotations

import logging
import random
import time
from typing import Callable, TypeVar

from ..errors import FastdataError, RemoteError, RemoteNotFoundError

T = TypeVar("T")
log = logging.getLogger("fastdata.remote")

__all__ = ["RemoteError", "RemoteNotFoundError", "with_retries"]

_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


def describe(e: BaseException) -> str:
    """One line about a remote failure, without the library's traceback (and never credentials)."""
    text = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    if isinstance(e, FileNotFoundError):
        return "no such object" + (f" ({text})" if text and "bucket" in text.lower() else "")
    if isinstance(e, PermissionError):
        return "access denied (check credentials and the bucket policy)"
    return f"{type(e).__name__}: {text}"[:300] if text else type(e).__name__


def is_permanent(e: BaseException) -> bool:
    return isinstance(e, _PERMANENT) or isinstance(e, (TypeError, AttributeError, FastdataError))


def with_retries(fn: Callable[[], T], what: str, deadline: float, *, first_delay: float = 0.2,
                 max_delay: float = 5.0) -> T:
    """``fn()``, retried on transient errors with jittered exponential backoff until the monotonic
    ``deadline``; then (or on a permanent error) a RemoteError saying ``what`` failed and why."""
    delay = first_delay
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - fsspec backends raise anything; classified below
            if isinstance(e, FastdataError):
                raise
            if is_permanent(e):
                cls = RemoteNotFoundError if isinstance(e, FileNotFoundError) else RemoteError
                raise cls(f"{what}: {describe(e)}") from None
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteError(f"{what}: still failing after {attempt} attempt(s) within the time bound "
                                  f"(RemoteOptions.timeout): {describe(e)}") from None
            log.info("%s: attempt %d failed (%s); retrying in %.1fs", what, attempt, describe(e), delay)
            time.sleep(min(delay * (0.5 + random.random()), left))
            delay = min(delay * 2, max_delay)

