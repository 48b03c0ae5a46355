"""The lease registry: every hold of one client, in one place, and the watchdog renewing them.

A :class:`Hold` is one owner's hold on one object. Its life is a small state machine, one
table (:data:`aiolock.holds.TRANSITIONS`, drawn in that module's docstring) that
:func:`~aiolock.holds.move` reads, raising on a pair not in it; every event is fired by the
method of :class:`Leases` of its name (``granted``, ``releasing``, ``released``, ``lose``),
and nothing else moves a hold::

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

A task's first acquisition of an object makes no record while it waits: the record is made
at its grant, or when it leaves work to the background (:meth:`Leases.for_acquire`,
:meth:`Leases.adopt`); nothing else of the task's owner can run on the object meanwhile.

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
import inspect
import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any

from .config import Config
from .errors import ClientClosedError, LockLostError
from .holds import (
    Cleanup,
    Hold,
    HoldEvent,
    HoldState,
    LostCallback,
    Owner,
    Renewal,
    check_callback,
    local_deadline,
    move,
)
from .metrics import Metrics
from .tasks import new_id
from .transport import Transport
from .watchdog import RENEWALS, Watchdog

logger = logging.getLogger("aiolock")

#: server changes whose words are kept for messages
_CHANGES_KEPT = 64

# What every acquire and release reads, as module globals: on Python 3.11 an enum member read
# off its class (HoldEvent.GRANTED) goes through EnumType.__getattr__, about 3x slower.
_GRANTED, _RELEASING, _RELEASED, _LOST = (
    HoldEvent.GRANTED,
    HoldEvent.RELEASING,
    HoldEvent.RELEASED,
    HoldEvent.LOST,
)
_OVER = HoldState.RELEASED


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

    def for_acquire(self, name: str, owner: Owner, kind: str) -> Hold | None:
        """The record an acquisition of ``owner`` on ``name`` works on: the owner's hold if
        it has one (held, or with work of the owner under way on it), else a new one; or None
        when the owner is the running task: its first acquisition of ``name`` makes its
        record only when it needs one, at its grant or when it leaves work to the background
        (:meth:`adopt`). Nothing else of that owner can run on ``name`` meanwhile (a task
        runs one operation at a time; its background work keeps a record), so a task waiting
        for a lock costs no record (issue 18)."""
        hold = self.holds.get((name, owner.id))
        if hold is not None:
            return hold
        if self.closed:
            raise ClientClosedError("the client is closed")
        task = owner.task
        if task is not None and task is asyncio.current_task():
            return None
        hold = Hold(name, owner, self._next_field(name, owner.id), kind)
        self.holds[(name, owner.id)] = hold
        return hold

    def adopt(self, name: str, owner: Owner, field: str, kind: str) -> tuple[Hold, bool]:
        """The record of an acquisition that started without one (:meth:`for_acquire`),
        made now with the owner's turn on it taken for the acquisition (which held that turn
        all along: nothing else of the owner ran on ``name``), writing ``field``; and
        whether the turn is the acquisition's (True).

        Only an owner of a task used by another task at the same time (the library never
        does that) can find a record there already: the two cannot be put in order any
        more; the acquisition goes on with that record, without its turn."""
        key = (name, owner.id)
        hold = self.holds.get(key)
        if hold is not None:
            logger.warning(
                "aiolock: owner %s of a task was used for %r by another task while that task "
                "was acquiring it; their operations may overlap (share an owner across tasks "
                "with new_owner())",
                owner.id,
                name,
            )
            return hold, False
        hold = Hold(name, owner, field, kind)
        hold.take_turn()
        self.holds[key] = hold
        return hold, True

    def next_field(self, name: str, owner_id: str) -> str:
        """The owner id the next generation of ``owner_id``'s hold on ``name`` writes."""
        return self._next_field(name, owner_id)

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
        if first:
            now = asyncio.get_running_loop().time()
            if local_deadline(sent_at, lease_ms) <= now:
                return False
        move(hold, _GRANTED)  # first: an illegal grant changes nothing
        hold.cleanup = cleanup
        hold.count += 1
        if first:
            if self.metrics is not None and self.metrics.recording():
                hold.since = now
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
        deadline = max(hold.deadline, local_deadline(sent_at, lease_ms))
        if deadline <= asyncio.get_running_loop().time():
            self.lose(hold, "its lease ran out before the server's answer arrived")
            return False
        if deadline != hold.deadline:
            hold.deadline = deadline
            if hold.timer is not None:
                self._arm(hold)
        return True

    def _arm(self, hold: Hold) -> None:
        """A timer at the hold's deadline, for those who want to be told at once (on_lost,
        guard); without them the deadline is checked lazily (:meth:`current`)."""
        if hold.timer is not None:
            hold.timer.cancel()
        hold.timer = asyncio.get_running_loop().call_at(hold.deadline, self._expired, hold)

    def _expired(self, hold: Hold) -> None:
        hold.timer = None
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
        move(hold, _RELEASING)
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
        if hold.state is _OVER:
            # Its owner force-unlocked it while this release was in flight: over already.
            self.forget_if_idle(hold)
            return None
        self._end(hold, _RELEASED)
        hold.count = 0
        hold.token = None
        hold.callbacks.clear()  # released, never lost: they are not due, now or later
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
        self._end(hold, _LOST)
        error = hold.lost = LockLostError(
            f"lock {hold.name!r} held by {hold.owner.id} was lost: {reason}",
            name=hold.name,
            owner=hold.owner.id,
        )
        hold.stale += hold.count - used
        hold.count = 0
        loop = asyncio.get_running_loop()
        for callback in hold.callbacks:
            loop.call_soon(_run_callback, callback, error)
        hold.callbacks.clear()
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

    def _end(self, hold: Hold, event: HoldEvent) -> None:
        """The only way out of HELD (or RELEASING): released or lost. It ends the hold's
        generation: nothing of it may carry over into the next one. (The owner's next
        acquire may be granted on this same record: it queued for the hold's turn while this
        generation was still being released or cleaned up in the background.)"""
        move(hold, event)  # first: an illegal end changes nothing
        if self.metrics is not None and hold.since:
            seconds = asyncio.get_running_loop().time() - hold.since
            self.metrics.hold_ended(hold.kind, hold.name, seconds, event is _LOST)
        hold.since = 0.0
        hold.deadline = math.inf
        if hold.timer is not None:
            hold.timer.cancel()
            hold.timer = None
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
        check_callback(callback)
        self.current(hold)
        if hold.state is HoldState.LOST and hold.lost is not None:
            asyncio.get_running_loop().call_soon(_run_callback, callback, hold.lost)
            return lambda: None
        hold.callbacks.append(callback)
        if hold.timer is None and hold.state is HoldState.HELD:
            self._arm(hold)

        def remove() -> None:
            if callback in hold.callbacks:
                hold.callbacks.remove(callback)

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
        """Holds by state. Once the client is closed its lost holds are not counted: the
        close lost them all, nothing is kept alive for them any more (they stay only so
        that their owners' ``unlock()`` and ``on_lost`` still tell the loss)."""
        result = {state.value: 0 for state in HoldState}
        for hold in self.holds.values():
            result[hold.state.value] += 1
        if self.closed:
            result[HoldState.LOST.value] = 0
        return result


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


__all__ = [
    "RENEWALS",
    "Hold",
    "HoldState",
    "Leases",
    "Owner",
    "Renewal",
    "Watchdog",
]
