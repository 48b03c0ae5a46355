"""The client: a thin facade over one transport, its wait entries and its lease registry:
factories of locks, owners, lifecycle (``aclose``) and ``statistics()``."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, NoReturn, ParamSpec, TypeVar
from urllib.parse import parse_qs, urlsplit

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

from . import decorator
from .commands import cleanup_deadline
from .config import Config
from .contexts import async_only
from .errors import ClientClosedError, LockTimeout, WrongEventLoopError
from .fair_lock import FairLock
from .fenced_lock import FencedLock
from .holds import Hold, Owner
from .keys import check_name, check_seconds
from .latch import CountDownLatch
from .leases import Leases
from .lock import Lock, unlock_at_exit
from .members import MemberLock
from .metrics import Metrics, resolve
from .permit_semaphore import PermitExpirableSemaphore
from .pubsub import PubSub
from .redlock import DRIFT_FACTOR, RedLock
from .rules import Rule
from .runtime import Runtime
from .rwlock import ReadWriteLock
from .semaphore import Semaphore
from .sentinel import is_sentinel_url, master_from_url
from .spin_lock import SpinLock, spinning
from .transport import ServerSettings, StandaloneTransport, Transport
from .transport.cluster import ClusterTransport
from .transport.resolve import SentinelAddress

if TYPE_CHECKING:
    from starlette.requests import Request

P = ParamSpec("P")
T = TypeVar("T")
R = TypeVar("R", bound="Rule")
logger = logging.getLogger("aiolock")


@dataclass(frozen=True, slots=True)
class ClientStatistics:
    """What one client holds open, has in flight and keeps alive (no Redis call)."""

    #: open command links and commands on them awaiting replies
    links: int
    commands_in_flight: int
    #: pub/sub channels listened to, and tasks parked waiting on them
    subscriptions: int
    tasks_waiting: int
    #: command links and pub/sub connections opened so far (1 + reconnects each)
    links_opened: int
    pubsub_connections_opened: int
    #: pub/sub connections opened again after one was lost
    pubsub_reconnects: int
    #: dropped links fenced before their lost replies were settled
    fences: int
    #: holds the watchdog renews, and renewal script calls made so far
    renewals: int
    renewal_calls: int
    #: holds by state: acquiring, held, releasing, released, lost
    holds: Mapping[str, int]
    #: cleanups and other background work still running
    background_tasks: int
    #: times the server behind the client changed (a failover named another master, or a
    #: server restarted: another run_id); every hold was checked there each time
    server_changes: int = 0


class AioLock:
    """A client of aiolock: the factory of locks, bound to one Redis deployment.

    ``AioLock(redis)`` takes the connection settings of a ``redis.asyncio.Redis`` (address or
    unix socket, TLS, credentials, database, client name) and opens its own connections with
    them: one pipelined link for every command and one pub/sub link. Each client has its own
    uuid (``client.id``), the first half of every owner id it writes, so several clients in
    one process never share holds. ``async with client:`` closes it; :meth:`aclose` may be
    called more than once. A Redis client passed in is not closed by :meth:`aclose`; one made
    by :func:`from_url` is.

    ``AioLock(redis.asyncio.RedisCluster(...))`` works on a Redis Cluster: the slot map is
    the RedisCluster's (it follows MOVED and reloads after a failover), and aiolock opens one
    pipelined link and one pub/sub link per master with the nodes' connection settings.

    ``metrics``: True (the default) records metrics through OpenTelemetry's global meter
    provider if opentelemetry-api is installed (the ``otel`` extra), else nothing; False
    records nothing; an :class:`~aiolock.Metrics` records there (see ``aiolock.metrics``).

    A client of a Sentinel-managed master (``Sentinel(...).master_for(name)``) asks the
    Sentinels where the master is at every connect, through redis-py, and follows it when
    it moves (see the documentation's "Sentinel", docs/sentinel.md).
    """

    def __init__(
        self,
        redis: Redis | RedisCluster,
        *,
        config: Config | None = None,
        metrics: Metrics | bool = True,
    ) -> None:
        if not isinstance(redis, Redis | RedisCluster):
            raise TypeError(
                f"expected a redis.asyncio.Redis or RedisCluster, got {type(redis).__name__}"
            )
        if config is not None and not isinstance(config, Config):
            raise TypeError(f"config must be an aiolock.Config, got {type(config).__name__}")
        self.redis = redis
        self.config = config or Config()
        self.id = str(uuid.uuid4())
        transport: Transport
        if isinstance(redis, RedisCluster):
            if self.config.replica_acks:
                # The cluster transport rewrites and redirects single commands; a script
                # chained with its WAIT is not carried through that yet.
                raise ValueError("replica_acks is not supported on a Redis Cluster yet")
            transport = ClusterTransport(redis, self.config)
            nodes = sorted(node.name for node in redis.nodes_manager.startup_nodes.values())
            #: (where, database): which deployment this client's locks live on
            self.deployment = ("cluster " + ",".join(nodes), 0)
        else:
            settings = ServerSettings.from_redis(redis)
            pool = redis.connection_pool
            resolver = SentinelAddress(pool) if isinstance(pool, SentinelConnectionPool) else None
            transport = StandaloneTransport(settings, self.config, resolver=resolver)
            where = settings.address if resolver is None else resolver.deployment
            self.deployment = (where, settings.db)
        self._owns_redis = False
        self._owned_sentinel: Sentinel | None = None
        self._background: set[asyncio.Task[Any]] = set()
        #: False once aclose() stopped waiting for background work: none is started then
        self._spawning = True
        self.metrics = resolve(metrics)
        pubsub = PubSub(transport)
        leases = Leases(self.id, transport, self.config, self._spawn, self.metrics)
        self._runtime = Runtime(
            transport,
            pubsub,
            leases,
            self.config,
            self._spawn,
            self.metrics,
            id=self.id,
            deployment=self.deployment,
        )
        if self.metrics is not None:
            self.metrics.watch(transport)

    def __repr__(self) -> str:
        state = "closed" if self._runtime.closed else "open"
        return f"<aiolock.AioLock {self.id} {state}, {len(self._runtime.leases.holds)} holds>"

    # -- factories ------------------------------------------------------------------------

    def lock(self, name: str, *, max_hold: float | None = None) -> Lock:
        """The reentrant lock called ``name`` (no Redis call until it is used).
        ``max_hold`` caps how long the watchdog renews its holds (None: ``config.max_hold``);
        each of the locks below takes it too."""
        return Lock(self._runtime, check_name(name), max_hold=max_hold)

    def fenced_lock(self, name: str, *, max_hold: float | None = None) -> FencedLock:
        """The fenced lock called ``name``: a lock whose acquisitions return fencing tokens."""
        return FencedLock(self._runtime, check_name(name), max_hold=max_hold)

    def spin_lock(
        self,
        name: str,
        *,
        initial_delay: float = 0.001,
        max_delay: float = 0.128,
        multiplier: float = 2.0,
        max_hold: float | None = None,
    ) -> SpinLock:
        """The spin lock called ``name``: a lock whose waiters try again after a growing
        pause instead of subscribing (Redisson's ``RSpinLock``; see :class:`SpinLock`)."""
        return SpinLock(
            self._runtime,
            check_name(name),
            initial_delay=initial_delay,
            max_delay=max_delay,
            multiplier=multiplier,
            max_hold=max_hold,
        )

    def fair_lock(
        self, name: str, *, wait_allowance: float | None = None, max_hold: float | None = None
    ) -> FairLock:
        """The fair lock called ``name``: a lock handed out first come, first served (Redisson's
        ``RFairLock`` layout). ``wait_allowance`` (seconds, 10 by default) bounds how long a
        waiter that died holds up the line once the lock is free (see :class:`FairLock`)."""
        return FairLock(
            self._runtime, check_name(name), wait_allowance=wait_allowance, max_hold=max_hold
        )

    def read_write_lock(self, name: str, *, max_hold: float | None = None) -> ReadWriteLock:
        """The read-write lock called ``name``: ``.read_lock()`` shared by many readers,
        ``.write_lock()`` exclusive (Redisson's ``RReadWriteLock`` layout)."""
        return ReadWriteLock(self._runtime, check_name(name), max_hold=max_hold)

    def semaphore(self, name: str) -> Semaphore:
        """The semaphore called ``name`` (Redisson's RSemaphore layout)."""
        return Semaphore(self._runtime, check_name(name))

    def permit_expirable_semaphore(self, name: str) -> PermitExpirableSemaphore:
        """The semaphore called ``name`` whose permits expire (Redisson's
        RPermitExpirableSemaphore layout)."""
        return PermitExpirableSemaphore(self._runtime, check_name(name))

    def countdown_latch(self, name: str) -> CountDownLatch:
        """The countdown latch called ``name`` (Redisson's RCountDownLatch layout)."""
        return CountDownLatch(self._runtime, check_name(name))

    @async_only
    async def alock(
        self, name: str, *, wait_time: float | None = None, lease_time: float | None = None
    ) -> AsyncIterator[Lock]:
        """Hold the lock ``name`` for the ``async with`` body.

        Waits without bound, or at most ``wait_time`` seconds and then raises
        :class:`~aiolock.LockTimeout` (a ``TimeoutError``). At exit the lock is released;
        the body's own exception wins over a failed release (see :class:`Lock`).
        """
        lock = self.lock(name)
        if wait_time is None:
            await lock.lock(lease_time)
        elif not await lock.try_lock(check_seconds(wait_time, "wait_time"), lease_time):
            raise LockTimeout(f"lock {name!r} not acquired within {wait_time} s", name=name)
        async with _releasing(lock):
            yield lock

    def locked(
        self,
        name: str | Callable[..., str],
        *,
        wait_time: float | None = None,
        lease_time: float | None = None,
        kind: Literal["lock", "fair_lock", "read_lock", "write_lock"] = "lock",
        guard: bool = True,
    ) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]:
        """Decorate an ``async def`` function so that each call holds the lock ``name``.

        ``name`` is a template filled from the call's arguments, bound to the function's
        parameters (positional or keyword, defaults applied): ``"order:{order_id}"``,
        ``"user:{user.id}"``, ``"order:{request.match_info[order_id]}"``; or a function
        given the call's arguments that returns the name. A template naming no parameter of
        the function is refused here (TypeError), as is a function that is not ``async def``.

        Each call waits for the lock as long as it takes, or at most ``wait_time`` seconds
        and then raises :class:`~aiolock.LockTimeout` without running the function.
        ``lease_time`` and ``kind`` (``"lock"``, ``"fair_lock"``, ``"read_lock"``,
        ``"write_lock"``) are those of the lock held; a call made while its task already
        holds the lock re-enters it. The release at the end of the call is shielded and the
        function's own exception wins over a failed one.

        If the hold is lost during the call: with ``guard`` (the default) the call is
        cancelled at once, as ``Lock.guard()`` cancels its body, and raises
        :class:`~aiolock.LockLostError`; with ``guard=False`` it runs to its end and then
        raises LockLostError instead of returning.

        The decorated function keeps the signature (and typing) of the original, so FastAPI,
        aiohttp and others read its parameters as before.
        """
        return decorator.locked(
            lambda: self,
            name,
            wait_time=wait_time,
            lease_time=lease_time,
            kind=kind,
            guard=guard,
        )

    def lock_dependency(
        self,
        name: str | Callable[[Request], str],
        *,
        wait_time: float | None = 0,
        lease_time: float | None = None,
        kind: Literal["lock", "fair_lock", "read_lock", "write_lock"] = "lock",
        guard: bool = True,
        status_code: int = 429,
        detail: Any = None,
        retry_after: float | None = 1,
    ) -> Callable[[Request], AsyncIterator[Lock]]:
        """A FastAPI dependency that holds the lock ``name`` for the request:
        ``Depends(locks.lock_dependency("order:{order_id}"))``.

        ``name`` is a template filled from the request's path parameters, then its query
        parameters (as strings, or as the path's convertors make them: ``{order_id:int}``),
        or a function of the request (Starlette's ``Request``) that returns the name. A
        request without a value the template needs is answered 422.

        The request waits for the lock at most ``wait_time`` seconds (0 by default: not at
        all; None: as long as it takes); when it runs out the request is answered
        ``status_code`` (429 by default; 409 and 423 are common too) with ``detail`` and a
        ``Retry-After: <retry_after>`` header (None: no header), and the endpoint does not
        run. The dependency's value is the lock held. ``lease_time``, ``kind`` and ``guard``
        are as for :meth:`locked`: with ``guard`` a lost hold cancels the request's task,
        which ends with LockLostError (a 500 unless the response was sent already).

        The lock is released when FastAPI runs the dependency's exit code: after the response
        has been sent (and its background tasks have run) with FastAPI's default,
        ``Depends(..., scope="request")`` (FastAPI 0.118 and later; 0.110 to 0.117 run it
        before the response is sent); right after the endpoint returns, before the response
        is sent, with ``Depends(..., scope="function")`` (FastAPI 0.121 and later).

        FastAPI is imported when the dependency is made; aiolock does not require it.
        """
        from .fastapi import lock_dependency

        return lock_dependency(
            lambda: self,
            name,
            wait_time=wait_time,
            lease_time=lease_time,
            kind=kind,
            guard=guard,
            status_code=status_code,
            detail=detail,
            retry_after=retry_after,
        )

    def rule(self, kind: Callable[[str], R], name: str) -> R:
        """The rule of the object ``name`` made by ``kind`` (rules are immutable: lock
        objects of one name share one, so making a lock object per request stays cheap).

        :meta private:
        """
        return self._runtime.rule(kind, name)

    def new_owner(self) -> Owner:
        """An explicit owner, for holds that pass between tasks (``lock.lock(owner=o)`` in
        one task, ``lock.unlock(owner=o)`` in another). Its holds are not tied to a task:
        they last until unlocked, lost, or the client closes."""
        return self._runtime.new_owner()

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._runtime.closed

    async def __aenter__(self) -> AioLock:
        self.runtime()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __enter__(self) -> NoReturn:
        raise TypeError("use 'async with' with an aiolock client, not 'with'")

    def __exit__(self, *args: object) -> None:  # pragma: no cover - __enter__ always raises
        pass

    async def aclose(self) -> None:
        """Close the client within ``config.cleanup_timeout``.

        Every hold is lost (``on_lost`` callbacks run, guarded bodies are cancelled) and
        released on the server where it can be in that time (else it expires unrenewed);
        waiters raise ClientClosedError; then every connection is closed.
        """
        if self._runtime.closed:
            return
        loop = asyncio.get_running_loop()
        if self._runtime.loop is not None and self._runtime.loop is not loop:
            raise WrongEventLoopError(
                f"aiolock client {self.id} belongs to another event loop; close it there"
            )
        self._runtime.close()
        start = loop.time()
        deadline = cleanup_deadline(start, self.config)
        # what is cancelled at the end gets the last tenth (at most 0.1 s) to end: within
        # the bound too
        cancel_at = deadline - min(0.1, (deadline - start) / 10)
        rt = self._runtime
        rt.leases.close()
        rt.pubsub.close()
        try:
            # The waiters it woke run first: each that was in a line (a fair lock's) hands its
            # give-up to a background task, waited for below, before the connections close.
            await asyncio.sleep(0)
            # Cleanups, and commands still in flight (an acquire's reply: its caller gives
            # back what it took while the connection is still there).
            while (
                self._background or rt.transport.statistics().commands_in_flight
            ) and loop.time() < cancel_at:
                if self._background:
                    await asyncio.wait(self._background, timeout=cancel_at - loop.time())
                else:
                    await asyncio.sleep(min(0.005, max(0.0, cancel_at - loop.time())))
            for task in list(self._background):
                task.cancel()
            if self._background:
                await asyncio.wait(self._background, timeout=max(0.0, deadline - loop.time()))
        finally:
            self._spawning = False
            await rt.transport.aclose()
            if self.metrics is not None:
                self.metrics.unwatch(rt.transport)
            await rt.leases.watchdog.wait_closed()
            if self._owns_redis:
                await self.redis.aclose()
            if self._owned_sentinel is not None:
                await self._owned_sentinel.aclose()

    # -- the runtime, for tests and tools (the lock types are handed it) ----------------

    @property
    def unchecked_runtime(self) -> Runtime:
        """The runtime, as the lock types are handed it (their constructors take a client
        too: ``aiolock.FairLock(client, name, clock=...)``); no check made.

        :meta private:
        """
        return self._runtime

    def runtime(self, *, closed_ok: bool = False) -> Runtime:
        """The runtime of the lock types; raises unless the client is used from its own
        event loop and is open (or ``closed_ok``: for what needs no Redis, like reporting
        the holds a closing client lost).

        :meta private:
        """
        return self._runtime.use(closed_ok=closed_ok)

    def resolve_owner(self, owner: Owner | None, task: asyncio.Task[Any] | None = None) -> Owner:
        """``owner``, or the owner that is ``task`` (by default the current task).

        :meta private:
        """
        return self._runtime.resolve_owner(owner, task)

    def holds_of(self, name: str) -> list[Hold]:
        """This client's holds on the object ``name``.

        :meta private:
        """
        return self._runtime.holds_of(name)

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``coro`` in a background task that :meth:`aclose` waits for. Once aclose()
        has stopped waiting for them none is started: ``coro`` is closed unrun and the task
        raises ClientClosedError at once (its work needed the client)."""
        loop = asyncio.get_running_loop()
        if not self._spawning:
            coro.close()
            refused = loop.create_task(_refused(self.id))
            refused.add_done_callback(_retrieve)
            return refused
        task = loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def statistics(self) -> ClientStatistics:
        """What the client holds open, has in flight and keeps alive (no Redis call)."""
        rt = self._runtime
        transport = rt.transport.statistics()
        return ClientStatistics(
            links=transport.links,
            commands_in_flight=transport.commands_in_flight,
            subscriptions=transport.subscriptions,
            tasks_waiting=rt.pubsub.parked + spinning(self._runtime),
            links_opened=transport.links_opened,
            pubsub_connections_opened=transport.pubsub_connections_opened,
            pubsub_reconnects=transport.pubsub_reconnects,
            fences=transport.fences,
            renewals=rt.leases.watchdog.renewing,
            renewal_calls=rt.leases.watchdog.calls,
            holds=rt.leases.counts(),
            background_tasks=len(self._background),
            server_changes=transport.server_changes,
        )


async def _refused(client_id: str) -> Any:
    raise ClientClosedError(f"aiolock client {client_id} is closed: no background work starts")


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # seen: whoever needed the work is told by the task or not at all


@asynccontextmanager
async def _releasing(lock: Lock) -> AsyncIterator[None]:
    """Release ``lock`` when the block ends; the block's own exception wins."""
    try:
        yield
    except BaseException as exc:
        await unlock_at_exit(lock, exc, None)
        raise
    else:
        await unlock_at_exit(lock, None, None)


def from_url(
    url: str,
    *,
    redis_options: Mapping[str, Any] | None = None,
    metrics: Metrics | bool = True,
    **config_overrides: Any,
) -> AioLock:
    """A client on a new ``redis.asyncio.Redis`` for ``url``, closed with the client.

    Keyword arguments are :class:`Config` fields, e.g. ``from_url(url, watchdog_timeout=10)``;
    ``redis_options`` go to ``Redis.from_url`` (e.g. ``{"ssl_ca_certs": ...}``); ``metrics``
    as for :class:`AioLock`.

    ``redis+cluster://host:port`` (``rediss+cluster://`` with TLS) makes a
    ``redis.asyncio.RedisCluster`` instead, seeded from that node.

    ``redis+sentinel://host:26379[,host:port...]/<service>[/<db>]`` makes a client of the
    master the Sentinels monitor as ``<service>`` (``password@`` before the hosts is the
    master's; the Sentinels' own credentials go in ``?sentinel_password=...``; see
    :mod:`aiolock.sentinel`); ``redis_options`` then go to ``Sentinel.master_for``.
    """
    check_url(url)
    config = Config(**config_overrides)
    redis: Redis | RedisCluster
    sentinel: Sentinel | None = None
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("redis+cluster", "rediss+cluster"):
        base = scheme.lower().removesuffix("+cluster")
        redis = RedisCluster.from_url(f"{base}://{rest}", **(redis_options or {}))
    elif is_sentinel_url(url):
        redis, sentinel = master_from_url(
            url, timeout=config.command_timeout, redis_options=dict(redis_options or {})
        )
    else:
        redis = Redis.from_url(url, **(redis_options or {}))
    client = AioLock(redis, config=config, metrics=metrics)
    client._owned_sentinel = sentinel
    client._owns_redis = True
    return client


URL_SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
)
"""What :func:`from_url` takes (redis-py's own error names only its first three)."""


#: the names of aiolock's settings, refused as URL parameters (see check_url)
_CONFIG_FIELDS = frozenset(field.name for field in fields(Config))


def check_url(url: object) -> None:
    """Refuse (TypeError / ValueError, before any I/O) what ``from_url`` cannot take: a
    URL that is not a string, a cluster URL without a host, a database path that is not a
    number (redis-py would silently use database 0), port 0 (redis-py would use 6379), an
    aiolock setting given as a URL parameter (redis-py would ignore it)."""
    if not isinstance(url, str):
        raise TypeError(f"from_url takes a URL string, not {type(url).__name__}")
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in URL_SCHEMES:
        schemes = ", ".join(f"{s}://" for s in URL_SCHEMES)
        raise ValueError(f"a Redis URL starts with one of {schemes}; not {url!r}")
    settings = sorted(_CONFIG_FIELDS.intersection(parse_qs(url.partition("?")[2])))
    if settings:
        # redis-py would take them as connection options and ignore them
        given = ", ".join(f"{name}=..." for name in settings)
        raise ValueError(
            f"{', '.join(settings)} in the URL: aiolock's settings are keywords of "
            f"from_url (from_url(url, {given})), not URL parameters: {url!r}"
        )
    if scheme == "unix" or is_sentinel_url(url):
        return  # a socket path; the Sentinel parser checks its own
    try:
        parts = urlsplit(url)
        port = parts.port  # a port that is not a number raises ValueError here
    except ValueError as exc:
        raise ValueError(f"not a Redis URL: {url!r} ({exc})") from None
    if port == 0:  # redis-py would go to 6379 instead
        raise ValueError(f"port 0 is no Redis server's port: {url!r}")
    if scheme.endswith("+cluster") and not parts.hostname:
        raise ValueError(f"a cluster URL names a node to start from: {url!r}")
    db = parts.path.strip("/")
    if db and not re.fullmatch(r"-?[0-9]+", db):
        raise ValueError(f"the database in a Redis URL is a number, not {db!r}: {url!r}")


def red_lock(
    *clients_or_locks: AioLock | MemberLock,
    name: str | None = None,
    drift_factor: float = DRIFT_FACTOR,
) -> RedLock:
    """A red lock over independent Redis masters: ``red_lock(client_a, client_b, client_c,
    name="x")`` takes ``client.lock("x")`` on each; ``red_lock(lock_a, lock_b, lock_c)``
    takes the given lock objects (e.g. fenced locks), one per master. Held by a quorum of
    ``N // 2 + 1``. See :class:`RedLock`."""
    if clients_or_locks and all(isinstance(c, AioLock) for c in clients_or_locks):
        if name is None:
            raise TypeError("red_lock over clients needs name=, the lock's name on each master")
        check_name(name)
        locks: list[MemberLock] = [c.lock(name) for c in clients_or_locks if isinstance(c, AioLock)]
        return RedLock(locks, name=name, drift_factor=drift_factor)
    if any(isinstance(c, AioLock) for c in clients_or_locks):
        raise TypeError("red_lock takes either clients (and name=) or lock objects, not both")
    lock_objects: list[Any] = list(clients_or_locks)
    if name is not None:
        check_name(name)
    return RedLock(lock_objects, name=name, drift_factor=drift_factor)
