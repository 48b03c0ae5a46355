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
    """

    watchdog_timeout: float = 30.0
    cleanup_timeout: float = 5.0
    retry_attempts: int = 3
    pubsub_reconnect_delay: float = 0.2

    def __post_init__(self) -> None:
        check_seconds(self.watchdog_timeout, "watchdog_timeout", positive=True)
        check_seconds(self.cleanup_timeout, "cleanup_timeout", positive=True)
        check_seconds(self.pubsub_reconnect_delay, "pubsub_reconnect_delay", positive=True)
        if isinstance(self.retry_attempts, bool) or not isinstance(self.retry_attempts, int):
            raise TypeError("retry_attempts must be an int")
        if self.retry_attempts < 0:
            raise ValueError(f"retry_attempts must be >= 0, got {self.retry_attempts}")
