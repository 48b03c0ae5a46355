"""The connection layer under faults: every symptom of issue "Core, part 1", reproduced against
real servers and a real proxy, and the documented bounds."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import pytest
import redis.asyncio
from redis.credentials import CredentialProvider

import aiolock
from aiolock.testing import RedisServer, TcpProxy, acl_user, exhaust_connections
from aiolock.transport import (
    Link,
    NotSent,
    OutcomeUnknown,
    ServerSettings,
    StandaloneTransport,
    pack,
)
from aiolock.transport.subscriber import Subscriber
from tests.sync_helpers import true

COMMAND_TIMEOUT = 0.5
CLEANUP_TIMEOUT = 0.7
#: scheduling slack of a loaded 2-core machine on top of a documented bound
SLACK = 0.35


async def eventually(check: Callable[[], Awaitable[object]], within: float = 5) -> None:
    """Poll server state (there is no event to wait on there) until ``check`` is true."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def not_(value: Awaitable[object]) -> bool:
    return not await value


def elapsed_since(started: float) -> float:
    return asyncio.get_running_loop().time() - started


def now() -> float:
    return asyncio.get_running_loop().time()


@pytest.fixture
async def via_proxy(proxy: TcpProxy) -> AsyncIterator[aiolock.AioLock]:
    async with aiolock.from_url(
        proxy.url, command_timeout=COMMAND_TIMEOUT, cleanup_timeout=CLEANUP_TIMEOUT
    ) as client:
        async with client.lock("warm-up"):  # open both connections before faults start
            await asyncio.create_task(client.lock("warm-up").try_lock(wait_time=0.01))
        yield client


# -- 1. a command that cannot be encoded fails alone ------------------------------------------


async def test_an_argument_that_cannot_be_encoded_fails_alone(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """The encoding happens before anything is queued: a bad argument raises, and every reply
    after it still goes to its own caller."""
    transport = StandaloneTransport(
        ServerSettings.from_redis(redis_client), aiolock.Config(command_timeout=2)
    )
    try:
        await redis_client.set("a", "1")
        await redis_client.set("b", "2")
        first = await transport.send(pack(("GET", "a")), key="a")
        with pytest.raises(UnicodeEncodeError):
            await transport.send(pack(("GET", os.fsdecode(b"\xff"))), key="x")
        second = await transport.send(pack(("GET", "b")), key="b")
        assert (await first.future, await second.future) == (b"1", b"2")
    finally:
        await transport.aclose()


async def test_a_name_from_fsdecode_is_refused_and_others_stay_exact(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    with pytest.raises(ValueError, match="UTF-8"):
        client.lock(os.fsdecode(b"\xff"))
    other = make_client()
    assert await other.lock("exact").try_lock()
    assert not await client.lock("exact").try_lock()
    assert await client.lock("free").try_lock()
    assert not await other.lock("free").try_lock()


# -- 2. readers never die -----------------------------------------------------------------------


@pytest.mark.parametrize("payload", [b"\xff\xfe\xfd", b"hello", b"", b"-1", b"0" * 100_000])
async def test_a_malformed_message_is_skipped(
    client: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    redis_client: redis.asyncio.Redis,
    payload: bytes,
) -> None:
    """Anyone can PUBLISH on a lock's channel. A payload that is not a lock message (not
    UTF-8, not a number, huge) is logged and skipped; the real unlock still wakes the
    waiter at once, and aclose() is clean."""
    holder = make_client().lock("malformed")
    assert await holder.try_lock(lease_time=30)
    waiter = asyncio.create_task(client.lock("malformed").try_lock(wait_time=10))
    await eventually(lambda: _ready(client.statistics().tasks_waiting == 1))
    await redis_client.publish("redisson_lock__channel:{malformed}", payload)
    await asyncio.sleep(0.05)
    started = now()
    await holder.unlock()
    assert await waiter
    assert elapsed_since(started) < 2
    await client.aclose()


async def _ready(value: bool) -> bool:
    return value


# -- 3. a subscription that cannot be had is an error, never a hang ------------------------------


async def test_a_server_at_maxclients_fails_a_waiting_try_lock_at_once(
    fresh_server_maxclients: RedisServer,
) -> None:
    server = fresh_server_maxclients
    async with (
        aiolock.from_url(server.url, command_timeout=COMMAND_TIMEOUT) as holder,
        aiolock.from_url(server.url, command_timeout=COMMAND_TIMEOUT) as waiter,
    ):
        assert await holder.lock("full").try_lock(lease_time=30)
        assert not await waiter.lock("full").try_lock()  # its command link is open
        with exhaust_connections(server.url):
            started = now()
            with pytest.raises(aiolock.RedisUnavailableError, match="max number of clients"):
                await waiter.lock("full").try_lock(wait_time=1)
            assert elapsed_since(started) < 1 + COMMAND_TIMEOUT + SLACK


@pytest.fixture
def fresh_server_maxclients() -> Iterator[RedisServer]:
    from aiolock.testing import external_redis_url

    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server")
    with RedisServer(["--maxclients", "8"]) as server:
        yield server


class _SlowCredentials(CredentialProvider):
    """Credentials that take a moment: the handshake is sent only after them."""

    def get_credentials(self) -> tuple[str]:
        return ("secret",)

    async def get_credentials_async(self) -> tuple[str]:
        await asyncio.sleep(0.2)
        return ("secret",)


async def test_a_refusal_written_before_the_handshake_is_the_error() -> None:
    """Redis at maxclients writes -ERR max number of clients reached on accept and closes.
    Read before any command was sent (uvloop, a loaded machine), that reply was taken for one
    to a command: the link dropped with IndexError('pop from an empty deque'), and the
    server's reason was lost. The refusal itself is now the error."""

    served = asyncio.Event()

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(b"-ERR max number of clients reached\r\n")
            await reader.read()  # left open until the client drops it: the error comes first
            writer.close()
            await writer.wait_closed()
        finally:
            served.set()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    settings = ServerSettings("127.0.0.1", port, credential_provider=_SlowCredentials())
    try:
        with pytest.raises(NotSent, match="max number of clients"):
            await Link.open(settings, command_timeout=5, ping_interval=5)
        await asyncio.wait_for(served.wait(), 10)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_subscription_refused_by_an_acl_is_a_clear_error(redis_url: str) -> None:
    """An ACL user with every key and command but no channel: the -NOPERM answer to
    SUBSCRIBE reaches the waiter as SubscriptionError, at once."""
    with acl_user(redis_url, "no-channels", "~*", "+@all", "resetchannels") as url:
        async with (
            aiolock.from_url(redis_url) as holder,
            aiolock.from_url(url, command_timeout=COMMAND_TIMEOUT) as waiter,
        ):
            assert await holder.lock("acl").try_lock(lease_time=30)
            started = now()
            with pytest.raises(aiolock.SubscriptionError, match="NOPERM"):
                await waiter.lock("acl").try_lock(wait_time=10)
            assert elapsed_since(started) < 5  # at once, not after waiting out wait_time


async def test_waiters_whose_subscription_is_refused_when_made_again_are_told(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """The waiter's user loses its channels while it waits (ACL SETUSER resetchannels: Redis
    drops its pub/sub connection, and subscribing again is refused with -NOPERM). Nobody
    would wake the parked waiter any more: it raises SubscriptionError at once, as a new
    waiter does, instead of waking only when the holder's lease would have run out; a waiter
    after the channels are given back subscribes again and is woken by the release."""
    with acl_user(redis_url, "loses-channels", "~*", "&*", "+@all") as url:
        async with (
            aiolock.from_url(redis_url) as holder,
            aiolock.from_url(url, command_timeout=COMMAND_TIMEOUT) as waiter,
        ):
            lock = holder.lock("acl-again")
            assert await lock.try_lock(lease_time=60)
            parked = asyncio.create_task(waiter.lock("acl-again").try_lock(wait_time=30))
            async with asyncio.timeout(5):
                while waiter.statistics().tasks_waiting != 1:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            await redis_client.acl_setuser("loses-channels", enabled=True, reset_channels=True)
            started = now()
            with pytest.raises(aiolock.SubscriptionError, match="NOPERM"):
                await parked
            assert elapsed_since(started) < 5  # not at the end of the holder's 60 s lease
            with pytest.raises(aiolock.SubscriptionError, match="NOPERM"):
                await waiter.lock("acl-again").try_lock(wait_time=30)
            await redis_client.acl_setuser("loses-channels", enabled=True, channels=["*"])
            again = asyncio.create_task(waiter.lock("acl-again").try_lock(wait_time=30))
            async with asyncio.timeout(5):
                while waiter.statistics().tasks_waiting != 1:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            await lock.unlock()
            async with asyncio.timeout(5):
                assert await again


class Heard(list[bytes | bool]):
    """A pub/sub listener that records what it hears: each message, and False / True when
    told its subscription was lost / is back."""

    def on_message(self, data: bytes) -> None:
        self.append(data)

    def on_reset(self, listening: bool) -> None:
        self.append(listening)

    def on_refused(self, error: Exception) -> None:
        self.append(False)


async def test_a_listener_hears_its_channel_is_back_after_every_loss(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """Pub/sub is at most once, so a listener told its subscription was lost is told when it
    is back, also when the connection opened in between dropped before confirming it: its
    waiters re-check then for what was published while nobody listened (they used to wait
    for the holder's lease instead)."""
    heard = Heard()
    proxied = redis.asyncio.Redis.from_url(proxy.url)
    settings = ServerSettings.from_redis(proxied)
    await proxied.aclose()
    transport = StandaloneTransport(settings, aiolock.Config(command_timeout=COMMAND_TIMEOUT))
    try:
        await transport.subscribe(b"back", heard, key="back")
        proxy.drop_replies(1, to="SUBSCRIBE")
        await redis_client.client_kill_filter(_type="pubsub")
        async with asyncio.timeout(5):
            await proxy.wait_for_drops()  # the next connection's SUBSCRIBE goes unanswered
            while heard[-1:] != [True]:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        # lost; lost again (its SUBSCRIBE unanswered within command_timeout); back
        assert heard == [False, False, True]
        await redis_client.publish("back", "after")
        async with asyncio.timeout(5):
            while heard[-1:] != [b"after"]:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    finally:
        await transport.aclose()


@pytest.mark.parametrize("moment", ["before it is adopted", "before its opener resumes"])
async def test_a_pubsub_connection_that_dies_as_it_opens_is_opened_again(
    moment: str, redis_client: redis.asyncio.Redis
) -> None:
    """A pub/sub connection reset just as it opens (the RST read right after the handshake's
    last reply: before the subscriber adopted it, or before the task that opened it went on)
    is opened again and its channels subscribed there. (The first used to leave the opener
    waiting for ever, the second to leave the subscriber without a connection for good:
    either way its waiters heard nothing more and re-checked only on their TTL timers.)"""
    settings = ServerSettings.from_redis(redis_client)
    config = aiolock.Config(command_timeout=COMMAND_TIMEOUT)
    opened: list[Link] = []
    heard = Heard()

    async def open_link(
        sink: Callable[[bytes, bytes], None], on_closed: Callable[[Link, BaseException], None]
    ) -> Link:
        link = await Link.open(
            settings,
            command_timeout=config.command_timeout,
            ping_interval=config.ping_interval,
            sink=sink,
            on_closed=on_closed,
            standalone=True,
        )
        opened.append(link)
        if len(opened) == 2:  # the one opened after the first is dropped: reset as it opens
            reset = ConnectionResetError("reset as it opened")
            if moment == "before it is adopted":
                link.close(reset)
            else:
                asyncio.get_running_loop().call_soon(link.close, reset)
        return link

    subscriber = Subscriber(open_link, config, what="a test")
    try:
        await subscriber.subscribe(b"again", heard)
        opened[0].close(ConnectionResetError("dropped"))
        # (On uvloop, the second connection's SUBSCRIBE may be confirmed before the reset
        # is read: the listener is then told "back", "lost", "back" again.)
        async with asyncio.timeout(5):
            while len(opened) < 3 or heard[-1:] != [True]:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        assert len(opened) == 3 and not opened[2].closed
        await redis_client.publish("again", "heard")
        async with asyncio.timeout(5):
            while heard[-1:] != [b"heard"]:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    finally:
        await subscriber.aclose()


# -- 4. every call has a bound ---------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["pause", "blackhole"])
async def test_bounds_hold_against_a_stalled_server(
    fault: str, proxy: TcpProxy, redis_server: RedisServer
) -> None:
    """A paused server (SIGSTOP) or a link that swallows everything: try_lock(wait_time=W)
    returns or raises within W + command_timeout; unlock() and an async-with exit within
    cleanup_timeout; aclose() within cleanup_timeout. Nothing waits for the stall to end."""
    if not isinstance(redis_server, RedisServer):
        pytest.skip("needs its own redis-server")
    client = aiolock.from_url(
        proxy.url, command_timeout=COMMAND_TIMEOUT, cleanup_timeout=CLEANUP_TIMEOUT
    )
    held = client.lock("stalled-held")
    owner = client.new_owner()
    assert await held.try_lock(owner=owner)
    exiting = client.lock("stalled-exit")
    await exiting.__aenter__()
    if fault == "pause":
        redis_server.pause()
    else:
        proxy.blackhole_replies()
        proxy.blackhole_requests()
    try:
        started = now()
        with pytest.raises(aiolock.RedisOperationError):
            await client.lock("stalled").try_lock(wait_time=0.5)
        assert elapsed_since(started) < 0.5 + COMMAND_TIMEOUT + SLACK

        started = now()
        with pytest.raises(aiolock.AioLockError):
            await held.unlock(owner=owner)
        assert elapsed_since(started) < CLEANUP_TIMEOUT + SLACK

        started = now()
        with pytest.raises(aiolock.AioLockError):
            await exiting.__aexit__(None, None, None)
        assert elapsed_since(started) < CLEANUP_TIMEOUT + SLACK

        started = now()
        await client.aclose()
        assert elapsed_since(started) < CLEANUP_TIMEOUT + SLACK
    finally:
        redis_server.resume()
        proxy.pass_through()
        await client.aclose()


async def test_a_stalled_acquire_is_undone_once_the_server_answers(
    via_proxy: aiolock.AioLock, redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    """The acquire reached a server that then stopped answering; the caller gave up at its
    bound. When the server answers again, what it may have taken is released."""
    if not isinstance(redis_server, RedisServer):
        pytest.skip("needs its own redis-server")
    lock = via_proxy.lock("stalled-undo")
    # the script is in the server's buffer when it stops: it runs when it resumes
    redis_server.pause()
    try:
        with pytest.raises(aiolock.RedisOperationError):
            await lock.try_lock(wait_time=0.2)
    finally:
        redis_server.resume()
    await eventually(lambda: not_(redis_client.exists("stalled-undo")), within=5)
    # the undo's own reply is handled a moment after the key is gone
    await eventually(lambda: true(lock.statistics().hold_count == 0), within=5)


async def test_a_loop_held_up_past_command_timeout_drops_no_link(redis_url: str) -> None:
    """A burst of tasks, or a caller blocking the loop, holds the event loop up longer than
    command_timeout while the commands wait to be flushed and their replies wait unread: that
    is not the server's delay. No link is dropped, nothing is fenced, every acquire and
    release gets its answer (on uvloop too, whose due timers run before it polls)."""
    async with aiolock.from_url(redis_url, command_timeout=1) as client:
        assert await client.lock("held-up-warm").try_lock()  # the link is open
        await client.lock("held-up-warm").unlock()

        async def cycle(index: int) -> bool:
            lock = client.lock(f"held-up-{index}")
            taken = await lock.try_lock()
            await lock.unlock()
            return taken

        cycles = [asyncio.create_task(cycle(index)) for index in range(500)]
        # every task sends its acquire in the next iteration; then, in that same iteration,
        # before the commands are flushed, the loop is held up
        asyncio.get_running_loop().call_soon(time.sleep, 1.5)
        assert all(await asyncio.gather(*cycles))
        statistics = client.statistics()
        assert (statistics.links_opened, statistics.fences) == (1, 0)


async def test_redis_py_socket_timeouts_are_not_needed(proxy: TcpProxy) -> None:
    """The bound is aiolock's own (command_timeout), whatever the caller's Redis says."""
    async with aiolock.from_url(
        proxy.url, command_timeout=COMMAND_TIMEOUT, redis_options={"socket_timeout": None}
    ) as client:
        assert not await client.lock("no-socket-timeout").is_locked()
        proxy.blackhole_replies()
        started = now()
        with pytest.raises(aiolock.RedisOperationError):
            await client.lock("no-socket-timeout").try_lock()
        assert elapsed_since(started) < COMMAND_TIMEOUT + SLACK


async def test_a_silent_link_is_pinged_and_replaced(proxy: TcpProxy) -> None:
    async with aiolock.from_url(proxy.url, command_timeout=0.3, ping_interval=0.2) as client:
        assert not await client.lock("silent").is_locked()
        proxy.blackhole_replies()
        # a PING unanswered (0.2 + 0.3 s): dropped, soon after on a loaded machine
        await eventually(lambda: true(client.statistics().links == 0), within=5)
        proxy.pass_through()
        assert not await client.lock("silent").is_locked()  # a new link
        assert client.statistics().links_opened == 2


# -- 5. a request that arrives late never runs after it was judged not to have run ----------------


async def test_a_request_delivered_after_a_reset_cannot_duplicate_an_acquire(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """A middlebox resets our side while it still holds the acquire, and delivers it later.
    The lost link is fenced (CLIENT KILL) before anything is concluded, so the acquire sent
    again is the only one that runs: unlock() leaves nothing behind."""
    lock = via_proxy.lock("late-acquire")
    owner = via_proxy.new_owner()
    proxy.hold_requests()
    acquiring = asyncio.create_task(lock.try_lock(wait_time=2, lease_time=30, owner=owner))
    await proxy.wait_for_held_requests()
    proxy.reset_client_side()
    assert await acquiring
    assert await redis_client.hvals("late-acquire") == [b"1"]
    await proxy.release_held_requests()  # the held acquire reaches a killed connection
    assert await redis_client.hvals("late-acquire") == [b"1"]
    await lock.unlock(owner=owner)
    await asyncio.sleep(0.1)
    assert not await redis_client.exists("late-acquire")
    assert via_proxy.statistics().fences >= 1


async def test_a_request_delivered_after_a_reset_cannot_duplicate_a_release(
    via_proxy: aiolock.AioLock,
    proxy: TcpProxy,
    redis_client: redis.asyncio.Redis,
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    """The same for a partial release (count 2 -> 1): run twice it would delete the lock
    while its holder still holds it, and another client would take it."""
    lock = via_proxy.lock("late-release")
    owner = via_proxy.new_owner()
    assert await lock.try_lock(lease_time=30, owner=owner)
    assert await lock.try_lock(lease_time=30, owner=owner)
    proxy.hold_requests()
    releasing = asyncio.create_task(lock.unlock(owner=owner))
    await proxy.wait_for_held_requests()
    proxy.reset_client_side()
    await releasing
    assert await redis_client.hvals("late-release") == [b"1"]
    await proxy.release_held_requests()
    assert await redis_client.hvals("late-release") == [b"1"]
    assert not await make_client().lock("late-release").try_lock()
    await lock.unlock(owner=owner)
    assert not await redis_client.exists("late-release")


async def test_a_dropped_reply_is_settled_by_reading_not_by_running_again(
    via_proxy: aiolock.AioLock, proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """One reply is lost and the link is dropped for it (command_timeout): the reentrant
    acquire ran once, and is counted once."""
    lock = via_proxy.lock("dropped")
    owner = via_proxy.new_owner()
    assert await lock.try_lock(lease_time=30, owner=owner)
    proxy.drop_next_reply(to="EVALSHA")
    assert await lock.try_lock(wait_time=2, lease_time=30, owner=owner)
    assert await redis_client.hvals("dropped") == [b"2"]
    assert lock.statistics(owner=owner).hold_count == 2


async def test_without_client_kill_a_lost_acquire_is_never_sent_again(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    """An ACL user without CLIENT KILL cannot fence a lost link: the lost acquire is not sent
    again (OutcomeUnknownError), and what it may take when it arrives late expires with its
    lease, never renewed."""
    # Redis 6.2 cannot take a subcommand away: no CLIENT but the subcommands aiolock needs
    rules = ("~*", "&*", "+@all", "-client", "+client|info", "+client|setname", "+client|id")
    with acl_user(redis_url, "no-kill", *rules) as url:
        async with TcpProxy.for_url(url) as proxy:
            async with aiolock.from_url(
                proxy.url, command_timeout=COMMAND_TIMEOUT, cleanup_timeout=CLEANUP_TIMEOUT
            ) as client:
                lock = client.lock("unfenced")
                assert not await lock.is_locked()
                proxy.hold_requests()
                acquiring = asyncio.create_task(lock.try_lock(wait_time=1, lease_time=0.5))
                await proxy.wait_for_held_requests()
                proxy.reset_client_side()
                with pytest.raises(aiolock.OutcomeUnknownError):
                    await acquiring
                await proxy.release_held_requests()  # the late acquire runs now
                await eventually(lambda: not_(redis_client.exists("unfenced")), within=2)
                assert client.statistics().renewals == 0


# -- 6. closing and reconnecting ------------------------------------------------------------


async def test_aclose_during_a_connect_leaks_nothing(redis_server: RedisServer) -> None:
    if not isinstance(redis_server, RedisServer):
        pytest.skip("needs its own redis-server")
    client = aiolock.from_url(redis_server.url, command_timeout=2, cleanup_timeout=0.5)
    redis_server.pause()  # the TCP connect succeeds, the handshake gets no answer
    try:
        connecting = asyncio.create_task(client.lock("closing").try_lock())
        await asyncio.sleep(0.1)
        started = now()
        await client.aclose()
        assert elapsed_since(started) < 0.5 + SLACK
        with pytest.raises((aiolock.RedisOperationError, aiolock.ClientClosedError)):
            await connecting
        stats = client.statistics()
        assert (stats.links, stats.background_tasks) == (0, 0)
    finally:
        redis_server.resume()

    def connections() -> int:
        with redis.Redis.from_url(redis_server.url) as admin:
            return len(admin.client_list())

    async def only_the_admins() -> bool:
        return await asyncio.to_thread(connections) == 1

    # the server saw it closed: it handles the close once resumed (not within a fixed 0.1 s
    # on a loaded machine)
    await eventually(only_the_admins, within=5)


async def test_a_short_outage_does_not_use_up_every_retry(fresh_server: RedisServer) -> None:
    """The server is down for 0.3 s: reconnects back off (with jitter) instead of failing
    back-to-back, so the operation rides it out."""
    async with aiolock.from_url(fresh_server.url, command_timeout=1) as client:
        lock = client.lock("outage")
        assert not await lock.is_locked()
        fresh_server.kill()
        restart = asyncio.get_running_loop().call_later(0.3, fresh_server.restart)
        try:
            assert await lock.try_lock(wait_time=3)
        finally:
            restart.cancel()


async def test_callers_behind_a_failing_connect_share_its_result() -> None:
    async with aiolock.from_url("redis://127.0.0.1:1/0", command_timeout=1) as client:
        results = await asyncio.gather(
            *(client.lock(f"nowhere:{i}").try_lock() for i in range(20)), return_exceptions=True
        )
    assert all(isinstance(r, aiolock.RedisUnavailableError) for r in results)
    assert client.statistics().links_opened == 0


# -- 7. settings through public API; errors that name the fix --------------------------------------


async def test_a_unix_socket_and_credentials_are_taken_from_the_callers_redis() -> None:
    from aiolock.testing import external_redis_url

    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server")
    with RedisServer(["--unixsocket", "redis.sock"]) as server:
        assert server.data_dir is not None
        path = str(server.data_dir / "redis.sock")
        with acl_user(server.url, "unix-user", "~*", "&*", "+@all"):
            redis_client = redis.asyncio.Redis(
                unix_socket_path=path, username="unix-user", password="aiolock-test", db=3
            )
            async with aiolock.AioLock(redis_client) as client:
                assert await client.lock("unix").try_lock()
                assert await redis_client.exists("unix")  # db 3, over the socket, as that user
                info = await redis_client.client_list()
                assert sum(c["user"] == "unix-user" for c in info) >= 2  # ours and aiolock's
            await redis_client.aclose()


async def test_a_wrong_password_is_a_clear_error(redis_url: str) -> None:
    with acl_user(redis_url, "someone", "~*", "+@all") as url:
        wrong = url.replace("aiolock-test", "wrong")
        async with aiolock.from_url(wrong, command_timeout=1) as client:
            with pytest.raises(aiolock.RedisUnavailableError, match="AUTH"):
                await client.lock("auth").try_lock()


@pytest.mark.parametrize("password", [None, "wrong"])
async def test_a_password_required_but_missing_or_wrong_fails_every_call_at_once(
    fresh_server: RedisServer, password: str | None
) -> None:
    """A password-protected server (``requirepass``) reached without a password refuses
    every command with NOAUTH, and with a wrong one refuses AUTH (WRONGPASS): waiting does
    not change either, so every call fails at once, saying what to do. Before, NOAUTH
    (first met at ``CLIENT INFO``) was taken for a connection that may work later: each
    retry of each call waited out the reconnect backoff (here 2 s, within command_timeout),
    and the error named CLIENT INFO, not the missing password."""
    admin = redis.asyncio.Redis.from_url(fresh_server.url)
    await admin.config_set("requirepass", "pw")
    await admin.aclose()
    url = (
        fresh_server.url if password is None else fresh_server.url.replace("//", f"//:{password}@")
    )
    async with aiolock.from_url(
        url, reconnect_delay=2.0, reconnect_max_delay=2.0, command_timeout=10.0
    ) as client:
        async with asyncio.timeout(4):  # far more than a refusal takes, far below 2 s x 8
            for call in (
                client.lock("x").try_lock,
                client.lock("y").lock,
                client.semaphore("s").acquire,
                client.lock("z").is_locked,
            ):
                with pytest.raises(aiolock.RedisUnavailableError) as info:
                    await call()
                message = str(info.value)
                if password is None:
                    assert "NOAUTH" in message and "requires a password" in message, message
                else:
                    assert "AUTH" in message and "WRONGPASS" in message, message


async def test_rediss_against_a_plain_server_says_so_quickly(redis_url: str) -> None:
    url = redis_url.replace("redis://", "rediss://")
    async with aiolock.from_url(url, command_timeout=2) as client:
        started = now()
        with pytest.raises(aiolock.RedisUnavailableError, match=r"redis://"):
            await client.lock("tls").try_lock()
        assert elapsed_since(started) < 2 + SLACK


def test_no_private_redis_py_attribute_is_read() -> None:
    """aiolock takes settings through redis-py's public API only (pool.connection_class,
    pool.connection_kwargs); it never reads a connection's private streams."""
    from pathlib import Path

    import aiolock as package

    root = Path(package.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text()
        for private in ("._reader", "._writer", "._sock", "conn._", "connection._"):
            assert private not in text, f"{path} reads {private}"


async def test_outcome_unknown_carries_the_link_to_fence(
    redis_client: redis.asyncio.Redis,
) -> None:
    transport = StandaloneTransport(
        ServerSettings.from_redis(redis_client), aiolock.Config(command_timeout=2)
    )
    try:
        call = await transport.send(pack(("CLIENT", "ID")), key=None)
        client_id = await call.future
        blocked = await transport.send(pack(("BLPOP", "never", 0)), key="never")
        await redis_client.client_kill_filter(_id=client_id)
        lost = await blocked.future
        assert isinstance(lost, OutcomeUnknown)
        assert lost.link is not None and lost.link.client_id == client_id
        assert await transport.fence(lost, None)  # gone already: nothing can run any more
    finally:
        await transport.aclose()
