"""The ``locked`` decorator (``AioLock.locked``, ``aiolock.locked``): each call of an ``async
def`` function holds a lock named from the call's arguments; against a real Redis."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, assert_type

import anyio
import pytest

import aiolock
from aiolock.default import default_client


@pytest.fixture
async def offline() -> AsyncIterator[aiolock.AioLock]:
    """A client of no server: any Redis call raises RedisUnavailableError."""
    async with aiolock.from_url("redis://127.0.0.1:1/0") as client:
        yield client


async def test_calls_of_one_name_take_turns_and_other_names_run_alongside(
    client: aiolock.AioLock,
) -> None:
    """Positional and keyword calls of one account share its lock; another account's calls
    run at the same time (each call waits, inside its lock, for one of the other account)."""
    active: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    inside = {"a": asyncio.Event(), "b": asyncio.Event()}

    @client.locked("account:{account}")
    async def deposit(account: str, amount: int) -> int:
        active[account] += 1
        peak[account] = max(peak[account], active[account])
        inside[account].set()
        async with asyncio.timeout(10):
            await inside["b" if account == "a" else "a"].wait()
        await asyncio.sleep(0.002)
        active[account] -= 1
        return amount

    calls = [
        deposit(account, n) if n % 2 else deposit(amount=n, account=account)
        for n in range(8)
        for account in "ab"
    ]
    results = await asyncio.gather(*calls)

    assert_type(results, list[int])
    assert sorted(results) == sorted(list(range(8)) * 2)
    assert peak == {"a": 1, "b": 1}
    assert not await client.lock("account:a").is_locked()
    assert not await client.lock("account:b").is_locked()


async def test_the_name_comes_from_the_bound_arguments(client: aiolock.AioLock) -> None:
    seen: list[tuple[str, int]] = []

    async def held(name: str) -> None:
        lock = client.lock(name)
        seen.append((name, await lock.hold_count()))

    @client.locked("{kind}:{order_id}")
    async def pay(order_id: int, *, kind: str = "order") -> None:
        await held(f"{kind}:{order_id}")

    class User:
        id = 42

    @client.locked("user:{user.id}:{extra[region]}")
    async def greet(user: User, **extra: str) -> None:
        await held(f"user:{user.id}:{extra['region']}")

    @client.locked(lambda request, *_: f"path:{request['path']}")
    async def handle(request: dict[str, str], *rest: int) -> None:
        await held(f"path:{request['path']}")

    await pay(7)
    await pay(order_id=8)
    await pay(9, kind="refund")
    await greet(User(), region="eu")
    await handle({"path": "/x"}, 1, 2)

    assert seen == [
        ("order:7", 1),
        ("order:8", 1),
        ("refund:9", 1),
        ("user:42:eu", 1),
        ("path:/x", 1),
    ]


async def test_a_template_may_name_a_value_passed_through_kwargs(client: aiolock.AioLock) -> None:
    @client.locked("job:{job_id}")
    async def run(**job: Any) -> str:
        assert await client.lock(f"job:{job['job_id']}").is_held_by_current_task()
        return str(job["job_id"])

    assert await run(job_id=5, retries=1) == "5"
    with pytest.raises(TypeError, match=r"called without 'job_id', which the lock name"):
        await run(retries=1)


async def test_wait_time_runs_out_with_lock_timeout_and_the_function_does_not_run(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    ran = []

    @client.locked("busy:{n}", wait_time=0)
    async def now(n: int) -> None:
        ran.append(n)

    @client.locked("busy:{n}", wait_time=0.2)
    async def soon(n: int) -> None:
        ran.append(n)

    async with make_client().lock("busy:1"):
        with pytest.raises(aiolock.LockTimeout) as info:
            await now(1)
        assert isinstance(info.value, TimeoutError)
        assert info.value.name == "busy:1"
        with pytest.raises(aiolock.LockTimeout, match=r"'busy:1' not acquired within 0.2 s"):
            await soon(1)
        await now(2)  # another name is free
    await now(1)
    assert ran == [2, 1]


async def test_without_wait_time_a_call_waits_for_the_holder(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    ran = asyncio.Event()

    @client.locked("queue:{n}")
    async def job(n: int) -> int:
        ran.set()
        return n

    other = make_client().lock("queue:1")
    await other.lock()
    call = asyncio.create_task(job(1))
    await asyncio.sleep(0.2)
    assert not ran.is_set()  # waiting, not running
    await other.unlock()
    assert await asyncio.wait_for(call, 10) == 1


async def test_lease_time_is_the_lease_of_the_hold_and_it_is_not_renewed(
    client: aiolock.AioLock,
) -> None:
    @client.locked("leased", lease_time=5)
    async def job() -> tuple[float | None, bool]:
        lock = client.lock("leased")
        return await lock.remaining_ttl(), lock.statistics().renewed

    ttl, renewed = await job()
    assert ttl is not None and 0 < ttl <= 5
    assert not renewed


async def test_the_kinds_of_lock(client: aiolock.AioLock) -> None:
    """Readers share the read lock; the write lock excludes them; the fair lock queues in
    Redisson's fair-lock layout."""
    readers_in = 0
    both_in = asyncio.Event()

    @client.locked("doc:{doc}", kind="read_lock")
    async def read(doc: str) -> None:
        nonlocal readers_in
        readers_in += 1
        if readers_in == 2:
            both_in.set()
        async with asyncio.timeout(10):
            await both_in.wait()  # two readers inside at once
        readers_in -= 1

    @client.locked("doc:{doc}", kind="write_lock", wait_time=0)
    async def write(doc: str) -> str | None:
        return await client.read_write_lock(f"doc:{doc}").mode()

    @client.locked("printer", kind="fair_lock")
    async def fair() -> bool:
        return await client.fair_lock("printer").is_held_by_current_task()

    await asyncio.gather(read("x"), read("x"))
    assert await write("x") == "write"
    async with client.read_write_lock("doc:x").read_lock():
        with pytest.raises(aiolock.LockTimeout):
            await asyncio.create_task(write("x"))  # another task: excluded by the reader
    assert await fair()


async def test_a_call_re_enters_a_lock_its_task_holds(client: aiolock.AioLock) -> None:
    counts: list[int] = []

    @client.locked("tree:{root}")
    async def walk(root: str, depth: int) -> None:
        counts.append(await client.lock(f"tree:{root}").hold_count())
        if depth:
            await walk(root, depth - 1)

    await walk("r", 2)
    assert counts == [1, 2, 3]
    assert not await client.lock("tree:r").is_locked()


# -- a lost hold ----------------------------------------------------------------------------


async def test_a_lost_hold_cancels_the_call_which_raises_lock_lost_error(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    """The default (``guard=True``): the loss is told the moment the watchdog finds it (here
    the lock was force-unlocked by another client); the call is cancelled there, its
    ``finally`` runs, and it raises LockLostError; nothing stays held."""
    locks = make_client(watchdog_timeout=0.6)
    steps: list[str] = []

    @locks.locked("lost:{n}")
    async def job(n: int) -> None:
        steps.append("in")
        try:
            assert await make_client().lock(f"lost:{n}").force_unlock()
            await asyncio.sleep(30)
            steps.append("after the loss")
        finally:
            await asyncio.sleep(0.01)  # cleanup that awaits still runs
            steps.append("finally")

    with pytest.raises(aiolock.LockLostError, match="'lost:1'") as info:
        await asyncio.wait_for(job(1), 20)
    assert isinstance(info.value.__cause__, asyncio.CancelledError)
    assert steps == ["in", "finally"]
    assert locks.statistics().holds.get("held", 0) == 0
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_with_guard_false_the_call_runs_on_and_then_raises_lock_lost_error(
    make_client: Callable[..., aiolock.AioLock],
) -> None:
    locks = make_client(watchdog_timeout=0.6)
    steps: list[str] = []

    @locks.locked("lost-late", guard=False)
    async def job() -> str:
        assert await make_client().lock("lost-late").force_unlock()
        await asyncio.sleep(0.6)  # past a renewal, which finds the lock gone
        steps.append("ran to its end")
        return "result"

    with pytest.raises(aiolock.LockLostError, match="'lost-late'"):
        await job()
    assert steps == ["ran to its end"]


async def test_a_fixed_lease_that_runs_out_cancels_a_guarded_call(client: aiolock.AioLock) -> None:
    @client.locked("too-long", lease_time=0.3)
    async def job() -> None:
        await asyncio.sleep(30)

    with pytest.raises(aiolock.LockLostError, match="lease ran out"):
        await asyncio.wait_for(job(), 20)


# -- cancellation -----------------------------------------------------------------------------


async def test_a_cancelled_call_releases_its_lock_and_stays_cancelled(
    client: aiolock.AioLock,
) -> None:
    entered = asyncio.Event()

    @client.locked("cancel:{n}")
    async def job(n: int) -> None:
        entered.set()
        await asyncio.sleep(30)

    task = asyncio.create_task(job(1))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert not await client.lock("cancel:1").is_locked()
    assert client.statistics().holds.get("held", 0) == 0


async def test_a_call_cancelled_while_it_waits_holds_nothing(
    client: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    ran = []

    @client.locked("cancel-wait")
    async def job() -> None:
        ran.append(1)

    other = make_client().lock("cancel-wait")
    await other.lock()
    task = asyncio.create_task(job())
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await other.unlock()
    await asyncio.sleep(0.1)
    assert ran == []
    assert not await client.lock("cancel-wait").is_locked()
    assert client.statistics().holds.get("held", 0) == 0


async def test_a_timeout_around_a_guarded_call_is_still_that_timeout(
    client: aiolock.AioLock,
) -> None:
    """The guard's own cancellation machinery (an asyncio.timeout) does not take another
    timeout's cancellation for a loss."""

    @client.locked("outer-timeout")
    async def job() -> None:
        await asyncio.sleep(30)

    with pytest.raises(TimeoutError) as info:
        async with asyncio.timeout(0.2):
            await job()
    assert not isinstance(info.value, aiolock.AioLockError)
    assert not await client.lock("outer-timeout").is_locked()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_an_anyio_cancel_scope_around_a_guarded_call(client: aiolock.AioLock) -> None:
    """anyio's level cancellation (Starlette and FastAPI cancel that way) ends the call and
    releases the lock; the scope catches its own cancellation, not a LockLostError."""

    @client.locked("anyio-scope")
    async def job() -> None:
        await asyncio.sleep(30)

    with anyio.move_on_after(0.2) as scope:
        await job()
    assert scope.cancelled_caught
    assert not await client.lock("anyio-scope").is_locked()
    assert client.statistics().holds.get("held", 0) == 0


async def test_a_cancel_from_outside_wins_over_a_loss_at_the_same_moment(
    client: aiolock.AioLock,
) -> None:
    """The race: the hold is lost (force-unlocked by this client: the loss is told at once)
    and the task is cancelled from outside before it runs again. The call ends with the
    outside CancelledError, not with LockLostError: the outside cancellation is not
    swallowed."""
    entered = asyncio.Event()

    @client.locked("race")
    async def job() -> None:
        entered.set()
        await asyncio.sleep(30)

    task = asyncio.create_task(job())
    await entered.wait()
    assert await client.lock("race").force_unlock()  # another owner's hold: lost now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    assert not await client.lock("race").is_locked()


# -- bad input --------------------------------------------------------------------------------


async def _pay(order_id: str, amount: int = 1) -> None:
    pass


def _sync(order_id: str) -> None:
    pass


async def _agen(order_id: str) -> AsyncIterator[None]:
    yield


@pytest.mark.parametrize(
    ("name", "func", "error", "match"),
    [
        ("order:{id}", _pay, TypeError, r"names 'id', which is not a parameter of .*_pay\("),
        ("order:{order_id}:{}", _pay, ValueError, r"name a parameter in each field"),
        ("order:{0}", _pay, ValueError, r"name a parameter in each field"),
        ("order:{order_id", _pay, ValueError, r"malformed"),
        ("order:{order_id}", _sync, TypeError, r"coroutine functions \(async def\), not function"),
        ("order:{order_id}", _agen, TypeError, r"not an async generator function"),
        (b"order", _pay, TypeError, r"str template or a callable, not bytes"),
    ],
)
async def test_bad_decorations_are_refused_at_once(
    offline: aiolock.AioLock, name: Any, func: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        offline.locked(name)(func)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"wait_time": -1}, ValueError),
        ({"wait_time": "1"}, TypeError),
        ({"lease_time": 0}, ValueError),
        ({"kind": "fenced_lock"}, ValueError),
        ({"kind": None}, TypeError),
    ],
)
async def test_bad_options_are_refused_at_once(
    offline: aiolock.AioLock, options: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        offline.locked("x", **options)


async def test_bad_calls_fail_before_any_redis_call(offline: aiolock.AioLock) -> None:
    """``offline`` has no server: a Redis call would raise RedisUnavailableError."""
    pay = offline.locked("order:{order_id}")(_pay)
    named = offline.locked(lambda order_id, amount=1: order_id)(_pay)
    with pytest.raises(TypeError, match=r"_pay\(order_id: str, amount: int = 1\) -> None: missing"):
        await pay()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword"):
        await pay("1", amont=2)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="must not be empty"):
        await named("")
    with pytest.raises(TypeError, match="returned int, not a str"):
        await named(1)  # type: ignore[arg-type]
    with pytest.raises(AttributeError) as info:
        await offline.locked("{order_id.nope}")(_pay)("1")
    assert "while making the lock name from '{order_id.nope}'" in str(info.value.__notes__)


# -- what the decorated function looks like ------------------------------------------------


async def test_the_decorated_function_keeps_its_signature_name_and_doc(
    client: aiolock.AioLock,
) -> None:
    async def pay(order_id: str, amount: int = 1) -> float:
        """Pay the order."""
        return amount / 2

    decorated = client.locked("order:{order_id}")(pay)
    assert inspect.signature(decorated) == inspect.signature(pay, eval_str=True)
    assert (decorated.__name__, decorated.__doc__) == ("pay", "Pay the order.")
    assert decorated.__wrapped__ is pay  # type: ignore[attr-defined]
    assert inspect.iscoroutinefunction(decorated)
    assert_type(await decorated("1", amount=3), float)


async def test_methods_are_decorated_with_self_in_the_template(client: aiolock.AioLock) -> None:
    class Account:
        def __init__(self, number: str) -> None:
            self.number = number

        @client.locked("account:{self.number}")
        async def deposit(self, amount: int) -> bool:
            return await client.lock(f"account:{self.number}").is_held_by_current_task()

    assert await Account("7").deposit(5)
    assert list(inspect.signature(Account("7").deposit).parameters) == ["amount"]


# -- the process default client -------------------------------------------------------------


@pytest.fixture
async def default(client: aiolock.AioLock) -> AsyncIterator[aiolock.AioLock]:
    aiolock.configure(client)
    try:
        yield client
    finally:
        aiolock.configure(aiolock.default.DEFAULT_URL)


@aiolock.locked("default:{n}", wait_time=0)
async def _on_the_default_client(n: int) -> bool:
    """Decorated at import, long before any client is configured."""
    return await default_client().lock(f"default:{n}").is_held_by_current_task()


async def test_aiolock_locked_uses_the_default_client_of_each_call(
    default: aiolock.AioLock, make_client: Callable[..., aiolock.AioLock]
) -> None:
    assert await _on_the_default_client(1)
    async with make_client().lock("default:1"):
        with pytest.raises(aiolock.LockTimeout):
            await _on_the_default_client(1)


def test_aiolock_does_not_import_a_web_framework() -> None:
    """FastAPI and Starlette are imported when a dependency is made, not with aiolock."""
    code = (
        "import sys, aiolock\n"
        "loaded = {'fastapi', 'starlette', 'aiohttp'} & set(sys.modules)\n"
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- typing ----------------------------------------------------------------------------------

TYPED = """
import aiolock

locks = aiolock.from_url("redis://127.0.0.1:1/0")


@locks.locked("order:{order_id}", wait_time=0)
async def pay(order_id: str, amount: int = 1) -> float:
    return amount / 2


@aiolock.locked("order:{order_id}")
async def refund(order_id: str) -> None:
    pass


async def main() -> None:
    reveal_type(pay)
    reveal_type(await pay("1", amount=2))
    reveal_type(refund)
    await pay(1)
    await pay("1", amont=2)
    locks.locked("x", kind="fenced_lock")
"""


@pytest.mark.slow
def test_mypy_sees_the_decorated_signature(tmp_path: Path) -> None:
    """mypy --strict keeps the parameters and the return type of a decorated function
    (ParamSpec), and flags bad calls and bad kinds."""
    pytest.importorskip("mypy", reason="the lint extra is not installed")
    source = tmp_path / "typed.py"
    source.write_text(textwrap.dedent(TYPED))
    # In a process of its own: mypy tunes the garbage collector of the process it runs in.
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-version", "3.11", str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out, err, status = proc.stdout, proc.stderr, proc.returncode
    lines = [
        line.partition(": ")[2].replace("builtins.", "")
        for line in out.splitlines()
        if line.split(":")[0].endswith("typed.py")
    ]
    assert status == 1, out + err
    expected = [
        'note: Revealed type is "def (order_id: str, amount: int =) -> '
        'typing.Coroutine[Any, Any, float]"',
        'note: Revealed type is "float"',
        'note: Revealed type is "def (order_id: str) -> typing.Coroutine[Any, Any, None]"',
        'error: Argument 1 to "pay" has incompatible type "int"; expected "str"',
        'error: Unexpected keyword argument "amont" for "pay"',
        'error: Argument "kind" to "locked" of "AioLock" has incompatible type '
        "\"Literal['fenced_lock']\"",
    ]
    assert len(lines) == len(expected), out
    for line, start in zip(lines, expected, strict=True):
        assert line.startswith(start), out
