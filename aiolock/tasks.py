"""Owner numbers: the asyncio Task plays the part of Redisson's thread.

Each Task gets a number the first time it touches a lock, and every explicit owner gets one
when it is made; numbers come from one counter per process and are never reused, so a
finished task's owner id cannot be mistaken for a new one's.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref

_ids: weakref.WeakKeyDictionary[asyncio.Task[object], int] = weakref.WeakKeyDictionary()
_next_id = itertools.count(1)


def new_id() -> int:
    """A number no task or owner of this process has had."""
    return next(_next_id)


def current_task() -> asyncio.Task[object]:
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("aiolock locks must be used from inside an asyncio task")
    return task


def current_task_id(task: asyncio.Task[object] | None = None) -> int:
    """The number of ``task`` (default: the running one), assigned on first use."""
    if task is None:
        task = current_task()
    try:
        return _ids[task]
    except KeyError:
        task_id = _ids[task] = new_id()
        return task_id
