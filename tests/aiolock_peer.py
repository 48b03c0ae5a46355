"""An aiolock client in a process of its own, speaking the line protocol of
tests/redisson_peer.py, so tests drive both kinds of peer alike (see tests/peers.py).

Each ``<tid>`` is an asyncio task of its own (the owner of what it takes, as any aiolock
user's task) that runs its commands in order:

    <tid> fair-lock NAME WAIT_MS LEASE_MS    WAIT_MS -1: lock(); LEASE_MS -1: the watchdog
    <tid> fair-unlock NAME
    <tid> read-lock NAME WAIT_MS LEASE_MS  /  <tid> read-unlock NAME
    <tid> write-lock NAME WAIT_MS LEASE_MS /  <tid> write-unlock NAME
    quit

    -> "ready <client uuid>", then "<tid> owner <owner id>" when a task starts, and per
       command "<tid> acquired <monotonic ns>" | "<tid> timeout" | "<tid> unlocked" |
       "<tid> error <repr>"

``python tests/aiolock_peer.py URL [--clock-offset MS] [--watchdog S] [--allowance S]``: the
offset skews the clock this client writes into fair-lock deadlines; the allowance is its fair
locks' ``wait_allowance``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import aiolock


def say(*words: object) -> None:
    print(*words, flush=True)


class Peer:
    def __init__(self, client: aiolock.AioLock, options: argparse.Namespace) -> None:
        self.client = client
        self.offset: float = options.clock_offset / 1000
        self.allowance: float | None = options.allowance

    def clock(self) -> float:
        return time.time() + self.offset

    def lock_of(self, op: str, name: str) -> aiolock.Lock:
        if op.startswith("fair"):
            return aiolock.FairLock(
                self.client, name, wait_allowance=self.allowance, clock=self.clock
            )
        rw = self.client.read_write_lock(name)
        return rw.read_lock() if op.startswith("read") else rw.write_lock()

    async def thread(self, tid: str, commands: asyncio.Queue[list[str]]) -> None:
        say(tid, "owner", self.client.resolve_owner(None).id)
        while True:
            words = await commands.get()
            op, name = words[0], words[1]
            lock = self.lock_of(op, name)
            try:
                if op.endswith("-lock"):
                    wait_ms, lease_ms = int(words[2]), int(words[3])
                    lease = None if lease_ms < 0 else lease_ms / 1000
                    if wait_ms < 0:
                        await lock.lock(lease)
                        acquired = True
                    else:
                        acquired = await lock.try_lock(wait_ms / 1000, lease)
                    if acquired:
                        say(tid, "acquired", time.monotonic_ns())
                    else:
                        say(tid, "timeout")
                else:
                    await lock.unlock()
                    say(tid, "unlocked")
            except Exception as exc:  # reported, the task goes on
                say(tid, "error", repr(exc).replace("\n", " "))


async def main(options: argparse.Namespace) -> None:
    config: dict[str, Any] = {}
    if options.watchdog is not None:
        config["watchdog_timeout"] = options.watchdog
    async with aiolock.from_url(options.url, **config) as client:
        peer = Peer(client, options)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        queues: dict[str, asyncio.Queue[list[str]]] = {}
        tasks: list[asyncio.Task[None]] = []
        say("ready", client.id)
        while line := await reader.readline():
            words = line.decode().split()
            if not words:
                continue
            if words[0] == "quit":
                break
            tid = words[0]
            if tid not in queues:
                queues[tid] = asyncio.Queue()
                tasks.append(asyncio.create_task(peer.thread(tid, queues[tid])))
            queues[tid].put_nowait(words[1:])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--clock-offset", type=int, default=0, metavar="MS")
    parser.add_argument("--watchdog", type=float, default=None, metavar="S")
    parser.add_argument("--allowance", type=float, default=None, metavar="S")
    asyncio.run(main(parser.parse_args()))
