"""``python -m benchmarks.diagnostics.aclose_hang``: does ``AioLock.aclose()`` return?

A waiter takes the lock (its pub/sub entry is released, so an UNSUBSCRIBE is queued for the
pub/sub writer task) and the client is closed at once. PubSubHub's ``writer.cancel(); await
writer`` then waits for a writer that was cancelled while ``send_command`` was finishing:
redis-py sends through ``asyncio.wait_for`` (connections have a socket_timeout), and Python
3.11's ``wait_for`` drops a cancellation that arrives as the inner send completes. The writer
goes on to its next ``outbox.get()`` and ``aclose()`` never returns (or, if another item is
queued, it sends on the closed connection and raises AttributeError).
"""

from __future__ import annotations

import asyncio

import aiolock
from aiolock.testing import RedisServer


async def attempt(url: str) -> str:
    holder, waiter = aiolock.from_url(url), aiolock.from_url(url)
    lock = holder.lock("diag:aclose")
    await lock.lock(lease_time=5)
    task = asyncio.ensure_future(waiter.lock("diag:aclose").lock(lease_time=5))
    await asyncio.sleep(0.2)  # the waiter is subscribed and waiting
    await lock.unlock()
    await task  # acquired: its entry was released, an UNSUBSCRIBE is queued
    closing = asyncio.ensure_future(waiter.aclose())
    done, _ = await asyncio.wait({closing}, timeout=3)
    if not done:
        outcome = "HUNG (3 s)"
    elif closing.exception() is not None:
        outcome = f"raised {closing.exception()!r}"
    else:
        outcome = "ok"
    await holder.aclose()
    return outcome


def main() -> None:
    with RedisServer() as server:
        for i in range(3):
            print(f"attempt {i + 1}: waiter.aclose() {asyncio.run(attempt(server.url))}")


if __name__ == "__main__":
    main()
