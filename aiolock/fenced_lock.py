"""The fenced lock: a reentrant lock whose acquisitions return a growing fencing token."""

from __future__ import annotations

from typing import Any

from . import commands, scripts
from .holds import Owner
from .keys import check_seconds, token_key
from .lock import Lock, LockRule
from .rules import NOT_RUN, Attempt, Command
from .runtime import Runtime


class FencedRule(LockRule):
    """The lock's rule, plus the token counter ``redisson_lock_token:{name}`` (same slot)."""

    kind = "fenced_lock"

    __slots__ = ("_token_key",)

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._token_key = token_key(name)

    def attempt(self, owner: str, lease_ms: int, wait_ms: int | None) -> Command:
        return scripts.FENCED_LOCK_ACQUIRE.command((self.name, self._token_key), (lease_ms, owner))

    def parse(self, reply: Any) -> Attempt:
        acquired, value = int(reply[0]), int(reply[1])
        return Attempt(True, token=value) if acquired else Attempt(False, value)

    async def token(self, rt: Runtime) -> int:
        value = await commands.read(rt, self.key, "GET", self._token_key, what="reading a token")
        return int(value) if value is not None else 0

    async def settle_attempt(self, rt: Runtime, owner: str, count: int) -> Attempt | Any:
        settled = await super().settle_attempt(rt, owner, count)
        if settled is NOT_RUN or not settled.granted:
            return settled
        # It ran and the owner holds the lock, so nobody has taken a newer token since.
        return Attempt(True, token=await self.token(rt))


class FencedLock(Lock):
    """A reentrant lock whose every new acquisition takes a fencing token that only grows.

    A lease-based lock cannot stop a holder that was paused past its lease from acting as if
    it still held the lock. Pass the token along with every write to the guarded resource;
    the resource keeps the highest token it has accepted and, atomically with each write,
    accepts a token greater than or equal to it and refuses a lower one: the stale holder's
    writes are then refused. Compare tokens of one lock name only, as integers (they fit an
    int64, and a double exactly until 2255); they are neither consecutive nor timestamps.

    A new token is ``max(counter + 1, the server's clock in microseconds)``, taken by the
    script that takes the lock and stored in Redisson's counter ``redisson_lock_token:{name}``
    (a Redis integer, no TTL, in the lock's hash slot), so a lock's first token is a clock
    reading. A reentrant acquisition returns the token of the hold it re-enters.

    The guarantee: while the counter exists, each new token is above all before it, even if
    the server's clock steps back (the counter then goes on by one). When the counter is lost
    (a restart without persistence, a failover to a replica that missed the last tokens),
    the next acquisition starts it again from the clock of the server holding it now, which
    is above every earlier token unless a clock was stepped back (or the new master's clock
    lags the old one's) by more than the time between the last token and the next.

    The limits: a Redisson client's acquisition INCRs whatever the counter holds, so one that
    comes first after a loss gets 1 (2, 3... after it) until an aiolock acquisition jumps the
    counter back to the clock; and a deposed master still writable during a failover hands
    out tokens of its own meanwhile. docs/locks.md ("The fenced lock") says it in full.
    """

    __slots__ = ()

    _rule_class = FencedRule

    async def lock_and_get_token(
        self,
        lease_time: float | None = None,
        *,
        owner: Owner | None = None,
        max_hold: float | None = None,
    ) -> int:
        """Take the lock (waiting as long as it takes) and return its fencing token."""
        await self._grant(None, lease_time, owner, max_hold)
        return self._token(owner)

    async def try_lock_and_get_token(
        self,
        wait_time: float = 0,
        lease_time: float | None = None,
        *,
        owner: Owner | None = None,
        max_hold: float | None = None,
    ) -> int | None:
        """Take the lock within ``wait_time`` seconds; its fencing token, or None."""
        wait = check_seconds(wait_time, "wait_time")
        if await self._grant(wait, lease_time, owner, max_hold) is None:
            return None
        return self._token(owner)

    def _token(self, owner: Owner | None) -> int:
        """The token of the owner's hold (the first count's, for a reentrant hold)."""
        token = self._held(owner).token
        assert token is not None
        return token

    async def get_token(self) -> int:
        """The latest fencing token handed out for this lock (0 before the first, or after
        the counter was lost)."""
        rule = self._rule
        assert isinstance(rule, FencedRule)
        return await rule.token(self._runtime.use())
