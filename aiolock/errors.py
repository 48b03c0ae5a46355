"""The exceptions aiolock raises, one tree rooted at :class:`AioLockError`.

::

    AioLockError                      every error of this library
    ├── ClientClosedError             the client was closed (``aclose()``)
    ├── WrongEventLoopError           a client used from an event loop other than its own
    ├── RedisOperationError           a Redis call failed; the message says what is known
    │   ├── RedisUnavailableError     no connection could be opened (nothing was sent)
    │   ├── RedisTimeoutError         no reply within ``command_timeout`` (also a TimeoutError)
    │   ├── OutcomeUnknownError       a command's reply was lost and whether it ran could
    │   │                             not be settled in time; any hold it may have taken is
    │   │                             released in the background or expires unrenewed
    │   ├── SubscriptionError         the server refused a subscription (e.g. ACL -NOPERM)
    │   └── ReplicationError          no replica acknowledged a grant (``replica_acks``);
    │                                 the grant was given back
    └── LockError                     about one lock
        ├── LockNotOwnedError         unlock by an owner that does not hold the lock (or
        │                             the release of a semaphore permit that is not held)
        │   └── LockLostError         the hold ended without an unlock: lease expired,
        │                             force-unlocked, renewal not confirmed, client closed
        ├── LockTimeout               wait_time ran out (also a built-in TimeoutError)
        ├── LockUsageError            an operation the lock's rules forbid (e.g. a reader
        │                             asking for the write lock it can never get)
        └── LockStateError            the object's state on the server refuses the operation
                                      (a latch counted below zero, more permits removed
                                      than are available); nothing was changed. Also a
                                      built-in ValueError

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


class RedisUnavailableError(RedisOperationError):
    """No connection to Redis could be opened; the command was not sent."""


class RedisTimeoutError(RedisOperationError, TimeoutError):
    """Redis did not answer within ``Config.command_timeout``."""


class OutcomeUnknownError(RedisOperationError):
    """A command's reply was lost and whether it ran could not be settled in time.

    What it may have done is undone in the background as soon as the server answers (a hold
    it may have taken is released), or runs out with its lease, never renewed."""


class SubscriptionError(RedisOperationError):
    """The server refused a pub/sub subscription (for example an ACL ``-NOPERM``)."""


class ReplicationError(RedisOperationError):
    """No replica acknowledged a grant within ``replica_ack_timeout`` (``Config.replica_acks``),
    or whether one did could not be known (a lost reply): the grant was given back (or is
    being, in the background) and nothing is held. ``acknowledged`` is the WAIT's reply
    (None: unknown), ``requested`` the replicas it waited for."""

    def __init__(self, message: str, *, acknowledged: int | None, requested: int) -> None:
        super().__init__(message)
        self.acknowledged = acknowledged
        self.requested = requested


class LockError(AioLockError):
    """An error about one lock; ``name`` is the lock's name."""

    def __init__(self, message: str, *, name: str) -> None:
        super().__init__(message)
        self.name = name


class LockNotOwnedError(LockError):
    """The owner (by default the current task) does not hold the lock it tried to release."""

    def __init__(self, message: str, *, name: str, owner: str) -> None:
        super().__init__(message, name=name)
        self.owner = owner


class LockLostError(LockNotOwnedError):
    """A hold ended without being released: its lease expired, it was force-unlocked, the
    watchdog could not confirm a renewal before the lease ran out, or the client closed."""


class LockTimeout(LockError, TimeoutError):
    """The lock was not acquired within ``wait_time``."""


class LockUsageError(LockError):
    """An operation the lock's rules forbid, refused before any Redis call."""


class LockStateError(LockError, ValueError):
    """What the object holds on the server refuses the operation (counting down a latch that
    is open already, removing more permits than are available); nothing was changed."""
