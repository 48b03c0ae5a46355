"""One pipelined connection per client for aiolock's own commands.

Every script call of a client is written to one connection, without waiting for earlier
replies; replies come back in order and resolve the callers' futures first-in first-out.
Concurrent tasks thus share round trips and system calls instead of each borrowing a pooled
connection, and the pool is left to the application.

A caller may stop waiting (cancelled, timed out) without harming the connection: its reply is
still read and matched, so a cancelled acquire can learn whether it took the lock. When the
connection breaks, every command in flight fails with :class:`OutcomeUnknown` (it may or may
not have run) and the next command opens a new connection. Nothing is ever retried here.

Connections are opened by :func:`open_streams` with redis-py's own connection class and
settings (host or unix socket, TLS, credentials, database), so they reach the server exactly
as the pool would; the pub/sub connection (aiolock.pubsub) is opened the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

import hiredis
from redis.asyncio import ConnectionPool
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from .errors import ClientClosedError

#: flush the socket buffer (await drain) when this many bytes wait to be sent
HIGH_WATER = 1 << 16


def pack(*args: Any) -> bytes:
    """One command in RESP, packed by hiredis."""
    packed: bytes = hiredis.pack_command(args)
    return packed


class OutcomeUnknown(Exception):
    """The command was possibly sent but its reply was lost: it may or may not have run."""


class NotSent(Exception):
    """No connection could be opened: the command was not sent (safe to try again)."""


class _Link:
    """One open connection: its writer, the futures awaiting its replies, its reader task."""

    __slots__ = ("conn", "pending", "reader", "writer")

    def __init__(self, conn: AbstractConnection, writer: asyncio.StreamWriter) -> None:
        self.conn = conn
        self.writer = writer
        self.pending: deque[asyncio.Future[Any]] = deque()
        self.reader: asyncio.Task[None] | None = None

    def send(self, args: tuple[Any, ...]) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        self.writer.write(pack(*args))
        return future

    async def read(self, reader: asyncio.StreamReader) -> None:
        """Match replies to pending futures in order, until the connection breaks."""
        parser = hiredis.Reader(replyError=ResponseError)
        error: BaseException = RedisConnectionError("connection closed by the server")
        try:
            while data := await reader.read(1 << 16):
                parser.feed(data)
                while (reply := parser.gets()) is not False:
                    future = self.pending.popleft()
                    if not future.done():
                        future.set_result(reply)
        except (OSError, hiredis.ProtocolError, IndexError) as exc:
            error = exc
        except asyncio.CancelledError:
            error = ClientClosedError("the client is closed")
            raise
        finally:
            self.fail(error)
            with contextlib.suppress(Exception):
                await self.conn.disconnect(nowait=True)

    def fail(self, error: BaseException) -> None:
        """Stop writing; every command in flight gets OutcomeUnknown."""
        self.writer.close()
        while self.pending:
            future = self.pending.popleft()
            if not future.done():
                future.set_exception(OutcomeUnknown(f"reply lost: {error}"))


class Pipeline:
    """The pipelined connection of one client (opened on first use, reopened after a drop)."""

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._link: _Link | None = None
        self._connecting = asyncio.Lock()
        self._closed = False
        #: connections opened so far
        self.connections_opened = 0

    async def call(self, *args: Any) -> Any:
        """Send a command and return its reply; error replies raise ResponseError.

        Cancelling the caller leaves the command to complete on the server."""
        link = self._link
        if link is None or link.writer.is_closing():
            link = await self._connect()
        future = link.send(args)
        if link.writer.transport.get_write_buffer_size() > HIGH_WATER:
            with contextlib.suppress(ConnectionError):
                await link.writer.drain()
        reply = await asyncio.shield(future)
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    async def _connect(self) -> _Link:
        async with self._connecting:
            if self._closed:
                raise ClientClosedError("the client is closed")
            link = self._link
            if link is not None and not link.writer.is_closing():
                return link
            conn, reader, writer = await open_streams(self._pool)
            link = self._link = _Link(conn, writer)
            link.reader = asyncio.get_running_loop().create_task(link.read(reader))
            self.connections_opened += 1
            return link

    async def aclose(self) -> None:
        """Close the connection; commands in flight fail."""
        self._closed = True
        link, self._link = self._link, None
        if link is not None and link.reader is not None:
            link.reader.cancel()  # its cleanup disconnects
            with contextlib.suppress(asyncio.CancelledError):
                await link.reader


async def open_streams(
    pool: ConnectionPool,
) -> tuple[AbstractConnection, asyncio.StreamReader, asyncio.StreamWriter]:
    """A new connection made as ``pool`` would make it, as raw streams (RESP2).

    redis-py does the handshake (TLS, AUTH, SELECT); from then on the streams are ours, read
    with hiredis and written without redis-py's per-command machinery. Raises NotSent.
    """
    kwargs: dict[str, Any] = dict(pool.connection_kwargs)
    kwargs.update(decode_responses=False, protocol=2, health_check_interval=0)
    conn = pool.connection_class(**kwargs)
    try:
        await conn.connect()  # type: ignore[no-untyped-call]
    except (RedisError, OSError) as exc:
        raise NotSent(f"cannot connect to Redis: {exc}") from exc
    reader, writer = conn._reader, conn._writer
    if reader is None or writer is None:  # pragma: no cover - redis-py internals moved
        raise NotSent("redis-py's connection exposes no streams")
    return conn, reader, writer
