"""The countdown latch (Redisson's RCountDownLatch) on the shared acquisition loop.

A string at ``name`` holds the count; the latch is open when there is none (count 0). The
channel is ``redisson_countdownlatch__channel__{name}``: ``0`` is published when the count
reaches zero (open), ``1`` when a count is set. Waiting is the shared loop with a rule whose
"attempt" reads the count: a waiter is granted when it reads 0, and every message wakes
every local waiter to read it again.

The channel wraps the name in literal braces even when the name has a hash tag of its own
(``{t}x`` -> ``redisson_countdownlatch__channel__{{t}x}``, hash tag ``{t``), so on a cluster
it can land in another slot than the count. Redisson passes it as a key of its scripts,
which a cluster refuses (CROSSSLOT): Java clients cannot use such a latch on a cluster.
Here the channel is a script argument, never a key, and subscriptions to it are routed by
the channel itself (``Rule.channel_key``), so such a latch works wherever the publish
reaches its subscribers: on a standalone server, Sentinel, and a cluster with classic
PUBLISH/SUBSCRIBE (which reach every node). With sharded pub/sub (SPUBLISH), a script may
only publish to channels of its own slot, so a latch whose channel is in another slot must
keep to classic pub/sub (:func:`aiolock.keys.same_slot` tells which latches those are): its
scripts get the publish command as ``publish`` (lower case), which a cluster transport in
sharded mode leaves alone, and its waiters listen with classic SUBSCRIBE there.
Names without braces, the usual case, have the channel in the count's slot and are fully
interoperable with Redisson everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import acquire, commands, scripts
from .errors import LockStateError, RedisOperationError
from .holds import Owner
from .keys import (
    CLASSIC_PUBLISH,
    PUBLISH,
    check_permits,
    check_seconds,
    latch_channel,
    same_slot,
    to_millis,
)
from .pubsub import ALL
from .requests import REQUEST_TTL_MS, latches_of, mutate
from .rules import GRANTED, NOT_RUN, Attempt, Command
from .runtime import Runtime, RuntimeSource, runtime_of
from .semaphore import GrantRule
from .transport import pack

#: published when the count reaches zero (or, here, when the latch is deleted)
OPEN_MESSAGE = b"0"
#: published when a count is set (and by Redisson's delete)
SET_MESSAGE = b"1"
#: the loop's "owner" of a latch waiter (a latch has no owners)
_WAITER = Owner("latch-waiter")


def latch_wakes(data: bytes) -> int:
    """Every message of a latch channel wakes every local waiter to read the count again:
    ``0`` opened it; ``1`` set a count, or (from Redisson) deleted it, which opens it too."""
    if data == OPEN_MESSAGE or data == SET_MESSAGE:
        return ALL
    raise ValueError(data)


class LatchRule(GrantRule):
    """Waiting for the latch ``name`` to open: the attempt reads the count."""

    kind = "countdown_latch"
    replicated = False  # a read: nothing for replicas to acknowledge

    __slots__ = ("_channel", "_channel_key", "_get", "key", "name", "sharded_ok")

    def __init__(self, name: str) -> None:
        self.name = self.key = name
        channel = latch_channel(name)
        self._channel = channel.encode()
        #: whether its scripts may publish with SPUBLISH (the channel is in the count's slot)
        self.sharded_ok = same_slot(channel, name)
        self._channel_key = name if self.sharded_ok else channel
        self._get = pack(("GET", name))

    def channel(self, owner: str) -> bytes:
        return self._channel

    def channel_key(self, owner: str) -> str:
        return self._channel_key

    def wakes(self, data: bytes) -> int:
        return latch_wakes(data)

    def attempt(self, owner: str, lease_ms: int, wait_ms: int | None) -> Command:
        return self._get

    def parse(self, reply: Any) -> Attempt:
        return GRANTED if reply is None or int(reply) <= 0 else Attempt(False)

    async def settle_attempt(self, rt: Runtime, owner: str, count: int) -> Attempt | Any:
        return NOT_RUN  # a read: simply read again


@dataclass(frozen=True, slots=True)
class LatchStatistics:
    """What this client knows of one latch (no Redis call)."""

    name: str
    #: tasks of this client parked waiting for it to open
    tasks_waiting: int


class CountDownLatch:
    """A distributed countdown latch; get one with ``client.countdown_latch(name)``.

    ``try_set_count(n)`` closes it with a count of ``n``; each ``count_down()`` takes one
    off, and at zero it opens: every ``wait()`` returns True, in every process. An open
    latch has no key in Redis (count 0). Counting down an open latch raises LockStateError
    and changes nothing; a lost reply of a count-down is settled, never sent again blindly,
    so it never counts twice.
    """

    __slots__ = ("_rule", "_runtime", "name")

    def __init__(self, runtime: Runtime | RuntimeSource, name: str) -> None:
        self._runtime = runtime = runtime_of(runtime)
        self.name = name
        self._rule = runtime.rule(LatchRule, name)

    def __repr__(self) -> str:
        return f"<aiolock.CountDownLatch {self.name!r}>"

    async def try_set_count(self, count: int) -> bool:
        """Close the latch with ``count`` (>= 1) if it is open; True if set."""
        return bool(await self._mutate(scripts.LATCH_TRY_SET, (check_permits(count, "count"),)))

    async def count_down(self) -> int:
        """Count down by one and return the new count; at 0 the latch opens and its waiters
        everywhere are woken. Raises LockStateError (nothing changed) if it was open."""
        count = int(await self._mutate(scripts.LATCH_COUNT_DOWN, ()))
        if count < 0:
            raise LockStateError(
                f"latch {self.name!r} is open (count 0): it cannot be counted down",
                name=self.name,
            )
        return count

    async def get_count(self) -> int:
        """The count now (0: open)."""
        value = await commands.read(
            self._runtime.use(), self.name, "GET", self.name, what="get_count"
        )
        return max(0, int(value)) if value is not None else 0

    async def wait(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 (a bool result)
        """Wait until the latch is open, at most ``timeout`` seconds (None: as long as it
        takes); True if open. Returns or raises within ``timeout + command_timeout``.

        An open latch has no key, so a count lost with its server (one restarted empty, a
        failover to a replica that never had it) would read as open: if the server serving
        the latch changed while this wait went on, finding it open raises
        RedisOperationError instead (whether it was counted down cannot be told)."""
        wait = None if timeout is None else check_seconds(timeout, "timeout")
        runtime = self._runtime
        rt = runtime.use()
        since = rt.transport.loss_epoch_of(self.name)
        granted = await acquire.acquire(
            rt,
            self._rule,
            _WAITER,
            wait=wait,
            lease_ms=to_millis(runtime.config.command_timeout),
            renew=False,
        )
        if granted is not None and rt.transport.loss_epoch_of(self.name) != since:
            raise RedisOperationError(
                f"latch {self.name!r} reads open, but the server serving it changed while it "
                "was waited for (a restart, a failover): its count may have been lost with "
                "the old server rather than counted down"
            )
        return granted is not None

    async def delete(self) -> bool:
        """Delete the count, which opens the latch and wakes its waiters (Redisson's
        ``delete()`` publishes "closed" instead, leaving its waiters blocked on a latch
        whose count reads 0); True if there was a count."""
        return bool(await self._mutate(scripts.LATCH_DELETE, ()))

    def statistics(self) -> LatchStatistics:
        """What this client knows of the latch (no Redis call)."""
        entry = self._runtime.use().pubsub.entry(self._rule.channel(""))
        return LatchStatistics(
            name=self.name, tasks_waiting=entry.parked if entry is not None else 0
        )

    async def _mutate(self, script: scripts.Script, args: tuple[Any, ...]) -> Any:
        """Run a latch script that records its reply under a new request id."""
        runtime = self._runtime
        rt = runtime.use()
        latches = latches_of(runtime)
        request = latches.new_id()
        cmd = script.command(
            (self.name, latches.key(self.name)),
            (
                *args,
                REQUEST_TTL_MS,
                PUBLISH if self._rule.sharded_ok else CLASSIC_PUBLISH,
                latch_channel(self.name),
                request,
                *latches.take_done(self.name),
            ),
        )
        what = f"{script.name.removeprefix('latch_')} of latch {self.name!r}"
        try:
            reply = await mutate(
                rt, self.name, cmd, latches.settle(rt, self.name, request, int), what=what
            )
        except BaseException:
            latches.finished_later(self.name, request)
            raise
        latches.finished(self.name, request)
        return reply


__all__ = ["CountDownLatch", "LatchStatistics"]
