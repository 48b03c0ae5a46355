"""The reentrant lock (Redisson's RLock), owned by the asyncio Task that took it."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
from redis.exceptions import RedisError

from . import scripts
from .errors import ClientClosedError, LockLostError, LockNotOwnedError, RedisOperationError
from .holds import Hold, LostCallback
from .keys import UNLOCK_MESSAGE, check_seconds, lock_channel, to_millis

if TYPE_CHECKING:
    from .client import AioLock

T = TypeVar("T")


class Lock:
    """A reentrant distributed lock; get one with ``client.lock(name)``.

    The owner is the current asyncio Task: the same task may take the lock again (the hold
    count grows) and must unlock as often; any other task, in this process or another, waits.
    Waiting is woken by the unlock message on the lock's channel, never by polling.
    ``async with lock:`` is :meth:`lock` followed by a shielded :meth:`unlock`.
    """

    __slots__ = ("_channel", "_client", "name")

    def __init__(self, client: AioLock, name: str) -> None:
        self._client = client
        self.name = name
        self._channel = lock_channel(name)

    def __repr__(self) -> str:
        return f"<aiolock.{type(self).__name__} {self.name!r}>"

    # -- acquiring --------------------------------------------------------------------------

    async def try_lock(self, wait_time: float = 0, lease_time: float | None = None) -> bool:
        """Take the lock, waiting at most ``wait_time`` seconds; True if taken.

        With ``lease_time`` (seconds) the hold expires after it and is never renewed; without
        it the lease is ``config.watchdog_timeout`` and the watchdog renews it while held.
        """
        wait = check_seconds(wait_time, "wait_time")
        lease_ms = self._lease_ms(lease_time)
        self._client.check()
        return await self._acquire(self._client.owner(), lease_ms, lease_time is None, wait)

    async def lock(self, lease_time: float | None = None) -> None:
        """Take the lock, waiting as long as it takes."""
        lease_ms = self._lease_ms(lease_time)
        self._client.check()
        await self._acquire(self._client.owner(), lease_ms, lease_time is None, None)

    async def __aenter__(self) -> Lock:
        await self.lock()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.unlock()

    def _lease_ms(self, lease_time: float | None) -> int:
        if lease_time is None:
            return to_millis(self._client.config.watchdog_timeout)
        return to_millis(check_seconds(lease_time, "lease_time", positive=True))

    async def _acquire(self, owner: str, lease_ms: int, renew: bool, wait: float | None) -> bool:
        """Redisson's loop: try; subscribe; retry; then wait for a release message (at most
        the holder's TTL or the time left) before each further try."""
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        hub = self._client.pubsub
        # When tasks of this client already wait for a release, join them instead of barging
        # in with a try that would fail (one round trip saved, and first come first served
        # among local waiters). The wait is bounded by the holder's lease they last saw.
        ttl = self._local_queue_ttl(owner, sent_at) if wait != 0 else None
        if ttl is None:
            ttl = await self._attempt(owner, lease_ms, renew)
            if ttl is None:
                return True
            if wait is not None and wait <= 0:
                return False
        deadline = None if wait is None else sent_at + wait
        entry = await hub.subscribe(self._channel)
        try:
            # A release between our try and a subscription confirmed after it sent no message
            # we could see: try again. A subscription confirmed before the try needs no retry.
            if entry.confirmed_at is None or entry.confirmed_at > sent_at:
                ttl = await self._attempt(owner, lease_ms, renew)
                if ttl is None:
                    return True
            while True:
                timeout = None
                if ttl >= 0:
                    timeout = ttl / 1000
                    entry.holder_until = max(entry.holder_until, loop.time() + timeout)
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        return False
                    timeout = left if timeout is None else min(timeout, left)
                await entry.wait(timeout)
                if hub.closed:
                    raise ClientClosedError(f"client closed while waiting for lock {self.name!r}")
                ttl = await self._attempt(owner, lease_ms, renew)
                if ttl is None:
                    return True
        finally:
            hub.release(entry)

    def _local_queue_ttl(self, owner: str, now: float) -> int | None:
        """If tasks of this client are waiting for this lock under a live lease, the ms left
        of that lease; else None. Never for the holder itself (it would wait for itself)."""
        entry = self._client.pubsub.entry(self._channel)
        if (
            entry is None
            or entry.waiting == 0
            or entry.confirmed_at is None
            or entry.holder_until <= now
            or (self.name, owner) in self._client._holds
        ):
            return None
        return round((entry.holder_until - now) * 1000)

    async def _attempt(self, owner: str, lease_ms: int, renew: bool) -> int | None:
        """One acquire, safe against cancellation: None if taken, else the holder's TTL (ms).

        If the caller is cancelled while the script is in flight, the script still completes
        and a hold it obtained is released before the CancelledError propagates."""
        return await self._client.run_shielded(
            self._acquire_once(owner, lease_ms, renew), undo=self._undo_acquire(owner)
        )

    def _undo_acquire(self, owner: str) -> Callable[[int | None], Awaitable[None]]:
        async def undo(ttl: int | None) -> None:
            hold = self._client._holds.get((self.name, owner))
            if ttl is None and hold is not None:
                await self._release_once(hold)

        return undo

    async def _acquire_once(self, owner: str, lease_ms: int, renew: bool) -> int | None:
        holds = self._client._holds
        hold = holds.get((self.name, owner))
        if hold is not None and hold.lost is not None:
            self._forget(hold)  # a new hold starts afresh
            hold = None
        before = hold.count if hold is not None else 0
        sent_at = asyncio.get_running_loop().time()
        script, keys = self._acquire_script()
        reply = await self._run_resolved(
            script,
            keys,
            (lease_ms, owner),
            owner,
            ran_if=lambda count: count == before + 1,
            not_run_if=lambda count: count == before,
            ran_reply=self._resolved_acquire_reply,
        )
        ttl, token = self._parse_acquire_reply(reply)
        if ttl is not None:
            return ttl
        if hold is None:
            hold = holds[(self.name, owner)] = Hold(self.name, owner, lease_ms)
        hold.count += 1
        hold.lease_ms = lease_ms
        hold.token = token if token is not None else hold.token
        hold.confirm(sent_at)
        if renew and not hold.renewed:
            self._client.watchdog.register(hold)
        return None

    # The acquire script and its reply, overridden by the fenced lock.

    def _acquire_script(self) -> tuple[scripts.Script, tuple[str, ...]]:
        return scripts.LOCK_ACQUIRE, (self.name,)

    def _parse_acquire_reply(self, reply: Any) -> tuple[int | None, int | None]:
        """(holder's TTL or None if acquired, fencing token or None)."""
        return (None if reply is None else int(reply)), None

    async def _resolved_acquire_reply(self) -> Any:
        """The reply an acquire that is known to have run would have given."""
        return None

    # -- releasing --------------------------------------------------------------------------

    async def unlock(self) -> None:
        """Drop one hold of the current task; the last one releases the lock.

        Shielded: once called, the release completes even if the caller is cancelled.
        Raises LockNotOwnedError if the current task holds no count of this lock, and
        LockLostError if it did but the hold was lost (lease expired, force-unlocked, or
        renewal not confirmed in time).
        """
        client = self._client
        client.check()
        hold = self._current_hold()
        await client.run_shielded(self._release_once(hold))

    def _current_hold(self) -> Hold:
        owner = self._client.owner()
        hold = self._client._holds.get((self.name, owner))
        if hold is None:
            raise LockNotOwnedError(
                f"lock {self.name!r} is not held by the current task (owner id {owner})",
                name=self.name,
                owner=owner,
            )
        return hold

    async def _release_once(self, hold: Hold) -> None:
        if hold.lost is None:
            before = hold.count
            # Local waiters are woken by the release's reply, not by the message coming back.
            entry = self._client.pubsub.expect_echo(self._channel) if before == 1 else None
            released = None
            try:
                released = await self._run_resolved(
                    scripts.LOCK_RELEASE,
                    (self.name, self._channel),
                    (UNLOCK_MESSAGE, hold.lease_ms, hold.owner),
                    hold.owner,
                    ran_if=lambda count: count == before - 1,
                    not_run_if=lambda count: count == before,
                    ran_reply=lambda: _constant(1 if before == 1 else 0),
                )
            finally:
                if entry is not None:
                    entry.echo_delivered_early(released == 1)
            if released is not None:
                hold.count -= 1
                if released == 1 or hold.count <= 0:
                    self._forget(hold)
                return
            hold.mark_lost("its lease expired or it was force-unlocked")
        # Each unlock of a lost hold reports the loss and uses up one count; no Redis call:
        # whatever is left of it on the server expires with its lease, never renewed again.
        hold.count -= 1
        if hold.count <= 0:
            self._forget(hold)
        assert hold.lost is not None
        raise LockLostError(str(hold.lost), name=self.name, owner=hold.owner)

    def _forget(self, hold: Hold) -> None:
        hold.end()
        if hold.renewed:
            self._client.watchdog.unregister(hold)
        holds = self._client._holds
        if holds.get((hold.name, hold.owner)) is hold:
            del holds[(hold.name, hold.owner)]

    async def force_unlock(self) -> bool:
        """Delete the lock whoever holds it and wake its waiters; True if it was held.

        Holds of this client on the lock are marked lost (their guards are cancelled)."""
        client = self._client
        client.check()
        try:
            deleted = await client.run_script(
                scripts.LOCK_FORCE_UNLOCK, (self.name, self._channel), (UNLOCK_MESSAGE,)
            )
        except (RedisError, scripts.OutcomeUnknown, scripts.NotSent) as exc:
            raise RedisOperationError(f"force_unlock of {self.name!r} failed: {exc}") from exc
        for hold in [h for h in client._holds.values() if h.name == self.name]:
            hold.mark_lost("it was force-unlocked")
            if hold.renewed:
                client.watchdog.unregister(hold)
        return bool(deleted)

    # -- losing -------------------------------------------------------------------------------

    def on_lost(self, callback: LostCallback) -> Callable[[], None]:
        """Call ``callback(LockLostError)`` once if the current task's hold is lost.

        The hold is lost when a renewal finds the lock gone, when its lease runs out before a
        renewal is confirmed (e.g. Redis unreachable), or when it is force-unlocked. The
        callback runs soon after, from the event loop (a coroutine result is run as a task);
        it must not block. Returns a function that removes the callback.
        Raises LockNotOwnedError if the current task does not hold the lock.
        """
        self._client.check()
        return self._current_hold().add_callback(callback)

    @asynccontextmanager
    async def guard(self, lease_time: float | None = None) -> AsyncIterator[Lock]:
        """Hold the lock for the body and cancel the body if the hold is lost.

        ``async with lock.guard():`` takes the lock like ``async with lock:``; when the hold
        is lost, the body is cancelled (an anyio cancel scope) and LockLostError is raised
        from the ``async with``, so work done under a lock you no longer hold stops.
        """
        await self.lock(lease_time)
        hold = self._current_hold()
        with anyio.CancelScope() as scope:
            remove = hold.add_callback(lambda _: scope.cancel())
            try:
                yield self
            finally:
                remove()
                if hold.lost is None:
                    await self.unlock()
        if hold.lost is not None:
            await self.unlock()  # raises LockLostError

    # -- running scripts whose reply may be lost ----------------------------------------------

    async def _run_resolved(
        self,
        script: scripts.Script,
        keys: tuple[str, ...],
        args: tuple[Any, ...],
        owner: str,
        *,
        ran_if: Callable[[int], bool],
        not_run_if: Callable[[int], bool],
        ran_reply: Callable[[], Awaitable[Any]],
    ) -> Any:
        """Run a lock script that changes ``owner``'s count, never blindly twice.

        When its reply is lost the owner's count on the server tells what happened: if the
        script ran, ``ran_reply()`` stands for its reply; if it did not, it is tried again (at
        most ``config.retry_attempts`` times); anything else is reported as unresolved."""
        attempts = self._client.config.retry_attempts + 1
        for attempt in range(attempts):
            try:
                return await self._client.run_script(script, keys, args)
            except scripts.NotSent as exc:
                if attempt == attempts - 1:
                    raise RedisOperationError(f"{script.name} on {self.name!r}: {exc}") from exc
            except scripts.OutcomeUnknown as exc:
                count = await self._server_count(owner)
                if ran_if(count):
                    return await ran_reply()
                if not not_run_if(count):
                    raise RedisOperationError(
                        f"{script.name} on {self.name!r}: {exc}; the owner's count is now "
                        f"{count}, so the outcome is unknown"
                    ) from exc
                if attempt == attempts - 1:
                    raise RedisOperationError(
                        f"{script.name} on {self.name!r} failed {attempts} times: {exc}"
                    ) from exc
            except RedisError as exc:
                raise RedisOperationError(f"{script.name} on {self.name!r} failed: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def _server_count(self, owner: str) -> int:
        value = await self._read("HGET", self.name, owner)
        return int(value) if value is not None else 0

    # -- inspecting ---------------------------------------------------------------------------

    async def _read(self, *command: Any) -> Any:
        return await self._client.read(*command, what=f"reading lock {self.name!r}")

    async def is_locked(self) -> bool:
        """True if any owner holds the lock."""
        self._client.check()
        return bool(await self._read("EXISTS", self.name))

    async def is_held_by_current_task(self) -> bool:
        """True if the current task holds the lock (checked on the server)."""
        self._client.check()
        owner = self._client.owner()
        return bool(await self._read("HEXISTS", self.name, owner))

    async def hold_count(self) -> int:
        """How many times the current task holds the lock (0 if not at all)."""
        self._client.check()
        return await self._server_count(self._client.owner())

    async def remaining_ttl(self) -> float | None:
        """Seconds until the lease runs out; None if unlocked, ``math.inf`` if it never does."""
        self._client.check()
        pttl = int(await self._read("PTTL", self.name))
        if pttl == -2:
            return None
        if pttl == -1:
            return math.inf
        return pttl / 1000


async def _constant(value: T) -> T:
    return value
