"""The one process helper under RedisServer, LocalCluster and LocalSentinel: a first start
that loses its port to another process tries new ports, a restart keeps its port, a process
that ended by itself is told with its exit status and its log."""

from __future__ import annotations

import contextlib
import socket
import time

import pytest
import redis

from aiolock.testing import LocalCluster, RedisServer, external_redis_url, find_redis_server_binary

pytestmark = pytest.mark.skipif(
    external_redis_url() is not None or find_redis_server_binary() is None,
    reason="needs its own redis-server",
)


def occupy(port: int) -> socket.socket:
    """Listen on ``127.0.0.1:port`` as another program would."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_a_first_start_that_lost_its_port_takes_another() -> None:
    server = RedisServer()
    taken = server.port  # free when chosen; another program binds it before the start
    with occupy(taken), server:
        assert server.port != taken
        assert server.ping()
        assert "already in use" not in server.log()  # the failed try's log is not kept


def test_a_restart_keeps_its_port_even_when_it_is_taken(fresh_server: RedisServer) -> None:
    port = fresh_server.port
    fresh_server.kill()
    with occupy(port), pytest.raises(RuntimeError, match=r"(?s)exited.*already in use"):
        fresh_server.restart()  # clients look for it there: it must not move
    assert fresh_server.port == port
    assert not fresh_server.is_running
    fresh_server.restart()
    assert fresh_server.port == port
    assert fresh_server.ping()


def shut_down(server: RedisServer) -> None:
    """``SHUTDOWN NOSAVE``: the server ends by itself; wait until it has."""
    with redis.Redis.from_url(server.url) as client, contextlib.suppress(redis.ConnectionError):
        client.execute_command("SHUTDOWN", "NOSAVE")
    deadline = time.monotonic() + 10
    while server.is_running:
        assert time.monotonic() < deadline, "the server did not exit"
        time.sleep(0.01)


def test_returncode_tells_a_server_that_ended_by_itself(fresh_server: RedisServer) -> None:
    assert fresh_server.returncode is None  # running
    shut_down(fresh_server)
    assert fresh_server.returncode == 0
    assert fresh_server.pid is None
    fresh_server.restart()
    assert fresh_server.returncode is None
    fresh_server.kill()
    assert fresh_server.returncode is None  # killed here: not by itself


def test_a_cluster_wait_that_times_out_shows_the_log_of_a_node_that_died() -> None:
    with LocalCluster(masters=1, replicas_per_master=1) as cluster:
        (master,) = cluster.masters()
        (replica,) = cluster.replicas()
        shut_down(replica.server)
        with pytest.raises(TimeoutError) as waited:  # the master runs: no failover comes
            cluster.wait_for_failover_of(master, timeout=1)
    message = str(waited.value)
    assert "exited by itself (status 0); log ends:" in message
    assert "ready to exit, bye bye" in message  # the last line redis-server logs
