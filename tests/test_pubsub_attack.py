"""Reproductions found by attacking the waking of waiters through pub/sub under faults."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio

import aiolock
from aiolock.testing import RedisServer


async def test_a_refused_pubsub_reconnect_does_not_spin_the_event_loop(
    fresh_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The server starts asking for a password (``requirepass``) while a waiter waits, and
    the pub/sub connection drops: reopening it is refused (NOAUTH, a Refused). The
    subscriber's reconnect task waits out the connector's backoff between attempts, and
    once the password is gone again the waiter gets the lock. (Connector.connect used to
    raise the last Refused at once while the backoff ran, also to this task, which has no
    deadline: Subscriber._connect looped on it without ever yielding, blocking the event
    loop and logging some 20,000 warnings a second.)"""
    admin = redis.asyncio.Redis.from_url(fresh_server.url)
    async with (
        aiolock.from_url(fresh_server.url) as holder,
        aiolock.from_url(fresh_server.url, reconnect_delay=0.5, reconnect_max_delay=0.5) as client,
    ):
        await holder.lock("x").lock()

        async def wait_for_it() -> None:
            async with client.lock("x"):
                pass

        waiter = asyncio.ensure_future(wait_for_it())
        async with asyncio.timeout(5):
            while client.statistics().tasks_waiting != 1:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        try:
            await admin.config_set("requirepass", "pw")
            with caplog.at_level(logging.WARNING, logger="aiolock.pubsub"):
                await admin.client_kill_filter(_type="pubsub")
                await asyncio.sleep(1.5)  # about 3 attempts at 0.25-0.5 s apart
            failed = [
                r for r in caplog.records if "opening the pub/sub connection failed" in r.message
            ]
            assert len(failed) <= 10, f"{len(failed)} failed openings logged in 1.5 s"
            await admin.config_set("requirepass", "")
            await holder.lock("x").unlock()
            async with asyncio.timeout(10):  # reopened within the 0.5 s backoff, then woken
                await waiter
        finally:
            await admin.config_set("requirepass", "")
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
            await admin.aclose()


async def test_a_refused_command_link_reopen_does_not_spin_the_event_loop(
    fresh_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The same with the command link of a client holding a lock (its watchdog needs the
    server): StandaloneTransport._reopen used to loop on the connector's immediate Refused
    while the backoff ran, without yielding."""
    admin = redis.asyncio.Redis.from_url(fresh_server.url)
    async with aiolock.from_url(
        fresh_server.url, reconnect_delay=0.5, reconnect_max_delay=0.5
    ) as client:
        lock = client.lock("held")
        await lock.lock()
        try:
            await admin.config_set("requirepass", "pw")
            with caplog.at_level(logging.DEBUG, logger="aiolock"):
                await admin.client_kill_filter(_type="normal", skipme=True)
                await asyncio.sleep(1.5)  # about 3 attempts at 0.25-0.5 s apart
            failed = [r for r in caplog.records if "opening the link again" in r.message]
            assert len(failed) <= 10, f"{len(failed)} failed reopenings logged in 1.5 s"
        finally:
            await admin.config_set("requirepass", "")
            await admin.aclose()
