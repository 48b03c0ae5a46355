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
    subscriber's reconnect task must wait out the connector's backoff between attempts.
    It retries at once instead: Connector.connect raises the last Refused without awaiting
    while the backoff runs, so Subscriber._connect loops without ever yielding, blocking
    the event loop and logging a warning per turn until the backoff ends."""
    admin = redis.asyncio.Redis.from_url(fresh_server.url)
    async with (
        aiolock.from_url(fresh_server.url) as holder,
        aiolock.from_url(fresh_server.url, reconnect_delay=0.5, reconnect_max_delay=0.5) as client,
    ):
        await holder.lock("x").lock()
        waiter = asyncio.ensure_future(client.lock("x").lock())
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
        finally:
            await admin.config_set("requirepass", "")
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
            await admin.aclose()


async def test_a_refused_command_link_reopen_does_not_spin_the_event_loop(
    fresh_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The same with the command link of a client holding a lock (its watchdog needs the
    server): StandaloneTransport._reopen loops on the connector's immediate Refused while
    the backoff runs, without yielding."""
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
