"""The exceptions aiolock raises, one tree rooted at :class:`AioLockError`.

::

    AioLockError                      every error of this library
    ├── ClientClosedError             the client (or its pub/sub reader) was closed
    ├── WrongEventLoopError           a client used from an event loop other than its own
    ├── RedisOperationError           a Redis call failed and its outcome is known not to
    │                                 have changed anything, or could not be resolved
    └── LockError                     about one lock
        ├── LockNotOwnedError         unlock by a task that does not hold the lock
        │   └── LockLostError         the hold ended without an unlock: lease expired,
        │                             force-unlocked, or renewal could not be confirmed
        └── LockTimeout               wait_time ran out (also a built-in TimeoutError)

Bad arguments raise the built-in ``TypeError`` / ``ValueError`` before any Redis call.
``asyncio.CancelledError`` is never wrapped: it propagates unchanged after cleanup.
"""

from __future__ import annotations


class AioLockError(Exception):
    """Base class of every exception raised by aiolock."""


class ClientClosedError(AioLockError):
    """The client was closed (``aclose()``), so it can no longer run operations."""


class WrongEventLoopError(AioLockError):
    """A client bound to one event loop was used from another one."""


class RedisOperationError(AioLockError):
    """A Redis call failed; the message says whether its effect is known."""


class LockError(AioLockError):
    """An error about one lock; ``name`` is the lock's name."""

    def __init__(self, message: str, *, name: str) -> None:
        super().__init__(message)
        self.name = name


class LockNotOwnedError(LockError):
    """The current task does not hold the lock it tried to release."""

    def __init__(self, message: str, *, name: str, owner: str) -> None:
        super().__init__(message, name=name)
        self.owner = owner


class LockLostError(LockNotOwnedError):
    """A hold ended without being released: its lease expired, it was force-unlocked,
    or the watchdog could not confirm a renewal before the lease ran out."""


class LockTimeout(LockError, TimeoutError):
    """The lock was not acquired within ``wait_time``."""
