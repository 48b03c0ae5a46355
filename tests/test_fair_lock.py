"""The fair lock: first come, first served across tasks and processes, a line that survives
dead, stopped and impatient waiters, timed waits, and clocks that disagree.

The behaviour every exclusive lock shares (reentrancy, exclusion, cancellation) is in
tests/test_lock_family.py; Redisson interop in tests/test_interop.py.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio

import aiolock
from aiolock import scripts
from aiolock.testing import TcpProxy
from tests.peers import PeerProcess, Peers

QUEUE = "redisson_lock_queue:{{{}}}"
TIMEOUTS = "redisson_lock_timeout:{{{}}}"


async def eventually(check: Callable[[], Awaitable[object]], within: float = 10) -> None:
    """Poll state on the server (no event to wait on there) until ``check`` is true."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def queue_of(redis_client: redis.asyncio.Redis, name: str) -> list[str]:
    owners = await redis_client.lrange(QUEUE.format(name), 0, -1)
    return [o.decode() if isinstance(o, bytes) else o for o in owners]


async def queue_length(redis_client: redis.asyncio.Redis, name: str) -> int:
    return int(await redis_client.llen(QUEUE.format(name)))


async def deadline_ms(redis_client: redis.asyncio.Redis, name: str, owner: str) -> float:
    score = await redis_client.zscore(TIMEOUTS.format(name), owner)
    assert score is not None, f"{owner} not in line"
    return float(score)


async def script_calls(redis_client: redis.asyncio.Redis) -> int:
    stats = await redis_client.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval"))


class Line:
    """Tasks of one client that join a fair lock's line one at a time (each only once the one
    before it is in line on the server), take it, record their turn, and hold it until let go."""

    def __init__(self, lock: aiolock.FairLock, redis_client: redis.asyncio.Redis) -> None:
        self.lock = lock
        self.redis = redis_client
        self.order: list[int] = []
        self.owners: list[str] = []
        self.release: dict[int, asyncio.Event] = {}
        self.tasks: list[asyncio.Task[None]] = []

    async def join(self, count: int, wait_time: float | None = None) -> None:
        for _ in range(count):
            index = len(self.tasks)
            before = await queue_length(self.redis, self.lock.name)
            self.release[index] = asyncio.Event()
            self.tasks.append(asyncio.create_task(self._run(index, wait_time)))
            await eventually(lambda: _more(self.redis, self.lock.name, before))  # noqa: B023

    async def _run(self, index: int, wait_time: float | None) -> None:
        self.owners.append(self.lock.statistics().owner)
        if wait_time is None:
            await self.lock.lock()
        elif not await self.lock.try_lock(wait_time):
            return
        try:
            self.order.append(index)
            await self.release[index].wait()
        finally:
            await self.lock.unlock()

    async def let_go_in_order(self) -> None:
        """Let each holder go once it has the lock, in turn; never two at once."""
        for turn in range(len(self.tasks)):
            await eventually(lambda: _true(len(self.order) > turn))  # noqa: B023
            assert len(self.order) == turn + 1
            self.release[self.order[turn]].set()
        await asyncio.gather(*self.tasks)


async def _more(redis_client: redis.asyncio.Redis, name: str, before: int) -> bool:
    return await queue_length(redis_client, name) > before


async def _true(value: bool) -> bool:
    return value


# -- first come, first served -------------------------------------------------------------------


async def test_local_waiters_get_it_in_the_order_they_asked(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    lock = client.fair_lock("fifo-local")
    assert await lock.try_lock(lease_time=30)
    line = Line(lock, redis_client)
    await line.join(10)
    await eventually(lambda: _true(lock.statistics().tasks_waiting == 10))
    await lock.unlock()
    await line.let_go_in_order()
    assert line.order == list(range(10))
    assert not await redis_client.exists(QUEUE.format("fifo-local"), TIMEOUTS.format("fifo-local"))
    assert client.statistics().subscriptions == 0


async def test_fifo_of_20_waiters_from_3_processes_is_exact(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers
) -> None:
    """20 waiters in 3 processes join the line one by one (round robin over the processes);
    each takes the lock exactly in its turn, and the test lets each go as it reports."""
    name = "fifo-processes"
    lock = client.fair_lock(name)
    assert await lock.try_lock(lease_time=30)
    procs = [await peers.start("aiolock") for _ in range(3)]
    expected: list[tuple[PeerProcess, str]] = []
    for i in range(20):
        peer, tid = procs[i % 3], f"w{i}"
        await peer.send(tid, "fair-lock", name, -1, -1)
        owner = await peer.wait_owner(tid)
        await eventually(lambda: _in_line(redis_client, name, owner))  # noqa: B023
        expected.append((peer, tid))
    assert [p.owner(t) for p, t in expected] == await queue_of(redis_client, name)
    await lock.unlock()
    await take_turns(peers, name, expected)
    assert not await redis_client.exists(name, QUEUE.format(name), TIMEOUTS.format(name))


async def take_turns(peers: Peers, name: str, expected: list[tuple[PeerProcess, str]]) -> None:
    """Each peer thread in ``expected`` must acquire in that order; each is told to unlock as
    soon as it reports (its "unlocked" may come after the next one's "acquired")."""
    acquired: list[tuple[PeerProcess, str]] = []
    unlocked = 0
    while len(acquired) < len(expected) or unlocked < len(expected):
        event = await peers.next()
        if event.what == "unlocked":
            unlocked += 1
            continue
        assert event.what == "acquired", event
        acquired.append((event.peer, event.tid))
        assert acquired == expected[: len(acquired)]
        await event.peer.send(event.tid, "fair-unlock", name)


async def _in_line(redis_client: redis.asyncio.Redis, name: str, owner: str) -> bool:
    return owner in await queue_of(redis_client, name)


async def test_try_without_wait_never_barges_or_joins(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    lock = client.fair_lock("no-barging")
    assert await lock.try_lock(lease_time=30)
    line = Line(lock, redis_client)
    await line.join(1)
    assert not await asyncio.create_task(lock.try_lock())  # held: not taken, not in line
    assert await queue_length(redis_client, "no-barging") == 1
    await lock.unlock()
    await eventually(lambda: _true(line.order == [0]))
    assert not await asyncio.create_task(lock.try_lock())  # someone waited first
    line.release[0].set()
    await asyncio.gather(*line.tasks)
    assert await asyncio.create_task(lock.try_lock())  # free and nobody waits: taken
    assert await queue_length(redis_client, "no-barging") == 0


async def test_one_release_wakes_only_the_first_in_line(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    lock = client.fair_lock("head-only")
    assert await lock.try_lock(lease_time=30)
    line = Line(lock, redis_client)
    await line.join(5)
    await asyncio.sleep(0.1)
    before = await script_calls(redis_client)
    await lock.unlock()
    await eventually(lambda: _true(len(line.order) == 1))
    await asyncio.sleep(0.2)
    # the release and the first waiter's attempt: the others did not wake
    assert await script_calls(redis_client) - before == 2
    await line.let_go_in_order()


# -- waiters that leave, die or stop --------------------------------------------------------------


async def test_a_waiter_that_gives_up_moves_the_ones_behind_by_its_own_allowance(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    name = "give-up"
    lock = client.fair_lock(name)
    assert await lock.try_lock(lease_time=30)
    line = Line(lock, redis_client)
    await line.join(1, wait_time=0.6)  # allowance 0.6 s: its wait
    await line.join(2)  # allowance 10 s each
    owners = await queue_of(redis_client, name)
    behind = [await deadline_ms(redis_client, name, o) for o in owners[1:]]
    await line.tasks[0]  # its wait runs out
    await eventually(lambda: _equal(queue_of(redis_client, name), owners[1:]))
    after = [await deadline_ms(redis_client, name, o) for o in owners[1:]]
    assert [b - a for b, a in zip(behind, after, strict=True)] == [600, 600]
    await lock.unlock()
    line.order.insert(0, 0)  # (the first one never held it)
    await line.let_go_in_order()
    assert line.order == [0, 1, 2]


async def _equal(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


async def test_a_cancelled_waiter_leaves_the_line_and_its_channel(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    name = "cancelled"
    lock = client.fair_lock(name)
    assert await lock.try_lock(lease_time=30)
    line = Line(lock, redis_client)
    await line.join(3)
    owners = await queue_of(redis_client, name)
    channels = [f"redisson_lock__channel:{{{name}}}:{o}" for o in owners]
    assert [n for _, n in await redis_client.pubsub_numsub(*channels)] == [1, 1, 1]
    line.tasks[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await line.tasks[1]
    await eventually(lambda: _equal(queue_of(redis_client, name), [owners[0], owners[2]]))
    await eventually(lambda: _numsub(redis_client, channels, [1, 0, 1]))
    await lock.unlock()
    line.order.insert(1, 1)
    line.release[1].set()
    for turn in (0, 2):
        await eventually(lambda: _true(line.order[-1] == turn))  # noqa: B023
        line.release[turn].set()
    await asyncio.gather(*line.tasks, return_exceptions=True)
    await eventually(lambda: _numsub(redis_client, channels, [0, 0, 0]))
    assert client.statistics().subscriptions == 0


async def _numsub(
    redis_client: redis.asyncio.Redis, channels: list[str], counts: list[int]
) -> bool:
    return [n for _, n in await redis_client.pubsub_numsub(*channels)] == counts


async def test_cancel_after_release(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    """The race where the first waiter is woken by the release and cancelled before it runs
    again: it gives up, and since the lock is free its give-up wakes the next in line, which
    takes the lock at once instead of after the cancelled one's allowance (10 s)."""
    name = "cancel-after-release"
    lock = client.fair_lock(name)
    assert await lock.try_lock(lease_time=30)
    line = Line(lock, redis_client)
    await line.join(2)
    await eventually(lambda: _true(lock.statistics().tasks_waiting == 2))
    released = time.monotonic()
    await lock.unlock()
    line.tasks[0].cancel()  # woken (or about to be) and cancelled before it resumes
    await eventually(lambda: _true(bool(line.order)))
    assert time.monotonic() - released < 5
    if line.order == [0]:  # it won the race after all: fine, then the next one follows
        line.release[0].set()
        await eventually(lambda: _true(line.order == [0, 1]))
    assert line.order[-1] == 1
    line.release[1].set()
    await asyncio.gather(*line.tasks, return_exceptions=True)
    assert not await redis_client.exists(name, QUEUE.format(name), TIMEOUTS.format(name))


async def test_a_killed_waiter_holds_the_line_up_for_its_allowance_only(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers
) -> None:
    """The first waiter in line is killed (kill -9) and the holder (30 s lease) releases at
    once: the next waiter takes the lock about the dead one's allowance (1 s) after its last
    sign of life (it checked every quarter allowance), not after the lease."""
    name = "killed-waiter"
    lock = client.fair_lock(name)
    assert await lock.try_lock(lease_time=30)
    peer = await peers.start("aiolock", "--allowance", 1)
    await peer.send("w", "fair-lock", name, -1, -1)
    owner = await peer.wait_owner("w")
    await eventually(lambda: _in_line(redis_client, name, owner))
    killed = time.monotonic()
    peer.signal(signal.SIGKILL)
    waiter = asyncio.create_task(_timed_lock(client.fair_lock(name, wait_allowance=1)))
    await eventually(lambda: _equal(queue_length(redis_client, name), 2))
    released = time.monotonic()
    await lock.unlock()
    acquired = await waiter
    assert acquired - killed > 0.5
    assert acquired - released < 5
    assert await queue_of(redis_client, name) == []


async def _timed_lock(lock: aiolock.Lock) -> float:
    await lock.lock()
    try:
        return time.monotonic()
    finally:
        await lock.unlock()


#: the wait allowance of the dead-waiter tests, and how much later than it a live waiter may
#: take the free lock (its check's timer and round trip on a loaded machine): well below a
#: second allowance, so a bound of ALLOWANCE + SLACK rules out two allowances or more
ALLOWANCE = 2.0
SLACK = 1.0
ALIVE = "aiolock_lock_alive:{{{}}}"


async def _line_up_in_a_process(
    peers: Peers, redis_client: redis.asyncio.Redis, name: str, tasks: int
) -> PeerProcess:
    """A peer process (allowance ALLOWANCE) with ``tasks`` tasks waiting in line."""
    peer = await peers.start("aiolock", "--allowance", ALLOWANCE)
    for i in range(tasks):
        await peer.send(f"w{i}", "fair-lock", name, -1, -1)
        owner = await peer.wait_owner(f"w{i}")
        await eventually(lambda: _in_line(redis_client, name, owner))  # noqa: B023
    return peer


@pytest.mark.slow
async def test_dead_waiters_keep_a_free_lock_one_allowance_at_most_however_many(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers
) -> None:
    """A process with 4 tasks waiting in line is killed (kill -9) just before the holder
    (30 s lease) releases: the live waiter behind them takes the lock at most one allowance
    (plus a check's latency) after the release, not one allowance per dead waiter (8 s)."""
    name = "dead-waiters"
    lock = client.fair_lock(name)
    assert await lock.try_lock(lease_time=30)
    peer = await _line_up_in_a_process(peers, redis_client, name, 4)
    waiter = asyncio.create_task(_timed_lock(client.fair_lock(name, wait_allowance=ALLOWANCE)))
    await eventually(lambda: _equal(queue_length(redis_client, name), 5))
    peer.signal(signal.SIGKILL)
    released = time.monotonic()
    await lock.unlock()
    async with asyncio.timeout(30):
        acquired = await waiter
    assert acquired - released < ALLOWANCE + SLACK
    assert not await redis_client.exists(
        QUEUE.format(name), TIMEOUTS.format(name), ALIVE.format(name)
    )


@pytest.mark.slow
@pytest.mark.parametrize("holder", ["aiolock", "redisson"])
async def test_a_waiter_killed_before_an_early_release_keeps_the_lock_one_allowance_at_most(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers, holder: str
) -> None:
    """The first waiter in line is killed just before the holder releases with 30 s of its
    lease left: the live waiter behind it takes the lock at most one allowance later (plus a
    check's latency), not after the rest of the lease. Also when the holder is a Redisson
    client, whose release moves no deadline (the line is shared with it)."""
    name = f"early-release-{holder}"
    holding = await peers.start(holder)
    await holding.send("h", "fair-lock", name, 0, 30_000)
    await peers.expect(holding, "h", "acquired")
    peer = await _line_up_in_a_process(peers, redis_client, name, 1)
    waiter = asyncio.create_task(_timed_lock(client.fair_lock(name, wait_allowance=ALLOWANCE)))
    await eventually(lambda: _equal(queue_length(redis_client, name), 2))
    await asyncio.sleep(1)  # the lease goes on; the deadlines were set at enqueue
    peer.signal(signal.SIGKILL)
    released = time.monotonic()
    await holding.send("h", "fair-unlock", name)
    await peers.expect(holding, "h", "unlocked")
    async with asyncio.timeout(45):
        acquired = await waiter
    assert acquired - released < ALLOWANCE + SLACK
    assert await queue_of(redis_client, name) == []


@pytest.mark.slow
async def test_give_ups_lost_in_an_outage_are_sent_again(
    proxy: TcpProxy, redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """5 waiters (allowance 30 s) time out during a 3 s outage of their client's link, so
    their give-ups cannot reach Redis then: they are sent again once it is back, and another
    client takes the freed lock at once, not when their places would have run out (~25 s)."""
    name = "lost-give-ups"
    async with (
        aiolock.from_url(redis_url) as holder_client,
        aiolock.from_url(proxy.url, command_timeout=0.5) as waiters_client,
        aiolock.from_url(redis_url) as other,
    ):
        holder = holder_client.fair_lock(name)
        assert await holder.try_lock(lease_time=60)
        lock = waiters_client.fair_lock(name, wait_allowance=30)
        scopes: list[asyncio.Timeout] = []

        async def wait_and_time_out() -> None:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(None) as scope:
                    scopes.append(scope)
                    await lock.lock()

        waiters = []
        for count in range(1, 6):
            waiters.append(asyncio.create_task(wait_and_time_out()))
            await eventually(lambda: _equal(queue_length(redis_client, name), count))  # noqa: B023
        outage = time.monotonic()
        proxy.blackhole_requests()
        proxy.blackhole_replies()
        loop = asyncio.get_running_loop()
        for scope in scopes:  # they time out in the outage
            scope.reschedule(loop.time() + 1)
        await asyncio.gather(*waiters)
        assert await queue_length(redis_client, name) == 5  # nothing reached Redis
        await asyncio.sleep(max(0.0, outage + 3 - time.monotonic()))
        proxy.pass_through()
        proxy.reset_connections()
        released = time.monotonic()
        await holder.unlock()
        assert await other.fair_lock(name).try_lock(wait_time=40)
        assert time.monotonic() - released < 5
        assert await queue_length(redis_client, name) == 0
        await other.fair_lock(name).unlock()


async def test_a_stopped_waiter_loses_its_place_and_joins_again_when_it_resumes(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers
) -> None:
    """SIGSTOP the first waiter for longer than its allowance: the line goes on without it;
    after SIGCONT it joins the tail again and gets the lock in its new turn."""
    name = "stopped-waiter"
    lock = client.fair_lock(name)
    assert await lock.try_lock(lease_time=30)
    peer = await peers.start("aiolock", "--allowance", 0.5)
    await peer.send("w", "fair-lock", name, -1, -1)
    owner = await peer.wait_owner("w")
    await eventually(lambda: _in_line(redis_client, name, owner))
    peer.signal(signal.SIGSTOP)
    let_go = asyncio.Event()

    async def behind() -> None:
        async with client.fair_lock(name, wait_allowance=0.5):
            await let_go.wait()

    try:
        second = asyncio.create_task(behind())
        await eventually(lambda: _equal(queue_length(redis_client, name), 2))
        await lock.unlock()
        await eventually(lambda: _equal(queue_length(redis_client, name), 0))
        assert await redis_client.hlen(name) == 1  # the second has it: the stopped one dropped
    finally:
        peer.signal(signal.SIGCONT)
    await eventually(lambda: _in_line(redis_client, name, owner))  # back, at the tail
    let_go.set()
    await second
    await peers.expect(peer, "w", "acquired")
    await peer.send("w", "fair-unlock", name)
    await peers.expect(peer, "w", "unlocked")
    assert not await redis_client.exists(name, QUEUE.format(name), TIMEOUTS.format(name))


async def test_a_live_waiter_keeps_its_place_however_long_the_holder_renews(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    """Allowances of 0.5 s, a holder renewed by the watchdog (lease 0.6 s) for 2.5 s, longer
    than the lease and every allowance in line together: the waiters' deadlines move with
    the lease and the first in line refreshes its own, so nobody is presumed dead and the
    order holds."""
    name = "long-holder"
    holder_client = make_client(watchdog_timeout=0.6)
    holder = holder_client.fair_lock(name)
    assert await holder.try_lock()
    waiters = make_client(watchdog_timeout=0.6)
    line = Line(waiters.fair_lock(name, wait_allowance=0.5), redis_client)
    await line.join(3)
    owners = await queue_of(redis_client, name)
    await asyncio.sleep(2.5)
    assert await queue_of(redis_client, name) == owners
    await holder.unlock()
    await line.let_go_in_order()
    assert line.order == [0, 1, 2]


async def test_a_killed_holder_hands_over_when_its_lease_runs_out(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers
) -> None:
    """No message comes when a lease expires: the first waiter's timer (the lease) fires."""
    name = "killed-holder"
    peer = await peers.start("aiolock")
    await peer.send("h", "fair-lock", name, 0, 700)
    await peers.expect(peer, "h", "acquired")
    peer.signal(signal.SIGKILL)
    lock = client.fair_lock(name)
    started = time.monotonic()
    assert await lock.try_lock(wait_time=10)
    assert time.monotonic() - started < 5
    await lock.unlock()


# -- every wait is timed --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    ["held-without-ttl", "stale-last-waiter", "free-for-a-live-first-waiter"],
)
async def test_the_expected_wait_is_never_negative_or_zero(
    redis_client: redis.asyncio.Redis, state: str
) -> None:
    """States in which Redisson's script returns a negative or zero TTL (its waiter then waits
    for a message only, or polls in a hot loop): aiolock's returns a positive wait, at most
    a quarter of the waiter's allowance (10 s here: its heartbeat)."""
    name = "timed"
    queue, timeouts = QUEUE.format(name), TIMEOUTS.format(name)
    now = int(time.time() * 1000)
    if state == "held-without-ttl":
        await redis_client.hset(name, "someone:1", 1)
        expected: tuple[int, int] = (2_500, 2_500)
    elif state == "stale-last-waiter":
        await redis_client.hset(name, "someone:1", 1)
        await redis_client.pexpire(name, 5_000)
        await redis_client.rpush(queue, "head:1", "stale:1")
        await redis_client.zadd(timeouts, {"head:1": now + 60_000, "stale:1": now - 1_000})
        expected = (2_500, 2_500)
    else:
        await redis_client.rpush(queue, "head:1")
        await redis_client.zadd(timeouts, {"head:1": now + 2_000})
        expected = (1_000, 2_000)
    keys = (name, queue, timeouts, f"redisson_lock__channel:{{{name}}}", ALIVE.format(name))
    reply = await redis_client.eval(
        scripts.FAIR_LOCK_ACQUIRE.source, 5, *keys, 30_000, "me:1", 10_000, now, "0", "PUBLISH"
    )
    assert expected[0] <= reply <= expected[1]
    assert "me:1" in await queue_of(redis_client, name)


async def test_behind_a_dead_first_waiter_no_hot_loop(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    """The lock is free, the first in line is dead but not yet past its deadline (1 s): the
    next waiter sleeps until that deadline (Redisson's waiter polls with a 0 ms wait) and
    then takes the lock."""
    name = "dead-head"
    now = int(time.time() * 1000)
    await redis_client.rpush(QUEUE.format(name), "dead:1")
    await redis_client.zadd(TIMEOUTS.format(name), {"dead:1": now + 1_000})
    lock = client.fair_lock(name)
    await redis_client.config_resetstat()
    started = time.monotonic()
    assert await lock.try_lock(wait_time=10)
    assert time.monotonic() - started > 0.5
    assert await script_calls(redis_client) <= 4
    await lock.unlock()


# -- clocks ----------------------------------------------------------------------------------------


async def test_a_client_whose_clock_is_3s_ahead_keeps_the_line_in_order(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers
) -> None:
    """Clocks 3 s apart, allowances 10 s: no waiter is dropped, the order is exact."""
    name = "skew"
    lock = client.fair_lock(name)
    assert await lock.try_lock(lease_time=30)
    fast = await peers.start("aiolock", "--clock-offset", 3_000)
    slow = await peers.start("aiolock", "--clock-offset", -3_000)
    expected: list[tuple[PeerProcess, str]] = []
    for i in range(6):
        peer, tid = (fast, slow)[i % 2], f"w{i}"
        await peer.send(tid, "fair-lock", name, -1, -1)
        owner = await peer.wait_owner(tid)
        await eventually(lambda: _in_line(redis_client, name, owner))  # noqa: B023
        expected.append((peer, tid))
    await lock.unlock()
    await take_turns(peers, name, expected)


async def test_clocks_further_apart_than_the_allowance_reorder_but_never_hang(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    """A client 5 s ahead among waiters with 0.2 s allowances drops live waiters as dead;
    they join again at the tail: every one still gets the lock, one at a time."""
    name = "big-skew"
    normal, fast = make_client(), make_client()
    inside = 0
    taken = 0

    async def worker(lock: aiolock.FairLock) -> None:
        nonlocal inside, taken
        for _ in range(3):
            async with lock:
                inside += 1
                assert inside == 1
                await asyncio.sleep(0.02)
                inside -= 1
                taken += 1

    def skewed() -> float:
        return time.time() + 5

    locks = [normal.fair_lock(name, wait_allowance=0.2) for _ in range(4)]
    locks += [aiolock.FairLock(fast, name, wait_allowance=0.2, clock=skewed) for _ in range(4)]
    async with asyncio.timeout(30):
        await asyncio.gather(*(worker(lock) for lock in locks))
    assert taken == 24
    await eventually(lambda: _equal(queue_length(redis_client, name), 0))


# -- faults ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("held", [False, True], ids=["granted", "queued"])
async def test_a_lost_attempt_reply_is_settled_without_a_double_hold_or_place(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis, held: bool
) -> None:
    """The attempt ran (took the lock, or joined the line) and its reply was lost with the
    connection: the owner's count says what it did; a resent attempt finds itself in line."""
    name = "lost-reply"
    async with aiolock.from_url(proxy.url) as client:
        lock = client.fair_lock(name)
        async with lock:  # connections open before the fault
            pass
        if held:
            await redis_client.hset(name, "someone:1", 1)
            await redis_client.pexpire(name, 1_000)
        owner = client.new_owner()
        proxy.blackhole_replies()
        task = asyncio.create_task(lock.try_lock(wait_time=10, lease_time=30, owner=owner))
        if held:
            await eventually(lambda: _equal(queue_length(redis_client, name), 1))
        else:
            await eventually(lambda: redis_client.exists(name))
        proxy.pass_through()
        proxy.reset_connections()
        assert await task
        assert await redis_client.hvals(name) == [b"1"]
        assert lock.statistics(owner=owner).hold_count == 1
        assert await queue_length(redis_client, name) == 0
        await lock.unlock(owner=owner)
    assert not await redis_client.exists(name, QUEUE.format(name), TIMEOUTS.format(name))


async def test_cancelled_with_the_attempt_in_flight_leaves_no_hold_and_no_place(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    async with aiolock.from_url(proxy.url) as client:
        name = "in-flight"
        holder = client.fair_lock(name)
        assert await holder.try_lock(lease_time=30)
        proxy.delay_replies(0.3)
        task = asyncio.create_task(client.fair_lock(name).lock())
        await eventually(lambda: _equal(queue_length(redis_client, name), 1))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        proxy.pass_through()
        await eventually(lambda: _equal(queue_length(redis_client, name), 0))
        await holder.unlock()
        assert not any(client.statistics().holds.values())
    assert not await redis_client.exists(name, QUEUE.format(name), TIMEOUTS.format(name))


async def test_force_unlock_wakes_the_first_in_line(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis, peers: Peers
) -> None:
    name = "forced"
    peer = await peers.start("aiolock")
    await peer.send("h", "fair-lock", name, 0, 30_000)
    await peers.expect(peer, "h", "acquired")
    lock = client.fair_lock(name)
    waiter = asyncio.create_task(_timed_lock(lock))
    await eventually(lambda: _equal(queue_length(redis_client, name), 1))
    forced = time.monotonic()
    assert await client.fair_lock(name).force_unlock()
    assert await waiter - forced < 5  # woken, not after the 30 s lease


def test_bad_arguments(client: aiolock.AioLock) -> None:
    with pytest.raises(ValueError):
        client.fair_lock("x", wait_allowance=0)
    with pytest.raises(TypeError):
        client.fair_lock("x", wait_allowance="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        aiolock.FairLock(client, "x", clock=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        client.fair_lock("")
    assert client.fair_lock("x").wait_allowance == 10


@pytest.mark.slow
async def test_a_waiter_in_line_keeps_its_place_on_a_server_out_of_memory() -> None:
    """maxmemory reached (noeviction): every check of a waiter writes its heartbeat, which
    Redis would refuse as a script's first write (it needs memory); the check removes first,
    so the waiter keeps its place, and takes the lock when the holder releases."""
    from aiolock.testing import RedisServer, external_redis_url

    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server")
    with RedisServer(["--maxmemory-policy", "noeviction"]) as server:
        async with (
            aiolock.from_url(server.url) as client,
            redis.asyncio.Redis.from_url(server.url) as redis_client,
        ):
            holder = client.fair_lock("oom")
            assert await holder.try_lock(lease_time=30)
            waiter = asyncio.create_task(_timed_lock(client.fair_lock("oom", wait_allowance=0.4)))
            await eventually(lambda: _equal(queue_length(redis_client, "oom"), 1))
            await redis_client.config_set("maxmemory", 1)
            try:
                await asyncio.sleep(1.5)  # a heartbeat every 0.1 s
                assert not waiter.done()
                assert await queue_length(redis_client, "oom") == 1
                await holder.unlock()
                async with asyncio.timeout(10):
                    await waiter
            finally:
                await redis_client.config_set("maxmemory", 0)
