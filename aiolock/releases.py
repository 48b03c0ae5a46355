"""The release of holds: one count of an owner's hold, in the owner's turn, bounded by
``cleanup_timeout`` and finished in the background past it; a lost hold's counts are given
back with the loss they report."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .commands import (
    cleanup_deadline,
    fence_or_taint,
    fence_until,
    with_acks,
)
from .errors import (
    ClientClosedError,
    LockLostError,
    LockNotOwnedError,
    RedisOperationError,
    RedisTimeoutError,
    RedisUnavailableError,
)
from .holds import Hold, HoldState, Owner
from .operation import (
    Finish,
    Op,
    wait_shielded,
)
from .rules import (
    NOT_RUN,
    Attempt,
    Rule,
)
from .runtime import Runtime
from .settle import (
    best_effort,
    purge,
    register,
    send_give_up,
)
from .transport import (
    ErrorReply,
    OutcomeUnknown,
    first_reply,
    is_readonly,
)

logger = logging.getLogger("aiolock")


# -- releasing -------------------------------------------------------------------------------


def not_owned(rule: Rule, owner: Owner) -> LockNotOwnedError:
    return LockNotOwnedError(
        f"lock {rule.name!r} is not held by {owner.id}", name=rule.name, owner=owner.id
    )


async def release(rt: Runtime, rule: Rule, owner: Owner) -> None:
    """Release one count of ``owner``'s hold; the last one releases the object.

    Raises LockNotOwnedError if the owner holds none, LockLostError if its hold was lost
    (each unlock of a lost hold says so once), RedisOperationError subclasses if the release
    could not be confirmed within cleanup_timeout (it goes on in the background then, and
    the hold is never renewed again). Once called, it completes even if the caller is
    cancelled: the command goes out before the first suspension, or the whole release runs
    in a task of its own."""
    hold = rt.leases.get(rule.name, owner)
    if hold is not None:
        rt.leases.current(hold)
        if not hold.count and hold.stale:
            error = rt.leases.unlock_stale(hold)
            if not hold.stale and hold.busy:
                # its cleanup is still removing it from the server: let it end first (within
                # the unlock's bound), so the owner's next acquire finds its turn free
                await _wait_for_turn(rt, hold)
            raise error
    if rt.leases.closed:
        raise ClientClosedError(f"the client is closed; releasing {rule.name!r} is not possible")
    if hold is None or not hold.count:
        raise not_owned(rule, owner)
    loop = asyncio.get_running_loop()
    deadline = cleanup_deadline(loop.time(), rt.config)
    op = Op(rt, rule, owner, hold)
    if hold.take_turn():
        op.owns_turn = True
        try:
            await _release_one(op, deadline)
        finally:
            op.end()
        return
    # The owner's previous operation is still running (perhaps in the background, its
    # caller gone): the release queues behind it in a task of its own, which goes on
    # however long that takes, so an unlock once called is never dropped. The caller waits
    # for it until its deadline (cancelled or not), then leaves it to the background.
    task = rt.spawn(_release_later(op, deadline))
    try:
        await asyncio.wait((task,), timeout=max(0.0, deadline - loop.time()))
    except asyncio.CancelledError:
        await wait_shielded(task, max(0.0, deadline - loop.time()))
        task.add_done_callback(_log_release_failure)  # its caller is gone: nobody else hears
        raise
    if task.done():
        task.result()  # the release's own error, if any
        return
    task.add_done_callback(_log_release_failure)
    raise RedisTimeoutError(
        f"releasing {rule.name!r} was not confirmed within cleanup_timeout (it queued behind "
        "the owner's previous operation on it); it goes on in the background"
    )


def release_lost(rt: Runtime, rule: Rule, owner: Owner) -> LockLostError | None:
    """Give back one lost count of ``owner``'s hold, as :func:`release` does, but without
    waiting for the hold's cleanup still under way (it goes on in the background): what a
    guard does when it tells a loss, at once. The loss given back (None: nothing to give
    back, nothing done)."""
    hold = rt.leases.get(rule.name, owner)
    if hold is not None:
        rt.leases.current(hold)
        if not hold.count and hold.stale:
            return rt.leases.unlock_stale(hold)
    return None


def _log_release_failure(task: asyncio.Task[None]) -> None:
    """A release whose caller left (cancelled, or its time ran out) failed: say so."""
    if not task.cancelled() and (error := task.exception()) is not None:
        logger.warning("aiolock: a release left to the background failed: %s", error)


async def _wait_for_turn(rt: Runtime, hold: Hold) -> None:
    """Wait until the owner's operations on ``hold`` under way (a cleanup) have ended, at
    most until a release started now would give up (see cleanup_deadline)."""
    try:
        async with asyncio.timeout_at(
            cleanup_deadline(asyncio.get_running_loop().time(), rt.config)
        ):
            await hold.wait_turn()
    except TimeoutError:
        return
    hold.end_turn()
    rt.leases.forget_if_idle(hold)


async def _release_later(op: Op, deadline: float) -> None:
    """Release one count once the owner's operations before this one have ended, however
    long they take (each is bounded by its own commands' bounds; a caller that waits for
    this is bounded by ``deadline``). A turn that comes after ``deadline`` gets a fresh
    cleanup_timeout for the release itself: the caller has left, and a release out of time
    before it is even sent would end in a purge (the hold lost) for no reason."""
    hold, rule = op.hold, op.rule
    assert hold is not None
    try:
        await op.begin(None)
        if not hold.count:  # lost meanwhile
            if hold.stale:
                raise op.rt.leases.unlock_stale(hold)
            raise not_owned(rule, hold.owner)
        now = asyncio.get_running_loop().time()
        await _release_one(op, deadline if deadline > now else now + op.rt.config.cleanup_timeout)
    finally:
        op.end()


async def _release_one(op: Op, deadline: float | None) -> None:
    rt, rule, hold = op.rt, op.rule, op.hold
    assert hold is not None
    owner = hold.field
    before = hold.count
    if before == 1:
        rt.leases.releasing(hold)  # renewal stops now, whatever follows
    packed = with_acks(rt.config, rule.release(owner, hold.lease_ms, before))
    readonly: Any = None

    for _ in range(rt.config.retry_attempts + 1):
        call = rt.transport.send_now(packed, key=rule.key)
        if call is None:
            try:
                call = await op.send(packed, deadline)
            except (RedisUnavailableError, asyncio.CancelledError):
                _failed(rt, hold)  # nothing was sent: the cleanup removes the hold
                raise
        sent_at, epoch = call.sent_at, call.epoch
        # op.outcome() inlined (one frame less); what finishes a release its caller leaves is
        # made only when it leaves (cancelled, out of time, or the reply lost with its link)
        if op.link_bounds(call, deadline):
            try:
                reply = await call.future  # the link's health check bounds it
            except asyncio.CancelledError:
                await op.cancelled(call, _finishing(op, owner, sent_at, epoch))
                raise
        else:
            reply = await op.reply(call, deadline, _finishing(op, owner, sent_at, epoch))
        if isinstance(reply, OutcomeUnknown):
            reply = await op.settle(
                reply,
                deadline,
                lambda: rule.settle_release(rt, owner, before),
                _finishing(op, owner, sent_at, epoch),
            )
        if reply is NOT_RUN:
            continue
        if type(reply) is tuple:
            reply, acks = reply
            if not is_readonly(reply) and not (isinstance(acks, int) and acks > 0):
                # Released on the master; a failover before it reached a replica would bring
                # the hold back until its lease runs out (nobody renews it any more).
                logger.warning(
                    "aiolock: releasing %r: no replica acknowledged it (WAIT %d: %s)",
                    rule.name,
                    rt.config.replica_acks,
                    acks,
                )
        if is_readonly(reply):
            readonly = reply  # ran into a replica, wrote nothing: sent again to the master
            continue
        if reply is None or type(reply) is bool:  # settled
            outcome = reply
            if outcome is True and rt.leases.stale(hold, hold.epoch):
                # Settled by reading a server the hold was never checked on (it restarted,
                # or another master took over, since the hold was granted or last checked):
                # the owner holding nothing there cannot tell a release that ran from a
                # hold the change wiped.
                raise rt.leases.lose(
                    hold,
                    f"{rt.leases.change_of(hold)}, before its release was confirmed there",
                    used=1,
                )
        elif isinstance(reply, ErrorReply):
            _failed(rt, hold)
            raise RedisOperationError(f"releasing {rule.name!r} failed: {reply}")
        else:
            outcome = rule.parse_release(reply)
        if outcome is None:
            # The server says the owner holds nothing (its lease ran out or it was
            # force-unlocked before anyone here noticed), or another count than it expects:
            # the hold is lost, and what is left of it on the server removed.
            rt.leases.lose(hold, "its lease expired, it was force-unlocked, or it was changed")
            raise rt.leases.unlock_stale(hold)
        lost = _released(op, outcome, sent_at, epoch)
        if lost is not None:
            raise lost  # the server changed before the release was confirmed there
        return
    _failed(rt, hold)
    if readonly is not None:
        raise RedisUnavailableError(f"releasing {rule.name!r}: no master answered ({readonly})")
    raise RedisUnavailableError(f"releasing {rule.name!r}: sent again and again, never ran")


def _failed(rt: Runtime, hold: Hold) -> None:
    """The release cannot be confirmed: the hold is lost (no count of it can be trusted, and
    a lost hold is never renewed) and its cleanup purges it in the background, which is
    harmless whatever a late release does. This unlock used up its own count."""
    rt.leases.lose(hold, "a release of it could not be confirmed", used=1)


def _finishing(op: Op, owner: str, sent_at: float, epoch: int) -> Finish:
    """What finishes, in the background, a release (sent at ``sent_at`` on link ``epoch``)
    whose caller left."""
    rt, rule, hold = op.rt, op.rule, op.hold
    assert hold is not None

    async def finish(value: Any) -> None:
        value = first_reply(value)
        if isinstance(value, OutcomeUnknown):
            # Its link dropped after the caller left: the release may still run. It must
            # not match the owner's next hold, which waits for this turn (see Leases.taint).
            await fence_or_taint(rt, value, hold, owner)
        outcome = (
            None if isinstance(value, OutcomeUnknown | ErrorReply) else rule.parse_release(value)
        )
        if outcome is None:
            _failed(rt, hold)
        else:
            _released(op, outcome, sent_at, epoch)  # a loss is told to on_lost

    return finish


def _released(op: Op, last: bool, sent_at: float, epoch: int) -> LockLostError | None:
    hold = op.hold
    assert hold is not None
    if last or hold.count <= 1 or hold.state is not HoldState.HELD:
        return op.rt.leases.released(hold, epoch)
    return op.rt.leases.released_one(hold, sent_at, epoch)


async def undo_attempt(
    op: Op, value: Any, before: int, lease_ms: int, renew: bool, sent_at: float, epoch: int
) -> None:
    """Background: an attempt's caller left; give back what the attempt obtained (or take
    the owner out of the server's waiting state, when it obtained nothing)."""
    rt, rule, hold = op.rt, op.rule, op.hold
    owner = op.field
    value = first_reply(value)
    if isinstance(value, OutcomeUnknown):
        until = asyncio.get_running_loop().time() + lease_ms / 1000
        if not await fence_until(rt, value, until):
            if hold is not None:
                rt.leases.taint(hold, owner)
            # It may still run: remove what the owner has (an outer hold of the owner can no
            # longer be trusted either); a grant arriving later expires unrenewed.
            if hold is None:
                logger.warning(
                    "aiolock: %r: could not find out whether an acquire whose reply was lost "
                    "took it; if it did, the hold expires with its lease",
                    rule.name,
                )
            elif hold.count:
                rt.leases.lose(hold, "the reply of a nested acquire was lost")
            else:
                await purge(rt, rule, owner, lease_ms, hold)
            return
        settled = await rule.settle_attempt(rt, owner, before)
        result = Attempt(False) if settled is NOT_RUN else settled
        assert isinstance(result, Attempt)
    elif isinstance(value, ErrorReply):
        result = Attempt(False)
    else:
        result = rule.parse(value)
    if not result.granted:
        give_up = rule.give_up(owner)
        if give_up is not None:
            await send_give_up(rt, rule, give_up)
    elif hold is None:
        cmd = rule.undo(owner, result)
        if cmd is not None:
            await best_effort(rt, rule, cmd)
    elif before and hold.state is not HoldState.HELD:
        pass  # it re-entered a hold lost meanwhile: the loss's cleanup removes it
    elif not register(op, result, lease_ms, renew, sent_at, epoch):
        await purge(rt, rule, owner, lease_ms, hold)  # late or from another server: removed
    elif before:
        await _release_one(op, None)
    else:
        rt.leases.releasing(hold)
        await purge(rt, rule, owner, lease_ms, hold)
        rt.leases.released(hold)
