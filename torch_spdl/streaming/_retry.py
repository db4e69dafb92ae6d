"""Retries with backoff for reads from object storage, and the error that ends them.

Object stores fail transiently all the time at scale: a connection reset, a 503
``SlowDown``, a 500, a response cut short, a request that hangs. Such a read is tried
again after a growing, jittered pause; anything else (a missing object, access denied) is
raised at once. When the attempts run out the error names the URL, the byte range, the
attempts and the last cause, since "connection reset by peer" alone does not say which
of ten thousand shards failed.

The client libraries' own retry loops (botocore's, s3fs's) are turned off for the stores
this package opens, so that one policy, this one, decides how long a read may take.
The jitter comes from a ``random.Random`` of our own: the program's global RNG is never
drawn from.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from ._errors import ShardReadError

__all__ = ["RetryPolicy", "is_transient"]

T = TypeVar("T")

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeTooSkewed",
    }
)


def _status_of(exc: BaseException) -> tuple[int | None, str | None]:
    """The HTTP status and S3 error code carried by ``exc`` or what caused it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        status = getattr(current, "status", None)  # aiohttp
        if isinstance(status, int):
            return status, None
        response = getattr(current, "response", None)  # botocore
        if isinstance(response, dict):
            meta = response.get("ResponseMetadata", {})
            code = response.get("Error", {}).get("Code")
            return meta.get("HTTPStatusCode"), code
        current = current.__cause__ or current.__context__
    return None, None


def is_transient(exc: BaseException) -> bool:
    """Whether a failed read is worth trying again: a reset or refused connection, a
    timeout, a response cut short, throttling or a 5xx answer."""
    status, code = _status_of(exc)
    if status is not None or code is not None:
        return status in _TRANSIENT_STATUS or code in _TRANSIENT_CODES
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError, asyncio.TimeoutError, EOFError)):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    # aiohttp's and botocore's connection-level errors, without importing either
    return bool(
        names
        & {
            "ClientConnectionError",
            "ClientPayloadError",
            "ServerDisconnectedError",
            "ServerTimeoutError",
            "IncompleteRead",
            "HTTPClientError",
            "EndpointConnectionError",
            "ConnectionClosedError",
            "ReadTimeoutError",
            "ResponseStreamingError",
            "ContentLengthError",
            "TransferEncodingError",
        }
    )


@dataclass(frozen=True)
class RetryPolicy:
    """How reads are retried.

    Args:
        attempts: tries per request, the first included (1: no retry).
        backoff: the pause before the first retry, in seconds; it doubles each time.
        max_backoff: the longest pause.
        timeout: the longest one request may take, in seconds (a hung response is
            abandoned and tried again); None: no limit.
    """

    attempts: int = 5
    backoff: float = 0.1
    max_backoff: float = 5.0
    timeout: float | None = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError("backoff must be non-negative")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"timeout must be positive, got {self.timeout}")

    def pause(self, retry: int, jitter: random.Random) -> float:
        """The pause before retry number ``retry`` (1-based): exponential, full jitter."""
        ceiling = min(self.max_backoff, self.backoff * 2 ** (retry - 1))
        return ceiling * (0.5 + 0.5 * jitter.random())

    async def run(
        self, call: Callable[[], Awaitable[T]], url: str, what: str, jitter: random.Random
    ) -> T:
        """``await call()``, retried on transient errors; raises :class:`ShardReadError`."""
        for attempt in range(1, self.attempts + 1):
            try:
                if self.timeout is None:
                    return await call()
                return await asyncio.wait_for(call(), self.timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not is_transient(exc) or attempt == self.attempts:
                    raise ShardReadError(url, what, attempt, exc) from exc
                await asyncio.sleep(self.pause(attempt, jitter))
        raise AssertionError("unreachable")
