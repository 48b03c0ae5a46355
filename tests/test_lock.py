"""The reentrant lock without waiting: holds, leases, ownership, layout, bad input."""

from __future__ import annotations

import asyncio
import gc
import math
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions

import aiolock
from aiolock.tasks import current_task_id
from tests.conftest import run_worker


async def test_reentrant_in_one_task(client: aiolock.AioLock) -> None:
    lock = client.lock("order:1")
    assert await lock.try_lock()
    assert await lock.try_lock()
    assert await lock.hold_count() == 2
    assert await lock.is_held_by_current_task()
    await lock.unlock()
    assert await lock.is_locked()
    assert await lock.hold_count() == 1
    await lock.unlock()
    assert not await lock.is_locked()
    assert await lock.hold_count() == 0


async def test_two_lock_objects_of_one_name_share_the_hold(client: aiolock.AioLock) -> None:
    assert await client.lock("same").try_lock()
    assert await client.lock("same").try_lock()
    assert await client.lock("same").hold_count() == 2


async def test_another_task_is_excluded(client: aiolock.AioLock) -> None:
    lock = client.lock("order:2")
    assert await lock.try_lock()

    async def other() -> tuple[bool, bool, int]:
        return await lock.try_lock(), await lock.is_held_by_current_task(), await lock.hold_count()

    assert await asyncio.create_task(other()) == (False, False, 0)
    await lock.unlock()
    assert await asyncio.create_task(other()) == (True, True, 1)


async def test_another_process_is_excluded(client: aiolock.AioLock, redis_url: str) -> None:
    lock = client.lock("order:3")
    assert await lock.try_lock()
    assert await run_worker("try", redis_url, "order:3") == ["False"]
    await lock.unlock()
    assert await run_worker("try", redis_url, "order:3") == ["True"]


async def test_two_clients_exclude_each_other(make_client: Callable[..., aiolock.AioLock]) -> None:
    first, second = make_client(), make_client()
    assert first.id != second.id
    assert await first.lock("shared").try_lock()
    assert not await second.lock("shared").try_lock()


async def test_redisson_layout(client: aiolock.AioLock, redis_client: redis.asyncio.Redis) -> None:
    """Key = name, a hash of owner id -> count, TTL = lease; the last release deletes the key
    and publishes "0" on redisson_lock__channel:{name}."""
    lock = client.lock("layout")
    assert await lock.try_lock(lease_time=20)
    assert await lock.try_lock(lease_time=20)
    owner = f"{client.id}:{current_task_id()}"
    assert await redis_client.type("layout") == b"hash"
    assert await redis_client.hgetall("layout") == {owner.encode(): b"2"}
    assert 19_000 < await redis_client.pttl("layout") <= 20_000

    pubsub = redis_client.pubsub()
    await pubsub.subscribe("redisson_lock__channel:{layout}")
    try:
        confirmation = await pubsub.get_message(timeout=5)
        assert confirmation is not None and confirmation["type"] == "subscribe"
        await lock.unlock()
        await lock.unlock()
        message = await pubsub.get_message(timeout=5)
        assert message is not None
        assert message["data"] == b"0"
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
    assert not await redis_client.exists("layout")


async def test_a_hold_written_by_redisson_excludes_us(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    await redis_client.hset("java", "9b1c-uuid:42", 1)
    await redis_client.pexpire("java", 10_000)
    lock = client.lock("java")
    assert not await lock.try_lock()
    assert 0 < (await lock.remaining_ttl() or 0) <= 10


async def test_default_lease_is_the_watchdog_timeout(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    lock = make_client(watchdog_timeout=7).lock("lease")
    assert await lock.try_lock()
    ttl = await lock.remaining_ttl()
    assert ttl is not None and 6 < ttl <= 7


async def test_lease_expiry_frees_the_lock_and_unlock_reports_it(client: aiolock.AioLock) -> None:
    lock = client.lock("short")
    assert await lock.try_lock(lease_time=0.2)
    await asyncio.sleep(0.4)
    assert not await lock.is_locked()
    assert await asyncio.create_task(lock.try_lock())
    with pytest.raises(aiolock.LockLostError, match="short"):
        await lock.unlock()
    # the hold is forgotten: a second unlock is plainly "not owned"
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()


async def test_remaining_ttl(client: aiolock.AioLock, redis_client: redis.asyncio.Redis) -> None:
    lock = client.lock("ttl")
    assert await lock.remaining_ttl() is None
    await redis_client.hset("ttl", "someone", 1)
    assert await lock.remaining_ttl() == math.inf


async def test_force_unlock(client: aiolock.AioLock) -> None:
    lock = client.lock("forced")
    assert not await lock.force_unlock()
    assert await lock.try_lock(owner=client.new_owner())
    assert await lock.is_locked()
    assert await lock.force_unlock()
    assert not await lock.is_locked()
    assert await lock.try_lock()


async def test_force_unlock_of_our_own_hold_forgets_it(client: aiolock.AioLock) -> None:
    lock = client.lock("forced-own")
    assert await lock.try_lock()
    assert await lock.force_unlock()
    with pytest.raises(aiolock.LockNotOwnedError) as info:
        await lock.unlock()
    assert not isinstance(info.value, aiolock.LockLostError)
    assert await lock.try_lock()


async def test_force_unlock_makes_other_owners_lose_their_hold(client: aiolock.AioLock) -> None:
    lock = client.lock("forced-other")
    owner = client.new_owner()
    assert await lock.try_lock(owner=owner)
    assert await lock.force_unlock()
    assert lock.statistics(owner=owner).lost
    with pytest.raises(aiolock.LockLostError):
        await lock.unlock(owner=owner)


async def test_unlock_by_a_non_owner(client: aiolock.AioLock) -> None:
    lock = client.lock("not-mine")
    with pytest.raises(aiolock.LockNotOwnedError) as info:
        await lock.unlock()
    assert "not-mine" in str(info.value)
    assert f"{client.id}:{current_task_id()}" in str(info.value)
    assert info.value.owner == f"{client.id}:{current_task_id()}"

    assert await lock.try_lock(owner=client.new_owner())
    with pytest.raises(aiolock.LockNotOwnedError):
        await lock.unlock()
    assert await lock.is_locked()


async def test_async_with_releases_on_error(client: aiolock.AioLock) -> None:
    lock = client.lock("ctx")
    with pytest.raises(RuntimeError):
        async with lock:
            assert await lock.hold_count() == 1
            raise RuntimeError
    assert not await lock.is_locked()


async def test_task_ids_are_not_reused() -> None:
    async def task_id() -> int:
        return current_task_id()

    ids = [await asyncio.create_task(task_id()) for _ in range(100)]
    assert len(set(ids)) == 100
    assert current_task_id() == current_task_id()


async def test_a_task_has_one_number_on_every_client_and_its_ids_go_with_it(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    """A task's owner ids on two clients share its number, whichever client (or
    current_task_id) asked first; the clients' cached ids go when the task ends."""
    other = make_client()
    cached = client.unchecked_runtime._owner_ids

    async def ids(first_asks_number: bool) -> tuple[str, str, int]:
        number = current_task_id() if first_asks_number else None
        a = client.resolve_owner(None).id
        b = other.resolve_owner(None).id
        return a, b, current_task_id() if number is None else number

    before = len(cached)
    for first_asks_number in (False, True):
        a, b, number = await asyncio.create_task(ids(first_asks_number))
        assert a == f"{client.id}:{number}" and b == f"{other.id}:{number}"
    await asyncio.sleep(0)  # (the loop lets go of the last task)
    gc.collect()
    assert len(cached) == before


# -- bad input: fails at once, before any Redis call ------------------------------------------
# The client points at a port where nothing listens: a Redis call would raise a connection error.


@pytest.fixture
async def offline() -> Any:
    async with aiolock.from_url("redis://127.0.0.1:1/0") as client:
        yield client


@pytest.mark.parametrize(
    ("url", "error", "says"),
    [
        (None, TypeError, "URL string"),
        (1, TypeError, "URL string"),
        (b"redis://127.0.0.1:1", TypeError, "URL string"),
        ("redis+cluster://", ValueError, "names a node"),
        ("rediss+cluster://:secret@/", ValueError, "names a node"),
        ("redis://127.0.0.1:1/abc", ValueError, "'abc'"),
        ("redis://127.0.0.1:1/1x", ValueError, "'1x'"),
        ("redis://127.0.0.1:port/0", ValueError, "not a Redis URL"),
        # redis-py's message named redis://, rediss://, unix:// only
        (
            "localhost:6379",
            ValueError,
            r"redis\+cluster://, .*redis\+sentinel://.*'localhost:6379'",
        ),
        ("http://127.0.0.1:1/0", ValueError, r"starts with one of redis://, rediss://, unix://"),
        # redis-py went to 6379 (someone else's server, perhaps)
        ("redis://127.0.0.1:0", ValueError, "port 0"),
        # redis-py took them as connection options and ignored them
        (
            "redis://127.0.0.1:1/0?command_timeout=-1&socket_timeout=1",
            ValueError,
            r"command_timeout in the URL.*from_url\(url, command_timeout=\.\.\.\)",
        ),
        ("unix:///tmp/r.sock?watchdog_timeout=10", ValueError, "watchdog_timeout in the URL"),
    ],
)
async def test_from_url_refuses_bad_urls(url: Any, error: type[Exception], says: str) -> None:
    """Attack findings A3, A4: a clear TypeError / ValueError (redis-py raised
    AttributeError, its own cluster exception, or silently used database 0)."""
    with pytest.raises(error, match=says):
        aiolock.from_url(url)


async def test_from_url_takes_a_database_number(redis_url: str) -> None:
    base = redis_url.rsplit("/", 1)[0] if redis_url.count("/") > 2 else redis_url
    async with aiolock.from_url(f"{base}/3") as client:
        assert client.runtime().deployment[1] == 3
        assert await client.lock("db3").try_lock()
        await client.lock("db3").unlock()


@pytest.mark.parametrize("name", ["", None, 1, b"bytes"])
async def test_bad_names(offline: aiolock.AioLock, name: Any) -> None:
    with pytest.raises(ValueError if name == "" else TypeError):
        offline.lock(name)


BAD_TIMES = [-1, -0.001, math.nan, math.inf, -math.inf, "1", True, None]


@pytest.mark.parametrize("value", BAD_TIMES)
async def test_bad_wait_time(offline: aiolock.AioLock, value: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        await offline.lock("x").try_lock(wait_time=value)


@pytest.mark.parametrize("value", [*BAD_TIMES[:-1], 0, 0.0, 0.001])
async def test_bad_lease_time(offline: aiolock.AioLock, value: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        await offline.lock("x").try_lock(lease_time=value)
    with pytest.raises((TypeError, ValueError)):
        await offline.lock("x").lock(lease_time=value)


@pytest.mark.parametrize(
    "settings",
    [
        {"watchdog_timeout": 0},
        {"watchdog_timeout": -1},
        {"watchdog_timeout": math.nan},
        {"cleanup_timeout": math.inf},
        {"retry_attempts": -1},
        {"retry_attempts": 1.5},
        {"command_timeout": 0},
        {"command_timeout": "3"},
        {"reconnect_delay": 1, "reconnect_max_delay": 0.5},
        {"ping_interval": -1},
        {"watchdog_timeout": 0.01},
        {"command_timeout": 1e-9},
        {"ping_interval": 1e-6},
        {"retry_attempts": 10**9},
    ],
)
def test_bad_config(settings: dict[str, Any]) -> None:
    with pytest.raises((TypeError, ValueError)):
        aiolock.Config(**settings)


def test_a_lease_in_milliseconds_is_warned_about() -> None:
    """Redisson counts in milliseconds; aiolock in seconds. 30000 here is 8 hours."""
    with pytest.warns(UserWarning, match="seconds, not milliseconds"):
        aiolock.Config(watchdog_timeout=30000)


async def test_durations_redis_cannot_take_are_refused(offline: aiolock.AioLock) -> None:
    with pytest.raises(ValueError, match="at most"):
        await offline.lock("x").try_lock(lease_time=1e16)
    with pytest.raises(ValueError, match="at most"):
        await offline.lock("x").try_lock(wait_time=1e16)


@pytest.mark.parametrize("name", ["\udcff", "a{b", "{}x", "x{}y"])
async def test_names_that_cannot_be_placed_are_refused(offline: aiolock.AioLock, name: str) -> None:
    """A name Redis cannot take as UTF-8 (os.fsdecode(b"\\xff") gives one), or one whose
    keys would land in different cluster slots, fails before any I/O."""
    with pytest.raises(ValueError):
        offline.lock(name)


async def test_with_instead_of_async_with_says_so(offline: aiolock.AioLock) -> None:
    with pytest.raises(TypeError, match="async with"):
        with offline.lock("x"):
            pass
    with pytest.raises(TypeError, match="async with"):
        with offline:
            pass
    semaphore = offline.permit_expirable_semaphore("x")
    for block, what in [
        (offline.alock("x"), "alock"),
        (offline.lock("x").guard(), "guard"),
        (aiolock.multi_lock(offline.lock("x")).guard(), "guard"),
        (semaphore.permit(), "permit"),
        (semaphore.guard(), "guard"),
    ]:
        with pytest.raises(TypeError, match=rf"use 'async with {what}\(\.\.\.\)', not 'with'"):
            with block:  # type: ignore[attr-defined]
                pass


async def test_bad_client_arguments() -> None:
    with pytest.raises(TypeError):
        aiolock.AioLock("redis://localhost")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        aiolock.AioLock(redis.asyncio.Redis(), config={})  # type: ignore[arg-type]


async def test_closed_client(redis_client: redis.asyncio.Redis) -> None:
    client = aiolock.AioLock(redis_client)
    lock = client.lock("closed")
    await client.aclose()
    await client.aclose()  # idempotent
    assert client.closed
    for call in (lock.try_lock(), lock.lock(), lock.unlock(), lock.is_locked()):
        with pytest.raises(aiolock.ClientClosedError):
            await call
    # a client made on a caller's Redis leaves that Redis open
    assert await redis_client.ping()


async def test_client_is_bound_to_one_event_loop(redis_url: str) -> None:
    client = aiolock.from_url(redis_url)
    assert await client.lock("loop").try_lock(lease_time=5)

    def elsewhere() -> None:
        async def use() -> None:
            await client.lock("loop").is_locked()

        asyncio.run(use())

    with pytest.raises(aiolock.WrongEventLoopError):
        await asyncio.to_thread(elsewhere)
    await client.aclose()


def test_public_api() -> None:
    assert sorted(aiolock.__all__) == sorted(
        name
        for name in vars(aiolock)
        if (not name.startswith("_") and name[0].isupper())
        or name
        in {
            "from_url",
            "configure",
            "alock",
            "aclose_default",
            "locked",
            "lock_dependency",
            "multi_lock",
            "red_lock",
        }
    )
    for name in aiolock.__all__:
        assert getattr(aiolock, name).__module__.startswith("aiolock")
    assert issubclass(aiolock.LockTimeout, TimeoutError)
    assert issubclass(aiolock.LockLostError, aiolock.LockNotOwnedError)


async def test_locks_keep_working_on_a_server_out_of_memory() -> None:
    """Under OOM (noeviction) the server refuses commands that grow memory (HINCRBY among
    them): a new hold fails with an aiolock error saying so, but held locks are still renewed
    (HEXISTS, PEXPIRE) and their last release uses only DEL and PUBLISH, so it goes through."""
    from aiolock.testing import RedisServer, external_redis_url

    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server")
    with RedisServer(["--maxmemory-policy", "noeviction"]) as server:
        async with aiolock.from_url(server.url, watchdog_timeout=0.6) as client:
            held = client.lock("held-before")
            assert await held.try_lock()
            await client.redis.config_set("maxmemory", 1)  # far below what is in use: OOM
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                await client.redis.set("anything", "x")
            await asyncio.sleep(0.5)  # past a renewal period: renewed, not lost
            await held.unlock()
            assert not await held.is_locked()
            with pytest.raises(aiolock.RedisOperationError, match="OOM"):
                await client.lock("new").try_lock()


@pytest.mark.parametrize("kind", ["lock", "fenced", "fair", "write", "read", "spin"])
async def test_a_nested_release_goes_through_on_a_server_out_of_memory(kind: str) -> None:
    """Under OOM (noeviction) Redis refuses a script's memory-growing command only if it is
    the script's first write. A reentrant hold's inner release decremented its count with
    HINCRBY first: refused, the release failed with OOM and the outer hold, still valid and
    renewed, was reported lost at once (every type but the read lock, whose release deletes
    a timeout key first). The nested release must go through and the outer hold stay held."""
    from aiolock.testing import RedisServer, external_redis_url

    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server")
    with RedisServer(["--maxmemory-policy", "noeviction"]) as server:
        async with aiolock.from_url(server.url, watchdog_timeout=0.6) as client:
            make: dict[str, Callable[[str], Any]] = {
                "lock": client.lock,
                "fenced": client.fenced_lock,
                "fair": client.fair_lock,
                "write": lambda name: client.read_write_lock(name).write_lock(),
                "read": lambda name: client.read_write_lock(name).read_lock(),
                "spin": client.spin_lock,
            }
            lock = make[kind]("nested-oom")
            await lock.lock()
            await lock.lock()
            lost: list[BaseException] = []
            lock.on_lost(lost.append)
            await client.redis.config_set("maxmemory", 1)  # far below what is in use: OOM
            try:
                await lock.unlock()
                await asyncio.sleep(0.5)  # past a renewal period: renewed, not lost
                stats = lock.statistics()
                assert stats.held and stats.hold_count == 1 and not lost
                await lock.unlock()
            finally:
                await client.redis.config_set("maxmemory", 0)
            assert not await lock.is_locked() and not lost


async def test_a_redis_error_is_reported_as_an_aiolock_error(
    client: aiolock.AioLock, redis_client: redis.asyncio.Redis
) -> None:
    await redis_client.set("not-a-lock", "a string")
    lock = client.lock("not-a-lock")
    with pytest.raises(aiolock.RedisOperationError, match="WRONGTYPE"):
        await lock.try_lock()
    assert lock.statistics().state is None
    assert not any(client.statistics().holds.values())


async def test_an_owner_of_another_client_is_refused(redis_url: str) -> None:
    """Two clients holding one lock under one owner id would each believe they hold it alone
    (each renews it): a client refuses another client's owner (attack finding A1)."""
    async with aiolock.from_url(redis_url) as a, aiolock.from_url(redis_url) as b:
        owner = a.new_owner()
        assert await a.lock("attack-owner").try_lock(0, owner=owner)
        try:
            with pytest.raises(ValueError, match=owner.id):
                await b.lock("attack-owner").try_lock(0, owner=owner)
            assert not any(b.statistics().holds.values())
        finally:
            await a.lock("attack-owner").unlock(owner=owner)


async def test_another_clients_owner_is_refused_before_any_io(
    redis_url: str, proxy: aiolock.testing.TcpProxy
) -> None:
    """Every lock type and every call taking owner= refuses another client's owner with a
    ValueError before it opens a connection."""
    async with aiolock.from_url(redis_url) as a:
        owner = a.new_owner()
        async with aiolock.from_url(proxy.url) as b:
            rw = b.read_write_lock("rw-owner")
            locks: list[Any] = [
                b.lock("owner-1"),
                b.fenced_lock("owner-2"),
                b.fair_lock("owner-3"),
                b.spin_lock("owner-4"),
                rw.read_lock(),
                rw.write_lock(),
            ]
            for lock in locks:
                for call in (
                    lock.try_lock(0, owner=owner),
                    lock.lock(owner=owner),
                    lock.unlock(owner=owner),
                    lock.hold_count(owner=owner),
                ):
                    with pytest.raises(ValueError, match="another aiolock client"):
                        await call
                with pytest.raises(ValueError, match="another aiolock client"):
                    lock.statistics(owner=owner)
                with pytest.raises(ValueError, match="another aiolock client"):
                    lock.on_lost(lambda error: None, owner=owner)
            sem = b.permit_expirable_semaphore("owner-5")
            with pytest.raises(ValueError, match="another aiolock client"):
                await sem.try_acquire(owner=owner)
            with pytest.raises(ValueError, match="another aiolock client"):
                await sem.acquire(owner=owner)
            with pytest.raises(ValueError, match="another aiolock client"):
                async with sem.permit(owner=owner):
                    pass
            assert proxy.connections_accepted == 0


@pytest.mark.parametrize(
    ("owner_id", "error"),
    [
        (123, TypeError),
        (None, TypeError),
        (b"x:1", TypeError),
        ("", ValueError),
        ("mode", ValueError),
    ],
)
async def test_an_owner_with_a_bad_id_is_refused_before_any_io(
    proxy: aiolock.testing.TcpProxy, owner_id: Any, error: type[Exception]
) -> None:
    """``aiolock.Owner(id)`` is public and takes any object as its id (for other libraries'
    owner ids). An id that is not a str failed deep inside with AttributeError (or a
    confusing TypeError for bytes); an empty one was written as an empty hash field; and
    ``mode`` is the field a read-write lock keeps its mode in: a read lock of a free
    read-write lock under it failed half-way (HINCRBY on the mode) and left ``{mode: read}``
    with no holder and no TTL, so no writer could ever take it. Refused with TypeError /
    ValueError before any connection, by every type and by the composites."""
    async with aiolock.from_url(proxy.url) as client:
        owner = aiolock.Owner(owner_id)
        rw = client.read_write_lock("bad-owner-rw")
        for lock in (client.lock("bad-owner"), client.fair_lock("bad-owner-f"), rw.read_lock()):
            with pytest.raises(error):
                await lock.try_lock(0, owner=owner)
            with pytest.raises(error):
                lock.statistics(owner=owner)
        with pytest.raises(error):
            await rw.write_lock().lock(owner=owner)
        with pytest.raises(error):
            await client.permit_expirable_semaphore("bad-owner-p").try_acquire(owner=owner)
        multi = aiolock.multi_lock(client.lock("bad-owner-m1"), client.lock("bad-owner-m2"))
        with pytest.raises(error):
            await multi.try_lock(owner=owner)
        with pytest.raises(error):
            aiolock.red_lock(client, name="bad-owner-r").statistics(owner=owner)
        assert proxy.connections_accepted == 0


async def test_an_owner_id_of_another_library_is_taken(redis_url: str) -> None:
    """An owner made from another library's owner id (a Redisson or node-redisson peer's,
    to re-enter or release its hold) is no other aiolock client's: it is taken."""
    foreign = aiolock.Owner("0b9a6f3e-5f4c-4a57-9d0e-2c1d3e4f5a6b:3f2a0c4e-9b1d-4c55-8e2f")
    async with aiolock.from_url(redis_url) as client:
        lock = client.lock("foreign-owner")
        assert await lock.try_lock(0, owner=foreign)
        assert await lock.hold_count(owner=foreign) == 1
        await lock.unlock(owner=foreign)
