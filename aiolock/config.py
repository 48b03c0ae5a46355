"""Client configuration."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .keys import MIN_LEASE, check_lease, check_seconds


@dataclass(frozen=True, slots=True)
class Config:
    """Settings of one :class:`~aiolock.AioLock` client (immutable; all times in seconds).

    watchdog_timeout:
        The lease of a hold taken without ``lease_time``; the watchdog renews it every third.
    command_timeout:
        How long one Redis command may go unanswered (Redisson's default: 3 s). A connection
        whose oldest command waited longer is dropped, and the outcome of every command in
        flight on it is settled before anything is sent again. ``try_lock(wait_time=W)``
        returns or raises within ``W + command_timeout`` (it gives up a little before: 5%
        of command_timeout, at most 50 ms, so that it has returned by then).
    cleanup_timeout:
        How long ``unlock()``, an ``async with`` exit, undoing a cancelled acquire and
        ``aclose()`` may take; what is not confirmed by then goes on in the background (a
        hold is released as soon as the server answers, or expires unrenewed). Like
        command_timeout, it is kept with a small margin (5%, at most 50 ms).
    retry_attempts:
        How often a command that certainly did not run (no connection, or a lost request
        that was proven never to run) is sent again.
    reconnect_delay, reconnect_max_delay:
        Reconnection backs off exponentially from the first to the second, with jitter; a
        caller never waits past its own deadline for it.
    ping_interval:
        A connection silent this long is sent a PING; one that does not answer within
        ``command_timeout`` is dropped and opened again.
    replica_acks:
        0 (default): no replica acknowledgement. n > 0: every acquire and release script is
        followed, on the same connection, by ``WAIT n replica_ack_timeout`` (Redisson's
        ``checkLockSyncedSlaves``). A grant that no replica acknowledged is given back and
        :class:`~aiolock.ReplicationError` raised; at least one acknowledgement (even if
        fewer than n) is accepted, as in Redisson. See docs/sentinel.md, "Replica acknowledgement".
    replica_ack_timeout:
        How long ``WAIT`` waits for the replicas (seconds; Redisson's ``slavesSyncTimeout``,
        1 s). Must be below ``command_timeout``: the WAIT's time counts in its command's.
        Commands sent after it on the same connection wait behind it.
    max_hold:
        None (default): the watchdog renews a hold for as long as it is held. Seconds: it
        renews a hold taken without ``lease_time`` for at most this long after the grant,
        then lets the lease run out, so a stuck holder cannot keep a lock for ever; the loss
        is reported like any other (``on_lost``, ``guard()``, LockLostError naming the
        cap). Each ``lock()``/``try_lock()``/``guard()`` call may pass its own
        ``max_hold``. See docs/locks.md, "Capping a hold".
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
    replica_acks: int = 0
    replica_ack_timeout: float = 1.0
    sharded_pubsub: bool | None = None
    max_hold: float | None = None

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
        _check_int(self.replica_acks, "replica_acks", minimum=0, maximum=100)
        if check_seconds(self.replica_ack_timeout, "replica_ack_timeout", positive=True) < 0.001:
            raise ValueError("replica_ack_timeout must be at least 0.001 s")
        if self.replica_acks and self.replica_ack_timeout >= self.command_timeout:
            raise ValueError(
                "replica_ack_timeout must be below command_timeout (the WAIT is part of the "
                f"command), got {self.replica_ack_timeout} >= {self.command_timeout}"
            )
        if self.max_hold is not None:
            check_max_hold(self.max_hold)
        if self.watchdog_timeout < 0.03:
            raise ValueError("watchdog_timeout must be at least 0.03 s (renewed every third)")


def _check_int(value: object, what: str, *, minimum: int, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{what} must be between {minimum} and {maximum}, got {value}")


def check_max_hold(value: object, what: str = "max_hold") -> float:
    """Validate a cap on renewal (seconds, at least :data:`MIN_LEASE`; ``math.inf``: no cap).

    Unlike a lease, a cap of hours is ordinary (a nightly job) and Redisson has no such
    setting to count in milliseconds, so a large one is not warned about."""
    if isinstance(value, float) and value == math.inf:
        return value
    seconds = check_seconds(value, what, positive=True)
    if seconds < MIN_LEASE:
        raise ValueError(f"{what} must be at least {MIN_LEASE} s, got {value!r}")
    return seconds
