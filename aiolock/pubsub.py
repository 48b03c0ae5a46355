"""The shared pub/sub connection of one client and its per-channel wait entries.

One connection carries every channel. A waiter borrows the :class:`Entry` of its lock's
channel with :meth:`PubSubHub.subscribe`, which returns once the server has confirmed the
subscription, and gives it back with :meth:`PubSubHub.release`. Entries are reference-counted:
the channel is subscribed for the first waiter and unsubscribed when the last one leaves.

A reader task dispatches messages and never runs user code: an unlock message (``"0"``)
releases one permit of the entry's ``asyncio.Semaphore`` (one waiter wakes per release; a
message that arrives before anyone waits is kept as a permit), a read-unlock message (``"1"``)
wakes every waiter of the entry. Pub/sub is at-most-once, so after the connection drops and
comes back every waiter is woken to re-check; waits are always bounded by the holder's TTL.
A connection silent for ``pubsub_ping_interval`` is sent a PING; one that does not answer
within another interval is dropped and opened again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import hiredis
from redis.asyncio import ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError

from .config import Config
from .connection import NotSent, open_streams, pack
from .errors import ClientClosedError
from .keys import READ_UNLOCK_MESSAGE

logger = logging.getLogger("aiolock.pubsub")


class Entry:
    """The wait entry of one channel, shared by every local waiter on it."""

    __slots__ = (
        "_skip_echoes",
        "channel",
        "confirmed",
        "confirmed_at",
        "holder_until",
        "refs",
        "semaphore",
        "waiting",
    )

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.refs = 0
        self.waiting = 0
        self.semaphore = asyncio.Semaphore(0)
        self.confirmed = asyncio.get_running_loop().create_future()
        #: loop time at which the current subscription was confirmed (None until then)
        self.confirmed_at: float | None = None
        #: loop time at which the holder's lease ends, as last seen by a failed attempt
        self.holder_until = 0.0
        self._skip_echoes = 0

    def __repr__(self) -> str:
        return f"<Entry {self.channel} refs={self.refs} waiting={self.waiting}>"

    async def wait(self, seconds: float | None) -> bool:
        """Wait at most ``seconds`` (None: no bound) for a wake-up; True if one came."""
        self.waiting += 1
        try:
            async with asyncio.timeout(seconds):
                await self.semaphore.acquire()
            return True
        except TimeoutError:
            return False
        finally:
            self.waiting -= 1

    def wake_one(self) -> None:
        self.semaphore.release()

    def wake_all(self) -> None:
        for _ in range(max(1, self.waiting)):
            self.semaphore.release()

    def expect_echo(self) -> None:
        """A task of this client is about to release the lock: the unlock message it may
        publish is to pass unseen (registered before sending, since the message may arrive
        before the release's reply)."""
        self._skip_echoes += 1

    def echo_delivered_early(self, published: bool) -> None:
        """The release's reply came: if it published, give its permit now, without waiting
        for the message to come back; if it did not, no echo will come."""
        if published:
            self.semaphore.release()
        elif self._skip_echoes:
            self._skip_echoes -= 1

    def on_message(self, data: str) -> None:
        if data == READ_UNLOCK_MESSAGE:
            self.wake_all()
        elif self._skip_echoes:
            self._skip_echoes -= 1
        else:
            self.wake_one()

    def on_resubscribed(self) -> None:
        """The connection came back: messages may have been lost, wake every waiter."""
        self._skip_echoes = 0
        self.wake_all()


class PubSubHub:
    """One pub/sub connection per client, fanning messages out to wait entries."""

    def __init__(self, pool: ConnectionPool, config: Config) -> None:
        self._pool = pool
        self._config = config
        self._entries: dict[str, Entry] = {}
        self._writer: asyncio.StreamWriter | None = None
        # SUBSCRIBEs sent per channel and not yet confirmed: an entry is confirmed only by the
        # confirmation of the last one (an older one may precede a pending UNSUBSCRIBE).
        self._unconfirmed: dict[str, int] = {}
        self._runner: asyncio.Task[None] | None = None
        self._closed = False
        #: how many times the pub/sub connection was opened (1 + reconnects)
        self.connections_opened = 0

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def channels(self) -> list[str]:
        return list(self._entries)

    def entry(self, channel: str) -> Entry | None:
        return self._entries.get(channel)

    async def subscribe(self, channel: str) -> Entry:
        """Borrow the entry of ``channel``; returns once the subscription is confirmed."""
        if self._closed:
            raise ClientClosedError("the client's pub/sub connection is closed")
        entry = self._entries.get(channel)
        if entry is None:
            entry = self._entries[channel] = Entry(channel)
            self._send("SUBSCRIBE", channel)
        entry.refs += 1
        try:
            if not entry.confirmed.done():
                await asyncio.shield(entry.confirmed)
            if self._closed:
                raise ClientClosedError("the client's pub/sub connection was closed")
        except BaseException:
            self.release(entry)
            raise
        return entry

    def release(self, entry: Entry) -> None:
        """Give back an entry; the last holder's release unsubscribes the channel."""
        entry.refs -= 1
        if entry.refs == 0 and self._entries.get(entry.channel) is entry:
            del self._entries[entry.channel]
            if not self._closed:
                self._send("UNSUBSCRIBE", entry.channel)

    def expect_echo(self, channel: str) -> Entry | None:
        """See :meth:`Entry.expect_echo`; the entry to tell when the reply comes, if any."""
        entry = self._entries.get(channel)
        if entry is not None:
            entry.expect_echo()
        return entry

    async def aclose(self) -> None:
        """End the reader, close the connection, wake every waiter (they raise closed)."""
        if self._closed:
            return
        self._closed = True
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        for entry in self._entries.values():
            if not entry.confirmed.done():
                entry.confirmed.set_result(None)
            entry.wake_all()

    # -- the connection -------------------------------------------------------------------

    def _send(self, *args: str) -> None:
        """Write a command now (writes are ordered); if disconnected, the reconnect
        subscribes every entry anyway."""
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(pack(*args))
            if args[0] == "SUBSCRIBE":
                self._unconfirmed[args[1]] = self._unconfirmed.get(args[1], 0) + 1
        if self._runner is None:
            self._runner = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        """Open the connection, (re)subscribe every channel, read until it drops; repeat."""
        interval = self._config.pubsub_ping_interval
        while not self._closed:
            try:
                # connect() runs a handshake: bound it, the server may not answer at all
                async with asyncio.timeout(2 * interval):
                    conn, reader, writer = await open_streams(self._pool)
            except (NotSent, TimeoutError) as exc:
                logger.warning("aiolock pub/sub connection failed: %s; retrying", exc)
            else:
                self.connections_opened += 1
                try:
                    await self._serve(reader, writer, reconnected=self.connections_opened > 1)
                except (OSError, RedisConnectionError, hiredis.ProtocolError) as exc:
                    logger.warning("aiolock pub/sub connection lost: %r; reconnecting", exc)
                finally:
                    self._writer = None
                    writer.close()
                    with contextlib.suppress(Exception):
                        await conn.disconnect(nowait=True)
            if not self._closed:
                await asyncio.sleep(self._config.pubsub_reconnect_delay)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, reconnected: bool
    ) -> None:
        """Subscribe every entry, then dispatch what arrives until the connection fails."""
        channels = list(self._entries)
        self._unconfirmed = dict.fromkeys(channels, 1)
        for entry in self._entries.values():
            entry.confirmed_at = None
        self._writer = writer
        if channels:
            writer.write(pack("SUBSCRIBE", *channels))
        parser = hiredis.Reader(encoding="utf-8")
        interval = self._config.pubsub_ping_interval
        silent = False
        while True:
            try:
                async with asyncio.timeout(interval):
                    data = await reader.read(1 << 16)
            except TimeoutError:  # a whole interval without a word: is the connection alive?
                if silent:
                    raise RedisConnectionError(
                        "the pub/sub connection did not answer a PING"
                    ) from None
                silent = True
                writer.write(pack("PING"))
                continue
            if not data:
                raise RedisConnectionError("the pub/sub connection was closed by the server")
            silent = False
            parser.feed(data)
            while (reply := parser.gets()) is not False:
                self._dispatch(reply, reconnected)

    def _dispatch(self, reply: Any, reconnected: bool) -> None:
        if not isinstance(reply, list) or len(reply) < 3:
            return  # a PING's ["pong", ""]
        kind, channel, data = reply[0], reply[1], reply[2]
        if kind == "subscribe":
            left = self._unconfirmed.pop(channel, 1) - 1
            if left > 0:
                self._unconfirmed[channel] = left
                return
        entry = self._entries.get(channel)
        if entry is None:
            return
        if kind == "message":
            entry.on_message(data)
        elif kind == "subscribe" and entry.confirmed_at is None:
            entry.confirmed_at = asyncio.get_running_loop().time()
            if not entry.confirmed.done():
                entry.confirmed.set_result(None)
            elif reconnected:
                entry.on_resubscribed()
