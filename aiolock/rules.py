"""What a lock type tells the acquisition loop: its :class:`Rule` (the script that tries to
take it and what its reply means, its channel, its release), and the loop's small records."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Final

from .holds import Renewal
from .runtime import Runtime

logger = logging.getLogger("aiolock")


Command = bytes  # an encoded command, e.g. Script.command(keys, args)


class _NotRun:
    def __repr__(self) -> str:
        return "NOT_RUN"


#: a settled lost command that certainly did not run (it may be sent again)
NOT_RUN: Final = _NotRun()


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one try said: granted (with a fencing token for a fenced lock, or what else
    the type hands out in ``value``, e.g. a permit id), or busy, with the time in ms after
    which trying again may succeed although no message came (the holder's remaining TTL;
    None: unknown or never, wait for a message)."""

    granted: bool
    ttl_ms: int | None = None
    token: int | None = None
    value: Any = None


GRANTED = Attempt(True)


@dataclass(frozen=True, slots=True)
class GiveUp:
    """What an acquisition that tried and got nothing sends when it ends (a fair lock's
    waiter leaves the line), and for how many seconds it is sent again while it cannot be
    known to have run: after that, what it would remove is gone on the server anyway. It
    must be harmless when it runs twice."""

    command: Command
    retry_for: float = 0.0
    #: what it adds to a batch of its rule's give-ups sent as one command (Rule.give_ups):
    #: give-ups of one client and object that come together go out in few calls; None:
    #: sent alone
    part: tuple[Any, ...] | None = None


class Rule(ABC):
    """What one object type tells the acquisition loop (see the module docstring).

    A grant is a count of a hold of its owner (locks, and a permit-expirable semaphore's
    permits) unless ``holds`` is False (a semaphore's plain permits, a latch opening): then
    nothing is registered, the loop returns the grant, and a grant whose caller left is given
    back with :meth:`undo`."""

    #: the object's name (for messages) and the key commands about it are routed by
    name: str
    key: str
    #: the object's type, as metrics name it (the attribute ``lock.type``)
    kind: ClassVar[str] = "other"
    #: how the watchdog renews a hold taken without a lease
    renewal: Renewal | None = None
    #: whether a grant is a hold of its owner (see above)
    holds: bool = True
    #: whether an acquisition may queue behind tasks of this client already waiting for the
    #: object (parked on its channel under a live lease) instead of trying first; False when
    #: a waiter may be granted while others of the client wait (a read lock: readers share
    #: it while a writer waits, and a writer takes the read lock it blocks others from)
    queue_locally: bool = True
    #: a parked waiter's share of a wake-up: a message waking n wakes waiters in turn while
    #: their weights fit in n (a semaphore's waiter for k permits weighs k)
    weight: int = 1
    #: whether a grant is written on the server (and so confirmed by ``replica_acks``);
    #: False for a grant that only reads (a latch found open)
    replicated: bool = True

    @abstractmethod
    def channel(self, owner: str) -> bytes:
        """The channel a waiter owned by ``owner`` listens to."""

    def channel_key(self, owner: str) -> str:
        """The key a subscription to ``channel(owner)`` is routed by (a cluster transport
        listens on the node serving it): the object's key, unless the channel lives in
        another hash slot (a countdown latch whose name has a hash tag of its own)."""
        return self.key

    @abstractmethod
    def wakes(self, data: bytes) -> int:
        """How many waiters a message wakes (pubsub.ALL: every one); ValueError if malformed."""

    @abstractmethod
    def attempt(self, owner: str, lease_ms: int, wait_ms: int | None) -> Command:
        """The command that tries to take one count for ``owner``; ``wait_ms`` is how long
        the whole acquisition may wait (None: as long as it takes)."""

    @abstractmethod
    def parse(self, reply: Any) -> Attempt:
        """What the attempt's reply says."""

    @abstractmethod
    async def settle_attempt(self, rt: Runtime, owner: str, count: int) -> Attempt | _NotRun:
        """After a fence: what a lost attempt did, ``count`` being the owner's count before."""

    @abstractmethod
    def release(self, owner: str, lease_ms: int, count: int) -> Command:
        """The command that releases one count of ``owner``, whose count before it is
        ``count`` (a script that compares it makes a late or repeated release harmless)."""

    @abstractmethod
    def parse_release(self, reply: Any) -> bool | None:
        """True: the last count was released; False: counts remain; None: the owner holds
        none, or not the count it expected (its hold cannot be trusted)."""

    @abstractmethod
    async def settle_release(self, rt: Runtime, owner: str, count: int) -> bool | _NotRun | None:
        """After a fence: what a lost release did, ``count`` being the owner's count before."""

    @abstractmethod
    def purge(self, owner: str) -> Command:
        """The command that removes every count of ``owner`` (idempotent)."""

    def give_up(self, owner: str) -> GiveUp | None:
        """What an acquisition that tried and got nothing sends when it ends (a fair lock's
        waiter leaves the queue); None: nothing. Sent in the background, in the owner's turn
        on its hold (its next acquisition waits for it), again and again for at most
        ``retry_for`` seconds until it is known to have run."""
        return None

    def give_ups(self, parts: list[tuple[Any, ...]]) -> Command:
        """One command doing what the give-ups of these ``parts`` (GiveUp.part) do, in one
        go; only asked of a rule whose give-ups have parts."""
        raise NotImplementedError

    def undo(self, owner: str, grant: Attempt) -> Command | None:
        """For ``holds = False``: the command giving back a grant whose caller left."""
        return None
