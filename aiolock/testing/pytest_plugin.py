"""A pytest plugin for testing code that uses aiolock: a real Redis server and an aiolock
client as fixtures.

It is opt-in: nothing is loaded until a project asks for it, in its top-level
``conftest.py``::

    pytest_plugins = ["aiolock.testing.pytest_plugin"]

or on the command line (``pytest -p aiolock.testing.pytest_plugin``, or in ``addopts``).
pytest itself is not a dependency of aiolock; this module imports it.

Fixtures:

``aiolock_redis_server`` (session)
    A private :class:`~aiolock.testing.RedisServer` started on a free port for the session
    (no persistence, its own temporary directory), stopped at the end. With
    ``AIOLOCK_TEST_REDIS_URL`` set, that server is used instead (an
    :class:`~aiolock.testing.ExternalRedis`, which cannot be killed or paused).
``aiolock_redis_url`` (function)
    The server's URL, emptied before the test: a private server is FLUSHALLed; a server named
    by ``AIOLOCK_TEST_REDIS_URL`` has only the URL's database FLUSHDBed. A private server that
    an earlier test paused or killed is resumed or restarted first.
``aiolock_client`` (function, async)
    An :class:`aiolock.AioLock` on ``aiolock_redis_url``, made and closed on the test's event
    loop.
``aiolock_proxy`` (function, async)
    A started :class:`~aiolock.testing.TcpProxy` in front of ``aiolock_redis_url``, for
    faults (delay, blackhole, drop a reply, reset); connect through ``aiolock_proxy.url``.

The async fixtures run on the event loop of the test that asks for them, under
pytest-asyncio (strict or auto mode, whatever the test's ``loop_scope``) or under anyio's
pytest plugin (``@pytest.mark.anyio``, with the ``asyncio`` backend: aiolock runs on asyncio).
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final

import pytest
import redis

import aiolock

from ._proxy import TcpProxy
from ._server import ExternalRedis, RedisServer

__all__ = ["aiolock_client", "aiolock_proxy", "aiolock_redis_server", "aiolock_redis_url"]

_LOOP_SCOPES: Final = ("function", "class", "module", "package", "session")
_FLUSH_TIMEOUT: Final = 10.0


@pytest.fixture(scope="session")
def aiolock_redis_server() -> Iterator[RedisServer | ExternalRedis]:
    """A Redis server for the whole session: a private one, or ``AIOLOCK_TEST_REDIS_URL``'s."""
    from aiolock import testing  # at call time: a test may patch external_redis_url

    url = testing.external_redis_url()
    if url is not None:
        yield ExternalRedis(url)
        return
    with RedisServer() as server:
        yield server


@pytest.fixture
def aiolock_redis_url(aiolock_redis_server: RedisServer | ExternalRedis) -> str:
    """The session server's URL, emptied for this test (a private server is also brought
    back, should an earlier test have paused or killed it)."""
    server = aiolock_redis_server
    if isinstance(server, RedisServer):
        if server.is_paused:
            server.resume()
        if not server.is_running:
            server.restart()
    with redis.Redis.from_url(server.url, socket_timeout=_FLUSH_TIMEOUT) as client:
        if isinstance(server, RedisServer):
            client.flushall()
        else:
            client.flushdb()
    return server.url


@pytest.fixture
def aiolock_client(request: pytest.FixtureRequest) -> aiolock.AioLock:
    """An aiolock client on ``aiolock_redis_url``, closed at the end of the test; made and
    closed on the test's event loop."""
    client: aiolock.AioLock = _on_the_tests_loop(request, "_aiolock_client")
    return client


@pytest.fixture
def aiolock_proxy(request: pytest.FixtureRequest) -> TcpProxy:
    """A fault-injection proxy in front of ``aiolock_redis_url``, on the test's event loop."""
    proxy: TcpProxy = _on_the_tests_loop(request, "_aiolock_proxy")
    return proxy


# -- the async fixtures, once per way of running them ------------------------------------------


def _make_client() -> Callable[[str], AsyncIterator[aiolock.AioLock]]:
    async def client(aiolock_redis_url: str) -> AsyncIterator[aiolock.AioLock]:
        async with aiolock.from_url(aiolock_redis_url) as made:
            yield made

    return client


def _make_proxy() -> Callable[[str], AsyncIterator[TcpProxy]]:
    async def proxy(aiolock_redis_url: str) -> AsyncIterator[TcpProxy]:
        async with TcpProxy.for_url(aiolock_redis_url) as started:
            yield started

    return proxy


_MAKERS: Final = {"_aiolock_client": _make_client, "_aiolock_proxy": _make_proxy}

# anyio's plugin runs a plain async fixture on the test's runner when the test has
# ``anyio_backend``; pytest-asyncio (in strict mode) leaves such a fixture alone.
_aiolock_client_anyio = pytest.fixture(name="_aiolock_client_anyio")(_make_client())
_aiolock_proxy_anyio = pytest.fixture(name="_aiolock_proxy_anyio")(_make_proxy())

# pytest-asyncio runs a fixture on the loop of the scope it is told, so there is one per scope
# a test's loop can have. (A fixture function of each its own: pytest-asyncio marks them.)
if importlib.util.find_spec("pytest_asyncio") is not None:
    import pytest_asyncio

    def _register_asyncio_variants() -> None:
        for prefix, make in _MAKERS.items():
            for scope in _LOOP_SCOPES:
                name = f"{prefix}_asyncio_{scope}"
                globals()[name] = pytest_asyncio.fixture(loop_scope=scope, name=name)(make())

    _register_asyncio_variants()


def _on_the_tests_loop(request: pytest.FixtureRequest, prefix: str) -> Any:
    """The value of the async fixture ``prefix`` in the variant that runs on the loop of the
    test being set up: anyio's, or pytest-asyncio's of the test's loop scope."""
    public = prefix.lstrip("_")
    if "anyio_backend" in request.fixturenames:
        backend = request.getfixturevalue("anyio_backend")
        name = backend if isinstance(backend, str) else backend[0]
        if name != "asyncio":
            pytest.fail(f"{public} needs anyio's asyncio backend, not {name!r}", pytrace=False)
        if _asyncio_mode(request.config) == "auto":
            pytest.fail(
                f"{public} in an anyio test: pytest-asyncio's auto mode would run it on a loop "
                "of its own (it takes every async fixture); use its strict mode",
                pytrace=False,
            )
        return request.getfixturevalue(f"{prefix}_anyio")
    if _asyncio_mode(request.config) is None:
        pytest.fail(
            f"{public} is an async fixture: run the test with pytest-asyncio or with anyio's "
            "plugin (@pytest.mark.anyio)",
            pytrace=False,
        )
    marker = request.node.get_closest_marker("asyncio")
    scope = marker and (marker.kwargs.get("loop_scope") or marker.kwargs.get("scope"))
    scope = scope or request.config.getini("asyncio_default_test_loop_scope") or "function"
    return request.getfixturevalue(f"{prefix}_asyncio_{scope}")


def _asyncio_mode(config: pytest.Config) -> str | None:
    """pytest-asyncio's mode (``strict`` or ``auto``), ``None`` without pytest-asyncio."""
    if not config.pluginmanager.has_plugin("asyncio"):
        return None
    return str(config.getoption("asyncio_mode", None) or config.getini("asyncio_mode"))
