"""The process default client behind :func:`alock`.

:func:`configure` names it (a URL or a ready client); without it the URL is ``AIOLOCK_URL``,
then ``REDIS_URL``, then ``redis://localhost:6379/0``. A client made from a URL belongs to
one event loop, so one is made per running loop, on first use.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from contextlib import AbstractAsyncContextManager
from typing import Any

from .client import AioLock, from_url
from .config import Config
from .keys import check_name
from .lock import Lock

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
