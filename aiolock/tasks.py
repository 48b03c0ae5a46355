"""Owner numbers: the asyncio Task plays the part of Redisson's thread.

Each Task gets a number the first time it touches a lock, and every explicit owner gets one
when it is made; numbers come from one counter per process and are never reused, so a
finished task's owner id cannot be mistaken for a new one's.

A task's number lives in the owner ids the clients it used made for it
(:class:`OwnerIds`: ``<client id>:<number>``, weakly keyed by the task), and only when no
client has one in a table of its own: a task waiting for a lock of one client costs one weak
reference and its owner id, nothing more (issue 18).
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections.abc import Callable
from typing import Any

TaskKey = weakref.ref[asyncio.Task[Any]]

#: the numbers of live tasks that no client's cache holds (current_task_id() asked first)
_ids: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()
#: the owner id caches of the live clients (id() -> cache)
_caches: dict[int, dict[TaskKey, str]] = {}
_next_id = itertools.count(1)


def new_id() -> int:
    """A number no task or owner of this process has had."""
    return next(_next_id)


def current_task() -> asyncio.Task[object]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("aiolock locks must be used from inside an asyncio task")
    return task


def _known_id(task: asyncio.Task[Any]) -> int | None:
    """The number ``task`` has already, if any."""
    key = weakref.ref(task)
    for cache in list(_caches.values()):  # (copied at once: clients come and go)
        owner_id = cache.get(key)
        if owner_id is not None:
            return int(owner_id.rpartition(":")[2])
    return _ids.get(task)


def current_task_id(task: asyncio.Task[Any] | None = None) -> int:
    """The number of ``task`` (default: the running one), assigned on first use."""
    if task is None:
        task = current_task()
    number = _known_id(task)
    if number is None:
        number = _ids[task] = new_id()
    return number


class OwnerIds:
    """One client's cache of its task owners' ids (``<client id>:<task number>``), weakly
    keyed by the tasks: an entry goes with its task (no done callback on it, and no
    reference to the client)."""

    __slots__ = ("__weakref__", "_cache", "_forget", "_prefix")

    def __init__(self, client_id: str) -> None:
        self._prefix = f"{client_id}:"
        cache: dict[TaskKey, str] = {}
        self._cache = cache
        self._forget: Callable[[TaskKey], object] = lambda key: cache.pop(key, None)
        _caches[id(self)] = cache
        weakref.finalize(self, _caches.pop, id(self), None)

    def of(self, task: asyncio.Task[Any]) -> str:
        """The owner id of ``task``."""
        owner_id = self._cache.get(weakref.ref(task))  # one dict lookup, all in C
        if owner_id is None:
            number = _known_id(task)
            if number is None:
                number = new_id()
            owner_id = self._cache[weakref.ref(task, self._forget)] = f"{self._prefix}{number}"
        return owner_id

    def __len__(self) -> int:
        return len(self._cache)
