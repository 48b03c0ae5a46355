"""The transport of one Redis server: one pipelined command link and one pub/sub link.

Where that server is, is asked of a :class:`~.resolve.Resolver` at every connect: a fixed
address, or the master the Sentinels name now. When the master moves (a Sentinel announced
``+switch-master``, a link answered READONLY, the Sentinels name another server when asked
every second, or a new link reached another server), the command link is replaced and the
pub/sub link dropped, so both follow the master (the subscriber subscribes every channel
again and wakes every waiter to re-check).

The server behind the links can also change at the same address: every command link asks
the server's ``run_id`` when it opens (``INFO server``), and another one means the server
restarted (empty, unless it persists). Either change is told to the watchers
(:meth:`Transport.watch`, the lease registry, which checks every hold there at once), once,
before anything is sent to the new server. A command link lost while something is held is
opened again at once (with backoff), so that a restart is noticed then, not at the next
command.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ..config import Config
from .base import Transport, TransportStatistics, wait_call
from .calls import Call, LinkIdentity, NotSent, OutcomeUnknown, pack
from .connector import Connector
from .link import Link
from .resolve import FixedAddress, Resolver
from .settings import ServerSettings
from .subscriber import Listener, Subscriber

logger = logging.getLogger("aiolock.transport")

#: how many fenced link identities are remembered (a dropped link is fenced once)
_FENCES_KEPT = 64


class StandaloneTransport(Transport):
    """Every command of a client on one pipelined link; every channel on one pub/sub link."""

    def __init__(
        self, settings: ServerSettings, config: Config, *, resolver: Resolver | None = None
    ) -> None:
        self.settings = settings
        self.config = config
        self.resolver = resolver or FixedAddress(settings)
        self._link: Link | None = None
        #: the server the command link was last opened to (to see the master move)
        self._server: str | None = None
        self._watch: asyncio.Task[None] | None = None
        what = self.resolver.what
        if settings.ssl_context is not None:
            what += " (TLS: if that server does not speak TLS, use a redis:// URL)"
        self._connector = Connector(self._open_link, self._adopt, config, what=what)
        self._subscriber = Subscriber(self._open_subscriber_link, config, what=what)
        self._fenced: dict[LinkIdentity, None] = {}
        self._fences = 0
        self._warned_fence = False
        self._closed = False
        #: the server (address, run_id) what was written lives on: a link opened elsewhere,
        #: or to another run_id, is a change of server (run_id None: not known yet)
        self._home: tuple[str, str | None] | None = None
        self._reopening: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"<StandaloneTransport {self.resolver.what}>"

    async def _settings_now(self) -> ServerSettings:
        deadline = asyncio.get_running_loop().time() + self.config.command_timeout
        return await self.resolver.resolve(self.settings, deadline)

    async def _open_link(self) -> Link:
        config = self.config
        settings = await self._settings_now()
        link = await Link.open(
            settings,
            command_timeout=config.command_timeout,
            ping_interval=config.ping_interval,
            on_closed=self._link_closed,
            master_only=self.resolver.moves,
            standalone=True,
            ask_run_id=True,
        )
        return await self._still_master(link)

    async def _still_master(self, link: Link) -> Link:
        """``link`` if its server is still the one to talk to once it is open: a connect
        that hung on a frozen master can complete when it thaws, after a failover, while
        it still says it is a master (until the Sentinels demote it)."""
        if not self.resolver.moves:
            return link
        try:
            now = (await self._settings_now()).address
        except BaseException:
            link.close(NotSent("no master to check against"))
            raise
        if now != link.identity.server:
            link.close(NotSent(f"the master moved to {now}"))
            raise NotSent(f"the master moved to {now} while connecting to {link.identity.server}")
        return link

    def _adopt(self, link: Link) -> None:
        self._link = link
        server, run_id = link.identity.server, link.identity.run_id
        moved = self._server is not None and self._server != server
        self._server = server
        if moved:
            logger.warning("aiolock: the master is now %s", server)
            self._subscriber.drop(f"the master moved to {server}", unless_at=server)
        home = self._home
        if home is None or home[0] != server or home[1] is None or run_id is None:
            self._home = (server, run_id)
            if home is not None and home[0] != server:
                self._server_changed(f"the master moved to {server}")
        elif home[1] != run_id:
            self._home = (server, run_id)
            self._server_changed(f"{server} restarted: another run_id")
        if self.resolver.moves and self._watch is None and not self._closed:
            self._watch = asyncio.get_running_loop().create_task(self._watch_master())
            self.resolver.listen(self._switched, self.config)
        if link.closed:  # closed as it opened, before its loss was ours to hear
            self._link_closed(link, link.error or ConnectionError("closed as it opened"))

    def _server_changed(self, why: str) -> None:
        """Tell the watchers (once per change, before anything is sent there)."""
        logger.warning("aiolock: %s; every hold is checked there", why)
        self._tell(why)

    def _link_closed(self, link: Link, error: BaseException) -> None:
        """A command link closed: open another at once while something is held (a restart
        is noticed then, by its run_id); otherwise the next command opens it."""
        if link is not self._link or self._closed or self._reopening is not None:
            return
        if any(watcher.needs_server() for watcher in self._watchers):
            self._reopening = asyncio.get_running_loop().create_task(self._reopen())

    async def _reopen(self) -> None:
        try:
            while not self._closed:
                link = self._link
                if link is not None and not link.closed and not link.readonly:
                    return
                if not any(watcher.needs_server() for watcher in self._watchers):
                    return
                try:
                    await self._connector.connect(None)  # backs off after a failure
                except NotSent as exc:
                    logger.debug("aiolock: opening the link again: %s", exc)
        except Exception:  # never expected; the next command opens a link anyway
            logger.exception("aiolock: opening the link again failed")
        finally:
            self._reopening = None

    def _switched(self, old: str, new: str) -> None:
        """A Sentinel announced that the master moved from ``old`` to ``new``: leave ``old``
        now. (An event about another server than ours is left to the check every second.)"""
        link = self._link
        at = link.identity.server if link is not None and not link.closed else None
        home = self._home[0] if self._home is not None else None
        if old in (at, home):
            self._master_moved(new, f"the Sentinels switched the master to {new}")

    def _master_moved(self, now: str, why: str) -> None:
        """The master is ``now``: leave any other server at once (the command link takes no
        more commands, the pub/sub link is dropped) and tell the watchers if what was written
        lived elsewhere."""
        link = self._link
        if (
            link is not None
            and not link.closed
            and not link.readonly
            and link.identity.server != now
        ):
            logger.warning("aiolock: the master is now %s; leaving %s", now, link.identity.server)
            link.readonly = True  # no more commands: the next send connects to the master
            if not link.in_flight:
                link.close(ConnectionError(why))
        self._subscriber.drop(why, unless_at=now)
        home = self._home
        if home is not None and home[0] != now:
            self._home = (now, None)
            self._server_changed(why)

    async def _open_subscriber_link(
        self, sink: Callable[[bytes, bytes], None], on_closed: Callable[[Link, BaseException], None]
    ) -> Link:
        config = self.config
        link = await Link.open(
            await self._settings_now(),
            command_timeout=config.command_timeout,
            ping_interval=config.ping_interval,
            sink=sink,
            on_closed=on_closed,
            master_only=self.resolver.moves,
            standalone=True,
        )
        return await self._still_master(link)

    async def _watch_master(self) -> None:
        """Every second (or ``ping_interval`` if shorter), ask where the master is; if it is
        not where the links are (a frozen master thawed after a failover, before the
        Sentinels demoted it), replace them."""
        while not self._closed:
            await asyncio.sleep(min(self.config.ping_interval, 1.0))
            try:
                now = (await self._settings_now()).address
            except NotSent as exc:
                logger.debug("aiolock: asking where the master is: %s", exc)
                continue
            except Exception:  # never expected; this task must not die silently
                logger.exception("aiolock: asking where the master is failed")
                continue
            self._master_moved(now, f"the master moved to {now}")

    def send_now(self, packed: bytes, *, key: str | None) -> Call | None:
        link = self._link
        if link is None or link.closed or link.readonly or link.paused is not None:
            return None
        call = link.send(packed)
        call.epoch = self.epoch
        return call

    async def _current(self, deadline: float | None) -> Link:
        link = self._link
        if link is None or link.closed or link.readonly:
            if deadline is None:
                deadline = asyncio.get_running_loop().time() + self.config.command_timeout
            link = await self._connector.connect(deadline)
        return link

    async def send(self, packed: bytes, *, key: str | None, deadline: float | None = None) -> Call:
        link = await self._current(deadline)
        if link.paused is not None:
            # before writing: a caller cancelled here, or whose deadline passed, sent nothing
            await link.drain(deadline)
        call = link.send(packed)
        call.epoch = self.epoch
        return call

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
            link = await self._current(deadline)
            if identity.run_id is not None and link.identity.run_id not in (None, identity.run_id):
                # The dropped link's server restarted: that process is gone, and whatever it
                # was still to run with it (an id on the new one may be another client's).
                return self._fenced_now(identity)
            if self.resolver.moves and link.identity.server != identity.server:
                # The dropped link went to a server that is no longer the master (the link
                # to the master goes elsewhere now): whatever it still runs there is
                # discarded when that server becomes a replica of the master, and never
                # reaches the master. What the master has is what counts.
                return self._fenced_now(identity)
            if link.paused is not None:
                await link.drain(deadline)
            reply = await wait_call(link.send(pack(command)), deadline)
        except (NotSent, TimeoutError):
            return False
        if isinstance(reply, OutcomeUnknown):
            return False
        if not isinstance(reply, int):
            if not self._warned_fence:
                self._warned_fence = True
                logger.warning(
                    "aiolock: Redis refused CLIENT KILL (%s), so aiolock cannot close a "
                    "connection whose reply was lost: a lock script whose reply was lost is not "
                    "sent again, and what it may have taken is released or expires. Allow "
                    "+client|kill to this Redis user (see `aiolock acl`)",
                    reply,
                )
            return False
        return self._fenced_now(identity)

    def _fenced_now(self, identity: LinkIdentity) -> bool:
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
            server_changes=self.epoch,
        )

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        self._closed = True
        for task in (self._watch, self._reopening):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.resolver.aclose()
        await self._connector.aclose()
        await self._subscriber.aclose()
        link, self._link = self._link, None
        if link is not None:
            link.close(NotSent("the client is closed"))
