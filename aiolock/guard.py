"""The cancel-on-loss guard, written once for every type (``Lock.guard()``, the semaphore's
permit guard, ``MultiLock.guard()``, the ``locked`` decorator and the FastAPI dependency).

A :class:`Guard` is entered once the hold is taken and wraps the body: when the hold is lost
while the body runs, the body's task is cancelled once (``finally`` blocks and other cleanup
in it still run) and, when the body ends with that cancellation and no other, the loss is
raised from the ``async with`` as :class:`~aiolock.LockLostError`, at once: what is left of
the release (a lost hold's cleanup on a server that may be gone) goes on in the background.
A cancellation from outside still wins, as :func:`asyncio.timeout` tells its own from
others: by the task's count of cancellation requests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType

from .errors import AioLockError, LockLostError
from .holds import LostCallback

logger = logging.getLogger("aiolock")

#: registers a loss callback on the hold; returns its remover
OnLost = Callable[[LostCallback], Callable[[], None]]
#: the release at the end of the body, given the body's exception (None: it ended normally);
#: the body's own exception wins over a failed release
Release = Callable[[BaseException | None], Awaitable[None]]
#: the release of a hold the guard found lost: gives back its lost count without waiting for
#: the server (what it cannot finish at once goes on in the background)
ReleaseLost = Callable[[], Awaitable[None]]


class Guard:
    """Hold for the body and cancel the body if the hold is lost (see the module docstring).

    ``async with Guard(what, on_lost, release, release_lost):`` right after the hold was
    taken; ``what`` names the hold in the cancellation message."""

    __slots__ = (
        "_cancelling",
        "_inside",
        "_lost",
        "_on_lost",
        "_release",
        "_release_lost",
        "_remove",
        "_task",
        "_what",
    )

    def __init__(
        self, what: str, on_lost: OnLost, release: Release, release_lost: ReleaseLost
    ) -> None:
        self._what = what
        self._on_lost = on_lost
        self._release = release
        self._release_lost = release_lost
        self._lost: LockLostError | None = None
        self._inside = False
        self._remove: Callable[[], None] | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._inside = True
        try:
            # a hold lost already is told at the body's first suspension
            self._remove = self._on_lost(self._lost_now)
        except BaseException as exc:  # never expected (it was just taken): give it back
            self._inside = False
            await self._release(exc)
            raise

    def _lost_now(self, error: LockLostError) -> None:
        if self._inside and self._lost is None:
            self._lost = error
            assert self._task is not None
            self._task.cancel(f"aiolock: {self._what} was lost")

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._inside = False
        assert self._task is not None and self._remove is not None
        try:
            # the cancellation this guard asked for is taken back whatever the body did with
            # it (as asyncio.timeout does); it was the only one if the count is back down
            if self._lost is not None and self._task.uncancel() <= self._cancelling:
                if isinstance(exc, asyncio.CancelledError):
                    # The body ended with the cancellation the loss made (and no other):
                    # the loss is the outcome, told at once.
                    await self._release_lost()
                    raise self._lost from exc
            await self._release(exc)
        finally:
            self._remove()


async def release_at_exit(
    release: Awaitable[object], exc: BaseException | None, what: str, *, lost_ok: bool = False
) -> None:
    """The release at the end of an ``async with`` of every type: the body's own exception
    ``exc`` wins; a failed release (of ``what``, e.g. ``'name'``) is attached to it as a note,
    and logged, instead of replacing it. ``lost_ok``: a loss was told already (by a guard)."""
    try:
        await release
    except LockLostError:
        if lost_ok:
            return
        if exc is None:
            raise
        exc.add_note(f"aiolock: {what} was lost before the end of the block")
    except AioLockError as error:
        if exc is None:
            raise
        exc.add_note(f"aiolock: releasing {what} failed: {error}")
        logger.warning("aiolock: releasing %s after an error in the block failed: %s", what, error)
