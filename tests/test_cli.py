"""The ``aiolock`` command line end to end against a real redis-server: inspect, unlock --force
and watch, on locks held by aiolock and on Redisson-layout keys written with redis-py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio

import aiolock
from aiolock.cli import build_parser, main
from aiolock.testing import RedisServer, external_redis_url, find_redis_server_binary
from tests.peers import Peers
from tests.sync_helpers import eventually, true

# Owner ids as a Redisson client writes them: <client uuid>:<thread id>.
JAVA = "6e3d30b7-83b1-433a-9335-5e8b9916d3ac"
JAVA_57 = f"{JAVA}:57"
OTHER = "77aa0f00-1c2d-4e5f-8a9b-0123456789ab"
OTHER_12 = f"{OTHER}:12"
THIRD_3 = "0f0f0f0f-0000-4000-8000-000000000003:3"
NO_LEASE = 922337203685477

ROOT = Path(__file__).resolve().parent.parent


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AIOLOCK_URL", "REDIS_URL")}
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None,
        timeout: float = 30) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``python -m aiolock ARGS`` in a new process."""
    return subprocess.run(
        [sys.executable, "-m", "aiolock", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env if env is not None else clean_env(),
        cwd=ROOT,
    )


def inspect_json(url: str, *args: str) -> dict[str, dict[str, Any]]:
    proc = cli("inspect", "--url", url, "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return {each["name"]: each for each in json.loads(proc.stdout)}


async def inspect_json_async(url: str, *args: str) -> dict[str, dict[str, Any]]:
    return await asyncio.to_thread(inspect_json, url, *args)


async def take_and_release(lock: aiolock.Lock, wait_time: float) -> bool:
    """try_lock in this task, then unlock (a hold belongs to the task that took it)."""
    if not await lock.try_lock(wait_time=wait_time):
        return False
    await lock.unlock()
    return True


def owner_of(client: redis.Redis, name: str) -> str:
    fields = [f.decode() if isinstance(f, bytes) else f for f in client.hgetall(name)]
    assert len(fields) == 1
    return fields[0]


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as client:
        yield client


def now_ms(client: redis.Redis) -> int:
    secs, micros = client.time()
    return int(secs) * 1000 + int(micros) // 1000


def write_redisson_objects(r: redis.Redis) -> None:
    """One object of every type, as Redisson would leave them, plus unrelated data."""
    now = now_ms(r)
    r.hset("java:lock", JAVA_57, 2)
    r.pexpire("java:lock", 25_000)
    r.hset("java:fenced", JAVA_57, 1)
    r.pexpire("java:fenced", 25_000)
    r.set("redisson_lock_token:{java:fenced}", 41)
    r.hset("java:fair", JAVA_57, 1)
    r.pexpire("java:fair", 20_000)
    r.rpush("redisson_lock_queue:{java:fair}", OTHER_12, THIRD_3)
    r.zadd("redisson_lock_timeout:{java:fair}", {OTHER_12: now + 320_000, THIRD_3: now + 620_000})
    r.hset("java:rw", mapping={"mode": "read", JAVA_57: 2, OTHER_12: 1})
    r.pexpire("java:rw", 30_000)
    r.set("{java:rw}:" + JAVA_57 + ":rwlock_timeout:1", 1, px=30_000)
    r.hset("java:rw-w", mapping={"mode": "write", f"{JAVA_57}:write": 1})
    r.pexpire("java:rw-w", 30_000)
    r.set("java:pes", 3)
    r.zadd("{java:pes}:timeout", {bytes.fromhex("00" * 15 + "01"): now + 9_000,
                                  bytes.fromhex("ff" * 16): NO_LEASE})  # fmt: skip
    r.set("redisson_unlock_latch:{java:lock}:" + "ab" * 16, 0, px=20_000)
    # Not ours: a hash whose fields are not owner ids, a counter, a list.
    r.hset("user:1", mapping={"score:1": 5, "name": "ann"})
    r.hset("java:lookalike", "not-a-uuid:1", 1)
    r.set("page:views", 10)
    r.rpush("jobs", "x")


# -- the command --------------------------------------------------------------------------


def test_help_lists_the_subcommands() -> None:
    proc = cli("--help")
    assert proc.returncode == 0
    for command in ("inspect", "unlock", "watch", "demo"):
        assert command in proc.stdout
    assert "AIOLOCK_URL" in proc.stdout and "REDIS_URL" in proc.stdout
    script = Path(sys.executable).with_name("aiolock")  # the console script, if installed
    if script.exists():
        installed = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                                   check=False, timeout=30)  # fmt: skip
        assert installed.returncode == 0 and "inspect" in installed.stdout


def test_url_comes_from_url_then_aiolock_url_then_redis_url(redis_url: str) -> None:
    unreachable = "redis://127.0.0.1:9/0"  # discard port: nothing answers
    assert (
        cli("inspect", env=clean_env(AIOLOCK_URL=redis_url, REDIS_URL=unreachable)).returncode == 0
    )
    assert cli("inspect", env=clean_env(REDIS_URL=redis_url)).returncode == 0
    assert (
        cli("inspect", "--url", redis_url, env=clean_env(AIOLOCK_URL=unreachable)).returncode == 0
    )
    proc = cli("inspect", env=clean_env(AIOLOCK_URL=unreachable, REDIS_URL=redis_url))
    assert proc.returncode == 2
    assert "cannot reach Redis at redis://127.0.0.1:9/0" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_password_is_not_printed() -> None:
    proc = cli("inspect", "--url", "redis://user:s3cret@127.0.0.1:9/0")
    assert proc.returncode == 2
    assert "s3cret" not in proc.stderr and "user:***@127.0.0.1:9" in proc.stderr


# -- inspect ------------------------------------------------------------------------------


async def test_inspect_shows_locks_held_by_aiolock(redis_url: str, r: redis.Redis) -> None:
    async with aiolock.from_url(redis_url) as holder, aiolock.from_url(redis_url) as other:
        lock = holder.lock("orders:42")
        await lock.lock()
        await lock.lock()  # reentrant: count 2
        fenced = holder.fenced_lock("ledger")
        token = await fenced.lock_and_get_token(lease_time=20)
        waiter = asyncio.create_task(take_and_release(other.lock("orders:42"), wait_time=20))
        # the waiter has subscribed to the lock's channel and parked
        await eventually(lambda: true(other.statistics().tasks_waiting == 1))

        found = await inspect_json_async(redis_url)

        assert set(found) == {"orders:42", "ledger"}
        plain = found["orders:42"]
        assert plain["type"] == "lock" and plain["locked"]
        assert plain["holders"] == [{"owner": owner_of(r, "orders:42"), "count": 2, "mode": None}]
        assert 20_000 < plain["lease_ms"] <= 30_000  # the watchdog's 30 s lease
        assert plain["subscribers"] == 1  # the other client's one pub/sub connection
        ledger = found["ledger"]
        assert (ledger["type"], ledger["token"], ledger["holders"][0]["count"]) == (
            "fenced_lock", token, 1,
        )  # fmt: skip
        assert 15_000 < ledger["lease_ms"] <= 20_000

        await lock.unlock()
        await lock.unlock()
        assert await waiter
        await fenced.unlock()

    found = await inspect_json_async(redis_url)
    assert set(found) == {"ledger"}  # the token counter outlives the hold
    assert not found["ledger"]["locked"] and found["ledger"]["lease_ms"] is None


def test_inspect_reads_every_redisson_type(redis_url: str, r: redis.Redis) -> None:
    write_redisson_objects(r)
    pubsub = r.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe("redisson_sc:{java:sem}", "redisson_countdownlatch__channel__{java:latch}")
    try:
        r.set("java:sem", 5)
        r.set("java:latch", 2)
        found = inspect_json(redis_url)
    finally:
        pubsub.close()

    assert {name: each["type"] for name, each in found.items()} == {
        "java:lock": "lock",
        "java:fenced": "fenced_lock",
        "java:fair": "fair_lock",
        "java:rw": "read_write_lock",
        "java:rw-w": "read_write_lock",
        "java:pes": "permit_expirable_semaphore",
        "java:sem": "semaphore",
        "java:latch": "countdown_latch",
    }
    lock = found["java:lock"]
    assert lock["holders"] == [{"owner": JAVA_57, "count": 2, "mode": None}]
    assert 20_000 < lock["lease_ms"] <= 25_000
    assert found["java:fenced"]["token"] == 41
    fair = found["java:fair"]
    assert fair["queue_length"] == 2
    assert [w["owner"] for w in fair["queue"]] == [OTHER_12, THIRD_3]
    assert 310_000 < fair["queue"][0]["deadline_in_ms"] <= 320_000
    rw = found["java:rw"]
    assert rw["mode"] == "read"
    assert sorted((h["owner"], h["count"], h["mode"]) for h in rw["holders"]) == sorted(
        [(JAVA_57, 2, "read"), (OTHER_12, 1, "read")]
    )
    assert found["java:rw-w"]["holders"] == [{"owner": JAVA_57, "count": 1, "mode": "write"}]
    pes = found["java:pes"]
    assert (pes["permits"], pes["acquired_count"]) == (3, 2)
    leases = {p["id"]: p["lease_ms"] for p in pes["acquired"]}
    assert leases["ff" * 16] is None and 0 < leases["00" * 15 + "01"] <= 9_000
    assert (found["java:sem"]["permits"], found["java:sem"]["subscribers"]) == (5, 1)
    assert (found["java:latch"]["count"], found["java:latch"]["subscribers"]) == (2, 1)


def test_inspect_table(redis_url: str, r: redis.Redis) -> None:
    write_redisson_objects(r)
    proc = cli("inspect", "--url", redis_url)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["TYPE", "NAME", "HOLDERS", "LEASE", "WAITING", "DETAILS"]
    rows = {line.split()[1]: line for line in lines[1:]}
    assert set(rows) == {"java:lock", "java:fenced", "java:fair", "java:rw", "java:rw-w",
                         "java:pes"}  # fmt: skip
    assert f"{JAVA_57} x2" in rows["java:lock"]
    assert "last token 41" in rows["java:fenced"]
    assert f"queue: {OTHER_12} (3" in rows["java:fair"]
    assert f"read {JAVA_57} x2" in rows["java:rw"] and "mode read" in rows["java:rw"]
    assert "3 permits available; 2 acquired" in rows["java:pes"]

    r.flushall()
    assert cli("inspect", "--url", redis_url).stdout == "No locks or synchronizers found.\n"


def test_inspect_pattern_type_and_strings_as(redis_url: str, r: redis.Redis) -> None:
    write_redisson_objects(r)
    assert set(inspect_json(redis_url, "java:f*")) == {"java:fenced", "java:fair"}
    assert set(inspect_json(redis_url, "java:[lr]*", "--type", "lock")) == {"java:lock"}
    assert set(inspect_json(redis_url, "*", "--type", "read_write_lock")) == {
        "java:rw", "java:rw-w",
    }  # fmt: skip
    # A plain string is listed only when asked, and only if it holds an integer.
    r.set("pool:db", 4)
    r.set("pool:name", "primary")
    found = inspect_json(redis_url, "pool:*", "--strings-as", "semaphore")
    assert {name: (each["type"], each["permits"]) for name, each in found.items()} == {
        "pool:db": ("semaphore", 4),
    }
    assert inspect_json(redis_url, "pool:*") == {}
    latches = inspect_json(redis_url, "pool:*", "--strings-as", "countdown_latch")
    assert latches["pool:db"]["count"] == 4


def test_inspect_names_with_hash_tags(redis_url: str, r: redis.Redis) -> None:
    """``prefix:{N}`` is ``prefix:N`` when N holds a hash tag (Redisson's prefixName)."""
    r.hset("{orders}:42", JAVA_57, 1)
    r.set("redisson_lock_token:{orders}:42", 7)  # the fenced lock "{orders}:42"
    r.hset("{plain}", OTHER_12, 1)  # a lock named "{plain}": its token key is ...:{plain}
    r.set("redisson_lock_token:{plain}", 3)
    r.set("redisson_lock_token:{free}", 9)  # a free fenced lock named "free"
    found = inspect_json(redis_url)
    assert {name: (each["type"], each["token"]) for name, each in found.items()} == {
        "{orders}:42": ("fenced_lock", 7),
        "{plain}": ("fenced_lock", 3),
        "free": ("fenced_lock", 9),
    }
    assert set(inspect_json(redis_url, "{orders}*")) == {"{orders}:42"}


def test_inspect_uses_scan_with_count_never_keys(redis_url: str, r: redis.Redis) -> None:
    with r.pipeline(transaction=False) as pipe:
        for n in range(2000):
            pipe.set(f"data:{n}", n)
        pipe.execute()
    r.hset("big", mapping={f"{JAVA}:{n}": 1 for n in range(1500)})  # too big to be a lock
    write_redisson_objects(r)
    r.config_resetstat()

    found = inspect_json(redis_url, "*", "--count", "100")

    assert "big" not in found and "java:lock" in found
    stats = r.info("commandstats")
    assert "cmdstat_keys" not in stats
    assert stats["cmdstat_scan"]["calls"] >= 2000 / 100
    assert "cmdstat_hgetall" in stats and stats["cmdstat_hgetall"]["calls"] < 20


# -- unlock --force -----------------------------------------------------------------------


async def test_unlock_force_yes_frees_an_aiolock_lock_and_wakes_its_waiter(
    redis_url: str, r: redis.Redis
) -> None:
    async with aiolock.from_url(redis_url) as holder, aiolock.from_url(redis_url) as other:
        await holder.lock("stuck").lock()  # a 30 s lease, renewed by the watchdog
        waiter = asyncio.create_task(take_and_release(other.lock("stuck"), wait_time=25))
        await eventually(lambda: true(other.statistics().tasks_waiting == 1))  # parked
        assert not waiter.done()

        started = time.monotonic()
        proc = await asyncio.to_thread(cli, "unlock", "--force", "--yes", "stuck", "--url",
                                       redis_url)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Unlocked 'stuck': deleted it, published 0 on redisson_lock__channel:{stuck}." in (
            proc.stdout
        )
        assert await asyncio.wait_for(waiter, 10)  # woken by the message, not by the lease
        assert time.monotonic() - started < 10


def test_unlock_force_asks_first(redis_url: str, r: redis.Redis) -> None:
    r.hset("java:lock", JAVA_57, 1)
    r.pexpire("java:lock", 25_000)

    declined = cli("unlock", "--force", "java:lock", "--url", redis_url, stdin="n\n")
    assert declined.returncode == 1
    assert f"lock 'java:lock': held by {JAVA_57} x1, lease 2" in declined.stdout
    assert "Force-unlock it?" in declined.stdout and "Not unlocked." in declined.stdout
    assert r.exists("java:lock")
    no_answer = cli("unlock", "--force", "java:lock", "--url", redis_url, stdin="")
    assert no_answer.returncode == 1 and r.exists("java:lock")

    pubsub = r.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe("redisson_lock__channel:{java:lock}")
    try:
        accepted = cli("unlock", "--force", "java:lock", "--url", redis_url, stdin="y\n")
        assert accepted.returncode == 0, accepted.stdout + accepted.stderr
        assert not r.exists("java:lock")
        assert next_message(pubsub) == ("redisson_lock__channel:{java:lock}", "0")
    finally:
        pubsub.close()

    without_force = cli("unlock", "java:lock", "--url", redis_url)
    assert without_force.returncode == 2 and "--force" in without_force.stderr


async def read_until(stream: asyncio.StreamReader | None, marker: str, within: float = 15) -> str:
    """What ``stream`` prints up to and including ``marker`` (a prompt has no newline)."""
    assert stream is not None
    seen = b""
    async with asyncio.timeout(within):
        while marker.encode() not in seen:
            chunk = await stream.read(1)
            assert chunk, f"ended before {marker!r}: {seen.decode()!r}"
            seen += chunk
    return seen.decode()


async def test_unlock_force_frees_only_the_holder_it_showed(redis_url: str, r: redis.Redis) -> None:
    """Issue 19, symptom 13: the operator is shown holder A and asked; A releases and B takes
    the lock before the answer. The "y" was about A: B's hold must stay, and the lock is
    shown again (now held by B) and asked about again."""
    async with aiolock.from_url(redis_url) as a, aiolock.from_url(redis_url) as b:
        await a.lock("job").lock()
        owner_a = owner_of(r, "job")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "aiolock", "unlock", "--force", "job", "--url", redis_url,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=clean_env(),
        )  # fmt: skip
        try:
            shown = await read_until(proc.stdout, "[y/N] ")
            assert f"held by {owner_a} x1" in shown

            # While the question is on the screen: A releases, B takes the lock.
            await a.lock("job").unlock()
            b_holds, b_may_go = asyncio.Event(), asyncio.Event()

            async def b_holds_it() -> None:
                async with b.lock("job"):
                    b_holds.set()
                    await b_may_go.wait()

            holding = asyncio.create_task(b_holds_it())
            await asyncio.wait_for(b_holds.wait(), 10)
            owner_b = owner_of(r, "job")
            assert owner_b != owner_a

            assert proc.stdin is not None
            proc.stdin.write(b"y\n")  # meant for A
            again = await read_until(proc.stdout, "[y/N] ")
            assert owner_of(r, "job") == owner_b  # B's hold was not deleted
            assert "changed" in again and f"held by {owner_b} x1" in again
            proc.stdin.write(b"n\n")
            out, err = await asyncio.wait_for(proc.communicate(), 15)
            assert proc.returncode == 1, out.decode() + err.decode()
            assert "Not unlocked." in out.decode()
            assert owner_of(r, "job") == owner_b
            b_may_go.set()
            await asyncio.wait_for(holding, 10)  # B's own unlock finds its hold: no loss
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


def test_unlock_force_yes_asks_nobody_but_deletes_only_what_it_read(
    redis_url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """The compare-and-delete also guards ``--yes``: owners that changed between the read and
    the delete are read again (and shown) before anything is deleted."""
    import aiolock.cli.inspect as cli_inspect

    r.hset("java:lock", JAVA_57, 1)
    real_lookup = cli_inspect.lookup
    reads = 0

    def lookup(client: redis.Redis, name: str) -> Any:
        nonlocal reads
        reads += 1
        found = real_lookup(client, name)
        if reads == 1:  # the holder changes right after the first read
            r.delete("java:lock")
            r.hset("java:lock", OTHER_12, 1)
        return found

    monkeypatch.setattr(cli_inspect, "lookup", lookup)
    assert main(["unlock", "--force", "--yes", "java:lock", "--url", redis_url]) == 0
    out = capsys.readouterr().out
    assert f"held by {JAVA_57} x1" in out and f"held by {OTHER_12} x1" in out
    assert "changed" in out and reads == 2
    assert not r.exists("java:lock")


def test_unlock_force_on_a_free_lock_exits_0_as_its_help_says(redis_url: str) -> None:
    """A plain lock that nobody holds has no key: "already free" is success for scripts (the
    state asked for holds), as ``--help`` says."""
    help_text = cli("unlock", "--help").stdout
    assert "0 unlocked (or already free" in " ".join(help_text.split())
    proc = cli("unlock", "--force", "--yes", "never-taken", "--url", redis_url)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "'never-taken' is free" in proc.stdout


def next_message(pubsub: Any, timeout: float = 5) -> tuple[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message is not None and message["type"] in ("message", "pmessage"):
            return message["channel"].decode(), message["data"].decode()
    raise AssertionError("no message")


def test_unlock_force_redisson_rwlock_fair_and_fenced(redis_url: str, r: redis.Redis) -> None:
    write_redisson_objects(r)
    now = now_ms(r)
    stale = "dead0000-0000-4000-8000-000000000000:1"  # a waiter whose deadline has passed
    r.lpush("redisson_lock_queue:{java:fair}", stale)
    r.zadd("redisson_lock_timeout:{java:fair}", {stale: now - 1000})
    pubsub = r.pubsub()  # type: ignore[no-untyped-call]
    pubsub.subscribe("redisson_rwlock:{java:rw}", "redisson_lock__channel:{java:fenced}")
    pubsub.psubscribe("redisson_lock__channel:{java:fair}:*")
    try:
        rw = cli("unlock", "--force", "--yes", "java:rw", "--url", redis_url)
        assert rw.returncode == 0, rw.stdout + rw.stderr
        assert next_message(pubsub) == ("redisson_rwlock:{java:rw}", "1")  # wake all

        fair = cli("unlock", "--force", "--yes", "java:fair", "--url", redis_url)
        assert fair.returncode == 0, fair.stdout + fair.stderr
        assert "woke the first waiter" in fair.stdout
        assert next_message(pubsub) == (f"redisson_lock__channel:{{java:fair}}:{OTHER_12}", "0")
        queue = r.lrange("redisson_lock_queue:{java:fair}", 0, -1)
        assert queue == [OTHER_12.encode(), THIRD_3.encode()]  # the stale head was dropped

        fenced = cli("unlock", "--force", "--yes", "java:fenced", "--url", redis_url)
        assert fenced.returncode == 0, fenced.stdout + fenced.stderr
        assert next_message(pubsub) == ("redisson_lock__channel:{java:fenced}", "0")
    finally:
        pubsub.close()
    assert not r.exists("java:rw", "java:fair", "java:fenced")
    assert r.get("redisson_lock_token:{java:fenced}") == b"41"  # tokens keep growing


def test_unlock_force_leaves_what_is_not_a_lock(redis_url: str, r: redis.Redis) -> None:
    write_redisson_objects(r)
    for name, says in (
        ("page:views", "is a Redis string, not a lock"),
        ("user:1", "its hash fields are not lock owners"),
    ):
        proc = cli("unlock", "--force", "--yes", name, "--url", redis_url)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert says in proc.stdout
    assert r.exists("page:views", "user:1") == 2
    r.delete("redisson_lock_token:{java:fenced}")
    r.delete("java:fenced")
    r.set("redisson_lock_token:{java:fenced}", 41)
    proc = cli("unlock", "--force", "--yes", "java:fenced", "--url", redis_url)
    assert proc.returncode == 0 and "Nothing to unlock." in proc.stdout


# -- watch --------------------------------------------------------------------------------


@asynccontextmanager
async def watching(url: str, name: str, *args: str) -> AsyncIterator[WatchProcess]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aiolock", "watch", name, "--url", url, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=clean_env(),
    )  # fmt: skip
    watch = WatchProcess(proc)
    try:
        yield watch
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


class WatchProcess:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []

    async def line(self, within: float = 10) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), within)
        assert raw, "watch ended early"
        self.lines.append(raw.decode().rstrip("\n"))
        return self.lines[-1]

    async def until(self, predicate: Any, within: float = 10) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while True:
            event: dict[str, Any] = json.loads(await self.line(deadline - time.monotonic()))
            if predicate(event):
                return event

    async def interrupt(self) -> tuple[int, str, str]:
        self.proc.send_signal(signal.SIGINT)
        out, err = await asyncio.wait_for(self.proc.communicate(), 10)
        rest = out.decode().splitlines()
        self.lines += rest
        assert self.proc.returncode is not None
        return self.proc.returncode, "\n".join(self.lines), err.decode()


async def test_watch_shows_acquire_hand_off_and_release(redis_url: str, r: redis.Redis) -> None:
    async with watching(redis_url, "hot", "--json", "--interval", "0.1") as watch:
        first = json.loads(await watch.line())
        assert (first["event"], first["type"], first["holders"]) == ("watching", None, [])

        async with aiolock.from_url(redis_url) as a, aiolock.from_url(redis_url) as b:
            await a.lock("hot").lock()
            owner_a = owner_of(r, "hot")
            acquired = await watch.until(lambda e: e["event"] == "acquired")
            assert (acquired["owner"], acquired["count"]) == (owner_a, 1)

            await a.lock("hot").lock()
            count = await watch.until(lambda e: e["event"] == "count")
            assert (count["owner"], count["from"], count["to"]) == (owner_a, 1, 2)

            b_holds, b_may_release = asyncio.Event(), asyncio.Event()

            async def b_takes_it() -> None:
                async with b.lock("hot"):
                    b_holds.set()
                    await b_may_release.wait()

            waiter = asyncio.create_task(b_takes_it())
            await asyncio.sleep(0.3)
            await a.lock("hot").unlock()
            await a.lock("hot").unlock()  # hands off to b's waiter
            await asyncio.wait_for(b_holds.wait(), 10)
            owner_b = owner_of(r, "hot")
            message = await watch.until(lambda e: e["event"] == "message")
            assert (message["channel"], message["data"]) == ("redisson_lock__channel:{hot}", "0")
            handed = await watch.until(lambda e: e["event"] in ("handed_off", "acquired"))
            if handed["event"] == "handed_off":
                assert (handed["from"], handed["to"]) == (owner_a, owner_b)
            else:  # the watcher saw the lock free in between
                assert handed["owner"] == owner_b and handed["after_release_ms"] is not None

            b_may_release.set()
            await waiter
            released = await watch.until(lambda e: e["event"] == "released")
            assert (released["owner"], released["unlock_message"]) == (owner_b, True)

        code, out, err = await watch.interrupt()
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["event"] == "stopped"
    assert "Traceback" not in err


async def test_inspect_waiting_counts_waiters_not_watchers(redis_url: str, r: redis.Redis) -> None:
    """WAITING counts the connections that wait for the lock (aiolock's, and a Redisson
    peer's plain SUBSCRIBE), not the operator's own ``aiolock watch``."""
    async with aiolock.from_url(redis_url) as a, aiolock.from_url(redis_url) as b:
        await a.lock("hot").lock()
        waiter = asyncio.create_task(take_and_release(b.lock("hot"), wait_time=30))
        await eventually(lambda: true(b.statistics().tasks_waiting == 1))
        peer = r.pubsub()  # type: ignore[no-untyped-call]
        peer.subscribe("redisson_lock__channel:{hot}")  # as a Redisson waiter does
        try:
            async with watching(redis_url, "hot", "--json") as watch:
                first = json.loads(await watch.line())
                assert first["event"] == "watching"
                assert first["waiting"] == 2
                found = await inspect_json_async(redis_url, "hot")
                assert found["hot"]["subscribers"] == 2  # b's connection and the peer's
                table = await asyncio.to_thread(cli, "inspect", "hot", "--url", redis_url)
                row = table.stdout.splitlines()[1].split()
                assert row[:2] == ["lock", "hot"] and row[-1] == "2", table.stdout
        finally:
            peer.close()
        await a.lock("hot").unlock()
        assert await asyncio.wait_for(waiter, 10)


@pytest.mark.parametrize("keyspace", [False, True], ids=["unlock-messages", "keyspace-events"])
async def test_watch_misses_no_short_hold(redis_url: str, r: redis.Redis, keyspace: bool) -> None:
    """Holds far shorter than the watch's reads (20 lock/unlock cycles in a row) are all
    told: seen (released, handed off) or counted (unseen), never lost or counted twice;
    by the unlock messages, or by keyspace events when ``--keyspace-events`` turns them on
    (and the server's setting is put back when the watch ends; without the flag it is
    never changed)."""
    before = r.config_get("notify-keyspace-events")["notify-keyspace-events"]
    assert before == ""  # the server's default
    args = ["--json", "--keyspace-events"] if keyspace else ["--json"]
    async with watching(redis_url, "quick", *args) as watch:
        first = json.loads(await watch.line())
        assert first["keyspace_events"] is keyspace
        assert first["interval"] == (5.0 if keyspace else 0.5)
        during = r.config_get("notify-keyspace-events")["notify-keyspace-events"]
        assert ("K" in str(during)) is keyspace
        async with aiolock.from_url(redis_url) as client:
            lock = client.lock("quick")
            for _ in range(20):
                await lock.lock()
                await lock.unlock()
        told = 0
        while told < 20:
            event = await watch.until(
                lambda e: e["event"] in ("released", "handed_off", "unseen"), within=15
            )
            told += event.get("count", 1)
        await asyncio.sleep(1)  # nothing more may come
        code, out, err = await watch.interrupt()
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    counted = sum(
        e.get("count", 1) for e in events if e["event"] in ("released", "handed_off", "unseen")
    )
    assert counted == 20, out
    assert r.config_get("notify-keyspace-events")["notify-keyspace-events"] == before


# `aiolock watch`, with every read of the lock running an object's __del__ that takes 0.2 s:
# the way redis-py's Pipeline and PubSub close themselves when collected.
SLOW_DEL_WATCH = """
import sys, time
import aiolock.cli.inspect

class ClosesInDel:
    def __del__(self) -> None:
        time.sleep(0.2)

real_lookup = aiolock.cli.inspect.lookup

def lookup(client, name, **options):
    ClosesInDel()  # collected at once: its __del__ runs here
    return real_lookup(client, name, **options)

aiolock.cli.inspect.lookup = lookup
from aiolock.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_watch_ends_on_ctrl_c_even_inside_a_del(redis_url: str) -> None:
    """The CI hang: a KeyboardInterrupt raised while a ``__del__`` runs is printed as
    "Exception ignored" and dropped, and ``aiolock watch`` went on watching. Here nearly every
    moment of the watch loop is inside one, so SIGINT lands there; it must still end it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_DEL_WATCH, "watch", "w", "--url", redis_url,
         "--interval", "0.01"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert "watching" in proc.stdout.readline()
        time.sleep(0.75)  # a few reads of the lock, each in a __del__
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=5)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert out.splitlines()[-1].endswith("stopped")
    assert "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize("when", ["watching", "starting"])
def test_ctrl_c_ends_a_keyspace_watch_on_a_server_that_stopped_answering(when: str) -> None:
    """``--keyspace-events`` changes the server's setting and puts it back at the end. With
    the server paused (SIGSTOP), Ctrl-C during the watch kept it 30 s more (the put-back's
    connection timeout), then said only "cannot reach Redis", exit 0, the setting left
    changed; Ctrl-C while it was still turning the events on ended in a KeyboardInterrupt
    traceback. Now: it ends within seconds, and says how to put the setting back (exit 2);
    or, before it began, quietly (exit 0). Both fail on the old code."""
    if find_redis_server_binary() is None or external_redis_url() is not None:
        pytest.skip("needs a private redis-server to pause")
    with RedisServer() as server:
        if when == "starting":
            server.pause()
        proc = subprocess.Popen(
            [sys.executable, "-m", "aiolock", "watch", "w", "--url", server.url,
             "--keyspace-events"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            if when == "watching":
                assert "watching" in proc.stdout.readline()
                server.pause()
            else:
                time.sleep(1)  # importing, then connecting to the paused server
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=15)  # was 30 s and more
        finally:
            if proc.returncode is None:
                proc.kill()
                proc.communicate()
            server.resume()
        assert "Traceback" not in err, err
        if when == "watching":
            assert proc.returncode == 2, err
            assert out.splitlines()[-1].endswith("stopped")
            assert "could not put notify-keyspace-events back to ''" in err
            assert 'CONFIG SET notify-keyspace-events ""' in err
        else:
            assert (proc.returncode, out) == (0, ""), err


def test_watch_text_on_a_redisson_lock_for_a_duration(redis_url: str, r: redis.Redis) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "aiolock", "watch", "java:lock", "--url", redis_url,
         "--interval", "0.1", "--duration", "3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # watching: from here on, every change is seen
        assert first.split("  ", 2)[2] == "watching: free (no such lock yet) (Ctrl-C to stop)\n"
        with r.pipeline() as pipe:  # MULTI/EXEC: the hash never shows without its lease
            pipe.hset("java:lock", JAVA_57, 1)
            pipe.pexpire("java:lock", 30_000)
            pipe.execute()
        time.sleep(0.4)
        r.hset("java:lock", JAVA_57, 2)
        time.sleep(0.4)
        r.delete("java:lock")  # no unlock message: as when a lease runs out
        time.sleep(0.4)
        r.hset("java:lock", OTHER_12, 1)
        r.publish("redisson_lock__channel:{java:lock}", "0")
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    events = [line.split("  ", 2)[2] for line in out.splitlines()]
    assert events[0].startswith(f"acquired by {JAVA_57} x1, lease ")
    assert f"{JAVA_57}: hold count 1 -> 2" in events
    assert (
        f"released by {JAVA_57} without an unlock message (the lease ran out, or the key was "
        "deleted)" in events
    )
    assert "message '0' on redisson_lock__channel:{java:lock}" in events
    assert any(e.startswith(f"acquired by {OTHER_12} x1") for e in events)
    assert events[-1] == "stopped"


def test_main_in_process(
    redis_url: str, r: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    r.hset("java:lock", JAVA_57, 1)
    assert main(["inspect", "--url", redis_url, "--json"]) == 0
    [lock] = json.loads(capsys.readouterr().out)
    assert (lock["name"], lock["lease_ms"]) == ("java:lock", -1)  # a hash without expiry
    assert main(["unlock", "--force", "--yes", "java:lock", "--url", redis_url]) == 0
    assert not r.exists("java:lock")


def test_demo_takes_url_like_the_other_commands() -> None:
    args = build_parser().parse_args(["demo", "--url", "redis://127.0.0.1:1/0"])
    assert args.redis == "redis://127.0.0.1:1/0"
    assert build_parser().parse_args(["demo", "--redis", "redis://h/1"]).redis == "redis://h/1"


async def test_inspect_and_unlock_force_with_a_redisson_peer(redis_url: str, peers: Peers) -> None:
    """A Redisson client in another process (tests/redisson_peer.py: Redisson's own scripts
    and waiting loop) holds a fair lock, waits for it from a second thread, and holds a read
    lock: inspect shows what it wrote; unlock --force frees the fair lock, and the Redisson
    waiter, woken by the message to the head of the line, takes it. (Thread ids are numbers,
    as Java's are: inspect recognises owner fields ``<uuid>:<n>``.)"""
    java = await peers.start("redisson")
    await java.send("57", "fair-lock", "java-fair", 0, 60_000)
    await peers.expect(java, "57", "acquired")
    await java.send("12", "read-lock", "java-rw", 0, 60_000)
    await peers.expect(java, "12", "acquired")
    await java.send("58", "fair-lock", "java-fair", 60_000, 60_000)
    async with asyncio.timeout(10):
        while True:
            found = await asyncio.to_thread(inspect_json, redis_url, "java-*")
            if found.get("java-fair", {}).get("queue_length") == 1:
                break
            await asyncio.sleep(0.05)
    fair, rw = found["java-fair"], found["java-rw"]
    assert fair["type"] == "fair_lock"
    assert [(h["owner"], h["count"]) for h in fair["holders"]] == [(java.owner("57"), 1)]
    assert [entry["owner"] for entry in fair["queue"]] == [java.owner("58")]
    assert 0 < fair["lease_ms"] <= 60_000
    assert rw["type"] == "read_write_lock" and rw["mode"] == "read"
    assert [(h["owner"], h["count"]) for h in rw["holders"]] == [(java.owner("12"), 1)]

    proc = await asyncio.to_thread(cli, "unlock", "--force", "--yes", "java-fair", "--url",
                                   redis_url)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    await peers.expect(java, "58", "acquired", within=10)  # woken by the message, not a lease
    after = await asyncio.to_thread(inspect_json, redis_url, "java-fair")
    assert [h["owner"] for h in after["java-fair"]["holders"]] == [java.owner("58")]
