"""max_hold: a cap on how long the watchdog renews a hold, and the loss it ends in."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio

import aiolock
from aiolock import LockLostError

# watchdog_timeout 0.3 s: renewed every 0.1 s, so a cap of about a second is many renewals
FAST = {"watchdog_timeout": 0.3}


async def _until(predicate: Callable[[], bool], within: float) -> None:
    async with asyncio.timeout(within):
        while True:  # until it holds (or the timeout)
            if predicate():
                return
            await asyncio.sleep(0.01)


@pytest.mark.slow
async def test_reaching_the_cap_loses_the_hold_like_any_loss(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    """Renewed past its first lease, then not past the cap: on_lost fires once, the key
    expires on the server, and unlock() raises LockLostError naming the cap."""
    client = make_client(**FAST)
    lock = client.lock("cap-reached")
    await lock.lock(max_hold=1.0)
    told: list[LockLostError] = []
    lock.on_lost(told.append)
    await asyncio.sleep(0.6)  # twice the lease: only renewals keep it
    assert await redis_client.exists("cap-reached")
    assert lock.statistics().held and not told
    await _until(lambda: bool(told), within=3)
    assert len(told) == 1
    assert "max_hold of 1 s" in str(told[0])
    for _ in range(100):  # the lease runs out there too
        if not await redis_client.exists("cap-reached"):
            break
        await asyncio.sleep(0.02)
    assert not await redis_client.exists("cap-reached")
    with pytest.raises(LockLostError, match=r"max_hold of 1 s"):
        await lock.unlock()
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()
    await asyncio.sleep(0.2)
    assert len(told) == 1  # once
    assert await lock.try_lock()  # free again, for its owner too
    await lock.unlock()


@pytest.mark.slow
async def test_the_lease_never_runs_past_the_cap_on_the_server(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    """The last renewal carries the lease up to the cap, not a whole watchdog lease past."""
    client = make_client(watchdog_timeout=0.6)
    lock = client.lock("cap-edge")
    loop = asyncio.get_running_loop()
    start = loop.time()
    await lock.lock(max_hold=1.0)
    latest = 0.0
    while loop.time() - start < 2.5:
        pttl = await redis_client.pttl("cap-edge")
        if pttl < 0:
            break
        latest = max(latest, loop.time() - start + pttl / 1000)
        await asyncio.sleep(0.02)
    assert not await redis_client.exists("cap-edge")
    assert 0.9 < latest < 1.15, latest  # the server's expiry: at the cap, give or take a tick
    with pytest.raises(LockLostError, match="max_hold"):
        await lock.unlock()


@pytest.mark.slow
async def test_guard_cancels_its_body_at_the_cap(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    client = make_client(**FAST)
    lock = client.lock("cap-guard")
    body: list[str] = []
    with pytest.raises(LockLostError, match=r"max_hold of 0\.7 s") as caught:
        async with lock.guard(max_hold=0.7):
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                body.append("cancelled")
                raise
    assert body == ["cancelled"]
    assert caught.value.name == "cap-guard"
    assert not await lock.is_locked()


@pytest.mark.slow
async def test_below_the_cap_renewals_go_on(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    client = make_client(**FAST)
    lock = client.lock("cap-far")
    told: list[LockLostError] = []
    async with lock.guard(max_hold=30):
        lock.on_lost(told.append)
        lowest = 10_000
        for _ in range(30):  # 1.5 s: five leases
            await asyncio.sleep(0.05)
            lowest = min(lowest, await redis_client.pttl("cap-far"))
        assert lowest > 0
        assert lock.statistics().renewed
    assert not told
    assert not await redis_client.exists("cap-far")


async def test_a_cap_below_the_watchdog_lease_is_the_first_lease(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    client = make_client(watchdog_timeout=30)
    lock = client.lock("cap-short")
    await lock.lock(max_hold=0.5)
    assert 0 < await redis_client.pttl("cap-short") <= 500
    assert lock.statistics().lease_remaining is not None
    assert lock.statistics().lease_remaining <= 0.5  # type: ignore[operator]
    await lock.unlock()


async def test_a_nested_acquire_or_release_never_carries_the_lease_past_the_cap(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    client = make_client(watchdog_timeout=10)
    lock = client.lock("cap-nested")
    await lock.lock(max_hold=0.8)
    await lock.lock()  # nested, no cap of its own: the hold's stands
    assert await redis_client.pttl("cap-nested") <= 800
    await lock.lock(lease_time=20)
    assert await redis_client.pttl("cap-nested") <= 800
    await lock.unlock()  # a release of one count extends to the hold's lease: capped
    assert await redis_client.pttl("cap-nested") <= 800
    remaining = lock.statistics().lease_remaining
    assert remaining is not None and remaining <= 0.8
    await lock.unlock()
    await lock.unlock()
    assert not await redis_client.exists("cap-nested")


@pytest.mark.slow
async def test_the_client_default_applies_to_async_with_and_a_call_can_lift_it(
    make_client: Callable[..., aiolock.AioLock], redis_client: redis.asyncio.Redis
) -> None:
    client = make_client(max_hold=0.6, **FAST)
    assert client.config.max_hold == 0.6
    lock = client.lock("cap-default")
    with pytest.raises(LockLostError, match=r"max_hold of 0\.6 s"):
        async with lock:
            await asyncio.sleep(1.2)
    # per object, and per call (math.inf: no cap)
    assert await client.lock("cap-object", max_hold=math.inf).try_lock()
    assert await lock.try_lock(max_hold=math.inf)
    await asyncio.sleep(1.2)
    assert lock.statistics().held
    assert client.lock("cap-object").statistics().held
    await lock.unlock()
    await client.lock("cap-object").unlock()
    # a tighter per-object cap than the client's
    with pytest.raises(LockLostError, match=r"max_hold of 0\.4 s"):
        async with client.lock("cap-object", max_hold=0.4):
            await asyncio.sleep(1.0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fenced", "fair", "spin", "read", "write"])
async def test_every_watchdog_renewed_lock_type_honours_the_cap(
    make_client: Callable[..., aiolock.AioLock], kind: str
) -> None:
    client = make_client(**FAST)
    name = f"cap-{kind}"
    lock = _lock_of(client, kind, name, max_hold=0.6)
    await lock.lock()
    told: list[LockLostError] = []
    lock.on_lost(told.append)
    await asyncio.sleep(0.45)  # past the first lease: renewed
    assert lock.statistics().held
    await _until(lambda: bool(told), within=3)
    assert "max_hold of 0.6 s" in str(told[0])
    with pytest.raises(LockLostError, match="max_hold"):
        await lock.unlock()
    other = _lock_of(make_client(**FAST), kind, name)
    assert await other.try_lock(2)  # free on the server
    await other.unlock()


def _lock_of(client: aiolock.AioLock, kind: str, name: str, **kwargs: Any) -> Any:
    if kind == "fenced":
        return client.fenced_lock(name, **kwargs)
    if kind == "fair":
        return client.fair_lock(name, **kwargs)
    if kind == "spin":
        return client.spin_lock(name, **kwargs)
    rw = client.read_write_lock(name, **kwargs)
    return rw.read_lock() if kind == "read" else rw.write_lock()


@pytest.mark.slow
async def test_multi_lock_members_follow_their_clients_cap(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    client = make_client(max_hold=0.6, **FAST)
    multi = aiolock.multi_lock(client.lock("cap-m1"), client.lock("cap-m2"))
    body: list[str] = []
    with pytest.raises(LockLostError, match="max_hold"):
        async with multi.guard():
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                body.append("cancelled")
                raise
    assert body == ["cancelled"]


@pytest.mark.slow
async def test_multi_lock_members_carry_their_own_caps(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    """Per multi-lock: give its member lock objects the cap."""
    client = make_client(**FAST)
    multi = aiolock.multi_lock(
        client.lock("cap-o1", max_hold=0.6), client.fair_lock("cap-o2", max_hold=0.6)
    )
    told: list[LockLostError] = []
    await multi.lock()
    multi.on_lost(told.append)
    await _until(lambda: bool(told), within=3)
    assert "max_hold of 0.6 s" in str(told[0])
    with pytest.raises(LockLostError):
        await multi.unlock()


@pytest.mark.slow
async def test_an_expirable_permit_renewed_by_the_watchdog_is_capped_too(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    client = make_client(**FAST)
    pes = client.permit_expirable_semaphore("cap-permits")
    assert await pes.try_set_permits(1)
    permit = await pes.acquire(max_hold=0.6)
    told: list[LockLostError] = []
    pes.on_lost(permit, told.append)
    await asyncio.sleep(0.45)  # past the first lease: renewed
    assert not told
    await _until(lambda: bool(told), within=3)
    assert "max_hold of 0.6 s" in str(told[0])
    with pytest.raises(LockLostError, match="max_hold"):
        await pes.release(permit)
    assert await pes.try_acquire(2) is not None  # the permit came back
    with pytest.raises(ValueError, match="lease_time"):
        await pes.acquire(lease_time=5, max_hold=10)


async def test_bad_max_hold_is_refused_before_any_redis_call(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    client = make_client()
    lock = client.lock("cap-bad")
    bad: Any
    for bad, error in (
        (0, ValueError),
        (-1, ValueError),
        (float("nan"), ValueError),
        (0.0001, ValueError),
        ("5", TypeError),
        (True, TypeError),
    ):
        with pytest.raises(error, match="max_hold"):
            await lock.lock(max_hold=bad)
        with pytest.raises(error, match="max_hold"):
            await lock.try_lock(max_hold=bad)
        with pytest.raises(error, match="max_hold"):
            client.lock("cap-bad", max_hold=bad)
        with pytest.raises(error, match="max_hold"):
            aiolock.Config(max_hold=bad)
    with pytest.raises(ValueError, match="lease_time"):
        await lock.lock(lease_time=5, max_hold=10)
    assert not lock.statistics().held
    assert not await lock.is_locked()


async def test_a_cap_of_hours_is_not_taken_for_milliseconds(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    """A lease of 1000 s or more is warned about (Redisson counts in milliseconds), but a cap
    of an hour is an ordinary cap (the docs' nightly job), and Redisson has no max_hold to
    mistake it for: no warning (the suite turns warnings into errors). Warned on the old
    code, at every place a cap is given."""
    client = make_client(max_hold=7200)
    lock = client.lock("cap-hours", max_hold=3600)
    assert await lock.try_lock(max_hold=86400)
    await lock.unlock()
    async with lock.guard(max_hold=3600):
        pass
    aiolock.Config(max_hold=1000)
    semaphore = client.permit_expirable_semaphore("cap-hours-permits")
    await semaphore.try_set_permits(1)
    permit = await semaphore.acquire(max_hold=3600)
    await semaphore.release(permit)
    assert client.fair_lock("cap-hours-fair", max_hold=3600).name == "cap-hours-fair"
