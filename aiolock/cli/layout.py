"""Redisson's key layout, read backwards: which object a key or channel belongs to.

aiolock writes its locks in Redisson's layout (:mod:`aiolock.keys`); the CLI reads every type
of that layout, including the ones aiolock has no class for yet, so it also shows objects made
by Redisson (Java). For an object named ``N``:

===============================  ==========================================================
object                           keys (type) and channels
===============================  ==========================================================
lock                             ``N`` hash ``{<uuid>:<n>: hold count}``, PTTL = lease;
                                 channel ``redisson_lock__channel:{N}``
fenced lock                      the same, plus ``redisson_lock_token:{N}`` (string counter)
fair lock                        the same hash, plus ``redisson_lock_queue:{N}`` (list of
                                 waiting owners) and ``redisson_lock_timeout:{N}`` (zset:
                                 owner -> deadline, Unix ms); channel per waiter
                                 ``redisson_lock__channel:{N}:<owner>``
read-write lock                  ``N`` hash with ``mode`` = ``read`` | ``write``, readers
                                 ``<uuid>:<n>``, the writer ``<uuid>:<n>:write``; per read
                                 hold ``{N}:<owner>:rwlock_timeout:<k>``; channel
                                 ``redisson_rwlock:{N}``
semaphore                        ``N`` string (available permits); channel ``redisson_sc:{N}``
permit-expirable semaphore       the same, plus ``{N}:timeout`` (zset: permit id -> expiry ms)
countdown latch                  ``N`` string (the count); channel
                                 ``redisson_countdownlatch__channel__{N}``
===============================  ==========================================================

``prefix:{N}`` is ``prefix:N`` when ``N`` already holds a ``{``, and ``{N}:suffix`` is
``N:suffix`` then (:func:`aiolock.keys.suffixed`); the latch channel always adds braces.
"""

from __future__ import annotations

import re
from functools import lru_cache

from .. import keys
from ..keys import latch_channel as latch_channel
from ..keys import lock_channel as lock_channel
from ..keys import rwlock_channel as rwlock_channel
from ..keys import semaphore_channel as semaphore_channel
from ..keys import token_key as token_key

# The names are aiolock.keys's (one place), read backwards here.
fair_queue = keys.fair_queue_key
fair_timeout = keys.fair_timeout_key
fair_alive = keys.fair_alive_key
permit_timeout = keys.permit_timeouts_key

LOCK_CHANNEL = keys.LOCK_CHANNEL_PREFIX
TOKEN = keys.TOKEN_PREFIX
FAIR_QUEUE = keys.FAIR_QUEUE_PREFIX
FAIR_TIMEOUT = keys.FAIR_TIMEOUT_PREFIX
RWLOCK_CHANNEL = keys.RWLOCK_CHANNEL_PREFIX
SEMAPHORE_CHANNEL = keys.SEMAPHORE_CHANNEL_PREFIX
LATCH_CHANNEL = keys.LATCH_CHANNEL_PREFIX
UNLOCK_LATCH = "redisson_unlock_latch"
PERMIT_TIMEOUT = "timeout"
RWLOCK_HOLD_TIMEOUT = ":rwlock_timeout:"
NO_LEASE_SCORE = keys.NON_EXPIRABLE_SCORE
"""A permit-expirable semaphore's expiry score for a permit taken without a lease."""

_UUID = r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
OWNER = re.compile(rf"(?P<owner>{_UUID}:(?:[0-9]+|{_UUID}))(?P<write>:write)?")
"""A hash field of a lock: ``<client uuid>:<thread or task id>`` (node-redisson: a uuid for
the thread id), ``:write`` for a writer."""


def fair_waiter_channel(name: str, owner: str) -> str:
    return f"{lock_channel(name)}:{owner}"


def _unwrap(tagged: str) -> list[str]:
    """The names whose ``prefixName``/``suffixName`` part is ``tagged``, likeliest first.

    ``{a}`` comes from the name ``a`` or from the name ``{a}``; ``x{a}`` only from ``x{a}``; a
    part without ``{`` from no name at all.
    """
    if "{" not in tagged:
        return []
    inner = tagged[1:-1]
    if tagged.startswith("{") and tagged.endswith("}") and "{" not in inner:
        return [inner, tagged]
    return [tagged]


def names_after(prefix: str, key: str) -> list[str]:
    """The names whose ``keys.suffixed(prefix, name)`` is ``key`` (none if ``key`` is not
    one)."""
    if not key.startswith(prefix + ":"):
        return []
    return _unwrap(key[len(prefix) + 1 :])


def names_before(suffix: str, key: str) -> list[str]:
    """The names whose ``keys.suffix_name(name, suffix)`` is ``key``."""
    if not key.endswith(":" + suffix):
        return []
    return _unwrap(key[: -len(suffix) - 1])


def names_of_channel(prefix: str, channel: str) -> list[str]:
    """The names whose channel under ``prefix`` is ``channel``."""
    if prefix == LATCH_CHANNEL:
        rest = channel.removeprefix(prefix)
        if rest != channel and rest.startswith("{") and rest.endswith("}"):
            return [rest[1:-1]]
        return []
    return names_after(prefix, channel)


def is_internal(key: str) -> bool:
    """Keys that belong to an object but are not listed: unlock latches, read-hold leases."""
    return key.startswith(UNLOCK_LATCH + ":") or RWLOCK_HOLD_TIMEOUT in key


@lru_cache(maxsize=64)
def glob(pattern: str) -> re.Pattern[str]:
    """A Redis glob (``*``, ``?``, ``[abc]``, ``[^a-z]``, ``\\x``) as a whole-string regex."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        elif c == "[" and "]" in pattern[i + 1 :]:
            j = i + 1
            negate = j < n and pattern[j] == "^"
            j += negate
            parts: list[str] = []
            while pattern[j] != "]":
                if pattern[j] == "\\" and j + 1 < n:
                    j += 1
                    parts.append(re.escape(pattern[j]))
                elif j + 2 < n and pattern[j + 1] == "-" and pattern[j + 2] != "]":
                    low, high = sorted((pattern[j], pattern[j + 2]))
                    parts.append(f"{re.escape(low)}-{re.escape(high)}")
                    j += 2
                else:
                    parts.append(re.escape(pattern[j]))
                j += 1
                if j >= n:
                    break
            if parts:
                out.append("[" + ("^" if negate else "") + "".join(parts) + "]")
            else:
                out.append("." if negate else "(?!)")
            i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def escape_glob(text: str) -> str:
    """``text`` as a Redis glob that matches only itself (for PSUBSCRIBE and SCAN MATCH)."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
