"""Lock names -> Redis keys and pub/sub channels, in one place.

The layout is Redisson's, so a mixed fleet of Java and Python services can share locks:
side keys and channels are ``prefix:{name}``, or ``prefix:name`` when the name already holds
a ``{`` hash tag, so every key and channel of one object lands in the lock's cluster slot.
"""

from __future__ import annotations

import math

LOCK_CHANNEL_PREFIX = "redisson_lock__channel"
TOKEN_PREFIX = "redisson_lock_token"
UNLOCK_MESSAGE = "0"
READ_UNLOCK_MESSAGE = "1"


def check_name(name: object) -> str:
    """Return ``name`` if it is a usable lock name, else raise TypeError/ValueError."""
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("lock name must not be empty")
    return name


def suffixed(prefix: str, name: str) -> str:
    """``prefix:{name}``, or ``prefix:name`` if ``name`` already carries a hash tag."""
    if "{" in name:
        return f"{prefix}:{name}"
    return f"{prefix}:{{{name}}}"


def lock_channel(name: str) -> str:
    return suffixed(LOCK_CHANNEL_PREFIX, name)


def token_key(name: str) -> str:
    return suffixed(TOKEN_PREFIX, name)


def check_seconds(value: object, what: str, *, positive: bool = False) -> float:
    """Validate a duration in seconds: a finite real >= 0 (> 0 with ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"{what} must be finite, got {value!r}")
    if seconds < 0 or (positive and seconds == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{what} must be {bound}, got {value!r}")
    return seconds


def to_millis(seconds: float) -> int:
    """Seconds -> whole milliseconds, at least 1 (PEXPIRE 0 would delete the key)."""
    return max(1, round(seconds * 1000))
