"""aiolock's pytest plugin (``aiolock.testing.pytest_plugin``), used as a user uses it: a small
suite of a user's, run by a pytest of its own in a subprocess (pytester), on pytest-asyncio in
strict and auto mode at every loop scope, on anyio's plugin, against a server named by
``AIOLOCK_TEST_REDIS_URL``; and nowhere unless asked for."""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from aiolock.testing import (
    ENV_TEST_REDIS_URL,
    ExternalRedis,
    RedisServer,
    find_redis_server_binary,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "testing" / "test_seats.py"
CONFTEST = 'pytest_plugins = ["aiolock.testing.pytest_plugin"]\n'
INI = "[pytest]\nfilterwarnings = error\n"  # an unclosed client or socket fails the run
ASYNCIO_INI = INI + "asyncio_default_fixture_loop_scope = function\n"

ASYNCIO_SUITE = """
import pytest
import redis

import aiolock
from aiolock.testing import RedisServer

CLIENTS = []  # every client the fixture gave; all closed by the last test


@pytest.mark.asyncio
async def test_a_client_on_this_loop(aiolock_client, aiolock_redis_url):
    CLIENTS.append(aiolock_client)
    async with aiolock_client.lock("orders:1"):  # WrongEventLoopError on another loop
        async with aiolock.from_url(aiolock_redis_url) as other:
            assert not await other.lock("orders:1").try_lock()
    with redis.Redis.from_url(aiolock_redis_url) as plain:
        plain.set("left-behind", 1)


@pytest.mark.asyncio
async def test_an_empty_database_for_each_test(aiolock_redis_url):
    with redis.Redis.from_url(aiolock_redis_url) as plain:
        assert plain.dbsize() == 0


@pytest.mark.asyncio(loop_scope="module")
async def test_a_module_loop(aiolock_client):
    CLIENTS.append(aiolock_client)
    async with aiolock_client.lock("module"):
        pass


@pytest.mark.asyncio(loop_scope="session")
async def test_a_session_loop_and_the_proxy(aiolock_client, aiolock_proxy):
    CLIENTS.append(aiolock_client)
    async with aiolock.from_url(aiolock_proxy.url) as through:
        async with through.lock("proxied"):
            assert not await aiolock_client.lock("proxied").try_lock()
    assert aiolock_proxy.connections_accepted >= 1


@pytest.mark.asyncio(loop_scope="class")
class TestAClassLoop:
    async def test_it(self, aiolock_client):
        CLIENTS.append(aiolock_client)
        async with aiolock_client.lock("class"):
            pass


@pytest.mark.asyncio
async def test_pause_the_server(aiolock_redis_server):
    assert isinstance(aiolock_redis_server, RedisServer)
    aiolock_redis_server.pause()


@pytest.mark.asyncio
async def test_it_was_resumed_then_kill_it(aiolock_client, aiolock_redis_server):
    CLIENTS.append(aiolock_client)
    async with aiolock_client.lock("after-pause"):
        pass
    aiolock_redis_server.kill()


@pytest.mark.asyncio
async def test_it_was_restarted(aiolock_client):
    CLIENTS.append(aiolock_client)
    async with aiolock_client.lock("after-kill"):
        pass


def test_every_client_was_closed():
    assert len(CLIENTS) == 6
    assert all(client.closed for client in CLIENTS)
"""

ANYIO_SUITE = """
import pytest

import aiolock

CLIENTS = []


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_a_client_and_a_proxy_on_anyio(aiolock_client, aiolock_proxy):
    CLIENTS.append(aiolock_client)
    async with aiolock_client.lock("orders:1"):
        async with aiolock.from_url(aiolock_proxy.url) as through:
            assert not await through.lock("orders:1").try_lock()


@pytest.mark.anyio
async def test_another_test_another_client(aiolock_client):
    CLIENTS.append(aiolock_client)
    assert await aiolock_client.lock("orders:1").try_lock()  # the last one was released


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_not_on_trio(aiolock_client):
    pass


def test_every_client_was_closed():
    assert len(CLIENTS) == 2
    assert all(client.closed for client in CLIENTS)
"""


@pytest.fixture
def private_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's suite starts a server of its own (it needs one it may pause and kill)."""
    if find_redis_server_binary() is None:
        pytest.skip("the plugin starts a redis-server")
    monkeypatch.delenv(ENV_TEST_REDIS_URL, raising=False)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=120)


@pytest.mark.usefixtures("private_server")
@pytest.mark.parametrize("mode", ["strict", "auto"])
def test_on_pytest_asyncio(pytester: pytest.Pytester, mode: str) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makefile(".ini", pytest=ASYNCIO_INI + f"asyncio_mode = {mode}\n")
    pytester.makepyfile(test_user=ASYNCIO_SUITE)
    run(pytester).assert_outcomes(passed=9)


@pytest.mark.usefixtures("private_server")
def test_on_anyio(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makefile(".ini", pytest=INI)
    pytester.makepyfile(test_user=ANYIO_SUITE)
    result = run(pytester, "-p", "no:asyncio")
    result.assert_outcomes(passed=3, errors=1)
    result.stdout.fnmatch_lines(["*aiolock_client needs anyio's asyncio backend, not 'trio'*"])


@pytest.mark.usefixtures("private_server")
def test_on_anyio_beside_pytest_asyncio_in_strict_mode(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makefile(".ini", pytest=ASYNCIO_INI)
    pytester.makepyfile(test_user=ANYIO_SUITE)
    run(pytester, "-k", "not trio").assert_outcomes(passed=3, deselected=1)


@pytest.mark.usefixtures("private_server")
def test_on_anyio_beside_pytest_asyncio_in_auto_mode_says_why_not(
    pytester: pytest.Pytester,
) -> None:
    """pytest-asyncio's auto mode runs every async fixture on its own loop, anyio tests' too:
    the fixture says so rather than handing out a client of another loop."""
    pytester.makeconftest(CONFTEST)
    pytester.makefile(".ini", pytest=ASYNCIO_INI + "asyncio_mode = auto\n")
    pytester.makepyfile(test_user=ANYIO_SUITE)
    result = run(pytester, "-k", "a_client_and_a_proxy")
    result.assert_outcomes(errors=1, deselected=3)
    result.stdout.fnmatch_lines(["*pytest-asyncio's auto mode would run it on a loop*"])


def test_a_server_named_by_the_environment_is_used_and_only_its_database_emptied(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    redis_server: RedisServer | ExternalRedis,
) -> None:
    url3, url4 = (urlunsplit(urlsplit(redis_server.url)._replace(path=f"/{n}")) for n in (3, 4))
    with redis.Redis.from_url(url3) as db3, redis.Redis.from_url(url4) as db4:
        db3.set("old", 1)
        db4.set("kept", 1)
        monkeypatch.setenv(ENV_TEST_REDIS_URL, url3)
        pytester.makeconftest(CONFTEST)
        pytester.makefile(".ini", pytest=ASYNCIO_INI)
        pytester.makepyfile(
            test_user=f"""
import pytest
import redis
from aiolock.testing import ExternalRedis

@pytest.mark.asyncio
async def test_it(aiolock_redis_server, aiolock_redis_url, aiolock_client):
    assert isinstance(aiolock_redis_server, ExternalRedis)
    assert aiolock_redis_url == "{url3}"
    with redis.Redis.from_url(aiolock_redis_url) as db:
        assert db.dbsize() == 0
    assert await aiolock_client.lock("there").try_lock()
"""
        )
        run(pytester).assert_outcomes(passed=1)
        assert db3.exists("old") == 0  # FLUSHDB of the URL's database...
        assert db4.get("kept") == b"1"  # ...and of no other one
        db4.flushdb()


def test_nothing_is_loaded_unless_asked_for(pytester: pytest.Pytester) -> None:
    pytester.makefile(".ini", pytest=ASYNCIO_INI)
    pytester.makepyfile(test_user="def test_it(aiolock_client):\n    pass\n")
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'aiolock_client' not found*"])
    entry_points = metadata.distribution("aiolock-redis").entry_points
    assert not [ep for ep in entry_points if ep.group == "pytest11"]


@pytest.mark.usefixtures("private_server")
def test_without_an_async_plugin_the_async_fixtures_say_what_they_need(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makefile(".ini", pytest=INI)
    pytester.makepyfile(test_user="def test_it(aiolock_client):\n    pass\n")
    result = run(pytester, "-p", "no:asyncio", "-p", "no:anyio")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*aiolock_client is an async fixture: run the test with*"])


@pytest.mark.usefixtures("private_server")
@pytest.mark.parametrize("mode", ["strict", "auto"])
def test_the_documented_example_passes(pytester: pytest.Pytester, mode: str) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makefile(".ini", pytest=ASYNCIO_INI + f"asyncio_mode = {mode}\n")
    shutil.copy(EXAMPLE, pytester.path / EXAMPLE.name)
    run(pytester).assert_outcomes(passed=3)


def test_the_documented_example_is_the_one_the_docs_show() -> None:
    page = (ROOT / "docs" / "testing.md").read_text()
    assert f'--8<-- "{EXAMPLE.relative_to(ROOT).as_posix()}"' in page
    assert CONFTEST.strip() in page
