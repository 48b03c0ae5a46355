"""Settling what the acquisition loop could not conclude at once: a grant replicas did not
acknowledge is rolled back, an attempt whose caller left is undone, a reply lost with its
link is settled once the link is fenced (``CLIENT KILL``), and an owner's counts are purged
when nothing else can be known."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from .commands import (
    command,
    fence_or_taint,
    fence_until,
)
from .holds import Hold
from .operation import (
    Op,
)
from .rules import (
    Attempt,
    Command,
    GiveUp,
    Rule,
)
from .runtime import Runtime
from .transport import (
    ErrorReply,
    NotSent,
    OutcomeUnknown,
    first_reply,
)

logger = logging.getLogger("aiolock")


async def roll_back(op: Op, grant: Attempt, before: int, lease_ms: int) -> None:
    """Give back a grant that replicas did not acknowledge (not registered yet)."""
    rt, rule, hold = op.rt, op.rule, op.hold
    owner = op.field
    if hold is None:
        cmd = rule.undo(owner, grant)
        if cmd is not None:
            try:
                reply = await command(rt, rule.key, cmd, None)
            except NotSent:
                reply = None
            if isinstance(reply, OutcomeUnknown | ErrorReply | None):
                logger.warning(
                    "aiolock: %r: releasing a hold that no replica acknowledged (replica_acks) "
                    "failed (%s); it expires with its lease",
                    rule.name,
                    "not sent" if reply is None else reply,
                )
        return
    if not before:
        await purge(rt, rule, owner, lease_ms, hold)  # nothing else of the owner's is there
        return
    # A reentrant count on top of a hold: take that one count back (the script compares).
    try:
        reply = await command(rt, rule.key, rule.release(owner, hold.lease_ms, before + 1), None)
    except NotSent:
        reply = None
    if isinstance(reply, OutcomeUnknown):
        await fence_or_taint(rt, reply, hold, owner)
    if (
        isinstance(reply, OutcomeUnknown | ErrorReply | None)
        or rule.parse_release(first_reply(reply)) is not False
    ):
        rt.leases.lose(hold, "an unacknowledged reentrant grant could not be given back")


async def purge_in_turn(op: Op, lease_ms: int, deadline: float | None) -> bool:
    """Purge the owner's counts in this operation's turn, waiting for it until ``deadline``
    (then, or if the caller is cancelled, it goes on in the background: see Op.within)."""
    hold = op.record()  # (a deferred one made now: the purge is done in its turn)
    return await op.within(purge(op.rt, op.rule, op.field, lease_ms, hold), deadline)


def register(
    op: Op, result: Attempt, lease_ms: int, renew: bool, sent_at: float, epoch: int
) -> bool:
    rule, rt = op.rule, op.rt
    assert op.hold is not None
    field = op.field  # the generation's: the record may write another one by the cleanup

    return rt.leases.granted(
        op.hold,
        lease_ms=lease_ms,
        sent_at=sent_at,
        renewal=rule.renewal if renew else None,
        cleanup=lambda hold: purge(rt, rule, field, hold.lease_ms, hold),
        token=result.token,
        check=rule.renewal,
        epoch=epoch,
    )


async def purge(
    rt: Runtime, rule: Rule, owner: str, lease_ms: int, hold: Hold | None = None
) -> None:
    """Remove every count of ``owner`` from the server (a lost or abandoned hold), trying
    until the server answers or a lease of ``lease_ms`` would be over anyway. ``hold`` is
    the hold whose generation wrote ``owner``: a purge lost with its link, which may still
    arrive, is fenced or its field tainted (see fence_or_taint)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + max(lease_ms / 1000, rt.config.command_timeout)
    delay = rt.config.reconnect_delay
    while True:
        reply: object
        try:
            reply = await command(rt, rule.key, rule.purge(owner), None)
        except NotSent as error:
            reply = error
        if isinstance(reply, OutcomeUnknown) and hold is not None:
            await fence_or_taint(rt, reply, hold, owner)
        if not isinstance(reply, OutcomeUnknown | ErrorReply | NotSent):
            return
        if loop.time() + delay > until or rt.transport.closed:
            logger.warning(
                "aiolock: could not remove %s's hold on %r (%s); it expires with its lease",
                owner,
                rule.name,
                "the client was closed" if rt.transport.closed else reply,
            )
            return
        await asyncio.sleep(delay)
        delay = min(delay * 2, rt.config.reconnect_max_delay)


#: error replies that say "not now" (nothing ran): a give-up refused so is sent again
_BUSY_CODES = frozenset({"BUSY", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY", "TRYAGAIN"})


#: give-ups sent in one command at most (a fair lock's: one script call, one pass over the line)
_BATCH = 1000


class _Batch:
    """Give-ups of one rule going out in one command."""

    __slots__ = ("parts", "retry_for", "sent")

    def __init__(self) -> None:
        self.parts: list[tuple[Any, ...]] = []
        self.retry_for = 0.0
        self.sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()


async def send_give_up(rt: Runtime, rule: Rule, give_up: GiveUp) -> None:
    """Send a give-up until it is known to have run (a reply), or for ``retry_for``: a
    give-up lost with its link, or refused for now (a server loading, a failover), would
    otherwise leave its waiter in line.

    Give-ups with a part (a fair lock's) are batched per rule: one that comes while none of
    the rule's is on its way goes out at once, alone; those that come meanwhile join the
    next batch, sent (one at a time, up to _BATCH each) by a sender of their own once it is
    back. So the give-ups of many waiters of this client cancelled at once take a few calls,
    not one each (each call costs the server a pass over the line)."""
    if give_up.part is None:
        await _send_give_up(rt, rule, give_up.command, give_up.retry_for)
        return
    batches: deque[_Batch] | None = rt.give_ups.get(rule)
    if batches is None:
        batches = rt.give_ups[rule] = deque()
        try:
            await _send_give_up(rt, rule, give_up.command, give_up.retry_for)
        finally:
            if batches:
                rt.spawn(_send_batches(rt, rule, batches))
            elif rt.give_ups.get(rule) is batches:
                del rt.give_ups[rule]
        return
    if not batches or len(batches[-1].parts) >= _BATCH:
        batches.append(_Batch())
    batch = batches[-1]
    batch.parts.append(give_up.part)
    batch.retry_for = max(batch.retry_for, give_up.retry_for)
    await asyncio.shield(batch.sent)


async def _send_batches(rt: Runtime, rule: Rule, batches: deque[_Batch]) -> None:
    """Send ``rule``'s batched give-ups, one batch at a time, until none is left."""
    try:
        while batches:
            batch = batches.popleft()  # closed: give-ups from now on join the next one
            try:
                await _send_give_up(rt, rule, rule.give_ups(batch.parts), batch.retry_for)
            finally:
                batch.sent.set_result(None)
    finally:
        if rt.give_ups.get(rule) is batches:
            del rt.give_ups[rule]
        for batch in batches:  # cancelled (the client closing at its bound)
            batch.sent.set_result(None)


async def _send_give_up(rt: Runtime, rule: Rule, cmd: Command, retry_for: float) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + retry_for
    delay = rt.config.reconnect_delay
    while True:
        reply: object
        try:
            reply = await command(rt, rule.key, cmd, None)
        except NotSent as error:
            reply = error
        if isinstance(reply, ErrorReply) and reply.code not in _BUSY_CODES:
            logger.warning("aiolock: %r: a waiter could not leave the line: %s", rule.name, reply)
            return
        if not isinstance(reply, OutcomeUnknown | ErrorReply | NotSent):
            return
        if loop.time() + delay > until or rt.transport.closed:
            logger.debug("aiolock: %r: a give-up was not confirmed: %s", rule.name, reply)
            return
        if isinstance(reply, OutcomeUnknown):
            # Fence its link first (when that can be done in time): the lost one then cannot
            # run later, after the owner's next acquisition joined the line again.
            await fence_until(rt, reply, until)
        await asyncio.sleep(delay)
        delay = min(delay * 2, rt.config.reconnect_max_delay)


async def best_effort(rt: Runtime, rule: Rule, cmd: Command) -> None:
    try:
        await command(rt, rule.key, cmd, None)
    except NotSent as exc:
        logger.debug("aiolock: %r: %s", rule.name, exc)
