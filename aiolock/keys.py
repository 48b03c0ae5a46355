"""Names -> Redis keys, pub/sub channels and hash slots, in one place; input validation.

The layout is Redisson's, so a mixed fleet of Java and Python services can share locks:
side keys and channels are ``prefix:{name}``, or ``prefix:name`` when the name already holds
a ``{`` hash tag, so every key and channel of one object lands in the name's cluster slot.
A name for which that rule would split an object over two slots is rejected before any
I/O, on every deployment (the same name must work when a service moves to a cluster):
``a{b`` (an unclosed brace), ``{}a`` (an empty tag), and ``a}b`` (a closing brace with no
opening one: ``prefix:{a}b}`` has the hash tag ``a``). Every key and channel of every type
then lands in the name's slot, but for one documented exception: the countdown latch's
channel of a name with a tag of its own (:func:`latch_channel`).

All durations are seconds (floats), as everywhere in asyncio; Redis gets milliseconds.
"""

from __future__ import annotations

import binascii
import functools
import math
import warnings

LOCK_CHANNEL_PREFIX = "redisson_lock__channel"
TOKEN_PREFIX = "redisson_lock_token"
FAIR_QUEUE_PREFIX = "redisson_lock_queue"
FAIR_TIMEOUT_PREFIX = "redisson_lock_timeout"
FAIR_ALIVE_PREFIX = "aiolock_lock_alive"
RWLOCK_CHANNEL_PREFIX = "redisson_rwlock"
#: published by the last release of a lock: wakes one waiter
UNLOCK_MESSAGE = "0"
#: published when every waiter should re-check (a write unlock of a read-write lock)
WAKE_ALL_MESSAGE = "1"

#: the longest lease or wait in milliseconds: exact as a Lua number (2^53), and far within
#: what PEXPIRE accepts (about 285,000 years)
MAX_MILLIS = 2**53


def check_name(name: object) -> str:
    """Return ``name`` if it is a usable object name, else raise TypeError/ValueError."""
    if not isinstance(name, str):
        raise TypeError(f"lock name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("lock name must not be empty")
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"lock name {name!r} cannot be encoded as UTF-8: {exc.reason}"
            ) from None
    if ("{" in name or "}" in name) and key_slot(name) != key_slot(suffixed("x", name)):
        if "{" in name:
            why = (
                "has a '{' but no usable hash tag ({...} with something inside), so its "
                "keys and channels"
            )
        else:
            why = (
                "has a '}' and no '{': the side keys and channels of Redisson's layout wrap "
                "it as '{name}', whose hash tag stops at that '}', so they"
            )
        raise ValueError(
            f"lock name {name!r} {why} would land in another cluster slot than the name "
            "itself (scripts over them fail with CROSSSLOT on a cluster); use a name without "
            "braces, or one with a hash tag of its own such as '{tag}rest'"
        )
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


def suffix_name(name: str, suffix: str) -> str:
    """Redisson's ``suffixName``: ``{name}:suffix``, or ``name:suffix`` if ``name`` already
    carries a hash tag (same slot as ``name`` either way)."""
    if "{" in name:
        return f"{name}:{suffix}"
    return f"{{{name}}}:{suffix}"


def fair_queue_key(name: str) -> str:
    """A fair lock's waiting owners, first in line first: ``redisson_lock_queue:{name}``."""
    return suffixed(FAIR_QUEUE_PREFIX, name)


def fair_timeout_key(name: str) -> str:
    """A fair lock's waiters' deadlines: ``redisson_lock_timeout:{name}`` (zset, Unix ms)."""
    return suffixed(FAIR_TIMEOUT_PREFIX, name)


def fair_alive_key(name: str) -> str:
    """aiolock's fair-lock waiters' heartbeats: ``aiolock_lock_alive:{name}`` (zset owner ->
    Unix ms on the server's clock until which that waiter is presumed alive). Not Redisson's:
    its waiters have none, and its scripts never read it."""
    return suffixed(FAIR_ALIVE_PREFIX, name)


def rwlock_channel(name: str) -> str:
    """A read-write lock's channel, shared by readers and writers: ``redisson_rwlock:{name}``."""
    return suffixed(RWLOCK_CHANNEL_PREFIX, name)


def rwlock_timeout_prefix(name: str, owner: str) -> str:
    """The prefix of one reader's per-hold timeout keys ``{name}:<owner>:rwlock_timeout``
    (hold ``k`` is ``<prefix>:<k>``)."""
    return suffix_name(name, f"{owner}:rwlock_timeout")


# -- hash slots (CRC16/XMODEM of the hash tag, as Redis Cluster computes them) --------------


def key_slot(key: str | bytes) -> int:
    """The Redis Cluster hash slot of ``key`` (its ``{tag}`` if it has a non-empty one):
    CRC16/XMODEM (``binascii.crc_hqx``, in C) modulo 16384, as Redis Cluster computes it."""
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start != -1:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return binascii.crc_hqx(data, 0) % 16384


# -- durations ------------------------------------------------------------------------------


def check_seconds(value: object, what: str, *, positive: bool = False) -> float:
    """Validate a duration in seconds: a finite real >= 0 (> 0 with ``positive``) that Redis
    can take in milliseconds."""
    if type(value) is int and 0 < value <= MAX_MILLIS // 1000:
        return float(value)  # the common case, checked cheaply
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"{what} must be finite, got {value!r}")
    if seconds < 0 or (positive and seconds == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{what} must be {bound} seconds, got {value!r}")
    if seconds * 1000 > MAX_MILLIS:
        raise ValueError(f"{what} must be at most {MAX_MILLIS // 1000} seconds, got {value!r}")
    return seconds


#: the shortest lease: a hold must be able to outlive the round trip that takes it
MIN_LEASE = 0.01


def check_lease(value: object, what: str) -> float:
    """:func:`check_seconds` for a lease (at least :data:`MIN_LEASE`), warning when it looks
    like milliseconds (Redisson counts in milliseconds: ``30000`` there is 30 s, here it is
    8 hours)."""
    seconds = check_seconds(value, what, positive=True)
    if seconds < MIN_LEASE:
        raise ValueError(f"{what} must be at least {MIN_LEASE} s, got {value!r}")
    if seconds >= 1000:
        warnings.warn(
            f"{what}={value!r} is in seconds ({seconds / 3600:.1f} hours); "
            "aiolock counts in seconds, not milliseconds as Redisson does",
            stacklevel=3,
        )
    return seconds


@functools.lru_cache(maxsize=256)
def to_millis(seconds: float) -> int:
    """Seconds -> whole milliseconds, at least 1 (PEXPIRE 0 would delete the key). Cached:
    the few leases a program uses are one int each, not one per waiter (issue 18)."""
    return max(1, round(seconds * 1000))


# -- semaphores and latches (Redisson's layout) -----------------------------------------------

SEMAPHORE_CHANNEL_PREFIX = "redisson_sc"
LATCH_CHANNEL_PREFIX = "redisson_countdownlatch__channel__"
#: the pub/sub publish command passed to scripts (Redisson passes it as an argument too, so
#: that the same script text serves classic and sharded pub/sub)
PUBLISH = "PUBLISH"
#: the publish command of a script that must publish classically even where pub/sub is
#: sharded (a cluster transport turns PUBLISH arguments into SPUBLISH, not this spelling)
CLASSIC_PUBLISH = "publish"
#: the score Redisson gives a permit-expirable semaphore's permit taken without a lease
NON_EXPIRABLE_SCORE = 922337203685477
#: the most permits one call may ask for or add (Java's int, as Redisson)
MAX_PERMITS = 2**31 - 1


def semaphore_channel(name: str) -> str:
    """``redisson_sc:{name}``: where a semaphore's new permit counts are published."""
    return suffixed(SEMAPHORE_CHANNEL_PREFIX, name)


def permit_timeouts_key(name: str) -> str:
    """``{name}:timeout``: a permit-expirable semaphore's sorted set of permit ids."""
    return suffix_name(name, "timeout")


def latch_channel(name: str) -> str:
    """``redisson_countdownlatch__channel__{name}``: Redisson wraps the name in literal braces
    even when it has a hash tag of its own, so for such a name (``{t}x``) the channel's hash
    tag is ``{t`` and the channel lands in another cluster slot than the count (see
    :func:`same_slot`)."""
    return f"{LATCH_CHANNEL_PREFIX}{{{name}}}"


def same_slot(a: str, b: str) -> bool:
    """True if the keys or channels ``a`` and ``b`` land in the same cluster hash slot."""
    return key_slot(a) == key_slot(b)


def requests_key(name: str, client_id: str) -> str:
    """``{name}:aiolock_requests:<client id>``: a client's request latches on one object, in
    the object's slot (a hash: request id -> what the request did; see aiolock.semaphore)."""
    return suffix_name(name, f"aiolock_requests:{client_id}")


def check_permits(value: object, what: str = "permits", *, minimum: int = 1) -> int:
    """Validate a number of permits (or a latch count): an int (not a bool) from ``minimum``
    to :data:`MAX_PERMITS`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    if value > MAX_PERMITS:
        raise ValueError(f"{what} must be at most {MAX_PERMITS}, got {value}")
    return value
