"""aiolock's metrics exported to Prometheus through OpenTelemetry.

The application sets OpenTelemetry's global meter provider with a ``PrometheusMetricReader``
and serves ``prometheus_client``'s ``/metrics`` endpoint; every aiolock client records into
it without further setup (``metrics=True`` is the default when opentelemetry-api is
installed). Prometheus then scrapes series such as::

    aiolock_acquisitions_total{lock_type="lock"}
    aiolock_acquire_timeouts_total{lock_type="lock"}
    aiolock_acquire_wait_seconds_bucket{lock_type="lock",outcome="acquired",le="0.005"}
    aiolock_hold_duration_seconds_sum{lock_type="fair_lock",outcome="released"}
    aiolock_renewals_total{lock_type="lock"}
    aiolock_pubsub_reconnects_total

To have something to show, a few tasks work under locks until Ctrl-C (or ``DURATION``
seconds): order tasks contend for a handful of order locks (some ``try_lock`` calls time
out), a report task holds a watchdog-renewed lock for a while (renewals), and export tasks
share a semaphore. Every key starts with ``aiolock-example:prometheus:`` (or
``{aiolock-example:prometheus:``); they are deleted at the start and at the end, so it can be
run again.

Run it (the ``examples`` extra has the OpenTelemetry SDK, its Prometheus exporter and
prometheus_client)::

    pip install -e '.[examples]'
    REDIS_URL=redis://localhost:6379/0 METRICS_PORT=9464 python -m examples.prometheus.exporter
    curl -s 127.0.0.1:9464/metrics | grep '^aiolock_'
"""

from __future__ import annotations

import asyncio
import os
import random
import signal

from opentelemetry import metrics
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import start_http_server

import aiolock

PREFIX = "aiolock-example:prometheus"
ORDERS = 4


async def clear(locks: aiolock.AioLock) -> None:
    """Delete every key of the example (SCAN, not KEYS), the semaphore's side keys
    (``{name}:...``) included."""
    for pattern in (f"{PREFIX}:*", f"{{{PREFIX}:*"):
        async for key in locks.redis.scan_iter(match=pattern, count=500):
            await locks.redis.delete(key)


async def orders(locks: aiolock.AioLock, stop: asyncio.Event) -> None:
    """Take an order's lock for a moment; give up after 20 ms if it is busy (a timeout)."""
    while not stop.is_set():
        lock = locks.lock(f"{PREFIX}:order:{random.randrange(ORDERS)}")
        if await lock.try_lock(wait_time=0.02):
            try:
                await asyncio.sleep(random.uniform(0.001, 0.03))
            finally:
                await lock.unlock()
        await asyncio.sleep(0.005)


async def reports(locks: aiolock.AioLock, stop: asyncio.Event) -> None:
    """Hold a fair lock without a lease for a while: the watchdog renews it."""
    lock = locks.fair_lock(f"{PREFIX}:report")
    while not stop.is_set():
        async with lock:
            try:
                await asyncio.wait_for(stop.wait(), 1.5)
            except TimeoutError:
                pass


async def exports(locks: aiolock.AioLock, stop: asyncio.Event) -> None:
    """Take one of two export slots of a semaphore."""
    slots = locks.semaphore(f"{PREFIX}:export-slots")
    await slots.try_set_permits(2)
    while not stop.is_set():
        if await slots.try_acquire(wait_time=0.05):
            try:
                await asyncio.sleep(random.uniform(0.01, 0.05))
            finally:
                await slots.release()


async def main(redis_url: str, port: int, duration: float | None) -> None:
    server, thread = start_http_server(port, addr="127.0.0.1")
    provider = MeterProvider(metric_readers=[PrometheusMetricReader()])
    metrics.set_meter_provider(provider)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if duration is not None:
        loop.call_later(duration, stop.set)
    try:
        # watchdog_timeout=3: renewals every second, so they show at once
        async with aiolock.from_url(redis_url, watchdog_timeout=3) as locks:
            await clear(locks)  # what a killed earlier run left
            print(f"metrics on http://127.0.0.1:{port}/metrics (Ctrl-C to stop)", flush=True)
            try:
                await asyncio.gather(
                    *(orders(locks, stop) for _ in range(8)),
                    reports(locks, stop),
                    *(exports(locks, stop) for _ in range(3)),
                )
            finally:
                await clear(locks)
    finally:
        server.shutdown()
        thread.join(5)
        provider.shutdown()
    print("stopped", flush=True)


if __name__ == "__main__":
    seconds = os.environ.get("DURATION")
    asyncio.run(
        main(
            os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
            int(os.environ.get("METRICS_PORT", "9464")),
            float(seconds) if seconds else None,
        )
    )
