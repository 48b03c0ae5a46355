"""The fenced lock: a reentrant lock whose acquisitions return a growing fencing token."""

from __future__ import annotations

from typing import Any

from . import scripts
from .keys import check_seconds, token_key
from .lock import Lock


class FencedLock(Lock):
    """A reentrant lock whose every new acquisition takes a fencing token that only grows.

    A lease-based lock cannot stop a holder that was paused past its lease from acting as if
    it still held the lock. Pass the token along with every write to the guarded resource
    and have the resource reject tokens lower than the highest it has seen: the stale
    holder's writes are then refused. The counter lives at ``redisson_lock_token:{name}``,
    in the lock's hash slot, and is incremented by the same script that takes the lock.
    A reentrant acquisition returns the token of the hold it re-enters.
    """

    __slots__ = ()

    async def lock_and_get_token(self, lease_time: float | None = None) -> int:
        """Take the lock (waiting as long as it takes) and return its fencing token."""
        await self.lock(lease_time)
        return self._token()

    async def try_lock_and_get_token(
        self, wait_time: float = 0, lease_time: float | None = None
    ) -> int | None:
        """Take the lock within ``wait_time`` seconds; its fencing token, or None."""
        check_seconds(wait_time, "wait_time")
        if await self.try_lock(wait_time, lease_time):
            return self._token()
        return None

    async def get_token(self) -> int:
        """The latest fencing token handed out for this lock (0 before the first)."""
        self._client.check()
        value = await self._read("GET", token_key(self.name))
        return int(value) if value is not None else 0

    def _token(self) -> int:
        token = self._current_hold().token
        assert token is not None
        return token

    def _acquire_script(self) -> tuple[scripts.Script, tuple[str, ...]]:
        return scripts.FENCED_LOCK_ACQUIRE, (self.name, token_key(self.name))

    def _parse_acquire_reply(self, reply: Any) -> tuple[int | None, int | None]:
        acquired, value = int(reply[0]), int(reply[1])
        return (None, value) if acquired else (value, None)

    async def _resolved_acquire_reply(self) -> Any:
        # The acquire ran and we hold the lock, so nobody has taken a newer token since.
        return [1, await self.get_token()]
