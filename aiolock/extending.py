"""``extend()``: push the lease of a hold taken with a fixed lease, if its owner still holds it.

A hold taken with ``lease_time`` is never renewed; ``extend(seconds)`` sets its lease to run
out ``seconds`` from now (never sooner than it already would), atomically and only while the
owner still holds it on the server. It runs the type's own renewal script (the watchdog's:
``KEYS[1]`` the object, ``ARGV[1]`` the lease, ``ARGV[2]`` the owner id; it replies 1, 0 for
gone, -1 for not a lock), for this one hold, in the owner's turn (so it never races the
owner's unlock), bounded by ``command_timeout``.

Its local record follows the server's word only: the hold's deadline moves when a reply
saying "extended" arrives, never before. A reply that is lost (the link dropped) is settled
by fencing the link and sending the extend again (running it twice is the same as once: the
lease runs out ``seconds`` after the later one), within the call's time or else in the
background; a caller that is cancelled or runs out of time leaves the reply to the
background, which applies it when it comes. Until then the holder's deadline is the old
one, which never comes after the server's: at worst the hold is reported lost at the old
deadline (and removed from the server) while the server had extended it, never the other
way round. A link that cannot be fenced taints the owner id (``Leases.taint``), so the late
request can never touch a later hold of the owner.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .commands import command, fence_or_taint, fence_until, margin
from .errors import (
    ClientClosedError,
    LockLostError,
    LockUsageError,
    RedisOperationError,
    RedisTimeoutError,
)
from .holds import Hold, HoldState, Owner
from .operation import Op
from .releases import not_owned
from .rules import NOT_RUN, Command, Rule
from .runtime import Runtime
from .transport import ErrorReply, NotSent, OutcomeUnknown, is_readonly

logger = logging.getLogger("aiolock")


async def extend(rt: Runtime, rule: Rule, owner: Owner, lease_ms: int) -> None:
    """Make ``owner``'s hold on ``rule``'s object run out ``lease_ms`` from now (see the
    module docstring). LockNotOwnedError if it holds nothing, LockLostError if its hold was
    lost (found gone by this call or before), LockUsageError if the watchdog renews it."""
    leases = rt.leases
    hold = leases.get(rule.name, owner)
    if hold is not None:
        leases.current(hold)
        if not hold.count and hold.stale:
            assert hold.lost is not None
            raise hold.lost  # its unlock still reports it (no count is used here)
    if leases.closed:
        raise ClientClosedError(f"the client is closed; extending {rule.name!r} is not possible")
    if hold is None or not hold.count:
        raise not_owned(rule, owner)
    if hold.renewal is not None:
        raise LockUsageError(
            f"the watchdog renews the hold on {rule.name!r} (it was taken without lease_time), "
            "so extend() does not apply; cap its renewal with max_hold instead",
            name=rule.name,
        )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + rt.config.command_timeout - margin(rt.config.command_timeout)
    op = Op(rt, rule, owner, hold)
    try:
        await op.begin(deadline)
    except TimeoutError:
        raise RedisTimeoutError(
            f"extending {rule.name!r}: the owner's previous operation on it did not end in time"
        ) from None
    try:
        await _extend(op, hold, lease_ms, deadline)
    finally:
        op.end()


async def _extend(op: Op, hold: Hold, lease_ms: int, deadline: float) -> None:
    rt, rule, leases = op.rt, op.rule, op.rt.leases
    if leases.current(hold).state is not HoldState.HELD or not hold.count:
        if hold.stale and hold.lost is not None:
            raise hold.lost  # lost while this waited for the turn
        raise not_owned(rule, hold.owner)
    how = hold.check
    assert how is not None  # every hold has one
    field = hold.field
    packed = how.script.command((how.key,), (lease_ms, field))

    async def settle() -> Any:
        # The link is fenced: the lost request never runs late. Sending it again is safe
        # (extending twice is extending once, from the later one).
        return NOT_RUN

    for _ in range(rt.config.retry_attempts + 1):
        call = rt.transport.send_now(packed, key=rule.key) or await op.send(packed, deadline)
        sent_at, epoch = call.sent_at, call.epoch

        async def finish(value: Any, sent_at: float = sent_at, epoch: int = epoch) -> None:
            # the caller left (cancelled, out of time): settle the record to the reply
            if isinstance(value, OutcomeUnknown):
                value, sent_at = await _again(op, hold, field, packed, value)
                if value is None:
                    return  # unknown: the old deadline stands (never after the server's)
            try:
                _apply(op, hold, value, sent_at, epoch, lease_ms)
            except LockLostError:
                pass  # told to on_lost and to the next unlock
            except RedisOperationError as exc:
                logger.warning("aiolock: extending %r in the background: %s", rule.name, exc)

        reply = await op.outcome(call, deadline, finish, settle)
        if reply is NOT_RUN or is_readonly(reply):
            continue
        _apply(op, hold, reply, sent_at, epoch, lease_ms)
        return
    raise RedisOperationError(f"extending {rule.name!r}: sent again and again, never ran")


async def _again(
    op: Op, hold: Hold, field: str, packed: Command, unknown: OutcomeUnknown
) -> tuple[Any, float]:
    """In the background, after a reply was lost with its link: fence the link (the lost
    request then either ran or never will) and send the extend once more, so that the
    record can follow what the server says (the lease runs out ``lease_ms`` after this
    one). ``(None, 0)`` if that cannot be done: the old deadline stands."""
    rt = op.rt
    loop = asyncio.get_running_loop()
    if not await fence_until(rt, unknown, loop.time() + rt.config.command_timeout):
        rt.leases.taint(hold, field)  # it may still run late: never on a later hold
        return None, 0.0
    sent_at = loop.time()  # sent no earlier: a deadline from it is never late
    try:
        reply = await command(rt, op.rule.key, packed, None)
    except NotSent:
        return None, 0.0
    if isinstance(reply, OutcomeUnknown):
        await fence_or_taint(rt, reply, hold, field)
        return None, 0.0
    return reply, sent_at


def _apply(op: Op, hold: Hold, reply: Any, sent_at: float, epoch: int, lease_ms: int) -> None:
    """Apply the script's reply to the hold's record; raise what the caller is told."""
    rule, leases = op.rule, op.rt.leases
    if isinstance(reply, ErrorReply):
        raise RedisOperationError(f"extending {rule.name!r} failed: {reply}")
    if leases.stale(hold, epoch):
        raise RedisOperationError(
            f"extending {rule.name!r}: the server changed before the reply came (the hold is "
            "being checked there); its lease was not extended as far as this client knows"
        )
    extended = reply[0] if isinstance(reply, list | tuple) and reply else reply
    if hold.state is not HoldState.HELD:
        if hold.state is HoldState.LOST and hold.lost is not None:
            raise hold.lost  # lost here meanwhile: the loss's cleanup removes what is left
        raise not_owned(rule, hold.owner)
    if extended == 1:
        hold.epoch = epoch
        leases.confirmed(hold, sent_at, lease_ms)
        if hold.state is not HoldState.HELD:  # the reply came after its own lease ran out
            assert hold.lost is not None
            raise hold.lost
        return
    why = "the key is not a lock any more" if extended == -1 else "gone"
    raise leases.lose(
        hold, f"extend() found the lock {why} (its lease ran out, or it was force-unlocked)"
    )


__all__ = ["extend"]
