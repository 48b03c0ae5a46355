"""The transport of one Redis server: one pipelined command link and one pub/sub link."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..config import Config
from .base import Transport, TransportStatistics, wait_call
from .connector import Connector
from .link import Call, Link, LinkIdentity, NotSent, OutcomeUnknown, pack
from .settings import ServerSettings
from .subscriber import Listener, Subscriber

logger = logging.getLogger("aiolock.transport")

#: how many fenced link identities are remembered (a dropped link is fenced once)
_FENCES_KEPT = 64


class StandaloneTransport(Transport):
    """Every command of a client on one pipelined link; every channel on one pub/sub link."""

    def __init__(self, settings: ServerSettings, config: Config) -> None:
        self.settings = settings
        self.config = config
        self._link: Link | None = None
        what = f"Redis at {settings.address}"
        if settings.ssl_context is not None:
            what += " (TLS: if that server does not speak TLS, use a redis:// URL)"
        self._connector = Connector(self._open_link, self._adopt, config, what=what)
        self._subscriber = Subscriber(self._open_subscriber_link, config, what=what)
        self._fenced: dict[LinkIdentity, None] = {}
        self._fences = 0
        self._warned_fence = False
        self._closed = False

    def __repr__(self) -> str:
        return f"<StandaloneTransport {self.settings.address}>"

    async def _open_link(self) -> Link:
        config = self.config
        return await Link.open(
            self.settings,
            command_timeout=config.command_timeout,
            ping_interval=config.ping_interval,
        )

    def _adopt(self, link: Link) -> None:
        self._link = link

    async def _open_subscriber_link(
        self, sink: Callable[[bytes, bytes], None], on_closed: Callable[[Link, BaseException], None]
    ) -> Link:
        config = self.config
        return await Link.open(
            self.settings,
            command_timeout=config.command_timeout,
            ping_interval=config.ping_interval,
            sink=sink,
            on_closed=on_closed,
        )

    def send_now(self, packed: bytes, *, key: str | None) -> Call | None:
        link = self._link
        if link is None or link.closed or link.paused is not None:
            return None
        return link.send(packed)

    async def send(self, packed: bytes, *, key: str | None, deadline: float | None = None) -> Call:
        link = self._link
        if link is None or link.closed:
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + self.config.command_timeout
            link = await self._connector.connect(deadline)
        if link.paused is not None:
            await link.drain()  # before writing: a caller cancelled here sent nothing
        return link.send(packed)

    async def fence(self, lost: OutcomeUnknown, deadline: float | None) -> bool:
        identity = lost.link
        if identity is None or identity.client_id is None:
            return False
        if identity in self._fenced:
            return True
        command: tuple[object, ...] = ("CLIENT", "KILL", "ID", identity.client_id)
        if identity.addr:
            command += ("ADDR", identity.addr)
        if deadline is None:
            deadline = asyncio.get_running_loop().time() + self.config.command_timeout
        try:
            reply = await wait_call(
                await self.send(pack(command), key=None, deadline=deadline), deadline
            )
        except (NotSent, TimeoutError):
            return False
        if isinstance(reply, OutcomeUnknown):
            return False
        if not isinstance(reply, int):
            if not self._warned_fence:
                self._warned_fence = True
                logger.warning(
                    "aiolock cannot fence lost requests (%s: %s): a lock script whose reply was "
                    "lost is not sent again, and what it may have taken is released or expires",
                    " ".join(map(str, command[:2])),
                    reply,
                )
            return False
        self._fences += 1
        self._fenced[identity] = None
        while len(self._fenced) > _FENCES_KEPT:
            del self._fenced[next(iter(self._fenced))]
        return True

    def subscribe(self, channel: bytes, listener: Listener, *, key: str) -> asyncio.Future[None]:
        return self._subscriber.subscribe(channel, listener)

    def unsubscribe(self, channel: bytes, *, key: str) -> None:
        self._subscriber.unsubscribe(channel)

    def statistics(self) -> TransportStatistics:
        link = self._link
        open_link = link is not None and not link.closed
        return TransportStatistics(
            links=1 if open_link else 0,
            commands_in_flight=link.in_flight if link is not None and open_link else 0,
            subscriptions=self._subscriber.channels,
            links_opened=self._connector.opened,
            pubsub_connections_opened=self._subscriber.connections_opened,
            fences=self._fences,
            pubsub_reconnects=self._subscriber.reconnects,
        )

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        self._closed = True
        await self._connector.aclose()
        await self._subscriber.aclose()
        link, self._link = self._link, None
        if link is not None:
            link.close(NotSent("the client is closed"))
