"""Where the master is: the step before a connect, pluggable per transport.

A plain server is where its settings say (:class:`FixedAddress`). Under Sentinel the master
moves, so every connect asks the Sentinels through redis-py's own machinery
(:class:`SentinelAddress`: ``SentinelConnectionPool.get_master_address()``, which is
``Sentinel.discover_master``), and the links it opens check with ``ROLE`` that the server
they reached is a master.

A Sentinel also says when it switches the master: it publishes ``+switch-master <name>
<old ip> <old port> <new ip> <new port>`` on its own pub/sub once a failover completes
(Redisson's Sentinel manager listens to it). :meth:`SentinelAddress.listen` subscribes to it
on every Sentinel the client was given (one pub/sub link each, opened again with backoff when
lost) and tells the transport at once; until the Sentinel redis-py asks first names the new
master too (they learn the new configuration from each other within seconds), a connect goes
where the event said rather than back to the deposed master.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from redis.asyncio.sentinel import SentinelConnectionPool

from ..config import Config
from .calls import NotSent, OutcomeUnknown, pack
from .link import Link
from .settings import ServerSettings

logger = logging.getLogger("aiolock.transport")

#: the channel a Sentinel announces a completed failover on
SWITCH_CHANNEL = b"+switch-master"
#: how long (s) a switch event overrides a Sentinel that still names the deposed master
SWITCH_OVERRIDE = 10.0

#: ``on_switch(old address, new address)``, both ``host:port``
OnSwitch = Callable[[str, str], None]


class Resolver(ABC):
    """Turns a client's settings into the settings of the server to connect to now."""

    #: whether the server may change between connects (a failover)
    moves: bool = False

    @abstractmethod
    async def resolve(self, settings: ServerSettings, deadline: float) -> ServerSettings:
        """The settings of the master now; raises :class:`NotSent` (by ``deadline``)."""

    @property
    @abstractmethod
    def what(self) -> str:
        """What is connected to, for messages."""

    def listen(self, on_switch: OnSwitch, config: Config) -> None:  # noqa: B027 (a no-op)
        """Call ``on_switch(old, new)`` as soon as the deployment names another master
        (a resolver that is told nothing does nothing; its server is asked at connects)."""

    async def aclose(self) -> None:  # noqa: B027 (nothing to close by default)
        """Stop listening."""


class FixedAddress(Resolver):
    """One server, always at the address of its settings."""

    def __init__(self, settings: ServerSettings) -> None:
        self._what = f"Redis at {settings.address}"

    @property
    def what(self) -> str:
        return self._what

    async def resolve(self, settings: ServerSettings, deadline: float) -> ServerSettings:
        return settings


class SentinelAddress(Resolver):
    """The master of a ``SentinelConnectionPool`` (``Sentinel.master_for(...)``), asked of
    the Sentinels at every connect."""

    moves = True

    def __init__(self, pool: SentinelConnectionPool) -> None:
        if not pool.is_master:
            raise TypeError(
                "aiolock needs the master: use Sentinel.master_for(...), not slave_for(...)"
            )
        self.pool = pool
        self.service_name: str = pool.service_name
        #: the latest switch event: (old, new, until when it overrides a lagging Sentinel)
        self._switched: tuple[str, str, float] | None = None
        #: the latest switch announced (old, new)
        self._last: tuple[str, str] | None = None
        self._on_switch: OnSwitch | None = None
        self._followers: list[asyncio.Task[None]] = []
        #: Sentinels whose +switch-master subscription is confirmed now
        self.subscribed = 0
        #: switches of this service's master announced so far (each by every Sentinel)
        self.switches = 0

    @property
    def what(self) -> str:
        return f"the master {self.service_name!r} (Sentinel)"

    @property
    def deployment(self) -> str:
        """The Sentinels and the service: what tells two Sentinel-managed masters apart."""
        addresses = []
        for sentinel in self.pool.sentinel_manager.sentinels:
            kwargs = sentinel.connection_pool.connection_kwargs
            addresses.append(f"{kwargs.get('host')}:{kwargs.get('port')}")
        return f"sentinel {','.join(sorted(addresses))}/{self.service_name}"

    async def resolve(self, settings: ServerSettings, deadline: float) -> ServerSettings:
        try:
            async with asyncio.timeout_at(deadline):
                host, port = await self.pool.get_master_address()  # type: ignore[no-untyped-call]
        except TimeoutError:
            raise NotSent(
                f"the Sentinels did not name the master {self.service_name!r} in time "
                "(give the Sentinel a socket_timeout so that one stuck Sentinel is skipped)"
            ) from None
        except Exception as exc:  # MasterNotFoundError, a Sentinel's ConnectionError...
            raise NotSent(f"no master {self.service_name!r} from the Sentinels: {exc}") from exc
        named = f"{host}:{port}"
        switched = self._switched
        if switched is not None:
            old, new, until = switched
            if named == new or asyncio.get_running_loop().time() >= until:
                self._switched = None  # the Sentinels agree now (or it is too old to matter)
            elif named == old:
                # A Sentinel that has not learnt of the switch yet: the master is the new one.
                host, _, port = new.rpartition(":")
        return settings.at(str(host), int(port))

    # -- the Sentinels' switch events ------------------------------------------------------

    def listen(self, on_switch: OnSwitch, config: Config) -> None:
        """Subscribe to ``+switch-master`` on every Sentinel (see the module docstring);
        ``on_switch(old, new)`` is called for each event about this service. Once only."""
        if self._followers:
            return
        self._on_switch = on_switch
        loop = asyncio.get_running_loop()
        for sentinel in self.pool.sentinel_manager.sentinels:
            try:
                settings = ServerSettings.from_redis(sentinel)
            except TypeError as exc:  # a connection class aiolock cannot open
                logger.warning("aiolock: not listening to a Sentinel's switch events: %s", exc)
                continue
            self._followers.append(loop.create_task(self._follow(settings, config)))

    async def _follow(self, settings: ServerSettings, config: Config) -> None:
        """Keep one Sentinel's +switch-master subscription, opening its link again with
        backoff whenever it is lost (the master is also asked every second meanwhile)."""
        loop = asyncio.get_running_loop()
        delay = config.reconnect_delay
        while True:
            closed: asyncio.Future[BaseException] = loop.create_future()

            def on_closed(
                _: Link, error: BaseException, closed: asyncio.Future[Any] = closed
            ) -> None:
                if not closed.done():
                    closed.set_result(error)

            link: Link | None = None
            subscribed = False
            try:
                link = await Link.open(
                    settings,
                    command_timeout=config.command_timeout,
                    ping_interval=config.ping_interval,
                    sink=self._message,
                    on_closed=on_closed,
                )
                async with asyncio.timeout(config.command_timeout):
                    reply = await link.send(pack(("SUBSCRIBE", SWITCH_CHANNEL))).future
                if not (isinstance(reply, list) and reply[:2] == [b"subscribe", SWITCH_CHANNEL]):
                    cause = "the link dropped" if isinstance(reply, OutcomeUnknown) else reply
                    raise NotSent(f"SUBSCRIBE {SWITCH_CHANNEL.decode()} answered {cause!r}")
                subscribed = True
                self.subscribed += 1
                delay = config.reconnect_delay
                why = await closed
                logger.debug("aiolock: Sentinel %s events link lost: %r", settings.address, why)
            except (NotSent, TimeoutError) as exc:
                logger.debug("aiolock: Sentinel %s events: %s", settings.address, exc)
            except Exception:  # never expected; this task must not die
                logger.exception("aiolock: following Sentinel %s failed", settings.address)
            finally:
                if subscribed:
                    self.subscribed -= 1
                if link is not None:
                    link.close()
            await asyncio.sleep(delay / 2 + random.uniform(0, delay / 2))
            delay = min(delay * 2, config.reconnect_max_delay)

    def _message(self, channel: bytes, data: bytes) -> None:
        """A Sentinel's event: ``<name> <old ip> <old port> <new ip> <new port>``."""
        if channel != SWITCH_CHANNEL:
            return
        parts = data.decode(errors="replace").split()
        if len(parts) != 5 or parts[0] != self.service_name:
            return
        old, new = f"{parts[1]}:{parts[2]}", f"{parts[3]}:{parts[4]}"
        if self._last != (old, new):  # each Sentinel announces it: count and log it once
            self._last = (old, new)
            self.switches += 1
            logger.info(
                "aiolock: the Sentinels switched the master %r from %s to %s",
                self.service_name,
                old,
                new,
            )
        self._switched = (old, new, asyncio.get_running_loop().time() + SWITCH_OVERRIDE)
        if self._on_switch is not None:
            self._on_switch(old, new)

    async def aclose(self) -> None:
        followers, self._followers = self._followers, []
        for task in followers:
            task.cancel()
        for task in followers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
