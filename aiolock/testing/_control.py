"""Plumbing shared by the cluster and Sentinel helpers: a synchronous control connection per
process, and polling until a condition holds."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

_COMMAND_TIMEOUT: Final = 5.0
_POLL: Final = 0.05
_T = TypeVar("_T")


class NotYet(Exception):
    """A condition being waited for does not hold yet; the message says what is missing."""


class ControlClient:
    """A plain synchronous client for one server, strings decoded, no retries; reconnects on
    the next command after a connection error (the server may have been restarted)."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._client: redis.Redis | None = None

    def execute(self, *args: Any) -> Any:
        """Run one command; raw replies, except those redis-py parses (``INFO`` -> dict)."""
        if self._client is None:
            self._client = redis.Redis(
                host=self.host,
                port=self.port,
                decode_responses=True,
                socket_timeout=_COMMAND_TIMEOUT,
                socket_connect_timeout=_COMMAND_TIMEOUT,
                retry=Retry(NoBackoff(), 0),
            )
        try:
            return self._client.execute_command(*args)  # type: ignore[no-untyped-call]
        except (redis.ConnectionError, redis.TimeoutError):
            self.close()
            raise

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                client.close()


def pairs(reply: list[Any] | dict[str, Any]) -> dict[str, Any]:
    """A map reply as a dict, whether it came as a flat ``[key, value, ...]`` list or (as
    redis-py with hiredis gives ``SENTINEL MASTER``'s) already as a dict."""
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2], strict=True))


def wait_until(
    check: Callable[[], _T], timeout: float, what: str, diagnostics: Callable[[], str]
) -> _T:
    """Call ``check`` every 50 ms until it returns (rather than raising :class:`NotYet`, a
    Redis error, an ``OSError`` or a ``LookupError``); return what it returned.

    Raises:
        TimeoutError: not within ``timeout`` seconds; says what was last missing, then
            ``diagnostics()``.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except (NotYet, redis.RedisError, OSError, LookupError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no {what} within {timeout:g} s; last: {why}\n{diagnostics()}")
        time.sleep(_POLL)
