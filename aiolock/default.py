"""The process default client behind :func:`alock`, :func:`locked` and :func:`lock_dependency`.

:func:`configure` names it (a URL or a ready client); without it the URL is ``AIOLOCK_URL``,
then ``REDIS_URL``, then ``redis://localhost:6379/0``. A client made from a URL belongs to
one event loop, so one is made per running loop, on first use.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

from . import decorator
from .client import AioLock, from_url
from .config import Config
from .keys import check_name
from .lock import Lock

if TYPE_CHECKING:
    from starlette.requests import Request

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_URL = "redis://localhost:6379/0"

_configured: str | AioLock | None = None
_config_overrides: dict[str, Any] = {}
_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AioLock] = (
    weakref.WeakKeyDictionary()
)


def configure(url_or_client: str | AioLock, **config_overrides: Any) -> None:
    """Set the process default client: a Redis URL (plus :class:`Config` fields) or a client."""
    global _configured, _config_overrides
    if isinstance(url_or_client, AioLock):
        if config_overrides:
            raise TypeError("config overrides apply to a URL, not to a ready client")
    elif not isinstance(url_or_client, str):
        raise TypeError(f"expected a Redis URL or an AioLock, got {type(url_or_client).__name__}")
    else:
        Config(**config_overrides)  # reject bad settings now, not on first use
    _configured, _config_overrides = url_or_client, dict(config_overrides)
    _per_loop.clear()


async def aclose_default() -> None:
    """Close the default client that :func:`alock` made for the running event loop.

    Call it before the loop ends (at the end of ``main()``, in a web app's shutdown hook):
    its holds are released, waiters raise :class:`~aiolock.ClientClosedError`, and its
    connections are closed. Safe to call twice, or when no default client was made; the next
    :func:`alock` on this loop makes a new one. A client given to :func:`configure` is the
    caller's and is not closed here: close it with ``await client.aclose()``.
    """
    loop = asyncio.get_running_loop()
    client = _per_loop.pop(loop, None)
    if client is not None:
        await client.aclose()


def environment_url() -> str:
    """The default URL when none is configured: ``AIOLOCK_URL``, ``REDIS_URL``, or
    ``redis://localhost:6379/0``."""
    return os.environ.get("AIOLOCK_URL") or os.environ.get("REDIS_URL") or DEFAULT_URL


def default_client() -> AioLock:
    """The default client for the running event loop (created on first use)."""
    if isinstance(_configured, AioLock):
        return _configured
    loop = asyncio.get_running_loop()
    client = _per_loop.get(loop)
    if client is None or client.closed:
        url = _configured or environment_url()
        client = _per_loop[loop] = from_url(url, **_config_overrides)
    return client


def alock(
    name: str, *, wait_time: float | None = None, lease_time: float | None = None
) -> AbstractAsyncContextManager[Lock]:
    """Hold the lock ``name`` of the default client for the ``async with`` body.

    Waits without bound, or at most ``wait_time`` seconds and then raises
    :class:`~aiolock.LockTimeout` (a ``TimeoutError``). The unlock at exit is shielded.
    See :meth:`AioLock.alock`.
    """
    check_name(name)
    return default_client().alock(name, wait_time=wait_time, lease_time=lease_time)


def locked(
    name: str | Callable[..., str],
    *,
    wait_time: float | None = None,
    lease_time: float | None = None,
    kind: Literal["lock", "fair_lock", "read_lock", "write_lock"] = "lock",
    guard: bool = True,
) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """:meth:`AioLock.locked` on the default client, looked up at each call (so a module
    can decorate its functions before :func:`configure` runs, e.g. in an app's startup).

    ``@aiolock.locked("order:{order_id}", wait_time=0.5)`` on an ``async def`` function:
    each call holds the lock named from its arguments, waiting at most ``wait_time``
    seconds and then raising :class:`~aiolock.LockTimeout`.
    """
    return decorator.locked(
        default_client,
        name,
        wait_time=wait_time,
        lease_time=lease_time,
        kind=kind,
        guard=guard,
    )


def lock_dependency(
    name: str | Callable[[Request], str],
    *,
    wait_time: float | None = 0,
    lease_time: float | None = None,
    kind: Literal["lock", "fair_lock", "read_lock", "write_lock"] = "lock",
    guard: bool = True,
    status_code: int = 429,
    detail: Any = None,
    retry_after: float | None = 1,
) -> Callable[[Request], AsyncIterator[Lock]]:
    """:meth:`AioLock.lock_dependency` on the default client, looked up at each request:
    ``Depends(aiolock.lock_dependency("order:{order_id}"))`` holds the lock for the request
    and answers 429 when it is busy. Needs FastAPI (imported when the dependency is made).
    """
    from .fastapi import lock_dependency as make

    return make(
        default_client,
        name,
        wait_time=wait_time,
        lease_time=lease_time,
        kind=kind,
        guard=guard,
        status_code=status_code,
        detail=detail,
        retry_after=retry_after,
    )
