"""The transport interface (see aiolock.transport)."""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol

from ..config import Config
from ..keys import key_slot
from .calls import Call, OutcomeUnknown
from .subscriber import Listener

logger = logging.getLogger("aiolock.transport")


@dataclass(frozen=True, slots=True)
class TransportStatistics:
    """What a transport holds open and has in flight."""

    #: open command links
    links: int
    #: commands sent and not yet answered
    commands_in_flight: int
    #: pub/sub channels listened to
    subscriptions: int
    #: command links opened so far (1 + reconnects, per node)
    links_opened: int
    #: pub/sub connections opened so far
    pubsub_connections_opened: int
    #: dropped links whose requests were fenced (CLIENT KILL) before concluding
    fences: int
    #: pub/sub connections opened again after one was lost
    pubsub_reconnects: int = 0
    #: times the server behind the links changed (a failover, a restart)
    server_changes: int = 0


class Watcher(Protocol):
    """What the layer above is told of the servers behind a transport (the lease registry:
    it re-checks the holds whose server changed)."""

    def server_changed(self, why: str) -> None:
        """A server behind the links is another one now: the Sentinels named another master,
        a cluster's slots are served by another node (a failover, a slot migration), or a
        new link found another ``run_id`` (the server restarted, empty unless it persists).
        Which keys it concerns: those whose :meth:`Transport.epoch_of` is now
        :attr:`Transport.epoch` (every key, on one server); whether what was written there
        may be gone: :meth:`Transport.loss_epoch_of`. Called once per change, after the
        transport counted it in :attr:`Transport.epoch`, and before any command is sent to
        the new server."""

    def needs_server(self) -> bool:
        """Whether a lost command link should be opened again at once, to learn whether
        the server changed (True while something is held), rather than at the next command."""


class Transport(ABC):
    """The interface the layers above use (see the module docstring)."""

    config: Config
    #: who is told when the server changes (see :meth:`watch`)
    _watchers: tuple[Watcher, ...] = ()
    #: changes of server told so far (:meth:`Watcher.server_changed`); each starts an epoch.
    #: Every :class:`Call` carries the epoch in which it was sent (``Call.epoch``).
    epoch: int = 0

    def watch(self, watcher: Watcher) -> None:
        """Tell ``watcher`` when a server behind the links changes."""
        self._watchers = (*self._watchers, watcher)

    def epoch_of(self, key: str) -> int:
        """The epoch in which the server serving ``key`` last changed (0: never): what was
        written about ``key`` before is to be checked there. On one server, every key's is
        :attr:`epoch`; on a cluster, the epoch of the last change of the key's hash slot."""
        return self.epoch

    def loss_epoch_of(self, key: str) -> int:
        """The epoch of the last change of the server serving ``key`` that may have lost
        what was written about it (a master that was a replica, a restart; on a cluster not
        a slot migration, which moves the keys whole). A reply to a command about ``key``
        sent before it (``Call.epoch`` below this) came from a server whose writes may not
        be where ``key`` is served now. On one server, every change is such a change."""
        return self.epoch

    def _tell(self, why: str) -> None:
        """Count a change (a new :attr:`epoch`) and tell the watchers, once."""
        self.epoch += 1
        for watcher in self._watchers:
            try:
                watcher.server_changed(why)
            except Exception:  # never expected; the transport goes on
                logger.exception("aiolock: telling of a server change failed")

    @abstractmethod
    def send_now(self, packed: bytes, *, key: str | None) -> Call | None:
        """Write ``packed`` to the link serving ``key`` if one is open and takes writes;
        None otherwise (then use :meth:`send`). Never suspends."""

    @abstractmethod
    async def send(self, packed: bytes, *, key: str | None, deadline: float | None = None) -> Call:
        """Write ``packed`` to the link serving ``key``, opening one if needed (by
        ``deadline``, else within command_timeout); raises :class:`NotSent`."""

    @abstractmethod
    async def fence(self, lost: OutcomeUnknown, deadline: float | None) -> bool:
        """True once the dropped link of ``lost`` can run nothing more; False if that cannot
        be made sure now (no identity, no permission, no server before ``deadline``)."""

    @abstractmethod
    def subscribe(self, channel: bytes, listener: Listener, *, key: str) -> asyncio.Future[None]:
        """Listen to ``channel``; the future confirms it or fails (NotSent, SubscribeRefused)."""

    @abstractmethod
    def unsubscribe(self, channel: bytes, *, key: str) -> None:
        """Stop listening to ``channel``."""

    #: whether a script call over several objects must keep to one hash slot: always on a
    #: cluster; on one server once it refused such a call with CROSSSLOT (a proxy in front
    #: of a cluster, or a cluster node whose mode could not be asked)
    by_slot: bool = False

    def batch_key(self, key: str) -> Hashable:
        """Keys with equal batch keys may share one script call: every key on one server
        (fewer round trips), one hash slot where :attr:`by_slot`."""
        return key_slot(key) if self.by_slot else None

    def refused_cross_slot(self) -> None:
        """A call over several objects was answered CROSSSLOT (so it did not run): batch per
        slot from now on."""
        self.by_slot = True

    @abstractmethod
    def statistics(self) -> TransportStatistics: ...

    @property
    @abstractmethod
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called (nothing can be sent any more)."""

    @abstractmethod
    async def aclose(self) -> None:
        """Close every link; commands in flight settle with OutcomeUnknown."""


async def wait_call(call: Call, deadline: float | None) -> Any:
    """The reply of ``call``, waiting at most until ``deadline`` (loop time) for it.

    Raises TimeoutError past the deadline; the call is abandoned then (its reply dropped).
    Meant for commands whose late reply does not matter (reads, CLIENT KILL)."""
    if deadline is None:
        return await call.future
    try:
        async with asyncio.timeout_at(deadline):
            return await call.future
    except TimeoutError:
        call.abandon(lambda _: None)
        raise
