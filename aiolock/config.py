"""Client configuration."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import check_lease, check_seconds


@dataclass(frozen=True, slots=True)
class Config:
    """Settings of one :class:`~aiolock.AioLock` client (immutable; all times in seconds).

    watchdog_timeout:
        The lease of a hold taken without ``lease_time``; the watchdog renews it every third.
    command_timeout:
        How long one Redis command may go unanswered (Redisson's default: 3 s). A connection
        whose oldest command waited longer is dropped, and the outcome of every command in
        flight on it is settled before anything is sent again. ``try_lock(wait_time=W)``
        returns or raises within ``W + command_timeout``.
    cleanup_timeout:
        How long ``unlock()``, an ``async with`` exit, undoing a cancelled acquire and
        ``aclose()`` may take; what is not confirmed by then goes on in the background (a
        hold is released as soon as the server answers, or expires unrenewed).
    retry_attempts:
        How often a command that certainly did not run (no connection, or a lost request
        that was proven never to run) is sent again.
    reconnect_delay, reconnect_max_delay:
        Reconnection backs off exponentially from the first to the second, with jitter; a
        caller never waits past its own deadline for it.
    ping_interval:
        A connection silent this long is sent a PING; one that does not answer within
        ``command_timeout`` is dropped and opened again.
    sharded_pubsub:
        Redis Cluster only: whether waiters listen with sharded pub/sub (SSUBSCRIBE, and
        scripts publish with SPUBLISH) or classic (SUBSCRIBE/PUBLISH). None (the default)
        chooses as Redisson does: sharded if the cluster answers ``PUBSUB SHARDNUMSUB``
        (Redis 7+). Java and Python clients sharing locks must make the same choice.
    """

    watchdog_timeout: float = 30.0
    command_timeout: float = 3.0
    cleanup_timeout: float = 5.0
    retry_attempts: int = 3
    reconnect_delay: float = 0.05
    reconnect_max_delay: float = 2.0
    ping_interval: float = 5.0
    sharded_pubsub: bool | None = None

    def __post_init__(self) -> None:
        check_lease(self.watchdog_timeout, "watchdog_timeout")
        for what, least in (
            ("command_timeout", 0.01),
            ("cleanup_timeout", 0.01),
            ("reconnect_delay", 0.001),
            ("reconnect_max_delay", 0.001),
            ("ping_interval", 0.01),
        ):
            if check_seconds(getattr(self, what), what, positive=True) < least:
                raise ValueError(f"{what} must be at least {least} s, got {getattr(self, what)!r}")
        if self.sharded_pubsub is not None and not isinstance(self.sharded_pubsub, bool):
            raise TypeError("sharded_pubsub must be True, False or None")
        _check_int(self.retry_attempts, "retry_attempts", minimum=0, maximum=100)
        if self.reconnect_max_delay < self.reconnect_delay:
            raise ValueError("reconnect_max_delay must be >= reconnect_delay")
        if self.watchdog_timeout < 0.03:
            raise ValueError("watchdog_timeout must be at least 0.03 s (renewed every third)")


def _check_int(value: object, what: str, *, minimum: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{what} must be between {minimum} and {maximum}, got {value}")
