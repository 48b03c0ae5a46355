"""Which Redis the demo talks to: the one asked for, else a local one, else a private one."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis
from redis.exceptions import RedisError

from ..default import environment_url
from .errors import DemoError


def answers(url: str, timeout: float = 1.0) -> bool:
    """True if a Redis server at ``url`` answers PING (nothing is written)."""
    try:
        with redis.Redis.from_url(
            url, socket_connect_timeout=timeout, socket_timeout=timeout
        ) as client:
            return bool(client.ping())
    except (RedisError, OSError, ValueError):
        return False


@contextmanager
def redis_for_demo(url: str | None, *, embedded: bool, say: Callable[[str], None]) -> Iterator[str]:
    """Yield the URL of the Redis to use, starting (and at exit stopping) one if needed.

    An explicit ``url`` must answer. Without one the default client's URL is tried
    (``AIOLOCK_URL``, ``REDIS_URL``, then ``redis://localhost:6379/0``); if nothing answers
    there, or ``embedded`` is set, a private ``redis-server`` is started on a free port.
    """
    if url is not None:
        if not answers(url):
            raise DemoError(f"no Redis answers at {url}")
        yield url
        return
    if not embedded:
        default = environment_url()
        if answers(default):
            yield default
            return
        say(f"No Redis answers at {default}.")
    from ..testing import RedisServer

    try:
        server = RedisServer().start()
    except RuntimeError as exc:
        raise DemoError(f"could not start a private redis-server: {exc}") from exc
    try:
        say(f"Started a private redis-server (pid {server.pid}) at {server.url}.")
        yield server.url
    finally:
        server.stop()
        say("Stopped the private redis-server.")
