"""Security as an operator sets it up, against real servers: TLS with certificates made here
(trustme's throwaway CA) on a redis-server built with TLS, and the least-privilege ACL rule
that ``aiolock acl`` prints."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

import aiolock
from aiolock.testing import RedisServer, TcpProxy, external_redis_url, find_redis_server_binary
from tests.sync_helpers import eventually, true

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aiolock", *args],
        capture_output=True, text=True, timeout=30, check=False, cwd=ROOT,
    )  # fmt: skip


async def take_and_release(lock: aiolock.Lock, wait_time: float) -> bool:
    if not await lock.try_lock(wait_time=wait_time):
        return False
    await lock.unlock()
    return True


# -- TLS ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsServer:
    url: str
    """``rediss://`` on the TLS port."""
    ca: str
    """The PEM file of the CA that signed the server's certificate."""


NO_TLS = re.compile(r"Bad directive|TLS support|connection type tls")
"""What a redis-server (or valkey-server) built without TLS says about ``--tls-port``."""


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    """A redis-server with a TLS port, its certificate signed by a CA made for this run."""
    trustme = pytest.importorskip("trustme")
    binary = find_redis_server_binary()
    if binary is None or external_redis_url() is not None:
        pytest.skip("needs its own redis-server binary")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    folder = tmp_path_factory.mktemp("tls")
    ca_file, cert_file, key_file = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    port = free_port()
    server = RedisServer(
        ["--tls-port", str(port), "--tls-cert-file", str(cert_file),
         "--tls-key-file", str(key_file), "--tls-ca-cert-file", str(ca_file),
         "--tls-auth-clients", "no"],
    )  # fmt: skip
    try:
        server.start()
    except RuntimeError as exc:
        if NO_TLS.search(str(exc)):
            pytest.skip(f"{binary} ({server.version}) was built without TLS")
        raise
    try:
        yield TlsServer(f"rediss://127.0.0.1:{port}/0", str(ca_file))
    finally:
        server.stop()


async def test_locks_and_wake_ups_over_tls(tls: TlsServer) -> None:
    options = {"ssl_ca_certs": tls.ca}
    async with (
        aiolock.from_url(tls.url, redis_options=options) as a,
        aiolock.from_url(tls.url, redis_options=options) as b,
    ):
        await a.lock("tls:job").lock()  # a 30 s lease, renewed
        waiter = asyncio.create_task(take_and_release(b.lock("tls:job"), wait_time=20))
        await eventually(lambda: true(b.statistics().tasks_waiting == 1))
        await a.lock("tls:job").unlock()
        assert await asyncio.wait_for(waiter, 10)  # woken by the unlock message, over TLS

        latch = a.countdown_latch("tls:latch")
        assert await latch.try_set_count(1)
        waiting = asyncio.create_task(b.countdown_latch("tls:latch").wait(20))
        await asyncio.sleep(0.2)
        await latch.count_down()
        assert await asyncio.wait_for(waiting, 10)


async def test_a_certificate_without_its_ca_is_a_clean_error(tls: TlsServer) -> None:
    started = time.monotonic()
    async with aiolock.from_url(tls.url, command_timeout=3.0) as client:
        with pytest.raises(aiolock.RedisUnavailableError) as info:
            await client.lock("tls:x").try_lock()
    assert time.monotonic() - started < 3.0 + 2.0  # command_timeout, with room for load
    text = str(info.value)
    assert "certificate" in text and "ssl_ca_certs" in text, text
    assert "Traceback" not in text


@pytest.mark.parametrize("how", ["redis_options", "url"])
async def test_ssl_cert_reqs_none_skips_verification(tls: TlsServer, how: str) -> None:
    """``ssl_cert_reqs="none"`` (accepted by redis-py) raised ValueError: "Cannot set
    verify_mode to CERT_NONE when check_hostname is enabled"."""
    if how == "url":
        client = aiolock.from_url(tls.url + "?ssl_cert_reqs=none")
    else:
        client = aiolock.from_url(tls.url, redis_options={"ssl_cert_reqs": "none"})
    async with client, client.lock("tls:none"):
        assert await client.lock("tls:none").is_locked()


def test_a_bad_ssl_cert_reqs_is_named() -> None:
    with pytest.raises(ValueError, match="ssl_cert_reqs must be 'none', 'optional' or"):
        aiolock.from_url("rediss://127.0.0.1:1/0", redis_options={"ssl_cert_reqs": "maybe"})


@pytest.mark.parametrize(
    ("option", "extra"),
    [
        ("ssl_ca_certs", {}),
        ("ssl_ca_path", {}),
        ("ssl_certfile", {}),
        ("ssl_keyfile", {"ssl_certfile": str(Path(__file__))}),
    ],
)
def test_a_missing_certificate_file_is_named(
    tmp_path: Path, option: str, extra: dict[str, str]
) -> None:
    """The docs' own client example (``ssl_ca_certs="ca.pem"`` where no such file is) raised
    the ssl module's bare "[Errno 2] No such file or directory", naming neither the option
    nor the file (it did so on the old code)."""
    missing = str(tmp_path / "ca.pem")
    with pytest.raises(FileNotFoundError, match=f"{option}: no such file") as caught:
        aiolock.from_url("rediss://127.0.0.1:1/0", redis_options={**extra, option: missing})
    assert caught.value.filename == missing
    assert missing in str(caught.value)


# -- ACL ----------------------------------------------------------------------------------


def acl_line(*args: str) -> list[str]:
    proc = cli("acl", *args)
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout)
    assert words[:2] == ["ACL", "SETUSER"]
    return words


@pytest.fixture
def app_user(redis_url: str, r: redis.Redis) -> Iterator[str]:
    """User ``app1`` with the rule ``aiolock acl`` prints for the prefix ``app1:``; its URL."""
    r.execute_command(  # type: ignore[no-untyped-call]
        *acl_line("--user", "app1", "--prefix", "app1:", "--password", "s3cret")
    )
    try:
        yield redis_url.replace("redis://", "redis://app1:s3cret@")
    finally:
        r.acl_deluser("app1")


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as client:
        yield client


Use = Callable[[aiolock.AioLock, aiolock.AioLock, str], Awaitable[None]]


async def use_lock(app: aiolock.AioLock, other: aiolock.AioLock, name: str) -> None:
    await app.lock(name).lock()
    waiter = asyncio.create_task(take_and_release(other.lock(name), wait_time=20))
    await eventually(lambda: true(other.statistics().tasks_waiting == 1))
    await app.lock(name).unlock()
    assert await asyncio.wait_for(waiter, 10)


async def use_renewed_lock(app: aiolock.AioLock, other: aiolock.AioLock, name: str) -> None:
    lock = other.lock(name)  # `other` renews every 0.3 s (watchdog_timeout=0.9)
    await lock.lock()
    await asyncio.sleep(1.5)
    assert await lock.hold_count() == 1
    await lock.unlock()


async def use_fenced_lock(app: aiolock.AioLock, other: aiolock.AioLock, name: str) -> None:
    lock = app.fenced_lock(name)
    first = await lock.lock_and_get_token()
    await lock.unlock()
    second = await lock.lock_and_get_token()
    assert second > first  # a new token (max(counter + 1, the server's clock in µs))
    assert await lock.get_token() == second
    await lock.unlock()


async def use_fair_lock(app: aiolock.AioLock, other: aiolock.AioLock, name: str) -> None:
    await app.fair_lock(name).lock()
    waiter = asyncio.create_task(take_and_release(other.fair_lock(name), wait_time=20))
    await eventually(lambda: true(other.statistics().tasks_waiting == 1))
    await app.fair_lock(name).unlock()
    assert await asyncio.wait_for(waiter, 10)


async def use_read_write_lock(app: aiolock.AioLock, other: aiolock.AioLock, name: str) -> None:
    read = app.read_write_lock(name).read_lock()
    await read.lock()
    assert await app.read_write_lock(name).mode() == "read"
    writer = asyncio.create_task(take_and_release(other.read_write_lock(name).write_lock(), 20))
    await eventually(lambda: true(other.statistics().tasks_waiting == 1))
    await read.unlock()
    assert await asyncio.wait_for(writer, 10)


async def use_semaphore(app: aiolock.AioLock, other: aiolock.AioLock, name: str) -> None:
    semaphore = app.semaphore(name)
    assert await semaphore.try_set_permits(1)
    await semaphore.acquire()
    waiter = asyncio.create_task(other.semaphore(name).try_acquire(wait_time=20))
    await asyncio.sleep(0.2)
    await semaphore.release()
    assert await asyncio.wait_for(waiter, 10)
    assert await semaphore.available_permits() == 0


async def use_permit_semaphore(app: aiolock.AioLock, other: aiolock.AioLock, name: str) -> None:
    semaphore = app.permit_expirable_semaphore(name)
    assert await semaphore.try_set_permits(1)
    leased = await semaphore.acquire(lease_time=5)
    await semaphore.release(leased)
    renewed = await other.permit_expirable_semaphore(name).acquire()  # no lease: renewed
    await asyncio.sleep(1.0)
    assert await semaphore.available_permits() == 0
    await other.permit_expirable_semaphore(name).release(renewed)


async def use_latch(app: aiolock.AioLock, other: aiolock.AioLock, name: str) -> None:
    latch = app.countdown_latch(name)
    assert await latch.try_set_count(1)
    waiting = asyncio.create_task(other.countdown_latch(name).wait(20))
    await asyncio.sleep(0.2)
    await latch.count_down()
    assert await asyncio.wait_for(waiting, 10)
    assert await latch.get_count() == 0


USES: dict[str, Use] = {
    "lock": use_lock,
    "lock with a hash tag": use_lock,
    "renewed lock": use_renewed_lock,
    "fenced_lock": use_fenced_lock,
    "fair_lock": use_fair_lock,
    "read_write_lock": use_read_write_lock,
    "semaphore": use_semaphore,
    "permit_expirable_semaphore": use_permit_semaphore,
    "countdown_latch": use_latch,
}


def name_for(use: str, prefix: str) -> str:
    return f"{prefix}{{t}}:x" if "hash tag" in use else f"{prefix}{use.replace(' ', '-')}"


@pytest.mark.parametrize("use", sorted(USES))
async def test_the_printed_acl_rule_lets_every_type_work_under_its_prefix(
    app_user: str, r: redis.Redis, use: str
) -> None:
    async with (
        aiolock.from_url(app_user) as app,
        aiolock.from_url(app_user, watchdog_timeout=0.9) as other,
    ):
        await USES[use](app, other, name_for(use, "app1:"))
    assert app_user.startswith("redis://app1:")


def test_the_printed_acl_rule_lets_a_restart_be_noticed(app_user: str) -> None:
    """aiolock reads the server's run_id on every connection (INFO server): a server restarted
    empty is noticed at the reconnect and every hold is checked there at once. The printed
    rule must allow it, or restarts look like mere dropped connections."""
    with redis.Redis.from_url(app_user) as client:
        assert client.info("server")["run_id"]


@pytest.mark.parametrize("use", sorted(USES))
async def test_the_printed_acl_rule_refuses_another_prefix(
    app_user: str, r: redis.Redis, use: str
) -> None:
    async with (
        aiolock.from_url(app_user, command_timeout=2) as app,
        aiolock.from_url(app_user, command_timeout=2, watchdog_timeout=0.9) as other,
    ):
        with pytest.raises(aiolock.AioLockError, match="NOPERM"):
            await USES[use](app, other, name_for(use, "app2:"))
    assert r.keys("*app2*") == []  # nothing written


def test_acl_per_type_and_without_fencing() -> None:
    words = acl_line("--user", "locks", "--prefix", "jobs:", "--type", "lock", "--no-fencing")
    assert "+client|kill" not in words and "+evalsha" in words and "+hincrby" in words
    assert "+zadd" not in words and "+rpush" not in words  # fair lock's, semaphores'
    assert "~jobs:*" in words and "&redisson_lock__channel:{jobs:*" in words
    assert not any("redisson_sc" in w for w in words)
    proc = cli("acl", "--user", "x", "--prefix", "")
    assert proc.returncode != 0 and "must not be empty" in proc.stderr
    no_password = cli("acl", "--user", "x", "--prefix", "p:")
    assert "cannot log in" in no_password.stderr
    assert not any(w.startswith(">") for w in shlex.split(no_password.stdout))


async def test_without_client_kill_the_log_says_what_is_lost_and_what_to_allow(
    redis_url: str, r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A user made with ``--no-fencing`` cannot close a connection whose reply was lost; the
    warning says so in an operator's words and names the permission to add."""
    rule = acl_line("--user", "nokill", "--prefix", "app1:", "--password", "pw", "--no-fencing")
    r.execute_command(*rule)  # type: ignore[no-untyped-call]
    try:
        async with TcpProxy.for_url(redis_url) as proxy:
            url = proxy.url.replace("redis://", "redis://nokill:pw@")
            with caplog.at_level(logging.WARNING, logger="aiolock"):
                async with aiolock.from_url(url, command_timeout=1) as client:
                    assert not await client.lock("app1:warm").is_locked()
                    proxy.drop_next_reply(to="EVALSHA")
                    with contextlib.suppress(aiolock.AioLockError):
                        await client.lock("app1:x").try_lock(lease_time=5)
                    await eventually(lambda: true("CLIENT KILL" in caplog.text), within=10)
    finally:
        r.acl_deluser("nokill")
    [message] = [m for m in caplog.messages if "CLIENT KILL" in m]
    assert "Redis refused CLIENT KILL (NOPERM" in message
    assert "+client|kill" in message and "aiolock acl" in message
    assert "fence" not in message.lower()
