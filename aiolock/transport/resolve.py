"""Where the master is: the step before a connect, pluggable per transport.

A plain server is where its settings say (:class:`FixedAddress`). Under Sentinel the master
moves, so every connect asks the Sentinels through redis-py's own machinery
(:class:`SentinelAddress`: ``SentinelConnectionPool.get_master_address()``, which is
``Sentinel.discover_master``), and the links it opens check with ``ROLE`` that the server
they reached is a master.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod

from redis.asyncio.sentinel import SentinelConnectionPool

from .link import NotSent
from .settings import ServerSettings


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
        return settings.at(str(host), int(port))
