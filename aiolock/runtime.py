"""The runtime: what every lock type works with, handed down to it by the client.

One client has one runtime: its transport, pub/sub wait entries, leases (the holds and their
watchdog), config, owner resolution, background tasks and metrics. The lock types receive it
when they are made and never look anything up above it; the client (``aiolock.client``) is
a facade that builds the runtime, makes lock objects on it and closes it.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from .config import Config
from .errors import ClientClosedError, WrongEventLoopError
from .holds import Hold, Owner
from .leases import Leases
from .metrics import Metrics
from .pubsub import PubSub
from .tasks import OwnerIds, current_task, new_id
from .transport import Transport

R = TypeVar("R")

#: rules kept per runtime before the cache starts over (a rule is cheap to make again)
_RULES_KEPT = 4096
#: the ids of the aiolock clients made in this process (an owner id is ``<client id>:<n>``)
_CLIENT_IDS: set[str] = set()


class Runtime:
    """What the lock types and the acquisition loop work with: one client's transport, wait
    entries, holds, config, owners, background tasks and metrics."""

    __slots__ = (
        "__weakref__",
        "_closed",
        "_loop",
        "_owner_ids",
        "_rules",
        "config",
        "deployment",
        "give_ups",
        "id",
        "leases",
        "metrics",
        "pubsub",
        "spawn",
        "transport",
    )

    def __init__(
        self,
        transport: Transport,
        pubsub: PubSub,
        leases: Leases,
        config: Config,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
        metrics: Metrics | None = None,
        *,
        id: str = "",
        deployment: tuple[str, int] = ("", 0),
    ) -> None:
        self.transport = transport
        self.pubsub = pubsub
        self.leases = leases
        self.config = config
        #: runs a coroutine in a background task the client waits for when it closes
        self.spawn = spawn
        #: where acquisitions are recorded (None: no metrics)
        self.metrics = metrics
        #: the client's uuid: the first half of every owner id it writes
        self.id = id
        if id:
            _CLIENT_IDS.add(id)
        #: (where, database): which deployment the locks of this runtime live on
        self.deployment = deployment
        #: give-ups waiting to go out together, per rule (see settle.send_give_up)
        self.give_ups: dict[Any, Any] = {}
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rules: dict[tuple[Callable[[str], Any], str], Any] = {}
        #: each live task's owner id, made on its first call (weakly keyed: an entry goes with
        #: its task, with no done callback on it, and refers to no runtime)
        self._owner_ids = OwnerIds(id)

    # -- use ------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Mark the runtime closed: from now on :meth:`use` raises ClientClosedError."""
        self._closed = True

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the runtime was first used from (None: not used yet)."""
        return self._loop

    def use(self, *, closed_ok: bool = False) -> Runtime:
        """The runtime, checked: raises unless used from its own event loop and open (or
        ``closed_ok``: for what needs no Redis, like reporting the holds a closing client
        lost)."""
        if self._closed and not closed_ok:
            raise ClientClosedError(f"aiolock client {self.id} is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                raise WrongEventLoopError(
                    f"aiolock client {self.id} belongs to another event loop; "
                    "create one client per event loop"
                )
            self._loop = loop
        return self

    def without_metrics(self) -> Runtime:
        """This runtime recording no metrics (for a caller that records its whole operation
        once, like a spin lock's tries): itself if it records none."""
        if self.metrics is None:
            return self
        other = copy.copy(self)
        other.metrics = None
        return other

    # -- what the lock types share ----------------------------------------------------------

    def rule(self, kind: Callable[[str], R], name: str) -> R:
        """The rule of the object ``name`` made by ``kind`` (rules are immutable: lock
        objects of one name share one, so making a lock object per request stays cheap)."""
        rules = self._rules
        found = rules.get((kind, name))
        if found is None:
            if len(rules) >= _RULES_KEPT:
                rules.clear()
            found = rules[(kind, name)] = kind(name)
        return found  # keyed by its maker: what kind makes

    def new_owner(self) -> Owner:
        """An explicit owner, not tied to a task."""
        return Owner(f"{self.id}:{new_id()}")

    def resolve_owner(self, owner: Owner | None, task: asyncio.Task[Any] | None = None) -> Owner:
        """``owner``, or the owner that is ``task`` (by default the current task). Raises
        TypeError for what is not an Owner and ValueError for an owner of another client
        (two clients holding one object under one owner id would each believe they hold it
        alone)."""
        if owner is not None:
            check_owner(owner)
            if not owner.shared and self.owned_elsewhere(owner):
                raise ValueError(
                    f"owner {owner.id} belongs to another aiolock client, not to {self.id}; "
                    "make owners with this client's new_owner()"
                )
            return owner
        if task is None:
            task = current_task()
        return Owner(self._owner_ids.of(task), task)

    def owned_elsewhere(self, owner: Owner) -> bool:
        """Whether ``owner`` was made by another aiolock client of this process. An owner
        made from an id of another library (``aiolock.Owner("<Redisson or node-redisson
        owner id>")``, to re-enter or release its hold) is not: that sharing is deliberate."""
        made_by = owner.id.partition(":")[0]
        return made_by != self.id and made_by in _CLIENT_IDS

    def owns(self, owner: Owner) -> bool:
        """Whether ``owner`` was made by this runtime's client (its id starts with the
        client's uuid)."""
        return owner.id.startswith(f"{self.id}:")

    def holds_of(self, name: str) -> list[Hold]:
        """This runtime's holds on the object ``name``."""
        return [hold for (held, _), hold in self.leases.holds.items() if held == name]


def check_owner(owner: object) -> None:
    """Refuse (before any Redis call) what cannot be an owner handed in: not an
    :class:`~aiolock.Owner` (TypeError), or one whose id (``aiolock.Owner("<id>")`` takes
    any object) is not a non-empty str (TypeError, ValueError), or is ``mode``, the field
    where a read-write lock keeps its mode (ValueError: a hold under it would overwrite the
    mode)."""
    if not isinstance(owner, Owner):
        raise TypeError(f"owner must be an aiolock.Owner, not {type(owner).__name__}")
    owner_id = owner.id
    if not isinstance(owner_id, str):
        raise TypeError(f"an owner id is a str, not {type(owner_id).__name__}: {owner!r}")
    if not owner_id or owner_id == "mode":
        raise ValueError(f"{owner_id!r} cannot be an owner id")


class RuntimeSource(Protocol):
    """What a lock type's constructor takes instead of a runtime: a client (``aiolock.FairLock(
    client, name, clock=...)``), which hands its runtime down."""

    @property
    def unchecked_runtime(self) -> Runtime: ...


def runtime_of(source: Runtime | RuntimeSource) -> Runtime:
    """The runtime given, or the one the client given hands down."""
    return source if isinstance(source, Runtime) else source.unchecked_runtime
