"""A hold and its owner: one owner's hold on one object (its state, counts, lease deadline,
loss callbacks and turn), the records the lease registry (:mod:`aiolock.leases`) keeps and is
the only writer of.

A hold's life is one table, :data:`TRANSITIONS` (h11's style): a :class:`HoldState` and a
:class:`HoldEvent` give the next state, and :func:`move` is the only writer of
``Hold.state`` after the record is made (ACQUIRING). Each event is fired by the
:class:`~aiolock.leases.Leases` method of its name; a pair not in the table is a bug here and
raises :class:`HoldStateError` before anything of the hold is changed::

    state       | event: GRANTED   RELEASING   RELEASED   LOST
    ------------+-----------------------------------------------
    ACQUIRING   |        HELD      -           -          -
    HELD        |        HELD      RELEASING   RELEASED   LOST
    RELEASING   |        -         -           RELEASED   LOST
    RELEASED    |        HELD      -           -          -
    LOST        |        HELD      -           -          -

GRANTED on HELD is a nested (reentrant) count; on RELEASED or LOST it starts the next
generation on the same record (the owner's acquire queued for the hold's turn while the
generation before was released or cleaned up in the background). RELEASED straight from
HELD: the server said the last count went (the local count was off), or the owner
force-unlocked it. The registry never fires an event where nothing moves: a loss of a hold
that is not HELD or RELEASING, a release of one lost or already released, a force-unlock of a
record never granted (ACQUIRING) are told or skipped without a transition.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, NamedTuple

from .errors import LockLostError
from .scripts import Script
from .transport import ErrorReply, OutcomeUnknown

logger = logging.getLogger("aiolock")

#: the local deadline is this fraction of the lease (plus DRIFT_MIN s) before the server's
DRIFT_FACTOR = 0.01
DRIFT_MIN = 0.002
LostCallback = Callable[[LockLostError], Any]
Cleanup = Callable[["Hold"], Awaitable[None]]


def check_callback(callback: object) -> LostCallback:
    """``callback``, checked to be callable (TypeError otherwise: a bad callback would fail
    only when a loss fires)."""
    if not callable(callback):
        raise TypeError(f"on_lost takes a callable, not {type(callback).__name__}")
    return callback


class HoldState(enum.Enum):
    ACQUIRING = "acquiring"
    HELD = "held"
    RELEASING = "releasing"
    RELEASED = "released"
    LOST = "lost"

    # Members are singletons compared by identity: hashed by identity too, not by Enum's
    # Python-level hash of the name (four times the cost of a TRANSITIONS lookup).
    __hash__ = object.__hash__


class HoldEvent(enum.Enum):
    """What moves a hold (see :data:`TRANSITIONS`), fired by the Leases method of its name."""

    #: a count was granted: the first of a generation, or a nested one
    GRANTED = "granted"
    #: the release of the last count starts: renewal stops, whatever the outcome
    RELEASING = "releasing"
    #: the hold is over on the server
    RELEASED = "released"
    #: the hold is lost (gone, unconfirmed, force-unlocked, its task ended, client closed)
    LOST = "lost"

    __hash__ = object.__hash__


_S, _E = HoldState, HoldEvent

#: (state, event) -> the next state; every other pair is illegal (see the module docstring)
TRANSITIONS: dict[tuple[HoldState, HoldEvent], HoldState] = {
    (_S.ACQUIRING, _E.GRANTED): _S.HELD,
    (_S.HELD, _E.GRANTED): _S.HELD,
    (_S.RELEASED, _E.GRANTED): _S.HELD,
    (_S.LOST, _E.GRANTED): _S.HELD,
    (_S.HELD, _E.RELEASING): _S.RELEASING,
    (_S.HELD, _E.RELEASED): _S.RELEASED,
    (_S.RELEASING, _E.RELEASED): _S.RELEASED,
    (_S.HELD, _E.LOST): _S.LOST,
    (_S.RELEASING, _E.LOST): _S.LOST,
}

#: the same table by event, then state: what move() reads (no key tuple built per move)
_MOVES: dict[HoldEvent, dict[HoldState, HoldState]] = {event: {} for event in HoldEvent}
for (_state, _event), _next in TRANSITIONS.items():
    _MOVES[_event][_state] = _next
del _S, _E, _state, _event, _next


class HoldStateError(RuntimeError):
    """A hold was to move along a transition that is not in :data:`TRANSITIONS`: a bug in
    aiolock (the hold is left as it was)."""

    def __init__(self, hold: Hold, event: HoldEvent) -> None:
        super().__init__(
            f"aiolock bug: {hold!r} cannot move on {event.name} from {hold.state.name}"
        )
        self.hold = hold
        self.hold_state = hold.state
        self.event = event


def move(hold: Hold, event: HoldEvent) -> None:
    """Move ``hold`` on ``event`` (:data:`TRANSITIONS`): the only writer of its state once
    made. Raises HoldStateError, changing nothing, if the table has no such transition."""
    state = _MOVES[event].get(hold.state)
    if state is None:
        raise HoldStateError(hold, event)
    hold.state = state


class Renewal(NamedTuple):
    """How the watchdog renews a hold: ``script`` with KEYS[i] = ``key`` and ARGV[1] = lease,
    ARGV[i+1] = owner id; it replies per hold 1 (renewed), 0 (gone) or -1 (error)."""

    script: Script
    key: str


class Owner:
    """Who holds a lock: the asyncio Task that took it (the default), or an explicit owner
    made by :meth:`AioLock.new_owner`, usable from any task (Redisson's explicit thread id,
    anyio's ``acquire_on_behalf_of``). ``id`` is the owner id written to Redis:
    ``<client uuid>:<n>``, with ``n`` never reused in the process."""

    __slots__ = ("id", "task")

    #: whether the id names one hold and is never used for another (see SingleUseOwner)
    single_use: ClassVar[bool] = False
    #: whether the clients other than its own take it (see CompositeOwner)
    shared: ClassVar[bool] = False

    def __init__(self, owner_id: str, task: asyncio.Task[Any] | None = None) -> None:
        self.id = owner_id
        #: the task this owner is, or None for an explicit owner
        self.task = task

    @property
    def explicit(self) -> bool:
        return self.task is None

    def __repr__(self) -> str:
        kind = "explicit" if self.explicit else "task"
        return f"<aiolock.Owner {self.id} ({kind})>"


class CompositeOwner(Owner):
    """The owner a multi-lock or red lock hands to its members, on every member's client:
    one owner id on every member. Only the composites make it (from an owner of one of
    their members' clients); every other owner is refused by the clients it does not
    belong to, so two clients never hold one object under one owner id."""

    __slots__ = ()

    shared = True


class SingleUseOwner(Owner):
    """An owner whose id names one hold only and is never used again: a permit of a
    permit-expirable semaphore, whose id is the permit id (and which belongs to no task).
    No later hold can share its id, so a request of it that could not be fenced never needs
    another id (:meth:`Leases.taint` leaves it alone: the scripts take the permit id itself),
    and once it holds nothing a task it was given stops watching it."""

    __slots__ = ()

    single_use = True


class Hold:
    """One owner's hold on one object. Read-only outside :class:`Leases`."""

    __slots__ = (
        "_busy",
        "_turns",
        "callbacks",
        "cap",
        "capped",
        "check",
        "cleanup",
        "count",
        "deadline",
        "due",
        "epoch",
        "field",
        "kind",
        "lease_ms",
        "lost",
        "max_hold",
        "name",
        "owner",
        "renewal",
        "since",
        "stale",
        "state",
        "timer",
        "token",
    )

    def __init__(
        self, name: str, owner: Owner, field: str | None = None, kind: str = "lock"
    ) -> None:
        self.name = name
        self.owner = owner
        #: the object's type (for metrics)
        self.kind = kind
        #: the owner id the current generation writes to the server: the owner's, unless a
        #: request of an earlier one could not be fenced and may still arrive (Leases.taint);
        #: chosen when a generation starts (Leases.next_generation), fixed until it ends
        self.field = owner.id if field is None else field
        self.state = HoldState.ACQUIRING
        #: counts held (reentrancy) in the current generation
        self.count = 0
        #: counts of a lost generation that the owner has not unlocked yet
        self.stale = 0
        self.lease_ms = 0
        #: loop time of the grant of the current generation (0: not held; kept for metrics)
        self.since = 0.0
        #: how the watchdog renews it (None: a lease_time hold, never renewed)
        self.renewal: Renewal | None = None
        #: how it is checked on the server after a server change (the type's renewal script)
        self.check: Renewal | None = None
        #: the server epoch (Transport.epoch) in which it was last granted or checked
        self.epoch = 0
        #: what to run in the background to remove it from the server (lost, abandoned)
        self.cleanup: Cleanup | None = None
        #: the fencing token of a fenced lock's hold
        self.token: int | None = None
        #: loop time by which the lease must have been renewed, else the hold is lost
        self.deadline = math.inf
        #: loop time of the next renewal
        self.due = math.inf
        #: loop time past which the watchdog never carries the lease (max_hold; inf: no cap)
        self.cap = math.inf
        #: the max_hold (seconds) that set ``cap``, for messages
        self.max_hold: float | None = None
        #: the watchdog made its last renewal, up to the cap: the lease now runs out
        self.capped = False
        self.lost: LockLostError | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.callbacks: list[LostCallback] = []
        self._busy = False
        self._turns: deque[asyncio.Future[None]] | None = None

    def __repr__(self) -> str:
        return f"<Hold {self.name!r} by {self.owner.id} {self.state.value} count={self.count}>"

    # -- its owner's turn: the owner's operations on it run one after another -----------

    @property
    def busy(self) -> bool:
        """An operation of the owner on it (perhaps a background cleanup) is under way."""
        return self._busy

    def take_turn(self) -> bool:
        """Take the turn if it is free (never suspends); False if it is not."""
        if self._busy:
            return False
        self._busy = True
        return True

    async def wait_turn(self) -> None:
        """Take the turn after the operations queued before this one (first come first
        served); a waiter handed the turn and cancelled before it resumes passes it on."""
        if self.take_turn():
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._turns is None:
            self._turns = deque()
        self._turns.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.end_turn()
            raise

    def claim_turn(self) -> asyncio.Future[None]:
        """Take the turn now if it is free, else claim it next, ahead of every operation
        already queued: a future done once the turn is the caller's. For the cleanup of a
        generation that just ended (:meth:`Leases.run_cleanup`): it must run before any
        later operation of the owner, including one queued while the generation was still
        being released (an acquire run first would re-enter the old hold on the server,
        and the cleanup would then remove the new one)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.take_turn():
            waiter.set_result(None)
        else:
            if self._turns is None:
                self._turns = deque()
            self._turns.appendleft(waiter)
        return waiter

    def end_turn(self) -> None:
        """End the turn: the next queued operation gets it."""
        turns = self._turns
        while turns:
            waiter = turns.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the turn passes on: still busy
                return
        self._busy = False


def describe_failure(error: BaseException) -> str:
    """What went wrong, in words a reader of the log can act on."""
    if isinstance(error, ErrorReply):
        return f"Redis answered: {error}"
    if isinstance(error, OutcomeUnknown):
        return f"no reply: {error.__str__().removeprefix('reply lost: ')}"
    return str(error) or type(error).__name__


def local_deadline(sent_at: float, lease_ms: int) -> float:
    """When a lease set by a command sent at ``sent_at`` must be taken as over, here."""
    lease = lease_ms / 1000
    return sent_at + lease - (lease * DRIFT_FACTOR + DRIFT_MIN)
