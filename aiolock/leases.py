"""The lease registry: every hold of one client, in one place, and the watchdog renewing them.

A :class:`Hold` is one owner's hold on one object. Its life is a small state machine and
every transition is a method of :class:`Leases`; nothing else writes hold state::

    ACQUIRING --granted--> HELD --release of the last count--> RELEASING --confirmed--> RELEASED
        |                  |  ^ granted again (reentrant), release of one of several counts
        +--not granted-----|--+----------------------------------------------------> (forgotten)
                           +--lost: renewal found it gone, lease ran out unconfirmed,
                              force-unlocked, its task ended, the client closed--> LOST

Leaving HELD always stops renewal, whatever the outcome of the release: a hold never outlives
its unlock. A LOST hold's counts become *stale*: each later unlock by its owner reports the
loss (LockLostError) and uses up one, and the owner cannot take the lock again before it has
unlocked them all (it would be working under a lock it no longer holds). What a lost or
abandoned hold may have left on the server is removed in the background by its cleanup,
within its lease; nothing of it is ever renewed again.

Operations of one owner on one hold are serialized (:attr:`Hold.turn`), background cleanups
included, so a release still running cannot race the same owner's next acquire. Such an
acquire, queued for the turn, is granted on the same Hold record: a record can outlive a
generation (grant to release or loss), so ending one clears everything of it (its renewal
registration, the callbacks of a released hold) and the next generation starts clean. The
cleanup of a generation that ended lost claims the turn ahead of every operation queued for
it, and the owner id a generation writes is chosen when it starts: an acquire that waited for
the generation before to be settled never re-enters what is left of it on the server, nor
writes an owner id that a request of it, not fenced, may still match (:meth:`Leases.taint`).

The watchdog keeps alive the holds taken without a lease. The expiration-renewal map is
process-wide (Redisson's design): :data:`RENEWALS` maps a client id to that client's own map,
which only that client's event loop touches, so clients on many loops and threads never
share a dict that one of them mutates while another iterates. Each client runs one renewal
task while it has holds to renew; a hold is renewed ``watchdog_timeout / 3`` after its last
renewal; holds due in the same tick share script calls, grouped by the transport's batch key
(one hash slot on a cluster) in batches of up to :data:`BATCH`. A batch that a server refuses
with CROSSSLOT (it did not run: a cluster behind a proxy) is split per slot and sent again
at once, and the transport batches per slot from then on.

Every hold has a local deadline: when its lease was last set on the server, measured from
when the command was *sent*, plus the lease, minus a small drift. A timer marks the hold lost
at that deadline unless a renewal was confirmed first, so the holder learns of the loss no
later than the server expires the key.

The server behind the transport can change under the holds: a failover names another
master (whose data lacks what had not replicated yet), a cluster's slot is served by another
node (a failover, a migration), or a server restarts empty (another ``run_id``). The transport
counts *epochs* (``Transport.epoch``: every change starts a new one), says which keys a change
concerns (``Transport.epoch_of``: on one server every key, on a cluster the keys of the slots
that changed) and tells the registry (:meth:`Leases.server_changed`): every hold whose server
changed since it was last checked is checked on the new server at once, with the watchdog's
own renewal scripts and batches (a hold with a ``lease_time`` is checked with what is left of
its lease, which a check never lengthens). A hold absent there is lost now; the others are
not touched. A reply to a command sent (``Call.epoch``) before a change that may have lost
writes (``Transport.loss_epoch_of``: a failover, a restart; a slot migration moves the keys
whole) came from the server that was (a deposed master, a run that is gone): a grant in it is
no grant, a renewal in it confirms nothing, and a release confirmed by it, or settled on the
new server, cannot tell a released hold from one the change wiped, so it is reported lost. A
nested grant onto a hold not checked again since its server changed is lost too: the acquire
may have recreated the hold it claims to re-enter.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import inspect
import itertools
import logging
import math
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from typing import Any, ClassVar, NamedTuple

from .config import Config
from .errors import ClientClosedError, LockLostError
from .keys import key_slot
from .metrics import Metrics
from .scripts import Script
from .tasks import new_id
from .transport import ErrorReply, OutcomeUnknown, Transport

logger = logging.getLogger("aiolock")
watchdog_logger = logging.getLogger("aiolock.watchdog")

#: the local deadline is this fraction of the lease (plus DRIFT_MIN s) before the server's
DRIFT_FACTOR = 0.01
DRIFT_MIN = 0.002
#: holds renewed by one script call at most
BATCH = 100
#: server changes whose words are kept for messages
_CHANGES_KEPT = 64

LostCallback = Callable[[LockLostError], Any]
Cleanup = Callable[["Hold"], Awaitable[None]]


class HoldState(enum.Enum):
    ACQUIRING = "acquiring"
    HELD = "held"
    RELEASING = "releasing"
    RELEASED = "released"
    LOST = "lost"


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
        "_callbacks",
        "_timer",
        "_turns",
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
        self._timer: asyncio.TimerHandle | None = None
        self._callbacks: list[LostCallback] = []
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


class Leases:
    """The holds of one client and their transitions (see the module docstring)."""

    def __init__(
        self,
        client_id: str,
        transport: Transport,
        config: Config,
        spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task[Any]],
        metrics: Metrics | None = None,
    ) -> None:
        self._transport = transport
        #: where hold durations, losses and renewals are recorded (None: no metrics)
        self.metrics = metrics
        self._config = config
        self._spawn = spawn
        self._client_id = client_id
        self.holds: dict[tuple[str, str], Hold] = {}
        self._by_owner: dict[str, set[Hold]] = {}
        #: owner id -> object name -> the owner id to write for it instead (Leases.taint)
        self._fields: dict[str, dict[str, str]] = {}
        #: owner id -> its task and the done callback watching it
        self._watched: dict[str, tuple[asyncio.Task[Any], Callable[[object], None]]] = {}
        #: the client closed: no new holds
        self.closed = False
        #: what the latest changes were (epoch -> words), for messages
        self._changes: dict[int, str] = {}
        self.watchdog = Watchdog(client_id, self, transport, config)
        transport.watch(self)

    # -- lookup ------------------------------------------------------------------------------

    def get(self, name: str, owner: Owner) -> Hold | None:
        return self.holds.get((name, owner.id))

    def hold(self, name: str, owner: Owner, kind: str = "lock") -> Hold:
        """The hold of ``owner`` on ``name`` (an object of type ``kind``), made (ACQUIRING)
        if it has none."""
        hold = self.holds.get((name, owner.id))
        if hold is None:
            if self.closed:
                raise ClientClosedError("the client is closed")
            hold = Hold(name, owner, self.field(name, owner), kind)
            self.holds[(name, owner.id)] = hold
        return hold

    def field(self, name: str, owner: Owner) -> str:
        """The owner id ``owner`` writes for ``name`` on the server: its hold's while it
        holds it (or is releasing it), else the one its next hold will write (see
        :meth:`taint`)."""
        hold = self.holds.get((name, owner.id))
        if hold is not None and hold.count:
            return hold.field
        return self._next_field(name, owner.id)

    def _next_field(self, name: str, owner_id: str) -> str:
        fields = self._fields.get(owner_id)
        return owner_id if fields is None else fields.get(name, owner_id)

    def next_generation(self, hold: Hold) -> str:
        """An acquire that holds the owner's turn on ``hold``, which holds nothing, starts
        its next generation: the owner id it writes is chosen now, not when the record was
        made. The acquire may have queued on this record behind background work of the
        generation before (a release settled in the background, a cleanup) that found a
        request it could not fence and tainted the owner's field meanwhile: the taint
        takes effect for this very acquire. (Within a generation the field never changes.)"""
        assert not hold.count
        hold.field = self._next_field(hold.name, hold.owner.id)
        return hold.field

    def tainted(self, hold: Hold, field: str) -> bool:
        """Whether no later hold of ``hold``'s owner on its object will write ``field``
        again (it was tainted already, or a single-use owner's: never reused)."""
        return hold.owner.single_use or self._next_field(hold.name, hold.owner.id) != field

    def taint(self, hold: Hold, field: str) -> None:
        """A request of ``hold`` naming ``field`` (the owner id its generation writes) could
        not be fenced and may still reach the server, where it could match a later hold of
        the same owner (a release expecting count 1 finds the next hold's count 1; a purge
        removes it). Later holds of this owner on this object therefore write another owner
        id, which no old request names, from the owner's very next acquire on (see
        :meth:`next_generation`). Nothing to do if ``field`` is not the one they would
        write any more (tainted already), or for a single-use owner (a permit: no later
        holds)."""
        if self.tainted(hold, field):
            return
        fresh = f"{self._client_id}:{new_id()}"
        self._fields.setdefault(hold.owner.id, {})[hold.name] = fresh
        logger.warning(
            "aiolock: the reply to a request about %r was lost and its connection could not "
            "be closed, so that request may still reach Redis late; owner %s takes %r under "
            "the new owner id %s from now on, which the late request cannot touch",
            hold.name,
            hold.owner.id,
            hold.name,
            fresh,
        )

    def _owned(self, hold: Hold) -> None:
        """Index a hold that holds something under its owner (whose task's end releases
        it). A task owner's entry lasts as long as the task: one done callback each."""
        owner = hold.owner
        holds = self._by_owner.get(owner.id)
        if holds is None:
            holds = self._by_owner[owner.id] = set()
            task = owner.task
            if task is not None:

                def ended(_: object) -> None:
                    self._watched.pop(owner.id, None)
                    self._task_ended(owner)

                task.add_done_callback(ended)
                self._watched[owner.id] = (task, ended)
        holds.add(hold)

    def forget_if_idle(self, hold: Hold) -> None:
        """Drop a hold that holds nothing and reports nothing any more."""
        if hold.count or hold.stale or hold.busy or hold.state is HoldState.HELD:
            return
        key = (hold.name, hold.owner.id)
        if self.holds.get(key) is hold:
            del self.holds[key]
            holds = self._by_owner.get(hold.owner.id)
            if holds is not None:
                holds.discard(hold)
                if not holds and hold.owner.explicit:
                    del self._by_owner[hold.owner.id]
                elif not holds and hold.owner.single_use:
                    self._unwatch(hold.owner)

    def _unwatch(self, owner: Owner) -> None:
        """A single-use task owner holds nothing any more, and never will again: its task
        stops watching it (a task looping over permits would otherwise gather a callback
        per permit)."""
        del self._by_owner[owner.id]
        watched = self._watched.pop(owner.id, None)
        if watched is not None:
            task, ended = watched
            task.remove_done_callback(ended)

    # -- transitions -------------------------------------------------------------------------

    def granted(
        self,
        hold: Hold,
        *,
        lease_ms: int,
        sent_at: float,
        renewal: Renewal | None,
        cleanup: Cleanup,
        token: int | None = None,
        check: Renewal | None = None,
        epoch: int | None = None,
    ) -> bool:
        """One more count was granted by a command sent at ``sent_at``, in server epoch
        ``epoch`` (None: not known). False if it came after its own lease ran out, or from a
        server that is not the one now (the server serving the object changed since it was
        sent): then it is no grant (the caller removes what it took on the server); a nested
        grant never ends the hold it re-enters early: the scripts only extend a TTL, so the
        hold's own deadline still stands. A nested grant from such a server, or onto a hold
        not checked since its server changed, loses the hold (False): it cannot tell whether
        the hold was still there.

        A hold is renewed by the watchdog if any of its counts was taken without a lease;
        lock scripts only ever extend a TTL, so a short nested lease never shortens it.
        ``check`` is how the hold is checked after a server change (every hold has one)."""
        first = hold.count == 0
        if epoch is not None:
            if self.stale(hold, epoch) or (not first and hold.epoch < self.epoch_of(hold)):
                if not first and hold.state is HoldState.HELD:
                    self.lose(
                        hold,
                        f"{self.change_of(hold)}, and a nested acquire could not tell whether "
                        "it was still there",
                    )
                return False
        hold.cleanup = cleanup
        if first:
            now = asyncio.get_running_loop().time()
            if _deadline(sent_at, lease_ms) <= now:
                return False
            if self.metrics is not None:
                hold.since = now
        hold.count += 1
        hold.state = HoldState.HELD
        if first:
            hold.token = token
            hold.deadline = -math.inf
            hold.epoch = self.epoch
            hold.check = check
            self._owned(hold)
        hold.lease_ms = lease_ms if first else max(hold.lease_ms, lease_ms)
        if renewal is not None and hold.renewal is None:
            hold.renewal = renewal
            self.watchdog.add(hold, sent_at)
        return self._confirm(hold, sent_at, lease_ms)

    def confirmed(self, hold: Hold, sent_at: float, lease_ms: int) -> None:
        """The lease was extended to ``lease_ms`` by a command sent at ``sent_at``."""
        if hold.state is HoldState.HELD:
            self._confirm(hold, sent_at, lease_ms)

    def limit(self, hold: Hold, max_hold: float) -> None:
        """Cap how long the watchdog renews ``hold``: never past ``max_hold`` seconds from
        now (a cap set before, e.g. by an outer acquire, is never raised). The watchdog's
        last renewal carries the lease up to the cap; it then runs out and the hold is lost
        like any other (see :meth:`Watchdog._renew_due`)."""
        if hold.state is not HoldState.HELD or hold.renewal is None:
            return  # a hold with a lease_time is not renewed: its lease is its cap
        cap = asyncio.get_running_loop().time() + max_hold
        if cap < hold.cap:
            hold.cap = cap
            hold.max_hold = max_hold

    def capped_lease(self, hold: Hold, lease_ms: int) -> int:
        """``lease_ms``, cut so that a lease set now ends by the hold's cap (max_hold): a
        nested acquire or release never carries a capped hold past it."""
        if hold.cap == math.inf:
            return lease_ms
        left = math.floor((hold.cap - asyncio.get_running_loop().time()) * 1000)
        return max(1, min(lease_ms, left))

    def _confirm(self, hold: Hold, sent_at: float, lease_ms: int) -> bool:
        deadline = max(hold.deadline, _deadline(sent_at, lease_ms))
        if deadline <= asyncio.get_running_loop().time():
            self.lose(hold, "its lease ran out before the server's answer arrived")
            return False
        if deadline != hold.deadline:
            hold.deadline = deadline
            if hold._timer is not None:
                self._arm(hold)
        return True

    def _arm(self, hold: Hold) -> None:
        """A timer at the hold's deadline, for those who want to be told at once (on_lost,
        guard); without them the deadline is checked lazily (:meth:`current`)."""
        if hold._timer is not None:
            hold._timer.cancel()
        hold._timer = asyncio.get_running_loop().call_at(hold.deadline, self._expired, hold)

    def _expired(self, hold: Hold) -> None:
        hold._timer = None
        if hold.state is not HoldState.HELD:
            return
        if hold.deadline > asyncio.get_running_loop().time():
            # uvloop's timers have millisecond resolution and may fire a little early
            self._arm(hold)
            return
        if hold.capped:
            why = (
                f"it reached its max_hold of {hold.max_hold:g} s, so the watchdog stopped "
                "renewing it and its lease ran out"
            )
        elif hold.renewal is not None:
            why = "no renewal was confirmed in time"
        else:
            why = "its lease ran out"
        self.lose(hold, why)

    def current(self, hold: Hold) -> Hold:
        """``hold``, marked lost first if its deadline has passed."""
        if hold.state is HoldState.HELD and hold.deadline <= asyncio.get_running_loop().time():
            self._expired(hold)
        return hold

    def released_one(
        self, hold: Hold, sent_at: float, epoch: int | None = None
    ) -> LockLostError | None:
        """A release of one of several counts was confirmed (the script extended the lease
        to the hold's lease); see :meth:`released` for ``epoch`` and what is returned."""
        if hold.state is HoldState.LOST or (epoch is not None and self.stale(hold, epoch)):
            return self.released(hold, epoch)
        hold.count -= 1
        self._confirm(hold, sent_at, self.capped_lease(hold, hold.lease_ms))
        return None

    def releasing(self, hold: Hold) -> None:
        """The last count is being released: renewal stops now, whatever the outcome."""
        hold.state = HoldState.RELEASING
        self.watchdog.remove(hold)

    def released(self, hold: Hold, epoch: int | None = None) -> LockLostError | None:
        """The hold is over on the server (released, or known gone), as a command sent in
        server epoch ``epoch`` says (None: not known). If the server changed since it was
        sent, that word is not the server's now: a deposed master released what the new one
        may never have had, and an outcome settled on a restarted server cannot tell a
        released hold from one the restart wiped. The hold is then lost instead, this unlock
        using one of its counts, and the error to raise is returned."""
        if epoch is not None and self.stale(hold, epoch):
            return self.lose(
                hold, f"{self.change_of(hold)}, before its release was confirmed there", used=1
            )
        if hold.state is HoldState.LOST:
            # Lost here while its release was in flight, yet the release ran: that unlock
            # used its count (a cleanup still removes whatever else is left).
            hold.stale = max(0, hold.stale - 1)
            self.forget_if_idle(hold)
            return None
        self._end(hold, HoldState.RELEASED)
        hold.count = 0
        hold.token = None
        hold._callbacks.clear()  # released, never lost: they are not due, now or later
        self.forget_if_idle(hold)
        return None

    def lose(
        self, hold: Hold, reason: str, *, cleanup: bool = True, used: int = 0
    ) -> LockLostError:
        """Mark a HELD (or RELEASING) hold lost: its counts but ``used`` become stale,
        renewal stops, callbacks run soon; unless ``cleanup`` is False (it is known gone)
        its cleanup removes in the background whatever may be left on the server."""
        if hold.state is HoldState.LOST:
            hold.stale = max(0, hold.stale - used)  # the unlock that failed used its count
            if not hold.stale:
                self.forget_if_idle(hold)
            assert hold.lost is not None
            return hold.lost
        if hold.state is not HoldState.HELD and hold.state is not HoldState.RELEASING:
            return hold.lost or LockLostError(
                f"lock {hold.name!r} is not held by {hold.owner.id}",
                name=hold.name,
                owner=hold.owner.id,
            )
        self._end(hold, HoldState.LOST)
        error = hold.lost = LockLostError(
            f"lock {hold.name!r} held by {hold.owner.id} was lost: {reason}",
            name=hold.name,
            owner=hold.owner.id,
        )
        hold.stale += hold.count - used
        hold.count = 0
        loop = asyncio.get_running_loop()
        for callback in hold._callbacks:
            loop.call_soon(_run_callback, callback, error)
        hold._callbacks.clear()
        if cleanup:
            self.run_cleanup(hold)
        return error

    def unlock_stale(self, hold: Hold) -> LockLostError:
        """One unlock of a lost generation: uses up a stale count; the error to raise."""
        assert hold.stale > 0 and hold.lost is not None
        hold.stale -= 1
        error = hold.lost
        if not hold.stale:
            self.forget_if_idle(hold)
        return error

    def _end(self, hold: Hold, state: HoldState) -> None:
        """The only way out of HELD (or RELEASING): released or lost. It ends the hold's
        generation: nothing of it may carry over into the next one. (The owner's next
        acquire may be granted on this same record: it queued for the hold's turn while this
        generation was still being released or cleaned up in the background.)"""
        if self.metrics is not None and hold.since:
            seconds = asyncio.get_running_loop().time() - hold.since
            self.metrics.hold_ended(hold.kind, hold.name, seconds, state is HoldState.LOST)
        hold.since = 0.0
        hold.state = state
        hold.deadline = math.inf
        if hold._timer is not None:
            hold._timer.cancel()
            hold._timer = None
        self.watchdog.remove(hold)
        hold.cap, hold.max_hold, hold.capped = math.inf, None, False
        # Its renewal goes with it: a renewal left set made the next generation's grant look
        # registered already, and the watchdog never renewed it (issue 19, symptom 3).
        hold.renewal = None

    def run_cleanup(self, hold: Hold) -> None:
        """Run the hold's cleanup in the background, in its owner's turn, claimed now and
        ahead of the operations already queued for it (:meth:`Hold.claim_turn`): every
        later operation of the owner (taking the lock again) waits for it. A cleanup that
        came after such an acquire removed the new hold from the server (held here, free
        there): it queued only once its task ran, or, lost by background work that held
        the turn, it queued behind an acquire already waiting for that work to end."""
        cleanup = hold.cleanup
        if cleanup is None:
            return
        claimed = hold.claim_turn()

        async def run() -> None:
            await claimed
            try:
                await cleanup(hold)
            except Exception:
                logger.exception("aiolock: releasing lock %r in the background failed", hold.name)

        def done(_: asyncio.Task[None]) -> None:
            # whether it ran, failed, or was cancelled before it could (the client closing)
            if claimed.done() and not claimed.cancelled():
                hold.end_turn()
            else:
                claimed.cancel()  # still queued: end_turn skips it
            self.forget_if_idle(hold)

        self._spawn(run()).add_done_callback(done)

    def _task_ended(self, owner: Owner) -> None:
        self._fields.pop(owner.id, None)
        for hold in list(self._by_owner.pop(owner.id, ())):
            if hold.state is HoldState.HELD:
                task = owner.task
                logger.warning(
                    "aiolock: task %s (owner %s) ended holding lock %r (count %d); releasing it",
                    task.get_name() if task is not None else "?",
                    owner.id,
                    hold.name,
                    hold.count,
                )
                self.lose(hold, "its task ended without unlocking it")
            hold.stale = 0
            self.forget_if_idle(hold)

    # -- the server changes (transport.Watcher) -----------------------------------------------

    @property
    def epoch(self) -> int:
        """Changes of the servers behind the transport so far (see the module docstring)."""
        return self._transport.epoch

    def epoch_of(self, hold: Hold) -> int:
        """The epoch of the last change of the server serving ``hold``'s object: a hold
        last granted or checked before it is to be checked there."""
        return self._transport.epoch_of(hold.name)

    def stale(self, hold: Hold, epoch: int) -> bool:
        """Whether a reply about ``hold``'s object to a command sent in ``epoch`` came from a
        server whose writes may be gone where the object is served now (a failover, a
        restart: not a slot migration, which moves the keys whole)."""
        return epoch < self._transport.loss_epoch_of(hold.name)

    def change_of(self, hold: Hold) -> str:
        """What the last change of the server serving ``hold``'s object was, in words."""
        return self._changes.get(self.epoch_of(hold), "the server changed")

    def server_changed(self, why: str) -> None:
        """The transport reached another server for some keys (a failover, a migration, a
        restart: see the module docstring): a new epoch begins, and every hold on those
        keys is checked there at once."""
        self._changes[self.epoch] = f"the server changed ({why})"
        while len(self._changes) > _CHANGES_KEPT:
            del self._changes[next(iter(self._changes))]
        if any(hold.state is HoldState.HELD for hold in self.holds.values()):
            self.watchdog.revalidate(self.epoch)

    def needs_server(self) -> bool:
        """Whether a lost link should be opened again at once: while anything is held, to
        learn soon whether the server changed under it."""
        return any(self.current(hold).state is HoldState.HELD for hold in list(self.holds.values()))

    # -- callbacks ---------------------------------------------------------------------------

    def on_lost(self, hold: Hold, callback: LostCallback) -> Callable[[], None]:
        """Call ``callback(error)`` once when ``hold`` is lost; returns a remover."""
        self.current(hold)
        if hold.state is HoldState.LOST and hold.lost is not None:
            asyncio.get_running_loop().call_soon(_run_callback, callback, hold.lost)
            return lambda: None
        hold._callbacks.append(callback)
        if hold._timer is None and hold.state is HoldState.HELD:
            self._arm(hold)

        def remove() -> None:
            if callback in hold._callbacks:
                hold._callbacks.remove(callback)

        return remove

    # -- the client ends ---------------------------------------------------------------------

    def close(self) -> None:
        """The client closes: every hold is lost (callbacks run, guards are cancelled) and
        its cleanup runs (the client gives it cleanup_timeout)."""
        self.closed = True
        for hold in list(self.holds.values()):
            self.lose(hold, "the client was closed")
        self.watchdog.close()
        for task, ended in self._watched.values():  # long-lived tasks keep no closed client
            task.remove_done_callback(ended)
        self._watched.clear()

    def counts(self) -> dict[str, int]:
        result = {state.value: 0 for state in HoldState}
        for hold in self.holds.values():
            result[hold.state.value] += 1
        return result


def _why(error: BaseException) -> str:
    """What went wrong, in words a reader of the log can act on."""
    if isinstance(error, ErrorReply):
        return f"Redis answered: {error}"
    if isinstance(error, OutcomeUnknown):
        return f"no reply: {error.__str__().removeprefix('reply lost: ')}"
    return str(error) or type(error).__name__


def _deadline(sent_at: float, lease_ms: int) -> float:
    """When a lease set by a command sent at ``sent_at`` must be taken as over, here."""
    lease = lease_ms / 1000
    return sent_at + lease - (lease * DRIFT_FACTOR + DRIFT_MIN)


def _run_callback(callback: LostCallback, error: LockLostError) -> None:
    try:
        result = callback(error)
        if inspect.isawaitable(result):
            asyncio.ensure_future(result).add_done_callback(_log_failure)
    except Exception:
        logger.exception("aiolock: an on_lost callback failed")


def _log_failure(task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("aiolock: an on_lost callback failed", exc_info=task.exception())


# -- the watchdog ------------------------------------------------------------------------------

#: the process-wide expiration-renewal map: client id -> that client's map (see the docstring)
RENEWALS: dict[str, dict[tuple[str, str], Hold]] = {}
_RENEWALS_LOCK = threading.Lock()


class Watchdog:
    """The renewal task of one client (see the module docstring)."""

    def __init__(self, client_id: str, leases: Leases, transport: Transport, config: Config):
        self._client_id = client_id
        self._leases = leases
        self._transport = transport
        self.period = config.watchdog_timeout / 3
        self.tick = max(self.period / 10, 0.005)
        self._retry_delay = (config.reconnect_delay, config.reconnect_max_delay)
        #: the rounds checking every hold after a server change (Leases.server_changed)
        self._checks: set[asyncio.Task[None]] = set()
        self._lease_ms = max(1, round(config.watchdog_timeout * 1000))
        self._map: dict[tuple[str, str], Hold] = {}
        self._closed = False
        self._queue: list[tuple[float, int, Hold]] = []
        #: holds added since the last tick and when their lease was set: most are released
        #: long before their first renewal, and never enter the queue
        self._fresh: list[tuple[Hold, float]] = []
        self._order = itertools.count()
        self._task: asyncio.Task[None] | None = None
        #: renewal script calls made (each renews up to BATCH holds)
        self.calls = 0
        self._warned_at = -math.inf

    @property
    def renewing(self) -> int:
        return len(self._map)

    def add(self, hold: Hold, sent_at: float) -> None:
        if self._closed:
            return
        if self._map is not RENEWALS.get(self._client_id):
            with _RENEWALS_LOCK:  # in the process-wide map from its first hold until closed
                RENEWALS[self._client_id] = self._map
        self._map[(hold.name, hold.owner.id)] = hold
        hold.due = sent_at + self.period
        self._fresh.append((hold, sent_at))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def remove(self, hold: Hold) -> None:
        key = (hold.name, hold.owner.id)
        if self._map.get(key) is hold:
            del self._map[key]
        hold.due = math.inf

    def _leave(self) -> None:
        with _RENEWALS_LOCK:
            if RENEWALS.get(self._client_id) is self._map:
                del RENEWALS[self._client_id]

    def _schedule(self, hold: Hold, when: float) -> None:
        hold.due = when
        heapq.heappush(self._queue, (when, next(self._order), hold))

    def _serves(self, hold: Hold) -> bool:
        return self._map.get((hold.name, hold.owner.id)) is hold

    async def _run(self) -> None:
        """Renew while there are holds; with none, linger a period before ending (a loop of
        lock and unlock would otherwise start a task per hold)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._map:
                    await asyncio.sleep(self.period)
                    if not self._map:
                        return
                try:
                    await self._sleep_until_due(loop)
                    await self._renew_due(loop)
                except Exception:  # never expected; the renewal task must not die
                    watchdog_logger.exception("aiolock watchdog: a renewal round failed")
                    await asyncio.sleep(self.tick)
        finally:
            self._task = None

    def _promote(self) -> None:
        """Queue the fresh holds still held (each is due a period after it was taken)."""
        fresh, self._fresh = self._fresh, []
        for hold, sent_at in fresh:
            if self._serves(hold) and hold.due == sent_at + self.period:
                self._schedule(hold, hold.due)

    async def _sleep_until_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """Sleep until the earliest renewal is due, a tick at a time (holds added meanwhile
        join the queue each tick)."""
        self._promote()
        queue = self._queue
        while queue:
            when, _, hold = queue[0]
            if hold.due != when or not self._serves(hold):
                heapq.heappop(queue)  # released, lost or rescheduled since
                continue
            wait = when - loop.time()
            if wait <= 0:
                return
            await asyncio.sleep(min(wait, self.tick))
            self._promote()
        if not queue:
            await asyncio.sleep(self.tick)

    async def _renew_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """Renew every hold due within the next tick, grouped per script and batch key."""
        now = loop.time()
        horizon = now + self.tick
        groups: dict[tuple[Script, Hashable], list[Hold]] = {}
        last: list[Coroutine[Any, Any, None]] = []
        queue = self._queue
        while queue and queue[0][0] <= horizon:
            when, _, hold = heapq.heappop(queue)
            if hold.due != when or not self._serves(hold) or hold.renewal is None:
                continue
            if self._leases.current(hold).state is not HoldState.HELD:
                continue  # its deadline passed unconfirmed: lost, not renewed
            if self._near_cap(hold, now):
                # max_hold: the last renewal, carrying the lease up to the cap and no
                # further; the hold is never renewed again, and its lease runs out then
                hold.capped = True
                hold.due = math.inf
                left = math.floor((hold.cap - now) * 1000)
                if left >= 1:
                    last.append(self._renew(hold.renewal.script, [hold], final_ms=left))
                continue
            batch = (hold.renewal.script, self._transport.batch_key(hold.renewal.key))
            groups.setdefault(batch, []).append(hold)
        chunks = [
            (script, holds[start : start + BATCH])
            for (script, _), holds in groups.items()
            for start in range(0, len(holds), BATCH)
        ]
        if chunks or last:
            await asyncio.gather(*(self._renew(script, holds) for script, holds in chunks), *last)

    def _near_cap(self, hold: Hold, now: float) -> bool:
        """Whether a renewal now would carry ``hold``'s lease past its cap (max_hold)."""
        return hold.capped or (hold.cap - now) * 1000 < self._lease_ms

    async def _renew(
        self,
        script: Script,
        holds: list[Hold],
        lease_ms: int | None = None,
        *,
        final_ms: int | None = None,
    ) -> None:
        """Renew ``holds`` (all renewed by ``script``) in one call; with ``lease_ms``, check
        one hold that has a lease_time instead: the script then extends its lease to what
        is left of it, which changes nothing where the hold is, and renews nothing. With
        ``final_ms``, make one hold's last renewal (max_hold), to that lease: confirmed,
        never scheduled again."""
        loop = asyncio.get_running_loop()
        leases = self._leases
        checking = lease_ms is not None
        lease = lease_ms or final_ms or self._lease_ms
        how = (hold.check if checking else hold.renewal for hold in holds)
        keys = tuple(renewal.key for renewal in how if renewal is not None)
        args = (lease, *(hold.field for hold in holds))
        packed = script.command(keys, args)
        self.calls += 1
        sent_at = loop.time()
        epoch = leases.epoch
        try:
            call = await self._transport.send(packed, key=keys[0])
            epoch = call.epoch
            replies = await call.future
        except Exception as exc:  # NotSent, or anything unforeseen: try again next tick
            replies = exc
        metrics = leases.metrics if not checking else None
        if type(replies) is ErrorReply and replies.code == "CROSSSLOT" and len(holds) > 1:
            # Refused before it ran: a server that did not say it is a cluster node (a
            # proxy in front of one). Per slot from now on, and this batch again at once.
            if not self._transport.by_slot:
                self._transport.refused_cross_slot()
                watchdog_logger.warning(
                    "aiolock watchdog: the server refused a renewal across hash slots "
                    "(CROSSSLOT): renewing per slot from now on. Is it a cluster behind a "
                    "proxy? A redis+cluster:// URL would route by slot"
                )
            slots: dict[Hashable, list[Hold]] = {}
            for hold in holds:
                if hold.renewal is not None:
                    slots.setdefault(key_slot(hold.renewal.key), []).append(hold)
            if len(slots) > 1:
                await asyncio.gather(*(self._renew(script, group) for group in slots.values()))
                return
        # the reply of a server that is not the one serving them now
        stale = any(leases.stale(hold, epoch) for hold in holds)
        if isinstance(replies, ErrorReply | OutcomeUnknown | Exception) or stale:
            if not stale:
                self._warn(
                    f"renewing {len(holds)} lock(s) failed ({_why(replies)}); trying again "
                    "next tick, and a hold whose lease runs out first is reported lost"
                )
            for hold in holds:
                if self._serves(hold) and not checking:
                    if metrics is not None and not stale:
                        metrics.renewal(hold.kind, hold.name, False)
                    if final_ms is None:
                        self._schedule(hold, loop.time() + self.tick)
            return
        for hold, renewed in zip(holds, replies, strict=True):
            if checking and hold.state is not HoldState.HELD:
                continue
            if not checking and not self._serves(hold):
                continue  # released (or lost) meanwhile
            if metrics is not None:
                metrics.renewal(hold.kind, hold.name, renewed == 1)
            if renewed == 1:
                hold.epoch = epoch  # it is there, on the server of this epoch
                if final_ms is not None:
                    leases.confirmed(hold, sent_at, final_ms)
                elif not checking:
                    leases.confirmed(hold, sent_at, self._lease_ms)
                    self._schedule(hold, sent_at + self.period)
            elif hold.epoch < leases.epoch_of(hold):
                leases.lose(hold, f"{leases.change_of(hold)}, and the lock is not there")
            else:
                why = "the key is not a lock any more" if renewed == -1 else "gone"
                leases.lose(hold, f"the watchdog found the lock {why} (expired or force-unlocked)")

    # -- after a server change ---------------------------------------------------------------

    def revalidate(self, epoch: int) -> None:
        """Check every hold whose server changed since its last check, now (see the module
        docstring); ``epoch`` is the latest."""
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._revalidate(epoch))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _revalidate(self, epoch: int) -> None:
        """Check the holds not checked since their server changed, in the watchdog's
        batches (renewing those it renews), until each is checked or lost, or a server
        changes again (a newer round takes over: epoch ``epoch`` is over); a check that
        failed is tried again with backoff."""
        loop = asyncio.get_running_loop()
        leases = self._leases
        delay, max_delay = self._retry_delay
        try:
            while not self._closed and leases.epoch == epoch:
                pending = [
                    hold
                    for hold in list(leases.holds.values())
                    if hold.epoch < leases.epoch_of(hold)
                    and leases.current(hold).state is HoldState.HELD
                ]
                if not pending:
                    return
                groups: dict[tuple[Script, Hashable], list[Hold]] = {}
                calls: list[Coroutine[Any, Any, None]] = []
                now = loop.time()
                for hold in pending:
                    if (
                        hold.renewal is not None
                        and self._serves(hold)
                        and not self._near_cap(hold, now)
                    ):
                        batch = (hold.renewal.script, self._transport.batch_key(hold.renewal.key))
                        groups.setdefault(batch, []).append(hold)
                    elif hold.check is None:
                        leases.lose(
                            hold, f"{leases.change_of(hold)}, and the lock cannot be checked"
                        )
                    else:
                        left = math.floor((hold.deadline - loop.time()) * 1000)
                        if left >= 1:  # else its deadline marks it lost
                            calls.append(self._renew(hold.check.script, [hold], left))
                calls.extend(
                    self._renew(script, holds[start : start + BATCH])
                    for (script, _), holds in groups.items()
                    for start in range(0, len(holds), BATCH)
                )
                await asyncio.gather(*calls)
                if any(
                    hold.epoch < leases.epoch_of(hold) and hold.state is HoldState.HELD
                    for hold in pending
                ):
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, max_delay)
        except Exception:  # never expected; the watchdog's own ticks still renew
            watchdog_logger.exception("aiolock watchdog: checking the holds after a change failed")

    def _warn(self, message: str) -> None:
        """Log a failure: a warning at most once per renewal period, the rest at debug
        level (a slow server fails every batch of a tick at once)."""
        now = asyncio.get_running_loop().time()
        if now - self._warned_at >= self.period:
            self._warned_at = now
            watchdog_logger.warning("aiolock watchdog: %s", message)
        else:
            watchdog_logger.debug("aiolock watchdog: %s", message)

    def close(self) -> None:
        """Stop renewing anything and leave the process-wide map."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        for task in self._checks:
            task.cancel()
        self._map.clear()
        self._queue.clear()
        self._fresh.clear()
        self._leave()

    async def wait_closed(self) -> None:
        task = self._task
        if task is not None:
            try:
                await task
            except asyncio.CancelledError:
                pass


__all__ = [
    "BATCH",
    "RENEWALS",
    "Hold",
    "HoldState",
    "Leases",
    "Owner",
    "Renewal",
    "SingleUseOwner",
    "Watchdog",
]
