"""Shared fixtures: real Redis servers (aiolock.testing) and a fault-injection proxy.

Set AIOLOCK_TEST_REDIS_URL to run against an existing server instead of launching one; it is
FLUSHALLed before every test that asks for ``redis_url``, and fixtures that kill, pause or
restart a server skip.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

import aiolock
from aiolock.testing import (
    ExternalRedis,
    LocalCluster,
    RedisServer,
    TcpProxy,
    external_redis_url,
    find_redis_server_binary,
)
from tests.peers import Peers


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The event loop of every test: asyncio's, or uvloop's with AIOLOCK_TEST_LOOP=uvloop."""
    if os.environ.get("AIOLOCK_TEST_LOOP") == "uvloop":
        import uvloop

        return {"uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | ExternalRedis]:
    """One Redis server for the whole session (or the AIOLOCK_TEST_REDIS_URL stand-in)."""
    url = external_redis_url()
    if url is not None:
        yield ExternalRedis(url)
        return
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """One Redis Cluster (3 masters + 3 replicas) for the whole session, started on first use."""
    if find_redis_server_binary() is None:
        pytest.skip("needs a redis-server binary")
    for attempt in range(3):
        # Free ports are picked before they are bound: on a machine busy with other test
        # runs a start can lose a port race (or its wait its time); a new cluster then.
        cluster = LocalCluster()
        try:
            cluster.start()
        except Exception:  # a node that did not start, a wait that timed out
            if attempt == 2:
                raise
            continue
        break
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def healthy_cluster(local_cluster: LocalCluster) -> LocalCluster:
    """The session cluster, healed (what an earlier test killed, paused or left migrating is
    restored) and FLUSHALLed. Roles may differ from the start (failovers)."""
    local_cluster.heal()
    local_cluster.flushall()
    return local_cluster


@pytest.fixture
def cluster_url(healthy_cluster: LocalCluster) -> str:
    """``redis+cluster://`` of a node of the healthy session cluster (for aiolock.from_url)."""
    return "redis+cluster://" + healthy_cluster.url.removeprefix("redis://")


@pytest.fixture
def redis_url(redis_server: RedisServer | ExternalRedis) -> str:
    """The session server's URL, FLUSHALLed first so every test starts on an empty database."""
    if isinstance(redis_server, RedisServer):
        # A test that broke the shared server must not break the ones after it.
        if redis_server.is_paused:
            redis_server.resume()
        if not redis_server.is_running:
            redis_server.restart()
    with redis.Redis.from_url(redis_server.url, socket_timeout=10) as client:
        client.flushall()
    return redis_server.url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """An asyncio Redis client on the clean session server, closed at teardown."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def fresh_server() -> Iterator[RedisServer]:
    """A private server that the test may kill, pause or restart; always stopped afterwards."""
    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server (AIOLOCK_TEST_REDIS_URL is set)")
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        if server.is_paused:
            server.resume()
        server.stop()


@pytest.fixture
async def proxy(redis_url: str) -> AsyncIterator[TcpProxy]:
    """A started TcpProxy in front of the clean session server; connect through ``proxy.url``."""
    async with TcpProxy.for_url(redis_url) as tcp_proxy:
        yield tcp_proxy


# --- aiolock fixtures below ---


@pytest.fixture
async def client(redis_client: redis.asyncio.Redis) -> AsyncIterator[aiolock.AioLock]:
    """An aiolock client on the clean session server, closed at teardown."""
    async with aiolock.AioLock(redis_client) as lock_client:
        yield lock_client


@pytest.fixture
async def make_client(redis_url: str) -> AsyncIterator[Callable[..., aiolock.AioLock]]:
    """A factory of further clients (own connection pool each), all closed at teardown."""
    made: list[aiolock.AioLock] = []

    def make(url: str = redis_url, **config: Any) -> aiolock.AioLock:
        made.append(aiolock.from_url(url, **config))
        return made[-1]

    yield make
    for each in made:
        await each.aclose()


WORKER = Path(__file__).with_name("proc_worker.py")


def _worker_env(lock_type: str) -> dict[str, str]:
    return {**os.environ, "AIOLOCK_TEST_LOCK_TYPE": lock_type}


async def run_worker(*args: str, limit: float = 60, lock_type: str = "lock") -> list[str]:
    """Run tests/proc_worker.py in a new process; return its stdout lines (fails on rc != 0)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args, stdout=PIPE, stderr=PIPE, env=_worker_env(lock_type)
    )
    try:
        async with asyncio.timeout(limit):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    return out.decode().split()


class Worker:
    """tests/proc_worker.py in its own process, read line by line; killed at the end."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, *args: str, lock_type: str = "lock") -> Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), *args, stdout=PIPE, env=_worker_env(lock_type)
        )
        return cls(proc)

    async def line(self, within: float = 10) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(within):
            return (await self.proc.stdout.readline()).decode().strip()

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.proc.pid, sig)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        await self.proc.wait()


@pytest.fixture
async def workers() -> AsyncIterator[list[Worker]]:
    """Worker processes started by the test (append them); killed at teardown."""
    started: list[Worker] = []
    yield started
    for worker in started:
        await worker.stop()


@pytest.fixture
async def peers(redis_url: str) -> AsyncIterator[Peers]:
    """Lock users in processes of their own (tests/peers.py: aiolock's, or Redisson's
    scripts), started with ``await peers.start("aiolock" | "redisson", *args)``; closed at
    teardown."""
    group = Peers(redis_url)
    try:
        yield group
    finally:
        await group.aclose()
