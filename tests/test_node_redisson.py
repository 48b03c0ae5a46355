"""A mixed fleet, against software we did not write: node-redisson (npm, a Node.js RLock in
Redisson's layout) and aiolock on one server share locks. The npm package (and ioredis, its
Redis client) is installed into a temporary folder during the run; without node, npm or the
registry the tests skip, saying which.

Checked against the package's source (node-redisson 1.0.x, ``dist/locks/RedissonBaseLock.js``
and ``dist/executor/PubSubCommandExecutor.js``): it wraps a name in ``{...}`` for its channel
unless the name *starts* with ``{`` (Redisson: unless it *contains* one), it publishes with
classic PUBLISH only, and its owner ids are ``<client uuid>:<uuid>``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
import redis.asyncio

import aiolock
from tests.sync_helpers import eventually, true

PEER = Path(__file__).with_name("node_redisson_peer.js")
PACKAGES = ("node-redisson@1", "ioredis@5")
INSTALL_TIMEOUT = 240


@pytest.fixture(scope="session")
def node_modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """node-redisson and ioredis, installed by npm into a temporary folder for this run."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("needs Node.js and npm on PATH (node-redisson is an npm package)")
    folder = tmp_path_factory.mktemp("node-redisson")
    try:
        proc = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--loglevel=error",
             "--prefix", str(folder), *PACKAGES],
            capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm install {' '.join(PACKAGES)} took over {INSTALL_TIMEOUT} s "
                    "(is the npm registry reachable?)")  # fmt: skip
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        pytest.skip(f"npm could not install {' '.join(PACKAGES)}: {last}")
    return folder / "node_modules"


class NodePeer:
    """tests/node_redisson_peer.js in its own process: ``await ask(command, *args)``."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.answers: dict[str, asyncio.Future[list[str]]] = {}
        self.tags = 0
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            tag, *words = line.decode().split()
            future = self.answers.pop(tag, None)
            if future is not None and not future.done():
                future.set_result(words)
        for future in self.answers.values():
            if not future.done():
                future.set_exception(RuntimeError("the node peer ended"))

    def send(self, command: str, *args: object) -> asyncio.Future[list[str]]:
        assert self.proc.stdin is not None
        self.tags += 1
        tag = f"t{self.tags}"
        self.answers[tag] = asyncio.get_running_loop().create_future()
        self.proc.stdin.write(" ".join([command, tag, *map(str, args)]).encode() + b"\n")
        return self.answers[tag]

    async def ask(self, command: str, *args: object, within: float = 30) -> list[str]:
        return await asyncio.wait_for(self.send(command, *args), within)

    async def close(self) -> None:
        if self.proc.returncode is None:
            try:
                await self.ask("quit", within=5)
            except (TimeoutError, RuntimeError):
                pass
            if self.proc.returncode is None:
                self.proc.kill()
        await self.proc.wait()
        self.reader.cancel()


@pytest.fixture
async def node(node_modules: Path, redis_url: str) -> AsyncIterator[list[NodePeer]]:
    """Start node peers with ``await start()``; all closed at teardown."""
    started: list[NodePeer] = []
    yield started
    for peer in started:
        await peer.close()


async def start_peer(node_modules: Path, redis_url: str) -> NodePeer:
    address = urlsplit(redis_url)
    proc = await asyncio.create_subprocess_exec(
        "node", str(PEER), address.hostname or "127.0.0.1", str(address.port or 6379),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "NODE_PATH": str(node_modules)},
    )  # fmt: skip
    return NodePeer(proc)


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as client:
        yield client


async def test_mixed_acquisitions_never_overlap(
    node_modules: Path, redis_url: str, node: list[NodePeer], r: redis.Redis
) -> None:
    """Two Node processes and two aiolock clients (two tasks each) take one lock in turn;
    inside, each counts itself in and out in Redis: never two inside at once. (A 1 s lease:
    node-redisson subscribes after its failed try, so a release in between leaves it waiting
    out the lease it was told.)"""
    node += [await start_peer(node_modules, redis_url) for _ in range(2)]
    per_node, per_task = 400, 200
    redis_client = redis.asyncio.Redis.from_url(redis_url)

    async def aiolock_loop(client: aiolock.AioLock) -> None:
        lock = client.lock("mixed")
        for i in range(per_task):
            await lock.lock(lease_time=1)
            if await redis_client.incr("inside") > 1:
                await redis_client.incr("overlaps")
            if i % 3 == 0:
                await asyncio.sleep(0.001)
            await redis_client.decr("inside")
            await redis_client.incr("total")
            await lock.unlock()

    try:
        async with aiolock.from_url(redis_url) as a, aiolock.from_url(redis_url) as b:
            loops = [peer.send("loop", f"{n}-worker", "mixed", per_node)
                     for n, peer in enumerate(node)]  # fmt: skip
            await asyncio.wait_for(
                asyncio.gather(*(aiolock_loop(c) for c in (a, a, b, b)), *loops), 120
            )
            for each in loops:
                assert each.result() == ["looped", str(per_node), "0"]
    finally:
        await redis_client.aclose()
    assert r.get("overlaps") is None
    assert int(r.get("total") or 0) == 2 * per_node + 4 * per_task
    assert not r.exists("mixed")


async def test_reentrancy_counts_are_shared(
    node_modules: Path, redis_url: str, node: list[NodePeer], r: redis.Redis
) -> None:
    """One owner id, two libraries: node-redisson's hold and aiolock's (an explicit owner
    with node-redisson's owner id) count in the same hash field; the last release frees the
    lock. ``aiolock inspect`` reads node-redisson's owner ids (``<uuid>:<uuid>``)."""
    node.append(peer := await start_peer(node_modules, redis_url))
    [node_id] = await peer.ask("owner")
    client_id = "3f2a0c4e-9b1d-4c55-8e2f-0a1b2c3d4e5f"
    owner_id = f"{node_id}:{client_id}"
    assert await peer.ask("lock", client_id, "shared") == ["locked"]
    assert r.hgetall("shared") == {owner_id.encode(): b"1"}

    async with aiolock.from_url(redis_url) as client:
        owner = aiolock.Owner(owner_id)
        lock = client.lock("shared")
        assert await lock.try_lock(owner=owner)  # reentrant: the same owner id
        assert r.hgetall("shared") == {owner_id.encode(): b"2"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aiolock", "inspect", "shared", "--json", "--url", redis_url,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await proc.communicate()
        assert f'"owner": "{owner_id}"' in out.decode() and '"count": 2' in out.decode()
        assert await peer.ask("unlock", client_id, "shared") == ["unlocked"]
        assert r.hgetall("shared") == {owner_id.encode(): b"1"}
        await lock.unlock(owner=owner)
        assert not r.exists("shared")


async def test_wake_ups_both_ways(
    node_modules: Path, redis_url: str, node: list[NodePeer], r: redis.Redis
) -> None:
    """A release by one library wakes a waiter of the other at once (the leases are 30 s
    watchdog leases: waking by expiry would take that long)."""
    node.append(peer := await start_peer(node_modules, redis_url))
    async with aiolock.from_url(redis_url) as client:
        # Node holds, aiolock waits.
        assert await peer.ask("lock", "c1", "w") == ["locked"]
        waiter = asyncio.create_task(client.lock("w").try_lock(wait_time=20))
        await eventually(lambda: true(client.statistics().tasks_waiting == 1))
        released = time.monotonic()
        assert await peer.ask("unlock", "c1", "w") == ["unlocked"]
        assert await asyncio.wait_for(waiter, 20)
        assert time.monotonic() - released < 10  # woken, not expired (30 s)

        # aiolock holds, Node waits.
        lock = client.lock("w2")
        await lock.lock()
        answer = peer.send("trylock", "c2", "w2", 20_000)
        await eventually(
            lambda: true(r.pubsub_numsub("redisson_lock__channel:{w2}")[0][1] == 1), within=10
        )  # node-redisson subscribes after its first try: the release must come after that,
        # and after its listener is registered, a moment after the subscription (a message
        # in between is dropped by node-redisson itself, which then waits out its 20 s)
        await asyncio.sleep(0.3)
        released = time.monotonic()
        await lock.unlock()
        got, _ = await asyncio.wait_for(answer, 20)
        assert got == "true"
        assert time.monotonic() - released < 10
        assert await peer.ask("unlock", "c2", "w2") == ["unlocked"]


async def test_names_with_a_brace_differ(
    node_modules: Path, redis_url: str, node: list[NodePeer], r: redis.Redis
) -> None:
    """node-redisson leaves a name unwrapped only when it starts with ``{``; Redisson and
    aiolock when it contains one: ``a{b}`` unlocks on another channel there."""
    node.append(peer := await start_peer(node_modules, redis_url))
    listener = r.pubsub()  # type: ignore[no-untyped-call]
    listener.psubscribe("redisson_lock__channel:*")
    try:
        for name, node_channel, aiolock_channel in (
            ("a{b}", "redisson_lock__channel:{a{b}}", "redisson_lock__channel:a{b}"),
            ("{c}d", "redisson_lock__channel:{c}d", "redisson_lock__channel:{c}d"),
            ("plain", "redisson_lock__channel:{plain}", "redisson_lock__channel:{plain}"),
        ):
            assert await peer.ask("lock", "c", name) == ["locked"]
            assert await peer.ask("unlock", "c", name) == ["unlocked"]
            async with aiolock.from_url(redis_url) as client, client.lock(name):
                pass
            channels: list[str] = []
            deadline = time.monotonic() + 10
            while len(channels) < 2 and time.monotonic() < deadline:
                message = listener.get_message(timeout=1)
                if message is not None and message["type"] == "pmessage":
                    channels.append(message["channel"].decode())
            assert channels == [node_channel, aiolock_channel]
    finally:
        listener.close()
