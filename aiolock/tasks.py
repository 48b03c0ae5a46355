"""Owner ids: the asyncio Task plays the part of Redisson's thread.

Each Task gets an integer id the first time it touches a lock; ids come from one counter per
process and are never reused, so a finished task's id cannot be mistaken for a new task's.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref

_ids: weakref.WeakKeyDictionary[asyncio.Task[object], int] = weakref.WeakKeyDictionary()
_next_id = itertools.count(1)


def current_task_id() -> int:
    """The id of the running asyncio Task (assigned on first use)."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("aiolock locks must be used from inside an asyncio task")
    try:
        return _ids[task]
    except KeyError:
        task_id = _ids[task] = next(_next_id)
        return task_id
