"""The client: its two connections (one pipelined for every command, one for pub/sub, both
made with the settings of the caller's Redis pool), the holds of its tasks, its watchdog."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from redis.asyncio import Redis
from redis.exceptions import RedisError

from . import scripts
from .config import Config
from .connection import Pipeline
from .errors import ClientClosedError, LockTimeout, RedisOperationError, WrongEventLoopError
from .keys import check_name, check_seconds
from .pubsub import PubSubHub
from .tasks import current_task_id
from .watchdog import Watchdog

if TYPE_CHECKING:
    from .fenced_lock import FencedLock
    from .holds import Hold
    from .lock import Lock

T = TypeVar("T")
logger = logging.getLogger("aiolock")


class AioLock:
    """A client of aiolock: the factory of locks, bound to one ``redis.asyncio.Redis``.

    Each client has its own uuid (``client.id``), the first half of every owner id it writes,
    so several clients in one process never share holds. ``async with client:`` closes it;
    :meth:`aclose` stops everything the client started and may be called more than once.
    A client passed in by the caller is not closed by :meth:`aclose`; one made by
    :func:`from_url` is.
    """

    def __init__(self, redis: Redis, *, config: Config | None = None) -> None:
        if not isinstance(redis, Redis):
            raise TypeError(f"expected a redis.asyncio.Redis, got {type(redis).__name__}")
        if config is not None and not isinstance(config, Config):
            raise TypeError(f"config must be an aiolock.Config, got {type(config).__name__}")
        self.redis = redis
        self.config = config or Config()
        self.id = str(uuid.uuid4())
        self._owns_redis = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._holds: dict[tuple[str, str], Hold] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self.pubsub = PubSubHub(redis.connection_pool, self.config)
        self.pipeline = Pipeline(redis.connection_pool)
        self.watchdog = Watchdog(self)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<aiolock.AioLock {self.id} {state}, {len(self._holds)} holds>"

    # -- factories ------------------------------------------------------------------------

    def lock(self, name: str) -> Lock:
        """The reentrant lock called ``name`` (no Redis call until it is used)."""
        from .lock import Lock

        return Lock(self, check_name(name))

    @asynccontextmanager
    async def alock(
        self, name: str, *, wait_time: float | None = None, lease_time: float | None = None
    ) -> AsyncIterator[Lock]:
        """Hold the lock ``name`` for the ``async with`` body.

        Waits without bound, or at most ``wait_time`` seconds and then raises
        :class:`~aiolock.LockTimeout` (a ``TimeoutError``). The unlock at exit is shielded.
        """
        lock = self.lock(name)
        if wait_time is not None:
            check_seconds(wait_time, "wait_time")
        if wait_time is None:
            await lock.lock(lease_time)
        elif not await lock.try_lock(wait_time, lease_time):
            raise LockTimeout(f"lock {name!r} not acquired within {wait_time} s", name=name)
        try:
            yield lock
        finally:
            await lock.unlock()

    def fenced_lock(self, name: str) -> FencedLock:
        """The fenced lock called ``name``: a lock whose acquisitions return fencing tokens."""
        from .fenced_lock import FencedLock

        return FencedLock(self, check_name(name))

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> AioLock:
        self.check()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the pub/sub reader and background work; close the Redis client if owned.

        Held locks are not released: without renewal their leases simply run out.
        """
        if self._closed:
            return
        self._closed = True
        # each part is closed even if closing another one fails (exit callbacks run LIFO)
        async with contextlib.AsyncExitStack() as stack:
            if self._owns_redis:
                stack.push_async_callback(self.redis.aclose)
            stack.callback(self._end_holds)
            stack.push_async_callback(self.pipeline.aclose)
            stack.push_async_callback(self.pubsub.aclose)
            stack.push_async_callback(self.watchdog.aclose)
            if self._background:  # cleanups of cancelled callers still use the connections
                await asyncio.wait(self._background, timeout=self.config.cleanup_timeout)
                for task in self._background:
                    task.cancel()

    def _end_holds(self) -> None:
        for hold in self._holds.values():
            hold.end()
        self._holds.clear()

    # -- internals shared by the lock families -----------------------------------------------

    def check(self) -> None:
        """Raise unless the client is open and used from its own event loop."""
        if self._closed:
            raise ClientClosedError(f"aiolock client {self.id} is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                raise WrongEventLoopError(
                    f"aiolock client {self.id} belongs to another event loop; "
                    "create one client per event loop"
                )
            self._loop = loop

    def owner(self) -> str:
        """The owner id of the running task: ``<client uuid>:<task id>``."""
        return f"{self.id}:{current_task_id()}"

    async def run_script(
        self, script: scripts.Script, keys: tuple[str, ...], args: tuple[Any, ...]
    ) -> Any:
        """Run a script once on the client's pipelined connection (:func:`aiolock.scripts.run`).

        A lost reply raises ``scripts.OutcomeUnknown``: it may or may not have run."""
        return await scripts.run(self.pipeline, script, keys, args)

    async def read(self, *command: Any, what: str) -> Any:
        """Run a read-only command on the pipelined connection and return its raw reply;
        being idempotent it is tried again on a broken connection. Redis errors become
        :class:`RedisOperationError`."""
        attempts = self.config.retry_attempts + 1
        for attempt in range(attempts):
            try:
                return await self.pipeline.call(*command)
            except (scripts.OutcomeUnknown, scripts.NotSent) as exc:
                if attempt == attempts - 1:
                    raise RedisOperationError(f"{what} failed: {exc}") from exc
            except RedisError as exc:
                raise RedisOperationError(f"{what} failed: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` in a background task that :meth:`aclose` waits for."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def run_shielded(
        self,
        coro: Coroutine[Any, Any, T],
        undo: Callable[[T], Awaitable[object]] | None = None,
    ) -> T:
        """Run ``coro`` to completion even if the caller is cancelled.

        On cancellation the operation still finishes; then ``undo(result)`` runs if given
        (e.g. release a hold that a cancelled acquire obtained). The caller waits for both,
        at most ``cleanup_timeout``, and the CancelledError is re-raised unchanged.
        """
        task = asyncio.ensure_future(coro)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            cleanup = self.spawn(_finish_cancelled(task, undo))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait((cleanup,), timeout=self.config.cleanup_timeout)
            raise


async def _finish_cancelled(
    task: asyncio.Future[T], undo: Callable[[T], Awaitable[object]] | None
) -> None:
    try:
        result = await task
    except BaseException as exc:  # the operation failed: nothing to undo
        logger.debug("operation of a cancelled caller failed: %r", exc)
        return
    if undo is not None:
        try:
            await undo(result)
        except Exception:
            logger.exception("aiolock: undoing the operation of a cancelled caller failed")


def from_url(
    url: str, *, redis_options: Mapping[str, Any] | None = None, **config_overrides: Any
) -> AioLock:
    """A client on a new ``redis.asyncio.Redis`` for ``url``, closed with the client.

    Keyword arguments are :class:`Config` fields, e.g. ``from_url(url, watchdog_timeout=10)``;
    ``redis_options`` go to ``Redis.from_url`` (e.g. ``{"max_connections": 200}``).
    """
    config = Config(**config_overrides)
    client = AioLock(Redis.from_url(url, **(redis_options or {})), config=config)
    client._owns_redis = True
    return client
