"""The TcpProxy faults added for the core's regression tests, against a real redis-server:
dropping whole replies, holding requests, and resetting the client side while the server keeps
the connection (and later gets the held requests)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import hiredis
import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from aiolock.testing import TcpProxy

HANG_GUARD = 10  # seconds; only there so that a bug fails instead of hanging
T = TypeVar("T")


async def call(awaitable: Awaitable[T]) -> T:
    """A coroutine for create_task (redis-py's methods are typed as returning Awaitables)."""
    return await awaitable


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    """Poll state on the server (no event to wait on there) until ``check`` is true."""
    async with asyncio.timeout(HANG_GUARD):
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def no_retry_client(url: str, **kwargs: Any) -> redis.asyncio.Redis:
    """A client that surfaces connection errors instead of retrying them away."""
    return redis.asyncio.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **kwargs)


def command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class RawClient:
    """A bare RESP connection: exactly what is written, every reply parsed by hiredis."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.parser = hiredis.Reader()

    async def send(self, *commands: bytes) -> None:
        self.writer.write(b"".join(commands))
        await self.writer.drain()

    async def replies(self, n: int) -> list[Any]:
        out: list[Any] = []
        async with asyncio.timeout(HANG_GUARD):
            while len(out) < n:
                reply = self.parser.gets()
                if reply is False:
                    data = await self.reader.read(65536)
                    assert data, "connection closed"
                    self.parser.feed(data)
                else:
                    out.append(reply)
        return out


@pytest.fixture
async def raw(proxy: TcpProxy) -> AsyncIterator[RawClient]:
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    try:
        yield RawClient(reader, writer)
    finally:
        writer.close()
        await writer.wait_closed()


async def client_names(client: redis.asyncio.Redis) -> list[str]:
    return [entry["name"] for entry in await client.client_list()]


# --------------------------------------------------------------------------------------------
# drop_replies
# --------------------------------------------------------------------------------------------


async def test_drop_next_reply_leaves_the_connection_open_and_out_of_step(
    proxy: TcpProxy, raw: RawClient, redis_client: redis.asyncio.Redis
) -> None:
    await raw.send(b"PING\r\n")
    assert await raw.replies(1) == [b"PONG"]
    proxy.drop_next_reply()
    assert proxy.pending_drops == 1
    await raw.send(command(b"INCR", b"n"))
    async with asyncio.timeout(HANG_GUARD):
        await proxy.wait_for_drops()
    assert await redis_client.get("n") == b"1"  # the command ran; only its reply was lost
    # The next reply is delivered: to a client still waiting for INCR's, it looks like that.
    await raw.send(command(b"ECHO", b"next"))
    assert await raw.replies(1) == [b"next"]
    assert (proxy.replies_dropped, proxy.pending_drops) == (1, 0)


async def test_drop_one_reply_among_pipelined_replies_split_across_chunks(
    proxy: TcpProxy, raw: RawClient, redis_client: redis.asyncio.Redis
) -> None:
    """~1 MB of pipelined GET replies arrive in many TCP chunks, cut mid-reply; exactly the
    reply to GET k25 goes, whole, and the others arrive intact and in order."""
    values = {f"k{i}".encode(): bytes([65 + i % 26]) * 20000 for i in range(50)}
    await redis_client.mset(values)
    proxy.drop_replies(1, to=lambda args: args == (b"GET", b"k25"))
    await raw.send(*(command(b"GET", key) for key in values))
    replies = await raw.replies(49)
    assert replies == [value for key, value in values.items() if key != b"k25"]
    await raw.send(b"PING\r\n")
    assert await raw.replies(1) == [b"PONG"]
    assert proxy.replies_dropped == 1


async def test_drop_replies_to_a_command_name(proxy: TcpProxy, raw: RawClient) -> None:
    proxy.drop_replies(2, to="incr")  # any case
    await raw.send(
        command(b"SET", b"a", b"1"),
        command(b"INCR", b"a"),
        command(b"GET", b"a"),
        command(b"INCR", b"a"),
        command(b"INCR", b"a"),
    )
    assert await raw.replies(3) == [b"OK", b"2", 4]  # GET a, then the last INCR
    assert proxy.pending_drops == 0


async def test_drop_replies_by_command_skips_pubsub_connections(
    proxy: TcpProxy, raw: RawClient, redis_client: redis.asyncio.Redis
) -> None:
    """A pub/sub connection's messages answer no request: a command filter never takes them."""
    await raw.send(command(b"SUBSCRIBE", b"ch"))
    assert await raw.replies(1) == [[b"subscribe", b"ch", 1]]
    proxy.drop_next_reply(to="PUBLISH")
    await redis_client.publish("ch", "hello")  # directly, not through the proxy
    assert await raw.replies(1) == [[b"message", b"ch", b"hello"]]
    assert proxy.pending_drops == 1
    async with no_retry_client(proxy.url) as publisher:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await publisher.publish("ch", "lost reply")
    assert await raw.replies(1) == [[b"message", b"ch", b"lost reply"]]
    assert proxy.pending_drops == 0


def test_drop_replies_rejects_bad_arguments() -> None:
    tcp_proxy = TcpProxy("127.0.0.1", 6379)
    for bad_n in (-1, 1.5, True):
        with pytest.raises(ValueError):
            tcp_proxy.drop_replies(bad_n)  # type: ignore[arg-type]
    for bad_to in ("", " GET", 3):
        with pytest.raises(ValueError):
            tcp_proxy.drop_replies(1, to=bad_to)  # type: ignore[arg-type]
    tcp_proxy.drop_replies(3)
    tcp_proxy.drop_replies(0)
    assert tcp_proxy.pending_drops == 0
    tcp_proxy.drop_next_reply()
    tcp_proxy.pass_through()
    assert tcp_proxy.pending_drops == 0


# --------------------------------------------------------------------------------------------
# hold_requests / reset_client_side / release_held_requests
# --------------------------------------------------------------------------------------------


async def test_reset_client_side_then_deliver_the_held_request_later(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    """The middlebox resets the client while it still holds its SET, and delivers it later:
    meanwhile the server keeps the connection, and the client's retry on a new connection
    runs first."""
    async with no_retry_client(proxy.url, client_name="held") as client:
        await client.ping()
        proxy.hold_requests()
        in_flight = asyncio.create_task(call(client.set("k", "late")))
        async with asyncio.timeout(HANG_GUARD):
            await proxy.wait_for_held_requests(1)
        assert proxy.reset_client_side() == 1
        with pytest.raises(redis.ConnectionError):
            await in_flight
        assert await redis_client.get("k") is None  # held: not run
        assert (await client_names(redis_client)).count("held") == 1  # the server still sees it
        assert (proxy.orphaned_connections, proxy.active_connections) == (1, 0)
        assert proxy.held_requests == 1

        assert await client.set("k", "retry")  # reconnects; new connections are not held
        assert await redis_client.get("k") == b"retry"
        assert (await client_names(redis_client)).count("held") == 2

        assert await proxy.release_held_requests() == 1
        assert await redis_client.get("k") == b"late"  # the old request ran after the retry
        assert proxy.orphaned_connections == 0
        assert proxy.held_requests == 0

        async def closed() -> bool:  # the server notices the close on its own time
            return (await client_names(redis_client)).count("held") == 1

        await until(closed)
        assert await client.get("k") == b"late"  # the new connection is unaffected


async def test_reset_client_side_without_held_requests_keeps_the_server_side_open(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    async with no_retry_client(proxy.url, client_name="kept") as client:
        await client.ping()
        assert proxy.reset_client_side() == 1
        with pytest.raises(redis.ConnectionError):
            await client.ping()
        assert (await client_names(redis_client)).count("kept") == 1
        assert await proxy.release_held_requests() == 0

        async def closed() -> bool:
            return "kept" not in await client_names(redis_client)

        await until(closed)


async def test_held_requests_on_a_live_connection_go_on_release(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    async with no_retry_client(proxy.url) as client:
        await client.ping()
        proxy.hold_requests()
        pipe = client.pipeline(transaction=False)
        for _ in range(3):
            pipe.incr("n")
        in_flight = asyncio.create_task(pipe.execute())
        async with asyncio.timeout(HANG_GUARD):
            await proxy.wait_for_held_requests(3)
        assert await redis_client.get("n") is None
        assert not in_flight.done()
        assert await proxy.release_held_requests() == 0  # no reset connection to wait for
        async with asyncio.timeout(HANG_GUARD):
            assert await in_flight == [1, 2, 3]
        assert await client.incr("n") == 4  # not held any more


async def test_pass_through_releases_held_requests(proxy: TcpProxy) -> None:
    async with no_retry_client(proxy.url) as client:
        await client.ping()
        proxy.hold_requests()
        in_flight = asyncio.create_task(call(client.echo("hi")))
        async with asyncio.timeout(HANG_GUARD):
            await proxy.wait_for_held_requests()
        proxy.pass_through()
        async with asyncio.timeout(HANG_GUARD):
            assert await in_flight == b"hi"


async def test_reset_connections_discards_held_requests(
    proxy: TcpProxy, redis_client: redis.asyncio.Redis
) -> None:
    async with no_retry_client(proxy.url) as client:
        await client.ping()
        proxy.hold_requests()
        in_flight = asyncio.create_task(call(client.set("k", "never")))
        async with asyncio.timeout(HANG_GUARD):
            await proxy.wait_for_held_requests()
        proxy.reset_client_side()
        proxy.reset_connections()  # both sides now: the held request is gone
        with pytest.raises(redis.ConnectionError):
            await in_flight
        assert await proxy.release_held_requests() == 0
        assert await redis_client.get("k") is None
        assert proxy.orphaned_connections == 0
