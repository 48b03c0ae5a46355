"""THE acquisition loop, shared by every lock type (the acquisition layer's other modules:
``rules`` what a type tells the loop, ``commands`` one bounded command, ``operation`` an
owner's operation in its hold's turn, ``settle`` what could not be concluded at once,
``releases`` the release of holds).

A lock type describes itself with a :class:`Rule`: the script that tries to take it and what
its reply means, the channel a release is announced on and how many waiters a message
wakes, the release script, how to settle a lost reply, how to remove an owner's counts. The
loop does the rest, once for every type (Redisson's loop)::

    try --granted--> done
     |  busy (the holder's TTL)
    subscribe (confirmed) -> try again if the subscription came after the try
     |  busy
    wait for a wake-up, at most the holder's TTL and the time left -> try again -> ...

Bounds. ``try_lock(wait_time=W)`` returns or raises within ``W + command_timeout``: nothing
is sent after the wait ends, and each command is bounded by its link's health check
(``command_timeout``), or by a timer of the caller's own when that would come too late. A
release is bounded by ``cleanup_timeout``. A bound is when the call has returned, so each
gives up a small margin before it (see :func:`margin`); whatever is not done by then
(giving back a grant, settling a lost reply, a release) goes on in the background, in the
owner's turn on the hold.

Cancellation (and a caller's deadline passing with a command in flight) never leaks: the
command's outcome is handed to a background cleanup that holds the owner's turn on the hold
(so the owner's next operation waits for it), undoes a grant, and settles a lost reply; the
cancelled caller waits for it at most ``cleanup_timeout`` (shielded, also from anyio cancel
scopes) and then gets its CancelledError back unchanged.

Lost replies. A command whose link dropped may or may not have run, and may still run later.
Nothing is concluded until the transport has fenced the dropped link (``CLIENT KILL``); then
the rule reads what happened, and a command proven not to have run is sent again. When the
link cannot be fenced, an acquire is never sent again and whatever it may have taken is
removed by the cleanup (or expires with its lease, unrenewed); a release is never sent again
either, and the hold is purged instead (removing an owner's counts is harmless whatever a
late release does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from .commands import (
    give_up_point,
    past,
    with_acks,
)
from .errors import (
    ClientClosedError,
    LockLostError,
    RedisOperationError,
    RedisUnavailableError,
    ReplicationError,
    SubscriptionError,
)
from .holds import HoldState, Owner
from .operation import (
    Finish,
    Op,
    ready,
)
from .pubsub import Entry
from .releases import (
    undo_attempt,
)
from .rules import (
    NOT_RUN,
    Attempt,
    Rule,
)
from .runtime import Runtime
from .settle import (
    purge_in_turn,
    register,
    roll_back,
    send_give_up,
)
from .transport import (
    ErrorReply,
    NotSent,
    OutcomeUnknown,
    SubscribeRefused,
    is_readonly,
)

logger = logging.getLogger("aiolock")


# -- acquiring -------------------------------------------------------------------------------


def acquire(
    rt: Runtime,
    rule: Rule,
    owner: Owner,
    *,
    wait: float | None,
    lease_ms: int,
    renew: bool,
) -> Coroutine[Any, Any, Attempt | None]:
    """Take one count of ``rule``'s object for ``owner``, waiting at most ``wait`` seconds
    (None: as long as it takes): the acquisition to await, whose result is the grant, or
    None if the wait ran out. A grant of a hold rule is a count of the owner's hold
    (``rt.leases.get(rule.name, owner)``). With metrics, the acquisition is recorded."""
    run = _acquire(rt, rule, owner, wait=wait, lease_ms=lease_ms, renew=renew)
    metrics = rt.metrics
    if metrics is None or not metrics.recording():
        return run
    return metrics.acquisition(rule.kind, rule.name, run)


async def _acquire(
    rt: Runtime,
    rule: Rule,
    owner: Owner,
    *,
    wait: float | None,
    lease_ms: int,
    renew: bool,
) -> Attempt | None:
    loop = asyncio.get_running_loop()
    now = loop.time()
    wait_until = None if wait is None else now + wait
    give_up_at = give_up_point(wait_until, rt.config)
    # (Few locals, and a shallow stack: each is a slot of the frame every parked waiter
    # keeps, issue 18.)
    op = _operation(rt, rule, owner)
    #: an attempt was sent and did not end in a grant (what ends without one gives up)
    tried = False
    try:
        if op.hold is None and rule.holds:
            op.owns_turn = True  # the turn on the record to be made: nothing else can have it
            op.field = rt.leases.next_field(rule.name, owner.id)
        elif op.hold is not None and not await _begin(op, give_up_at):
            return None  # the owner's previous operation on it did not end in time
        wait_ms = None if wait is None else round(wait * 1000)
        entry = rt.pubsub.entry(rule.channel(op.field))
        if (
            entry is not None
            and (wait_until is None or wait_until > now)
            and entry.waiting
            and entry.confirmed_at is not None
            and entry.holder_until > now
            and (op.hold is None or not op.hold.count)
            and rule.queue_locally
        ):
            # Tasks of this client already wait for it under a live lease: queue behind them
            # instead of barging in with a try that would fail (a round trip saved, and first
            # come first served among local waiters). Never for a reentrant acquire.
            result = Attempt(False, round((entry.holder_until - now) * 1000))
        else:
            tried = True
            result = await _try(op, lease_ms, wait_ms, renew, give_up_at)
            if result.granted:
                tried = False
                return result
            if wait_until is not None and loop.time() >= wait_until:
                return None
        entry = await _subscribe(rt, rule, rule.channel(op.field), op.field, wait_until)
        if entry is None:
            return None
        try:
            # A release between our try and a subscription confirmed after it sent no
            # message we could see: try again. One confirmed before the try needs no retry.
            if entry.confirmed_at is None or entry.confirmed_at > now:
                tried = True
                result = await _try(op, lease_ms, wait_ms, renew, give_up_at)
                if result.granted:
                    tried = False
                    return result
            del now  # a parked waiter keeps only what it needs (issue 18)
            while True:
                until = _wait_bound(rt, entry, result.ttl_ms, wait_until)
                del result  # (and its TTL): the next try makes a new one
                if wait_until is not None and loop.time() >= wait_until:
                    return None
                if rt.pubsub.closed:  # it closed while a try was in flight: nobody wakes it
                    raise ClientClosedError(f"the client closed while waiting for {rule.name!r}")
                if entry.refused is not None:  # nobody would wake it (an ACL change)
                    raise SubscriptionError(f"waiting for {rule.name!r}: {entry.refused}")
                woken = entry.park(until, rule.weight)
                try:
                    await woken
                    if rt.pubsub.closed:
                        raise ClientClosedError(
                            f"the client closed while waiting for {rule.name!r}"
                        )
                    if wait_until is not None and loop.time() >= wait_until:
                        entry.pass_on(woken, rule.weight)  # a wake-up it will not use
                        return None
                    tried = True
                    result = await _try(op, lease_ms, wait_ms, renew, give_up_at)
                except BaseException:
                    # it leaves (cancelled, an error) with the wake-up unused, perhaps with
                    # what was released still free: the next waiter re-checks instead
                    entry.pass_on(woken, rule.weight)
                    raise
                if result.granted:
                    tried = False
                    return result
        finally:
            rt.pubsub.release(entry)
    finally:
        if tried and not op.handed_over:
            _give_up(op)
        if op.owns_turn:
            op.end()
        elif op.hold is not None and not op.handed_over:
            rt.leases.forget_if_idle(op.hold)  # it never got the turn


def _wait_bound(rt: Runtime, entry: Entry, ttl_ms: int | None, wait_until: float | None) -> float:
    """Until when a waiter parks: the holder's TTL (as its last try saw it; also noted on
    the entry) or its own time left, whichever ends first."""
    until = wait_until
    if ttl_ms is not None and ttl_ms >= 0:
        holder_until = asyncio.get_running_loop().time() + ttl_ms / 1000
        if holder_until > entry.holder_until:
            entry.holder_until = holder_until
        return holder_until if until is None or holder_until < until else until
    if until is None:
        # No TTL to bound the wait (a key without one): check again now and then anyway,
        # so a lost message can never leave a waiter hanging.
        until = asyncio.get_running_loop().time() + rt.config.watchdog_timeout
    return until


def _operation(rt: Runtime, rule: Rule, owner: Owner) -> Op:
    """The acquisition's operation, on the owner's hold record, or on none yet: a task's
    first acquisition of the object makes its record at the grant, or when it leaves work
    to the background (Leases.for_acquire)."""
    return Op(
        rt, rule, owner, rt.leases.for_acquire(rule.name, owner, rule.kind) if rule.holds else None
    )


async def _begin(op: Op, give_up_at: float | None) -> bool:
    """Take the owner's turn on its hold record (False: the owner's operation before did
    not end by ``give_up_at``) and check that the hold can be taken again."""
    hold, rt, rule = op.hold, op.rt, op.rule
    assert hold is not None
    try:
        await op.begin(give_up_at)
    except TimeoutError:
        return False
    rt.leases.current(hold)
    if hold.stale:
        raise LockLostError(
            f"{hold.lost}; unlock it as often as it was taken before taking it again",
            name=rule.name,
            owner=op.owner.id,
        )
    if not hold.count:
        # A new generation: the owner id it writes is chosen now that the work of the one
        # before has ended (a taint it made applies to this acquire).
        op.field = rt.leases.next_generation(hold)
    return True


async def _subscribe(
    rt: Runtime, rule: Rule, channel: bytes, owner: str, wait_until: float | None
) -> Entry | None:
    """Borrow the channel's entry once subscribed (None: the wait ran out first). A pub/sub
    connection that failed to open is tried again, as a command's is."""
    for attempt in range(rt.config.retry_attempts + 1):
        try:
            return await rt.pubsub.subscribe(
                channel, key=rule.channel_key(owner), wakes=rule.wakes, deadline=wait_until
            )
        except TimeoutError:
            return None
        except SubscribeRefused as exc:
            raise SubscriptionError(f"waiting for {rule.name!r}: {exc}") from exc
        except NotSent as exc:
            if rt.closed or rt.pubsub.closed:
                raise ClientClosedError(
                    f"the client closed while subscribing to wait for {rule.name!r}"
                ) from exc
            if attempt == rt.config.retry_attempts or past(wait_until):
                raise RedisUnavailableError(f"waiting for {rule.name!r}: {exc}") from exc
    raise AssertionError("unreachable")  # pragma: no cover


def _give_up(op: Op) -> None:
    """Tell the server an acquisition ended without a grant, in the background and in the
    owner's turn (so that its next acquisition cannot be overtaken by it). Also when the
    client is closing (a waiter woken by aclose): aclose waits for it, within its bound,
    before the connections close, so a closed client's waiters leave the line."""
    rt, rule = op.rt, op.rule
    give_up = rule.give_up(op.field)
    if give_up is None or rt.transport.closed:
        return

    async def send(_: Any) -> None:
        await send_give_up(rt, rule, give_up)

    if op.owns_turn:
        op.hand_over(ready(None), send)
    else:
        rt.spawn(send(None))


def _undoing(op: Op, before: int, lease_ms: int, renew: bool, sent_at: float, epoch: int) -> Finish:
    """What finishes an attempt its caller left (see releases.undo_attempt)."""

    async def finish(value: Any) -> None:
        await undo_attempt(op, value, before, lease_ms, renew, sent_at, epoch)

    return finish


async def _try(
    op: Op, lease_ms: int, wait_ms: int | None, renew: bool, give_up_at: float | None
) -> Attempt:
    """One attempt (sent again only when proven not to have run); a grant is registered."""
    rt, rule = op.rt, op.rule
    owner = op.field
    if op.hold is not None and op.hold.stale:
        # The hold this acquisition re-enters was lost while it waited (a server change
        # found it gone): as at the start, its lost counts are unlocked before a new grant.
        raise LockLostError(
            f"{op.hold.lost}; unlock it as often as it was taken before taking it again",
            name=rule.name,
            owner=owner,
        )
    before = op.hold.count if op.hold is not None else 0
    acks_wanted = rt.config.replica_acks if rule.replicated else 0
    packed = rule.attempt(owner, lease_ms, wait_ms)
    if acks_wanted:
        packed = with_acks(rt.config, packed)
    readonly: Any = None
    for _ in range(rt.config.retry_attempts + 1):
        call = rt.transport.send_now(packed, key=rule.key) or await op.send(packed, give_up_at)
        sent_at, epoch = call.sent_at, call.epoch
        # op.outcome() inlined (one frame less), its handlers made only when needed: on the
        # link-bounded path nothing is allocated for cancellation or lost replies
        if op.link_bounds(call, give_up_at):
            try:
                reply = await call.future  # the link's health check bounds it
            except asyncio.CancelledError:
                await op.cancelled(call, _undoing(op, before, lease_ms, renew, sent_at, epoch))
                raise
        else:
            finish = _undoing(op, before, lease_ms, renew, sent_at, epoch)
            reply = await op.reply(call, give_up_at, finish)
        if isinstance(reply, OutcomeUnknown):
            reply = await op.settle(
                reply,
                give_up_at,
                lambda: rule.settle_attempt(rt, owner, before),
                _undoing(op, before, lease_ms, renew, sent_at, epoch),
            )
        if reply is NOT_RUN:
            continue
        acks: Any = None
        if type(reply) is tuple:
            reply, acks = reply
        if is_readonly(reply):
            # It ran into a replica (the master was demoted) and wrote nothing: the link is
            # replaced, and the attempt sent again to wherever the master is now.
            readonly = reply
            continue
        if isinstance(reply, Attempt):  # settled
            result = reply
        elif isinstance(reply, ErrorReply):
            raise RedisOperationError(f"acquiring {rule.name!r} failed: {reply}")
        else:
            result = rule.parse(reply)
        if result.granted and acks_wanted and not (isinstance(acks, int) and acks > 0):
            # Given back within the call's bound, or else in the background (in the turn).
            given_back = await op.within(roll_back(op, result, before, lease_ms), give_up_at)
            raise _replication_error(rt, rule, acks, given_back)
        if result.granted and rule.holds:
            hold = op.record()  # (a deferred record is made now, in this operation's turn)
            if rt.leases.closed:
                # The client closed meanwhile: no grant; give it back before saying so.
                await purge_in_turn(op, lease_ms, give_up_at)
                raise ClientClosedError(f"the client closed while acquiring {rule.name!r}")
            if before and hold.state is not HoldState.HELD:
                # The hold this re-entered was lost meanwhile: the grant belongs to a lost
                # generation (the loss's cleanup removes the owner's counts).
                assert hold.lost is not None
                raise LockLostError(str(hold.lost), name=rule.name, owner=owner)
            if not register(op, result, lease_ms, renew, sent_at, epoch):
                if before:  # the hold it re-entered was lost (see Leases.granted)
                    assert hold.lost is not None
                    raise LockLostError(str(hold.lost), name=rule.name, owner=owner)
                # It came after its own lease ran out, or from a server that is not the one
                # now: no grant, and removed before anything else is tried (a try after it
                # would re-enter it). If that takes the rest of the call's time, the removal
                # goes on in the background and the caller tries nothing more: its waiting
                # ended long before (margin < command_timeout).
                await purge_in_turn(op, lease_ms, give_up_at)
                return Attempt(False, 0)
        return result
    if readonly is not None:
        raise RedisUnavailableError(f"acquiring {rule.name!r}: no master answered ({readonly})")
    raise RedisUnavailableError(f"acquiring {rule.name!r}: sent again and again, never ran")


def _replication_error(
    rt: Runtime, rule: Rule, acks: Any, given_back: bool = True
) -> ReplicationError:
    wanted = rt.config.replica_acks
    timeout = rt.config.replica_ack_timeout
    if isinstance(acks, int):
        why = f"no replica acknowledged it within {timeout:g} s (WAIT {wanted}: {acks})"
    elif acks is None:
        why = "its reply was lost, so whether a replica acknowledged it is unknown"
    else:
        why = f"WAIT failed: {acks}"
    back = "was given back" if given_back else "is being given back in the background"
    return ReplicationError(
        f"acquiring {rule.name!r}: {why}; the grant {back} (replica_acks={wanted})",
        acknowledged=acks if isinstance(acks, int) else None,
        requested=wanted,
    )
