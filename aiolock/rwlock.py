"""The read-write lock (Redisson's RReadWriteLock): many readers or one writer. Two rules on
the shared acquisition loop, one per side.

Layout (Redisson's, so Java and Python services share the lock):

* ``name``: a hash; ``mode`` = ``read`` | ``write``; each reader's field ``<owner>`` -> its
  hold count; the writer's field ``<owner>:write`` -> its hold count. Its TTL is the writer's
  lease, or the longest remaining read hold;
* ``{name}:<owner>:rwlock_timeout:<k>``: one string per read hold (the k-th hold of that
  reader), whose TTL is that hold's lease;
* ``redisson_rwlock:{name}``: the channel of readers and writers. A write unlock publishes
  ``1`` (every waiter re-checks: waiting readers may all come in), a read unlock that frees
  the lock ``0`` (one waiter: a writer).

The writer of owner ``o`` is the owner ``o:write`` as far as holds go (the hash field Redisson
writes), so one task may hold the write lock and read holds side by side: a writer may take
the read lock (and unlocking the write lock then leaves it reading, a downgrade). A reader may
not take the write lock: it would wait for itself for ever, so it gets
:class:`~aiolock.LockUsageError` at once.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from . import commands, scripts
from .errors import LockUsageError
from .holds import HoldState, Owner, Renewal
from .keys import (
    PUBLISH,
    UNLOCK_MESSAGE,
    WAKE_ALL_MESSAGE,
    rwlock_channel,
    rwlock_timeout_prefix,
)
from .lock import Lock, LockRule
from .rules import Attempt, Command
from .runtime import Runtime, RuntimeSource, runtime_of

_READ_HELD = b"READ_HELD"
_WRITE_SUFFIX = ":write"


class _RWRule(LockRule):
    """What both sides share: the lock hash at ``name`` and the channel
    ``redisson_rwlock:{name}``."""

    __slots__ = ()

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._channel_key = rwlock_channel(name)
        self._channel = self._channel_key.encode()


class ReadRule(_RWRule):
    """The read side: a count per reader in the hash, plus a timeout key per hold."""

    kind = "read_lock"

    __slots__ = ("_key_prefix",)

    #: a reader never queues behind this client's waiting tasks without trying: they may be
    #: writers waiting for readers, and readers share the lock with readers (Redisson's rule)
    queue_locally = False

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._key_prefix = name if "{" in name else f"{{{name}}}"
        self.renewal = Renewal(scripts.READ_LOCK_RENEW, name)

    def attempt(self, owner: str, lease_ms: int, wait_ms: int | None) -> Command:
        return scripts.READ_LOCK_ACQUIRE.command(
            (self.name, rwlock_timeout_prefix(self.name, owner)),
            (lease_ms, owner, owner + _WRITE_SUFFIX),
        )

    def release(self, owner: str, lease_ms: int, count: int) -> Command:
        return scripts.READ_LOCK_RELEASE.command(
            (
                self.name,
                self._channel_key,
                rwlock_timeout_prefix(self.name, owner),
                self._key_prefix,
            ),
            (UNLOCK_MESSAGE, lease_ms, owner, count, PUBLISH),
        )

    def purge(self, owner: str) -> Command:
        return scripts.READ_LOCK_PURGE.command(
            (
                self.name,
                self._channel_key,
                rwlock_timeout_prefix(self.name, owner),
                self._key_prefix,
            ),
            (UNLOCK_MESSAGE, owner, PUBLISH),
        )

    def force_unlock(self) -> Command:
        return scripts.READ_LOCK_FORCE_UNLOCK.command(
            (self.name, self._channel_key), (WAKE_ALL_MESSAGE, PUBLISH)
        )


class WriteRule(_RWRule):
    """The write side. The owner ids it is given are writers, ``<owner>:write`` (see
    :func:`writer_of`), or a plain owner id that replaced one after a request that could not
    be fenced: the hash field is always the id with ``:write`` (Redisson's writer field)."""

    kind = "write_lock"

    __slots__ = ()

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.renewal = Renewal(scripts.WRITE_LOCK_RENEW, name)

    def attempt(self, owner: str, lease_ms: int, wait_ms: int | None) -> Command:
        writer = _writer_field(owner)
        return scripts.WRITE_LOCK_ACQUIRE.command(
            (self.name,), (lease_ms, writer, writer.removesuffix(_WRITE_SUFFIX))
        )

    def parse(self, reply: Any) -> Attempt:
        if reply == _READ_HELD:
            raise LockUsageError(
                f"the owner holds the read lock of {self.name!r}, so it cannot take the write "
                "lock (it would wait for itself); unlock the read lock first",
                name=self.name,
            )
        return super().parse(reply)

    async def count(self, rt: Runtime, owner: str) -> int:
        return await super().count(rt, _writer_field(owner))

    def release(self, owner: str, lease_ms: int, count: int) -> Command:
        return scripts.WRITE_LOCK_RELEASE.command(
            (self.name, self._channel_key),
            (WAKE_ALL_MESSAGE, lease_ms, _writer_field(owner), count, PUBLISH),
        )

    def purge(self, owner: str) -> Command:
        return scripts.WRITE_LOCK_PURGE.command(
            (self.name, self._channel_key), (WAKE_ALL_MESSAGE, _writer_field(owner), PUBLISH)
        )

    def force_unlock(self) -> Command:
        return scripts.WRITE_LOCK_FORCE_UNLOCK.command(
            (self.name, self._channel_key), (WAKE_ALL_MESSAGE, PUBLISH)
        )


def _writer_field(owner: str) -> str:
    return owner if owner.endswith(_WRITE_SUFFIX) else owner + _WRITE_SUFFIX


def writer_of(owner: Owner) -> Owner:
    """The writer that ``owner`` is when it takes a write lock (its holds are apart from its
    read holds; its id is the hash field Redisson writes, ``<owner id>:write``)."""
    return Owner(owner.id + _WRITE_SUFFIX, owner.task)


class ReadLock(Lock):
    """The read side of a :class:`ReadWriteLock`: shared by any number of readers (tasks,
    processes, Redisson clients) while nobody writes. Everything else is
    :class:`~aiolock.Lock`'s: reentrancy, leases and the watchdog (which renews each hold's
    own timeout key and keeps the lock's TTL at the longest remaining read hold),
    ``async with``, ``try_lock``, ``guard``, ``on_lost``, ``statistics``.

    The owner holding the write lock may also take the read lock; a reader may not take the
    write lock (:class:`~aiolock.LockUsageError`). Readers come in while the lock is in read
    mode even if a writer waits, as with Redisson: a writer can wait as long as readers
    overlap without a gap.
    """

    __slots__ = ()

    _rule_class = ReadRule

    async def is_locked(self) -> bool:
        """True if anyone holds a read lock (checked on the server), the writer included."""
        flat = await self._read("HGETALL", self.name)
        if not flat:
            return False
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        mode = fields.get(b"mode")
        if mode == b"read":
            return True
        return any(f != b"mode" and not f.endswith(_WRITE_SUFFIX.encode()) for f in fields)

    async def force_unlock(self) -> bool:
        """Delete the lock if it is in read mode, whoever reads it, and wake every waiter;
        True if it was. A lock in write mode is left alone (False)."""
        return await super().force_unlock()


class WriteLock(Lock):
    """The write side of a :class:`ReadWriteLock`: exclusive of every reader and every other
    writer. Everything else is :class:`~aiolock.Lock`'s (reentrant, leases and the watchdog,
    ``async with``, ``try_lock``, ``guard``, ``on_lost``, ``statistics``).

    The writer may take the read lock too; unlocking the write lock then leaves the lock in
    read mode (a downgrade) and wakes waiting readers. A task holding the read lock asking
    for the write lock gets :class:`~aiolock.LockUsageError` at once instead of waiting for
    itself. Statistics and errors name the writer ``<owner id>:write``, Redisson's field.
    """

    __slots__ = ()

    _rule_class = WriteRule

    def _owner(self, owner: Owner | None) -> Owner:
        return writer_of(self._runtime.resolve_owner(owner))

    def _grant(
        self,
        wait: float | None,
        lease_time: float | None,
        owner: Owner | None,
        max_hold: float | None = None,
    ) -> Coroutine[Any, Any, Attempt | None]:
        reader = self._runtime.resolve_owner(owner)
        leases = self._runtime.use().leases
        read = leases.get(self.name, reader)
        if read is not None and leases.current(read).state is HoldState.HELD and read.count:
            raise LockUsageError(
                f"{reader.id} holds the read lock of {self.name!r}, so it cannot take the "
                "write lock (it would wait for itself); unlock the read lock first",
                name=self.name,
            )
        return super()._grant(wait, lease_time, owner, max_hold)

    async def is_locked(self) -> bool:
        """True if a writer holds the lock (checked on the server)."""
        return bool(await self._read("HGET", self.name, "mode") == b"write")

    async def force_unlock(self) -> bool:
        """Delete the lock if it is in write mode, whoever writes it, and wake every waiter;
        True if it was. A lock in read mode is left alone (False)."""
        return await super().force_unlock()


class ReadWriteLock:
    """A read-write lock; get one with ``client.read_write_lock(name)``.

    ``read_lock()`` is shared by readers, ``write_lock()`` excludes everyone else; both are
    locks like :class:`~aiolock.Lock` (reentrant, leased, ``async with``)::

        rw = client.read_write_lock("config")
        async with rw.read_lock():
            ...  # many readers at once
        async with rw.write_lock():
            ...  # alone

    Writers are not given priority (Redisson's rule): readers keep coming in while the lock
    is in read mode, so a writer waits until readers stop overlapping.
    """

    __slots__ = ("_read_lock", "_runtime", "_write_lock", "name")

    def __init__(
        self, runtime: Runtime | RuntimeSource, name: str, *, max_hold: float | None = None
    ) -> None:
        self.name = name
        self._runtime = runtime = runtime_of(runtime)
        self._read_lock = ReadLock(runtime, name, max_hold=max_hold)
        self._write_lock = WriteLock(runtime, name, max_hold=max_hold)

    def __repr__(self) -> str:
        return f"<aiolock.ReadWriteLock {self.name!r}>"

    def read_lock(self) -> ReadLock:
        """The read side (the same object every time; lock objects are stateless)."""
        return self._read_lock

    def write_lock(self) -> WriteLock:
        """The write side (the same object every time)."""
        return self._write_lock

    async def mode(self) -> str | None:
        """``"read"``, ``"write"`` or None (free), read from the server."""
        value = await commands.read(
            self._runtime.use(), self.name, "HGET", self.name, "mode", what="HGET"
        )
        return None if value is None else bytes(value).decode()
