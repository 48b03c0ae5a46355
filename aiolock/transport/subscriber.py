"""One pub/sub connection to one server, carrying every channel a client listens to.

Each channel has one :class:`Listener` (the pub/sub entry above); messages go to it as bytes,
undecoded. :meth:`Subscriber.subscribe` returns once the server confirmed the subscription,
and raises at once when it cannot be had: a connection refused (``maxclients``, a wrong
password) or a subscription refused (an ACL ``-NOPERM``). Pub/sub is at-most-once, so when
the connection drops every listener is told (``on_reset``: wake everyone to re-check), the
connection is opened again in the background with backoff while channels remain, every
channel is subscribed again, and listeners are told once more when that is confirmed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from ..config import Config
from .calls import ErrorReply, NotSent, OutcomeUnknown, pack
from .connector import Connector
from .link import Link, OutOfStep

logger = logging.getLogger("aiolock.pubsub")

OpenSubscriberLink = Callable[
    [Callable[[bytes, bytes], None], Callable[[Link, BaseException], None]], Awaitable[Link]
]


class Listener(Protocol):
    def on_message(self, data: bytes) -> None: ...

    def on_reset(self, listening: bool) -> None: ...

    def on_refused(self, error: Exception) -> None:
        """Its channel, subscribed before, was subscribed again and refused (an ACL change):
        nobody listens to it any more."""


class SubscribeRefused(Exception):
    """The server answered SUBSCRIBE with an error (``code``: its first word, e.g. NOPERM,
    or MOVED on a cluster node whose slot moved)."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


def _confirms(reply: object, channel: bytes) -> bool:
    """Whether ``reply`` is the confirmation of a subscription to ``channel``."""
    return (
        isinstance(reply, list)
        and len(reply) == 3
        and reply[0] in (b"subscribe", b"ssubscribe")
        and reply[1] == channel
    )


class _Channel:
    """One channel: its listener and the confirmation of its latest SUBSCRIBE."""

    __slots__ = ("confirmed", "listener", "reset", "sent_on")

    def __init__(self, listener: Listener, *, reset: bool = False) -> None:
        self.listener = listener
        self.confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: the link its latest SUBSCRIBE went out on
        self.sent_on: Link | None = None
        #: its listener was told the subscription was lost, and not yet that it is back
        self.reset = reset


class Subscriber:
    """The pub/sub connection of one client to one server (see the module docstring)."""

    def __init__(
        self, open_link: OpenSubscriberLink, config: Config, *, what: str, sharded: bool = False
    ):
        self._config = config
        self._subscribe_command = "SSUBSCRIBE" if sharded else "SUBSCRIBE"
        self._unsubscribe_command = "SUNSUBSCRIBE" if sharded else "UNSUBSCRIBE"
        self._channels: dict[bytes, _Channel] = {}
        self._link: Link | None = None
        self._connector = Connector(
            lambda: open_link(self._dispatch, self._lost), self._adopt, config, what=what
        )
        self._connecting: asyncio.Task[None] | None = None
        self._closed = False
        #: connections opened again after a loss (a plain count; metrics read it)
        self.reconnects = 0
        self._dropped = False

    @property
    def channels(self) -> int:
        return len(self._channels)

    @property
    def connections_opened(self) -> int:
        return self._connector.opened

    def subscribe(self, channel: bytes, listener: Listener) -> asyncio.Future[None]:
        """Listen to ``channel``; returns the future of its confirmation, which fails with
        :class:`NotSent` (no connection could be opened) or :class:`SubscribeRefused`."""
        if self._closed:
            raise NotSent("the client is closed")
        # a channel subscribed again (its last subscription failed) may have missed messages
        entry = self._channels[channel] = _Channel(listener, reset=channel in self._channels)
        link = self._link
        if link is not None and not link.closed:
            self._send(link, channel, entry)
        elif self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        return entry.confirmed

    def unsubscribe(self, channel: bytes) -> None:
        """Stop listening to ``channel`` (without waiting for the server's answer)."""
        entry = self._channels.pop(channel, None)
        if entry is None:
            return
        link = self._link
        if link is not None and not link.closed and entry.sent_on is link:
            link.send(pack((self._unsubscribe_command, channel)))

    def _send(self, link: Link, channel: bytes, entry: _Channel) -> None:
        resubscribe = entry.confirmed.done()
        if resubscribe:
            entry.confirmed = asyncio.get_running_loop().create_future()
        entry.sent_on = link
        call = link.send(pack((self._subscribe_command, channel)))
        confirmed = entry.confirmed

        def settled(future: asyncio.Future[object]) -> None:
            reply = future.result()
            if confirmed.done() or isinstance(reply, OutcomeUnknown):
                return  # dropped: the next connection subscribes it again
            if not isinstance(reply, ErrorReply) and not _confirms(reply, channel):
                # a reply went missing: the link is out of step; a new one subscribes again
                link.close(OutOfStep(f"SUBSCRIBE {channel!r} was answered {reply!r}"))
                return
            if isinstance(reply, ErrorReply):
                current = self._channels.get(channel) is entry
                if current:
                    del self._channels[channel]
                refused = SubscribeRefused(
                    f"{self._subscribe_command} {channel!r} refused: {reply}", reply.code
                )
                confirmed.set_exception(refused)
                confirmed.exception()
                if resubscribe and current:
                    # its first confirmation was heard long ago: nobody waits for this one
                    entry.listener.on_refused(refused)
                return
            confirmed.set_result(None)
            if entry.reset:
                # messages may have been lost since the listener was told: whatever became of
                # the subscriptions in between (one whose confirmation was lost with its link
                # never told it anything)
                entry.reset = False
                entry.listener.on_reset(True)

        call.future.add_done_callback(settled)

    def _adopt(self, link: Link) -> None:
        """``link`` is the connection now: subscribe every channel on it."""
        self._link = link
        if link.closed:
            # it closed between its handshake and now, before its loss was ours to hear
            self._lost(link, link.error or ConnectionError("closed as it opened"))
            return
        if self._dropped:
            self._dropped = False
            self.reconnects += 1
        for channel, entry in list(self._channels.items()):
            self._send(link, channel, entry)

    def drop(self, why: str, *, unless_at: str | None = None) -> None:
        """Drop the connection unless it goes to the server ``unless_at`` (the master moved):
        listeners are told, and every channel is subscribed again on a new connection."""
        link = self._link
        if link is not None and not link.closed and link.identity.server != unless_at:
            link.close(ConnectionError(why))

    def _dispatch(self, channel: bytes, data: bytes) -> None:
        entry = self._channels.get(channel)
        if entry is not None:
            entry.listener.on_message(data)

    def _lost(self, link: Link, error: BaseException) -> None:
        if link is not self._link:
            return
        self._link = None
        if self._closed:
            return
        self._dropped = True
        logger.warning(
            "aiolock: the pub/sub connection to Redis at %s was lost (%s); waiters re-check "
            "their locks and it reconnects",
            link.identity.server,
            error or type(error).__name__,
        )
        for entry in list(self._channels.values()):
            entry.reset = True
            entry.listener.on_reset(False)
        if self._channels and self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        """Open the connection while channels need one. A failed attempt fails the
        subscriptions still waiting for a confirmation (their callers must not hang); the
        confirmed ones stay and are subscribed again on the next connection (their waiters
        re-check on TTL-bounded timers meanwhile)."""
        try:
            while self._channels and not self._closed:
                try:
                    link = await self._connector.connect(None)  # adopted: channels subscribed
                except NotSent as exc:
                    logger.warning("aiolock: opening the pub/sub connection failed: %s", exc)
                    for entry in self._channels.values():
                        if not entry.confirmed.done():
                            entry.confirmed.set_exception(NotSent(str(exc)))
                            entry.confirmed.exception()
                    continue
                if not link.closed:
                    return
                # Lost as it opened (its loss, while this task still ran, started no other):
                # open another, after a pause, so a server that drops every new connection
                # is not hammered.
                await asyncio.sleep(self._config.reconnect_delay)
        except Exception:  # never expected; a task of ours must not die silently
            logger.exception("aiolock: reconnecting the pub/sub connection failed")
        finally:
            self._connecting = None

    async def aclose(self) -> None:
        """Close the connection and stop reconnecting; pending subscribes fail."""
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connecting
        await self._connector.aclose()
        for entry in self._channels.values():
            if not entry.confirmed.done():
                entry.confirmed.set_exception(NotSent("the client is closed"))
                entry.confirmed.exception()
        self._channels.clear()
        if self._link is not None:
            self._link.close()
