"""Client configuration."""

from __future__ import annotations

from dataclasses import dataclass

from .keys import check_seconds


@dataclass(frozen=True, slots=True)
class Config:
    """Settings of one :class:`~aiolock.AioLock` client (immutable; all times in seconds).

    watchdog_timeout:
        The lease of a hold taken without ``lease_time``; the watchdog renews it every third.
    cleanup_timeout:
        How long shielded cleanup (an unlock in ``__aexit__``, undoing a cancelled acquire)
        may take before it is left to finish in the background.
    retry_attempts:
        How often a lock script whose reply was lost is tried again, once its outcome has been
        resolved as "did not run" (a script that did run is never run again).
    pubsub_reconnect_delay:
        Pause between attempts to re-open the shared pub/sub connection after it dropped.
    pubsub_ping_interval:
        After this long without a word on the pub/sub connection it is sent a PING; if
        another interval passes in silence, the connection is dropped and opened again.
    """

    watchdog_timeout: float = 30.0
    cleanup_timeout: float = 5.0
    retry_attempts: int = 3
    pubsub_reconnect_delay: float = 0.2
    pubsub_ping_interval: float = 5.0

    def __post_init__(self) -> None:
        check_seconds(self.watchdog_timeout, "watchdog_timeout", positive=True)
        check_seconds(self.cleanup_timeout, "cleanup_timeout", positive=True)
        check_seconds(self.pubsub_reconnect_delay, "pubsub_reconnect_delay", positive=True)
        check_seconds(self.pubsub_ping_interval, "pubsub_ping_interval", positive=True)
        _check_int(self.retry_attempts, "retry_attempts", minimum=0)


def _check_int(value: object, what: str, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
