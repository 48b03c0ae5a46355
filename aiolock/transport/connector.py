"""Opening links with backoff: one attempt at a time, shared by every caller queued behind it.

After a failed attempt the next one waits ``reconnect_delay * 2^n`` (at most
``reconnect_max_delay``) with equal jitter, so a 1 ms outage does not use up every retry and
a long one does not turn into a connect storm. A caller never waits past its own deadline:
it gets the last error instead, and does not wait at all after a refusal that waiting would
not change (:class:`~.link.Refused`: a wrong password or database, a cluster node). A link
opened after every caller stopped waiting is still handed to ``adopt``, so none is ever
left unowned.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable

from ..config import Config
from .calls import NotSent, Refused
from .link import Link


class Connector:
    """Opens one kind of link to one server (see the module docstring)."""

    def __init__(
        self,
        open_link: Callable[[], Awaitable[Link]],
        adopt: Callable[[Link], None],
        config: Config,
        *,
        what: str,
    ) -> None:
        self._open_link = open_link
        self._what = what
        self._adopt = adopt
        self._config = config
        self._attempt: asyncio.Future[Link] | None = None
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._not_before = 0.0
        self._last_error: NotSent | None = None
        self._closed = False
        #: links opened so far
        self.opened = 0

    async def connect(self, deadline: float | None) -> Link:
        """A newly opened (and adopted) link; raises :class:`NotSent` (also when
        ``deadline`` passes)."""
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise NotSent("the client is closed")
            attempt = self._attempt
            if attempt is None:
                pause = self._not_before - loop.time()
                if pause > 0:
                    last = self._last_error
                    if isinstance(last, Refused) and deadline is not None:
                        # waiting would not change the answer. A background reopener (no
                        # deadline) waits the backoff instead: it would loop on this raise
                        # without ever yielding to the event loop.
                        raise Refused(str(last))
                    if deadline is not None and loop.time() + pause > deadline:
                        raise last or NotSent("reconnecting")
                    await asyncio.sleep(pause)
                    continue
                attempt = self._attempt = loop.create_future()
                self._task = loop.create_task(self._run(attempt))
            try:
                if deadline is None:
                    return await asyncio.shield(attempt)
                async with asyncio.timeout_at(deadline):
                    return await asyncio.shield(attempt)
            except TimeoutError:
                raise NotSent(f"no connection to {self._what} in time") from None

    async def _run(self, attempt: asyncio.Future[Link]) -> None:
        loop = asyncio.get_running_loop()
        try:
            link = await self._open_link()
        except BaseException as exc:
            error = exc if isinstance(exc, NotSent) else NotSent(f"connect failed: {exc!r}")
            self._failures += 1
            self._last_error = error
            config = self._config
            backoff = min(
                config.reconnect_max_delay, config.reconnect_delay * 2 ** (self._failures - 1)
            )
            self._not_before = loop.time() + backoff / 2 + random.uniform(0, backoff / 2)
            attempt.set_exception(error)
            attempt.exception()  # retrieved: no "never retrieved" warning if nobody waited
            if not isinstance(exc, Exception):
                raise
        else:
            self._failures = 0
            self._last_error = None
            self.opened += 1
            if self._closed:
                link.close(NotSent("the client is closed"))
                attempt.set_exception(NotSent("the client is closed"))
                attempt.exception()
            else:
                try:
                    self._adopt(link)
                except BaseException as exc:  # never expected: its callers must not hang
                    link.close(exc)
                    attempt.set_exception(NotSent(f"adopting a new link failed: {exc!r}"))
                    attempt.exception()
                    raise
                attempt.set_result(link)
        finally:
            self._attempt = self._task = None

    async def aclose(self) -> None:
        """No more links; an attempt under way is cancelled and closes what it opened."""
        self._closed = True
        task = self._task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
