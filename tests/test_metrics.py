"""Metrics (aiolock.metrics) read with OpenTelemetry's SDK and its in-memory reader: every
instrument for real acquisitions, timeouts, releases, renewals, lost holds and pub/sub
reconnects against a real server; no lock name unless asked; nothing left pending after
1,000 random cancellations; a raising meter provider or exporter never reaches lock code;
and aiolock without OpenTelemetry installed."""

from __future__ import annotations

import ast
import asyncio
import gc
import logging
import random
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio

import aiolock

pytest.importorskip("opentelemetry.sdk.metrics", reason="needs opentelemetry-sdk (the test extra)")

from opentelemetry import metrics as otel
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Point:
    attributes: dict[str, Any]
    value: float  # a counter's value, a histogram's sum
    count: int  # a histogram's count (1 for a counter)


class Read:
    """What the reader holds now: points by instrument name (cumulative)."""

    def __init__(self, reader: InMemoryMetricReader) -> None:
        self.points: dict[str, list[Point]] = {}
        data = reader.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        count = getattr(point, "count", 1)
                        value = getattr(point, "sum", None)
                        if value is None:
                            value = point.value  # type: ignore[union-attr]
                        self.points.setdefault(metric.name, []).append(
                            Point(dict(point.attributes or {}), value, count)
                        )

    def total(self, name: str, **attributes: str) -> float:
        """The sum of a counter's points (a histogram's counts) matching ``attributes``."""
        found = 0.0
        for point in self.points.get(name, ()):
            if all(point.attributes.get(k.replace("_", ".")) == v for k, v in attributes.items()):
                found += point.count if name.endswith((".wait", ".duration")) else point.value
        return found

    def attribute_sets(self, name: str) -> list[dict[str, Any]]:
        return [point.attributes for point in self.points.get(name, ())]


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def metrics(reader: InMemoryMetricReader) -> aiolock.Metrics:
    return aiolock.Metrics(MeterProvider(metric_readers=[reader]))


@pytest.fixture
async def measured(redis_url: str, metrics: aiolock.Metrics) -> AsyncIterator[aiolock.AioLock]:
    """A client recording into ``metrics``, with a short watchdog (renewals every 0.1 s)."""
    async with aiolock.from_url(redis_url, metrics=metrics, watchdog_timeout=0.3) as client:
        yield client


async def eventually(check: Callable[[], bool | Awaitable[bool]], within: float = 10) -> None:
    """Poll until ``check`` is true (state read from the reader or the server)."""
    async with asyncio.timeout(within):
        while True:
            result = check()
            if not isinstance(result, bool):
                result = await result
            if result:
                return
            await asyncio.sleep(0.01)


# -- each instrument, for real -------------------------------------------------------------------


async def test_acquire_and_release(measured: aiolock.AioLock, reader: InMemoryMetricReader) -> None:
    lock = measured.lock("metrics:a")
    async with lock:
        await asyncio.sleep(0.05)
    read = Read(reader)
    assert read.total("aiolock.acquisitions", lock_type="lock") == 1
    assert read.attribute_sets("aiolock.acquisitions") == [{"lock.type": "lock"}]
    assert read.attribute_sets("aiolock.acquire.wait") == [
        {"lock.type": "lock", "outcome": "acquired"}
    ]
    [hold] = read.points["aiolock.hold.duration"]
    assert hold.attributes == {"lock.type": "lock", "outcome": "released"}
    assert hold.count == 1 and hold.value >= 0.05
    assert read.total("aiolock.acquire.timeouts") == 0
    assert read.total("aiolock.holds.lost") == 0


async def test_timeout(
    measured: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    reader: InMemoryMetricReader,
) -> None:
    other = make_client(metrics=False)
    async with other.lock("metrics:busy"):
        assert not await measured.lock("metrics:busy").try_lock(wait_time=0.1)
    read = Read(reader)
    assert read.total("aiolock.acquire.timeouts", lock_type="lock") == 1
    assert read.total("aiolock.acquisitions") == 0
    [wait] = read.points["aiolock.acquire.wait"]
    assert wait.attributes == {"lock.type": "lock", "outcome": "timeout"}
    assert wait.value >= 0.1  # it waited its wait_time
    assert "aiolock.hold.duration" not in read.points


async def test_cancelled_and_failed_acquisitions_are_recorded(
    measured: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    redis_client: redis.asyncio.Redis,
    reader: InMemoryMetricReader,
) -> None:
    other = make_client(metrics=False)
    async with other.lock("metrics:held"):
        task = asyncio.create_task(measured.lock("metrics:held").lock())
        await eventually(lambda: measured.statistics().tasks_waiting == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await redis_client.set("metrics:not-a-lock", "x")
    with pytest.raises(aiolock.RedisOperationError):  # WRONGTYPE from the acquire script
        await measured.lock("metrics:not-a-lock").try_lock()
    read = Read(reader)
    outcomes = {a["outcome"]: a for a in read.attribute_sets("aiolock.acquire.wait")}
    assert sorted(outcomes) == ["cancelled", "error"]
    assert read.total("aiolock.acquire.wait", outcome="cancelled") == 1
    assert read.total("aiolock.acquire.wait", outcome="error") == 1
    assert read.total("aiolock.acquisitions") == read.total("aiolock.acquire.timeouts") == 0


TYPES: dict[str, Callable[[aiolock.AioLock], Awaitable[None]]] = {}


def _type(kind: str) -> Callable[[Callable[[aiolock.AioLock], Awaitable[None]]], Any]:
    def register(use: Callable[[aiolock.AioLock], Awaitable[None]]) -> Any:
        TYPES[kind] = use
        return use

    return register


@_type("lock")
async def _lock(client: aiolock.AioLock) -> None:
    async with client.lock("t:lock"):
        pass


@_type("fenced_lock")
async def _fenced(client: aiolock.AioLock) -> None:
    async with client.fenced_lock("t:fenced"):
        pass


@_type("spin_lock")
async def _spin(client: aiolock.AioLock) -> None:
    async with client.spin_lock("t:spin"):
        pass


@_type("fair_lock")
async def _fair(client: aiolock.AioLock) -> None:
    async with client.fair_lock("t:fair"):
        pass


@_type("read_lock")
async def _read(client: aiolock.AioLock) -> None:
    async with client.read_write_lock("t:rw").read_lock():
        pass


@_type("write_lock")
async def _write(client: aiolock.AioLock) -> None:
    async with client.read_write_lock("t:rw").write_lock():
        pass


@_type("semaphore")
async def _semaphore(client: aiolock.AioLock) -> None:
    semaphore = client.semaphore("t:sem")
    await semaphore.try_set_permits(1)
    await semaphore.acquire()
    await semaphore.release()


@_type("permit_expirable_semaphore")
async def _pes(client: aiolock.AioLock) -> None:
    pes = client.permit_expirable_semaphore("t:pes")
    await pes.try_set_permits(1)
    permit = await pes.acquire()
    await pes.release(permit)


@_type("countdown_latch")
async def _latch(client: aiolock.AioLock) -> None:
    latch = client.countdown_latch("t:latch")
    await latch.try_set_count(1)
    waiter = asyncio.create_task(latch.wait())
    await latch.count_down()
    assert await waiter


@pytest.mark.parametrize("kind", sorted(TYPES))
async def test_every_type_names_itself(
    kind: str, measured: aiolock.AioLock, reader: InMemoryMetricReader
) -> None:
    await TYPES[kind](measured)
    read = Read(reader)
    assert {a["lock.type"] for a in read.attribute_sets("aiolock.acquisitions")} == {kind}
    assert read.total("aiolock.acquisitions", lock_type=kind) >= 1
    holds = read.attribute_sets("aiolock.hold.duration")
    if kind in ("semaphore", "countdown_latch"):
        assert holds == []  # their grants are not holds of an owner
    else:
        assert holds == [{"lock.type": kind, "outcome": "released"}]


async def test_watchdog_renewals(measured: aiolock.AioLock, reader: InMemoryMetricReader) -> None:
    async with measured.lock("metrics:renewed"):
        await eventually(lambda: Read(reader).total("aiolock.renewals", lock_type="lock") >= 3)
    read = Read(reader)
    assert read.attribute_sets("aiolock.renewals") == [{"lock.type": "lock"}]
    assert read.total("aiolock.renewal.failures") == 0
    assert read.total("aiolock.holds.lost") == 0


async def test_a_deleted_key_is_a_failed_renewal_and_a_lost_hold(
    measured: aiolock.AioLock, redis_client: redis.asyncio.Redis, reader: InMemoryMetricReader
) -> None:
    lock = measured.lock("metrics:deleted")
    await lock.lock()
    lost = asyncio.Event()
    lock.on_lost(lambda _: lost.set())
    await redis_client.delete("metrics:deleted")
    async with asyncio.timeout(10):
        await lost.wait()
    read = Read(reader)
    assert read.total("aiolock.holds.lost", lock_type="lock") == 1
    assert read.total("aiolock.renewal.failures", lock_type="lock") == 1
    assert read.attribute_sets("aiolock.hold.duration") == [
        {"lock.type": "lock", "outcome": "lost"}
    ]
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()
    assert Read(reader).total("aiolock.holds.lost") == 1  # the unlock reports, not loses again


async def test_a_paused_server_fails_renewals_and_loses_the_hold(
    fresh_server: Any, reader: InMemoryMetricReader, metrics: aiolock.Metrics
) -> None:
    """The server stops answering (SIGSTOP): renewals are not confirmed and the hold is lost
    at its local deadline."""
    async with aiolock.from_url(
        fresh_server.url, metrics=metrics, watchdog_timeout=0.6, command_timeout=0.2
    ) as client:
        lock = client.lock("metrics:paused")
        await lock.lock()
        lost = asyncio.Event()
        lock.on_lost(lambda _: lost.set())
        fresh_server.pause()
        try:
            async with asyncio.timeout(10):
                await lost.wait()
        finally:
            fresh_server.resume()
        read = Read(reader)
        assert read.total("aiolock.holds.lost", lock_type="lock") == 1
        assert read.total("aiolock.renewal.failures", lock_type="lock") >= 1
        with pytest.raises(aiolock.LockLostError):
            await lock.unlock()


async def test_pubsub_reconnects(
    measured: aiolock.AioLock,
    make_client: Callable[..., aiolock.AioLock],
    redis_client: redis.asyncio.Redis,
    reader: InMemoryMetricReader,
) -> None:
    """CLIENT KILL TYPE pubsub while a task waits: the connection is opened again and
    counted; the waiter still gets the lock."""
    other = make_client(metrics=False)
    holder = other.lock("metrics:pubsub")
    await holder.lock()

    async def take_and_release() -> None:
        async with measured.lock("metrics:pubsub"):
            pass

    waiter = asyncio.create_task(take_and_release())
    await eventually(lambda: measured.statistics().tasks_waiting == 1)
    assert Read(reader).total("aiolock.pubsub.reconnects") == 0
    await redis_client.client_kill_filter(_type="pubsub")
    await eventually(lambda: Read(reader).total("aiolock.pubsub.reconnects") >= 1)
    assert measured.statistics().pubsub_reconnects >= 1
    assert Read(reader).attribute_sets("aiolock.pubsub.reconnects") == [{}]
    await holder.unlock()
    async with asyncio.timeout(10):
        await waiter
    assert Read(reader).total("aiolock.acquisitions") == 1


async def test_reconnects_of_a_closed_client_stay_counted(
    redis_url: str,
    metrics: aiolock.Metrics,
    redis_client: redis.asyncio.Redis,
    reader: InMemoryMetricReader,
) -> None:
    """The counter is cumulative: closing a client does not take its reconnects back."""
    client = aiolock.from_url(redis_url, metrics=metrics)
    try:
        await redis_client.hset("metrics:closed", "x", 1)
        waiter = asyncio.create_task(client.lock("metrics:closed").try_lock(wait_time=30))
        await eventually(lambda: client.statistics().tasks_waiting == 1)
        await redis_client.client_kill_filter(_type="pubsub")
        await eventually(lambda: client.statistics().pubsub_reconnects >= 1)
        reconnects = client.statistics().pubsub_reconnects
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    finally:
        await client.aclose()
    assert Read(reader).total("aiolock.pubsub.reconnects") == reconnects


async def test_clients_dropped_without_closing_are_not_kept(metrics: aiolock.Metrics) -> None:
    """The reconnect counter watches clients by weak reference: clients dropped without
    aclose() (made per request, say) are let go of, not gathered for ever."""
    for _ in range(300):
        aiolock.AioLock(redis.asyncio.Redis(), metrics=metrics)  # never used, never closed
    gc.collect()
    aiolock.AioLock(redis.asyncio.Redis(), metrics=metrics)
    assert len(metrics._sources) <= 130


# -- attributes: no lock name unless asked ------------------------------------------------------


async def test_lock_names_only_when_asked(redis_url: str) -> None:
    for lock_names in (False, True):
        reader = InMemoryMetricReader()
        metrics = aiolock.Metrics(MeterProvider(metric_readers=[reader]), lock_names=lock_names)
        async with aiolock.from_url(redis_url, metrics=metrics) as client:
            for i in range(5):
                async with client.lock(f"metrics:order:{i}"):
                    pass
        sets = Read(reader).attribute_sets("aiolock.acquisitions")
        if lock_names:
            assert sorted(s["lock.name"] for s in sets) == [f"metrics:order:{i}" for i in range(5)]
        else:
            assert sets == [{"lock.type": "lock"}]  # one series, whatever the names


async def test_metrics_argument(redis_url: str, metrics: aiolock.Metrics) -> None:
    async with aiolock.from_url(redis_url, metrics=False) as off:
        assert off.metrics is None
    async with aiolock.from_url(redis_url, metrics=metrics) as on:
        assert on.metrics is metrics
    async with aiolock.from_url(redis_url) as default:
        assert default.metrics is aiolock.metrics.default_metrics()
        assert default.metrics is not None  # opentelemetry-api is installed here
    with pytest.raises(TypeError, match=r"aiolock\.Metrics or a bool"):
        aiolock.from_url(redis_url, metrics="yes")  # type: ignore[arg-type]


# -- nothing leaks under cancellation -----------------------------------------------------------


async def test_1000_random_cancellations_leave_no_metric_pending(
    measured: aiolock.AioLock, redis_client: redis.asyncio.Redis, reader: InMemoryMetricReader
) -> None:
    """Tasks lock, try_lock, re-enter and unlock a few names and are cancelled at random
    moments: every acquisition started is recorded exactly once (acquired, timeout or
    cancelled), and every hold that began has ended in the hold histogram: released, or
    lost when its task was cancelled holding it (its task ended without unlocking)."""
    rng = random.Random(20261122)
    names = [f"metrics-cancel:{i}" for i in range(3)]
    calls = {"acquisitions": 0, "nested": 0}

    async def user(name: str) -> None:
        lock = measured.lock(name)
        while True:
            calls["acquisitions"] += 1
            if rng.random() < 0.5:
                await lock.lock(lease_time=None if rng.random() < 0.5 else 5)
            elif not await lock.try_lock(wait_time=rng.choice([0, 0.001, 0.01])):
                continue
            if rng.random() < 0.3:
                calls["acquisitions"] += 1
                async with lock:  # reentrant
                    calls["nested"] += 1
                    await asyncio.sleep(0)
            await asyncio.sleep(rng.choice([0, 0, 0.0005, 0.001]))
            await lock.unlock()

    cancelled = 0
    while cancelled < 1000:
        tasks = [asyncio.create_task(user(rng.choice(names))) for _ in range(10)]
        await asyncio.sleep(rng.choice([0, 0.0002, 0.0005, 0.001, 0.003]))
        for task in tasks:
            await asyncio.sleep(rng.choice([0, 0, 0.0001, 0.0003]))
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        cancelled += sum(isinstance(result, asyncio.CancelledError) for result in results)

    async def settled() -> bool:
        stats = measured.statistics()
        keys = [key async for key in redis_client.scan_iter("metrics-cancel:*")]
        return not keys and not any(stats.holds.values()) and stats.background_tasks == 0

    await eventually(settled)
    read = Read(reader)
    waits = {
        outcome: read.total("aiolock.acquire.wait", outcome=outcome)
        for outcome in ("acquired", "timeout", "cancelled", "error")
    }
    assert sum(waits.values()) == calls["acquisitions"], waits
    assert waits["error"] == 0
    assert read.total("aiolock.acquisitions") == waits["acquired"]
    assert read.total("aiolock.acquire.timeouts") == waits["timeout"]
    # A hold begins with a first grant: one the caller got (not a nested one), or one its
    # cancelled caller never saw (undone in the background). Each has ended.
    holds = read.total("aiolock.hold.duration")
    assert waits["acquired"] - calls["nested"] <= holds <= waits["acquired"] + waits["cancelled"]
    lost = read.total("aiolock.hold.duration", outcome="lost")
    assert lost == read.total("aiolock.holds.lost")
    assert holds == lost + read.total("aiolock.hold.duration", outcome="released")


# -- a failing meter provider or exporter never reaches lock code ---------------------------------


class _Raising:
    """An instrument that raises whatever it is asked to record."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def add(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("broken instrument")

    record = add


class _RaisingMeter(otel.NoOpMeter):
    def create_counter(self, *args: Any, **kwargs: Any) -> Any:
        return _Raising()

    def create_histogram(self, *args: Any, **kwargs: Any) -> Any:
        return _Raising()

    def create_observable_counter(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("broken meter")


class RaisingProvider(otel.MeterProvider):
    """A meter provider whose instruments raise on every record (or whose get_meter
    raises, with ``at_get_meter``): a stand-in for a broken SDK or a buggy custom one."""

    def __init__(self, at_get_meter: bool = False) -> None:
        self.at_get_meter = at_get_meter

    def get_meter(self, name: str, *args: Any, **kwargs: Any) -> otel.Meter:
        if self.at_get_meter:
            raise RuntimeError("broken provider")
        return _RaisingRecords(name)


class _RaisingRecords(_RaisingMeter):
    def create_observable_counter(self, *args: Any, **kwargs: Any) -> Any:
        return otel.NoOpObservableCounter("x")


async def _exercise(client: aiolock.AioLock, other: aiolock.AioLock, redis_client: Any) -> None:
    """Every recording path: acquire, timeout, cancel, renewal, release, loss."""
    lock = client.lock("broken:a")
    async with lock:
        await asyncio.sleep(0.25)  # renewed (watchdog_timeout 0.3)
    async with other.lock("broken:b"):
        assert not await client.lock("broken:b").try_lock(wait_time=0.05)
        task = asyncio.create_task(client.lock("broken:b").lock())
        await eventually(lambda: client.statistics().tasks_waiting == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await lock.lock()
    lost = asyncio.Event()
    lock.on_lost(lambda _: lost.set())
    await redis_client.delete("broken:a")
    async with asyncio.timeout(10):
        await lost.wait()
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock()
    async with client.permit_expirable_semaphore("broken:pes").permit():
        pass


@pytest.mark.parametrize("at_get_meter", [False, True], ids=["records-raise", "get-meter-raises"])
async def test_a_raising_meter_provider_never_reaches_lock_code(
    redis_url: str,
    redis_client: redis.asyncio.Redis,
    make_client: Callable[..., aiolock.AioLock],
    caplog: pytest.LogCaptureFixture,
    at_get_meter: bool,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="aiolock.metrics"):
        metrics = aiolock.Metrics(RaisingProvider(at_get_meter))
        async with aiolock.from_url(redis_url, metrics=metrics, watchdog_timeout=0.3) as client:
            await client.permit_expirable_semaphore("broken:pes").try_set_permits(1)
            await _exercise(client, make_client(metrics=False), redis_client)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # said once, then at DEBUG
    expected = "the meter provider failed" if at_get_meter else "recording a metric failed"
    assert expected in warnings[0].getMessage()


class RaisingExporter(MetricExporter):
    """An exporter that fails every export (a collector that is down, a bug)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.calls += 1
        raise RuntimeError("collector is down")

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


async def test_a_raising_exporter_never_reaches_lock_code(
    redis_url: str, redis_client: redis.asyncio.Redis, make_client: Callable[..., aiolock.AioLock]
) -> None:
    exporter = RaisingExporter()
    provider = MeterProvider(
        metric_readers=[PeriodicExportingMetricReader(exporter, export_interval_millis=20)]
    )
    try:
        metrics = aiolock.Metrics(provider)
        async with aiolock.from_url(redis_url, metrics=metrics, watchdog_timeout=0.3) as client:
            await client.permit_expirable_semaphore("broken:pes").try_set_permits(1)
            await _exercise(client, make_client(metrics=False), redis_client)
            await eventually(lambda: exporter.calls >= 3)
    finally:
        await asyncio.to_thread(provider.shutdown)


# -- without OpenTelemetry -----------------------------------------------------------------------

WITHOUT_OTEL = """
import asyncio, sys
sys.modules["opentelemetry"] = None  # import opentelemetry -> ImportError: the extra is absent
import aiolock, aiolock.metrics

async def main(url):
    assert aiolock.metrics.otel is None
    assert aiolock.metrics.default_metrics() is None
    try:
        aiolock.Metrics()
    except ImportError as exc:
        print("hint:", exc)
    async with aiolock.from_url(url, watchdog_timeout=0.3) as client:
        assert client.metrics is None
        async with client.lock("no-otel"):
            await asyncio.sleep(0.25)  # renewed
        assert not await client.lock("no-otel").is_locked()
        print("renewal calls", client.statistics().renewal_calls)
    print("modules", sorted(m for m in sys.modules if m.startswith("opentelemetry")))

asyncio.run(main(sys.argv[1]))
"""


def test_aiolock_works_without_opentelemetry(redis_url: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WITHOUT_OTEL), redis_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hint: aiolock's metrics need OpenTelemetry's API: pip install -e '.[otel]'" in (
        proc.stdout
    )
    assert "pip install 'aiolock-redis[otel]'" in proc.stdout
    assert "renewal calls 0" not in proc.stdout
    assert "modules ['opentelemetry']" in proc.stdout  # only the blocked entry
    assert proc.stderr == ""


GLOBAL_PROVIDER = """
import asyncio, sys
import aiolock
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

async def main(url):
    # A client made before the application sets its provider records once it is set.
    async with aiolock.from_url(url) as client:
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        async with client.lock("global"):
            pass
    data = reader.get_metrics_data()
    names = sorted(m.name for r in data.resource_metrics for s in r.scope_metrics
                   for m in s.metrics if s.scope.name == "aiolock")
    print(names)

asyncio.run(main(sys.argv[1]))
"""


def test_the_default_records_through_the_global_provider(redis_url: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(GLOBAL_PROVIDER), redis_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names: Sequence[str] = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert "aiolock.acquisitions" in names
    assert "aiolock.acquire.wait" in names
    assert "aiolock.hold.duration" in names
