"""Wait entries: the local waiters of one pub/sub channel, sharing one subscription.

A waiter borrows the :class:`Entry` of its channel with :meth:`PubSub.subscribe` (returns once
the server confirmed the subscription) and gives it back with :meth:`PubSub.release`. Entries
are reference-counted: the channel is subscribed for the first waiter and unsubscribed when
the last one leaves, so one waiter giving up never cancels a subscription others share.

A message wakes as many parked waiters as the channel's wake rule says (``wakes(payload)``:
one for a lock's unlock message, all for a write unlock, the released count for a semaphore).
Waiters are woken in the order they parked, each using its weight of the wake-up (a
semaphore's waiter for k permits weighs k, everyone else 1); one heavier than what is left is
passed over and keeps its place. A wake-up that finds nobody to wake is kept as a permit (up
to the number of borrowers), so a message arriving between a failed attempt and the wait is
not lost. When the subscription is lost or renewed, everyone is woken to re-check. Waits are
always bounded by the caller: each parked waiter has a deadline, and an entry keeps one timer,
for the earliest deadline of its waiters (not one per waiter).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
from collections import deque
from collections.abc import Callable

from .transport import NotSent, Transport

logger = logging.getLogger("aiolock.pubsub")

Wakes = Callable[[bytes], int]
#: a wake rule's answer meaning "every waiter"
ALL = -1
#: the deadlines an entry keeps before it first drops those of waiters that left
_COMPACT_MIN = 64


class Waiter(asyncio.Future[bool]):
    """A parked waiter's future, with its deadline (loop time); ordered by it, for the
    entry's heap of deadlines."""

    __slots__ = ("until",)

    until: float

    def __lt__(self, other: Waiter) -> bool:
        return self.until < other.until


class Entry:
    """The wait entry of one channel (see the module docstring)."""

    __slots__ = (
        "_compact_at",
        "_deadlines",
        "_parked",
        "_permits",
        "_timer",
        "_timer_at",
        "_wakes",
        "_weights",
        "channel",
        "confirmed",
        "confirmed_at",
        "holder_until",
        "key",
        "refs",
        "refused",
    )

    def __init__(self, channel: bytes, key: str, wakes: Wakes) -> None:
        self.channel = channel
        self.key = key
        self.refs = 0
        self._wakes = wakes
        self._parked: deque[asyncio.Future[bool]] = deque()
        #: the parked waiters by deadline (a heap; a waiter that left stays in it until its
        #: deadline passes or the heap is compacted), and the one timer, for the earliest
        self._deadlines: list[Waiter] = []
        self._compact_at = _COMPACT_MIN
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._permits = 0
        #: the weights of parked waiters that weigh more than 1 (None: no such waiter yet;
        #: a lock's waiters never make one)
        self._weights: dict[asyncio.Future[bool], int] | None = None
        self.confirmed: asyncio.Future[None] | None = None
        #: loop time at which the current subscription was confirmed (None: not listening)
        self.confirmed_at: float | None = None
        #: loop time at which the holder's lease ends, as last seen by a failed attempt
        self.holder_until = 0.0
        #: why its subscription, made again, was refused (None: it was not)
        self.refused: Exception | None = None

    def __repr__(self) -> str:
        return f"<Entry {self.channel!r} refs={self.refs} parked={self.parked}>"

    @property
    def parked(self) -> int:
        """Waiters parked now."""
        return sum(1 for future in self._parked if not future.done())

    @property
    def waiting(self) -> bool:
        """Whether a waiter is parked now (at once, however many there are)."""
        return any(not future.done() for future in self._parked)

    def park(self, until: float, weight: int = 1) -> Waiter:
        """A future that turns True when a wake-up comes (at once if one is kept) or False at
        loop time ``until`` (the entry's timer ends it: nothing to cancel once it is done).
        ``weight`` is the waiter's share of a wake-up (see :meth:`wake`). A waiter woken and
        then cancelled before it resumes must call :meth:`pass_on` with its weight."""
        loop = asyncio.get_running_loop()
        future = Waiter(loop=loop)
        if self._permits:
            self._permits -= 1
            future.set_result(True)
            return future
        self._parked.append(future)
        if weight != 1:
            if self._weights is None:
                self._weights = {}
            self._weights[future] = weight
        future.until = until
        deadlines = self._deadlines
        if len(deadlines) >= self._compact_at:
            # Waiters that left before their deadline: drop them (amortized O(1) a park).
            deadlines[:] = [waiter for waiter in deadlines if not waiter.done()]
            heapq.heapify(deadlines)
            self._compact_at = max(_COMPACT_MIN, 2 * len(deadlines))
        heapq.heappush(deadlines, future)
        if until < self._timer_at:
            self._arm(loop, until)
        return future

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = loop.call_at(when, self._time_up)

    def _time_up(self) -> None:
        """The timer: every waiter whose deadline came gets False; the timer is set again
        for the earliest deadline left."""
        armed_at = self._timer_at
        self._timer = None
        self._timer_at = math.inf
        deadlines = self._deadlines
        loop = asyncio.get_running_loop()
        # A timer may fire a little early (uvloop's have millisecond resolution): it ends
        # what it was set for, as a timer of each waiter's own did.
        limit = max(armed_at, loop.time())
        while deadlines and (deadlines[0].until <= limit or deadlines[0].done()):
            waiter = heapq.heappop(deadlines)
            if not waiter.done():
                waiter.set_result(False)
        if deadlines:
            self._arm(loop, deadlines[0].until)

    def stop(self) -> None:
        """Its last borrower left: no timer is kept for it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = math.inf
        self._deadlines.clear()

    def pass_on(self, future: asyncio.Future[bool], weight: int = 1) -> None:
        """The waiter of ``future`` (of ``weight``) leaves without using it (cancelled, out
        of time): a wake-up it got goes to the next."""
        if future.done() and not future.cancelled() and future.result():
            self.wake(weight)
        elif self._weights:
            self._weights.pop(future, None)

    def wake(self, count: int) -> None:
        """Wake parked waiters in turn while their weights fit in ``count`` (:data:`ALL`:
        every one); a waiter heavier than what is left is passed over and keeps its place.
        What finds nobody to wake is kept as permits, up to the number of borrowers."""
        parked = self._parked
        weights = self._weights
        if count == ALL:
            while parked:
                future = parked.popleft()
                if not future.done():
                    future.set_result(True)
            if weights:
                weights.clear()
            self._permits = self.refs
            return
        if not weights:  # every waiter weighs 1 (always so for the locks)
            woken = 0
            while parked and woken < count:
                future = parked.popleft()
                if not future.done():
                    future.set_result(True)
                    woken += 1
            if woken < count:
                self._permits = min(self.refs, self._permits + count - woken)
            return
        left = count
        passed: list[asyncio.Future[bool]] | None = None
        while parked and left > 0:
            future = parked.popleft()
            if future.done():
                weights.pop(future, None)
                continue
            weight = weights.get(future, 1)
            if weight > left:
                if passed is None:
                    passed = []
                passed.append(future)
                continue
            weights.pop(future, None)
            future.set_result(True)
            left -= weight
        if passed is not None:
            parked.extendleft(reversed(passed))
        if left > 0:
            self._permits = min(self.refs, self._permits + left)

    # -- the transport's Listener ---------------------------------------------------------------

    def on_message(self, data: bytes) -> None:
        try:
            count = self._wakes(data)
        except ValueError:
            logger.warning(
                "aiolock: ignoring a malformed message %r on %r", data[:100], self.channel
            )
            return
        if count:
            self.wake(count)

    def on_reset(self, listening: bool) -> None:
        """The subscription was lost (``listening`` False) or made again (True): messages
        may have been lost meanwhile, so everyone re-checks."""
        self.confirmed_at = asyncio.get_running_loop().time() if listening else None
        self.wake(ALL)

    def on_refused(self, error: Exception) -> None:
        """Its subscription was made again (after a reset) and refused: the waiters re-check
        and leave as a new one would (SubscriptionError); a new borrower subscribes again."""
        self.refused = error
        self.confirmed = None
        self.confirmed_at = None
        self.wake(ALL)


class PubSub:
    """The wait entries of one client, over its transport's subscriptions."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._entries: dict[bytes, Entry] = {}
        self._closed = False
        #: the waits of borrowers for a subscription's confirmation (close ends them)
        self._confirming: set[asyncio.Future[None]] = set()

    @property
    def entries(self) -> int:
        return len(self._entries)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def parked(self) -> int:
        """Waiters parked now, on every channel."""
        return sum(entry.parked for entry in self._entries.values())

    def entry(self, channel: bytes) -> Entry | None:
        return self._entries.get(channel)

    async def subscribe(
        self, channel: bytes, *, key: str, wakes: Wakes, deadline: float | None
    ) -> Entry:
        """Borrow the entry of ``channel`` once its subscription is confirmed.

        Raises what the transport raises (NotSent, SubscribeRefused) or TimeoutError past
        ``deadline``; the entry is given back then. NotSent at once when the client is
        closed, also while waiting for the confirmation (its waiter then leaves, and its
        give-up goes out before the connections close)."""
        if self._closed:
            raise NotSent("the client is closed")
        entry = self._entries.get(channel)
        if entry is None:
            entry = self._entries[channel] = Entry(channel, key, wakes)
        entry.refs += 1
        try:
            confirmed = entry.confirmed
            if confirmed is None or (
                confirmed.done() and not confirmed.cancelled() and confirmed.exception()
            ):
                # Never subscribed, or its subscription failed (the pub/sub connection could
                # not be opened) while others still borrow it: subscribe again.
                self._listen(entry)
            confirmed = entry.confirmed
            assert confirmed is not None
            if not confirmed.done():
                await self._confirmation(confirmed, deadline)
                if self._closed:
                    raise NotSent("the client is closed")
            confirmed.result()  # raises if it failed
        except BaseException:
            self.release(entry)
            raise
        return entry

    async def _confirmation(self, confirmed: asyncio.Future[None], deadline: float | None) -> None:
        """Wait for ``confirmed`` (shared by the channel's borrowers: never cancelled here)
        until ``deadline``, or until the client closes."""
        waiting = asyncio.get_running_loop().create_future()

        def done(_: asyncio.Future[None]) -> None:
            if not waiting.done():
                waiting.set_result(None)

        confirmed.add_done_callback(done)
        self._confirming.add(waiting)
        try:
            if deadline is None:
                await waiting
            else:
                async with asyncio.timeout_at(deadline):
                    await waiting
        finally:
            self._confirming.discard(waiting)
            if not self._confirming:
                # a set never shrinks: after many borrowers at once, let its table go
                self._confirming = set()
            confirmed.remove_done_callback(done)

    def _listen(self, entry: Entry) -> None:
        confirmed = entry.confirmed = self._transport.subscribe(entry.channel, entry, key=entry.key)

        def done(future: asyncio.Future[None]) -> None:
            if not future.cancelled() and future.exception() is None:
                entry.confirmed_at = asyncio.get_running_loop().time()
                entry.refused = None

        confirmed.add_done_callback(done)

    def release(self, entry: Entry) -> None:
        """Give back an entry; the last borrower's release unsubscribes the channel."""
        entry.refs -= 1
        if entry.refs == 0:
            entry.stop()
        if entry.refs == 0 and self._entries.get(entry.channel) is entry:
            del self._entries[entry.channel]
            if not self._closed:
                self._transport.unsubscribe(entry.channel, key=entry.key)

    def close(self) -> None:
        """Wake every waiter (they re-check and find the client closed), and every borrower
        waiting for a subscription's confirmation (it gets NotSent)."""
        self._closed = True
        for entry in self._entries.values():
            entry.wake(ALL)
        for waiting in self._confirming:
            if not waiting.done():
                waiting.set_result(None)
