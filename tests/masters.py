"""Fixtures for tests across several independent Redis servers (multi-locks, red locks),
imported by the test modules as ``servers_fixture`` and ``connect_fixture``:
``servers(n)`` starts n private redis-server processes (killed, paused, restarted by the
tests; always stopped afterwards), ``connect(servers, **config)`` opens one aiolock client
per server (closed afterwards, paused servers resumed first), and helpers that read the
servers directly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import pytest
import redis.asyncio

import aiolock
from aiolock.testing import RedisServer, TcpProxy, external_redis_url

Servers = Callable[..., list[RedisServer]]
Connect = Callable[..., list[aiolock.AioLock]]


@pytest.fixture(name="servers")
def servers_fixture() -> Iterator[Servers]:
    """``servers(n)``: n fresh private servers."""
    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server processes (AIOLOCK_TEST_REDIS_URL is set)")
    started: list[RedisServer] = []

    def start(count: int) -> list[RedisServer]:
        new = [RedisServer().start() for _ in range(count)]
        started.extend(new)
        return new

    yield start
    for server in started:
        if server.is_paused:
            server.resume()
        server.stop()


@pytest.fixture(name="connect")
async def connect_fixture(servers: Servers) -> AsyncIterator[Connect]:
    """``connect(servers_or_urls, **config)``: one aiolock client per server (or URL)."""
    made: list[aiolock.AioLock] = []
    paused: list[RedisServer] = []

    def make(
        targets: Sequence[RedisServer | str | TcpProxy], **config: Any
    ) -> list[aiolock.AioLock]:
        clients = []
        for target in targets:
            if isinstance(target, RedisServer):
                paused.append(target)
            url = target if isinstance(target, str) else target.url
            clients.append(aiolock.from_url(url, **config))
        made.extend(clients)
        return clients

    yield make
    for server in paused:
        if server.is_paused:
            server.resume()
    await asyncio.gather(*(client.aclose() for client in made))


def redis_of(server: RedisServer) -> redis.asyncio.Redis:
    """A redis-py client of ``server`` (``async with`` it), for reading the server directly."""
    return redis.asyncio.Redis.from_url(server.url, socket_timeout=5)


async def holders(server: RedisServer, name: str) -> dict[str, int]:
    """The lock hash ``name`` on ``server``: owner id -> hold count (a read-write lock's
    ``mode`` field left out)."""
    async with redis_of(server) as r:
        raw = await r.hgetall(name)
    return {
        (k.decode() if isinstance(k, bytes) else k): int(v)
        for k, v in raw.items()
        if k not in (b"mode", "mode")
    }


async def pttl(server: RedisServer, name: str) -> int:
    async with redis_of(server) as r:
        return int(await r.pttl(name))


#: the owner id that :func:`busy` writes: not an aiolock client's
SOMEONE_ELSE = "someone-else:1"


async def aiolock_fields(servers: Sequence[RedisServer], names: Sequence[str]) -> list[str]:
    """Every hold of any aiolock owner on the (running) servers, as ``name@port:field``:
    stricter than :func:`held_anywhere`, which a hold written under another owner id (the
    core does so after a request it could not fence) would escape."""
    found = []
    for server in servers:
        if not server.is_running or server.is_paused:
            continue
        for name in names:
            for field in await holders(server, name):
                if field != SOMEONE_ELSE:
                    found.append(f"{name}@{server.port}:{field}")
    return found


async def busy(server: RedisServer, name: str, seconds: float) -> None:
    """Make ``name`` held by someone else on ``server`` for ``seconds``."""
    async with redis_of(server) as r:
        await r.hset(name, SOMEONE_ELSE, 1)
        await r.pexpire(name, max(1, round(seconds * 1000)))


async def held_anywhere(
    servers: Sequence[RedisServer], names: Sequence[str], owner: str
) -> list[str]:
    """Where ``owner`` still has a count: ``name@port`` for each (running) server."""
    found = []
    for server in servers:
        if not server.is_running or server.is_paused:
            continue
        for name in names:
            if owner in await holders(server, name):
                found.append(f"{name}@{server.port}")
    return found


async def eventually(check: Callable[[], Awaitable[object]], within: float = 5) -> None:
    """Poll until ``check`` is true (state on a server has no event to wait on)."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.005)
