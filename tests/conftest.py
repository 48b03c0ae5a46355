"""Shared fixtures: real Redis servers (aiolock.testing) and a fault-injection proxy.

The session server, the emptied URL and the proxy are aiolock's own pytest plugin's
(aiolock.testing.pytest_plugin), under the names the suites use. Set AIOLOCK_TEST_REDIS_URL to
run against an existing server instead of launching one; its database is FLUSHDBed before
every test that asks for ``redis_url``, and fixtures that kill, pause or restart a server skip.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import traceback
import weakref
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.connection

import aiolock
from aiolock.testing import (
    ExternalRedis,
    LocalCluster,
    RedisServer,
    TcpProxy,
    external_redis_url,
    find_redis_server_binary,
)
from tests.peers import Peers

#: pytester runs the plugin's users' suites (tests/test_testing_plugin.py).
pytest_plugins = ["pytester", "aiolock.testing.pytest_plugin"]


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The event loop of every test: asyncio's, or uvloop's with AIOLOCK_TEST_LOOP=uvloop."""
    if os.environ.get("AIOLOCK_TEST_LOOP") == "uvloop":
        import uvloop

        return {"uvloop": uvloop.new_event_loop}
    return {"asyncio": asyncio.new_event_loop}


# -- the fast subset: pytest -m "not slow" ------------------------------------------------------

#: Suites of faults on several servers or processes: clusters, Sentinel, replicas, red locks
#: over several masters, processes killed mid-run, the watchdog's timing; the pytest plugin's
#: users' suites (a pytest each, in a subprocess); and the benchmarks.
SLOW_MODULES = {
    "tests/test_benchmark_cluster.py",
    "tests/test_benchmark_composite.py",
    "tests/test_benchmarks.py",
    "tests/test_cluster.py",
    "tests/test_cluster_family.py",
    "tests/test_cluster_seams.py",
    "tests/test_cluster_watch.py",
    "tests/test_composite_bounds.py",
    "tests/test_composite_faults.py",
    "tests/test_redlock.py",
    "tests/test_relock.py",
    "tests/test_replica_acks.py",
    "tests/test_semaphore_processes.py",
    "tests/test_sentinel.py",
    "tests/test_testing_cluster.py",
    "tests/test_testing_plugin.py",
    "tests/test_testing_sentinel.py",
    "tests/test_watchdog.py",
}
#: Folders whose every test is slow: the fault campaign.
SLOW_FOLDERS = ("tests/chaos/",)
#: The slowest tests of the other suites: a second or more each in a full run on 2 cores
#: (every parameter of a parametrized one). A new slow test can say @pytest.mark.slow itself.
SLOW_TESTS = {
    "tests/examples/test_example_aiohttp.py::test_the_readme_command",
    "tests/examples/test_example_fastapi.py::test_the_readme_uvicorn_command",
    "tests/examples/test_example_limiter.py::test_the_readme_command_twice",
    "tests/examples/test_example_optimistic.py::test_the_readme_command_twice",
    "tests/examples/test_example_prometheus.py::test_the_readme_command_exports_aiolock_series",
    "tests/examples/test_example_worker.py::test_a_run_after_a_killed_run_still_succeeds",
    "tests/examples/test_example_worker.py::test_the_readme_command_twice",
    "tests/examples/test_example_worker.py::test_workers_lose_no_deposit_and_never_overlap_run_after_run",
    "tests/test_cancellation.py::test_cancelled_while_the_acquire_reply_is_in_flight",
    "tests/test_cancellation.py::test_cancelled_while_the_acquire_request_is_in_flight",
    "tests/test_bounds.py::test_a_cancelled_call_ends_within_cleanup_timeout_of_its_cancellation",
    "tests/test_bounds.py::test_a_write_blocked_connection_bounds_a_fence_by_its_deadline",
    "tests/test_bounds.py::test_a_write_blocked_connection_bounds_unlock_by_cleanup_timeout",
    "tests/test_bounds.py::test_semaphore_releases_end_within_cleanup_timeout",
    "tests/test_cancellation.py::test_unresolvable_outcome_is_an_aiolock_error",
    "tests/test_cli.py::test_inspect_and_unlock_force_with_a_redisson_peer",
    "tests/test_cli.py::test_inspect_names_with_hash_tags",
    "tests/test_cli.py::test_inspect_pattern_type_and_strings_as",
    "tests/test_cli.py::test_inspect_shows_locks_held_by_aiolock",
    "tests/test_cli.py::test_inspect_table",
    "tests/test_cli.py::test_unlock_force_asks_first",
    "tests/test_cli.py::test_url_comes_from_url_then_aiolock_url_then_redis_url",
    "tests/test_cli.py::test_watch_ends_on_ctrl_c_even_inside_a_del",
    "tests/test_cli.py::test_watch_text_on_a_redisson_lock_for_a_duration",
    "tests/test_composite_types.py::test_cancellation_leaves_no_hold_and_no_place_in_line",
    "tests/test_fair_lock.py::test_a_killed_waiter_holds_the_line_up_for_its_allowance_only",
    "tests/test_fair_lock.py::test_a_live_waiter_keeps_its_place_however_long_the_holder_renews",
    "tests/test_fair_lock.py::test_a_lost_attempt_reply_is_settled_without_a_double_hold_or_place",
    "tests/test_fair_lock.py::test_behind_a_dead_first_waiter_no_hot_loop",
    "tests/test_fair_rw_faults.py::test_chaos",
    "tests/test_holds.py::test_a_background_release_does_not_race_the_next_lock",
    "tests/test_holds.py::test_a_caller_cancelled_while_the_link_is_write_blocked_leaves_no_lock",
    "tests/test_holds.py::test_a_failed_unlock_stops_renewal_and_the_lock_is_freed",
    "tests/test_holds.py::test_a_late_grant_is_removed_before_the_next_try",
    "tests/test_holds.py::test_a_nested_grant_after_the_hold_was_lost_is_not_a_new_hold",
    "tests/test_holds.py::test_a_wake_up_that_comes_as_the_wait_ends_is_passed_on",
    "tests/test_holds.py::test_client_alock_lets_the_body_exception_win",
    "tests/test_holds.py::test_one_bad_key_fails_only_its_own_renewal",
    "tests/test_holds.py::test_the_bodys_exception_wins_over_a_failed_unlock",
    "tests/test_holds.py::test_unlocking_as_often_as_locking_is_enough_after_a_loss",
    "tests/test_latch.py::test_a_tagged_latch_works_on_a_cluster",
    "tests/test_lock.py::test_another_process_is_excluded",
    "tests/test_lock_family.py::test_a_blackholed_server_bounds_try_lock",
    "tests/test_lock_family.py::test_a_killed_holder_frees_the_lock_after_its_lease",
    "tests/test_lock_family.py::test_a_paused_holder_learns_it_lost_the_lock",
    "tests/test_lock_family.py::test_processes_hammer_one_lock",
    "tests/test_multilock.py::test_cancellation_at_every_step_leaves_nothing_held",
    "tests/test_multilock.py::test_excludes_other_processes",
    "tests/test_multilock.py::test_server_lost_while_held_loses_the_multi_lock",
    "tests/test_packaging.py::test_the_wheel_installs_in_a_fresh_venv_and_runs_the_quickstart",
    "tests/test_permit_semaphore.py::test_an_acquire_that_cannot_be_fenced_taints_nothing",
    "tests/test_permit_semaphore.py::test_the_watchdog_renews_a_permit_past_its_lease",
    "tests/test_redisson_interop.py::test_a_peer_waits_for_our_expiring_permit",
    "tests/test_rwlock.py::test_read_holds_are_renewed_by_the_watchdog",
    "tests/test_synchronizer_attacks.py::test_a_chaotic_link_leaves_the_count_exact",
    "tests/test_testing_process_helper.py::test_a_cluster_wait_that_times_out_shows_the_log_of_a_node_that_died",
    "tests/test_transport.py::test_a_loop_held_up_past_command_timeout_drops_no_link",
    "tests/test_transport.py::test_bounds_hold_against_a_stalled_server",
    "tests/test_transport.py::test_redis_py_socket_timeouts_are_not_needed",
    "tests/test_transport.py::test_rediss_against_a_plain_server_says_so_quickly",
    "tests/test_transport.py::test_without_client_kill_a_lost_acquire_is_never_sent_again",
    "tests/test_waiting.py::test_a_silent_pubsub_connection_is_replaced",
    "tests/test_waiting.py::test_three_processes_hammer_one_lock",
    "tests/test_waiting.py::test_waiters_do_not_poll",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the slow tests (above) ``slow``: ``pytest -m "not slow"`` is the fast subset."""
    for item in items:
        path, _, name = item.nodeid.partition("::")
        if (
            path in SLOW_MODULES
            or path.startswith(SLOW_FOLDERS)
            or f"{path}::{name.partition('[')[0]}" in SLOW_TESTS
        ):
            item.add_marker(pytest.mark.slow)


# -- redis-py connections left open: named at the test that opened them ------------------------

#: Every redis-py asyncio connection made in this session, with the test that made it and where.
_connections: weakref.WeakKeyDictionary[
    redis.asyncio.connection.AbstractConnection, tuple[str, list[traceback.FrameSummary]]
] = weakref.WeakKeyDictionary()
_current_test = ["(no test)"]
_redis_py_init = redis.asyncio.connection.AbstractConnection.__init__


def _tracked_init(self: redis.asyncio.connection.AbstractConnection, *args: Any, **kw: Any) -> None:
    _redis_py_init(self, *args, **kw)
    _connections[self] = (_current_test[0], traceback.extract_stack(limit=16)[:-1])


redis.asyncio.connection.AbstractConnection.__init__ = _tracked_init  # type: ignore[method-assign]


def _left_open() -> list[str]:
    """Connections still connected on an event loop that is closed (no one can close them
    now; they warn 'unclosed Connection' whenever the collector frees them, often at the end
    of the session, naming no test). Each is reported once."""
    found = []
    for connection, (test, stack) in list(_connections.items()):
        writer = getattr(connection, "_writer", None)
        loop = getattr(writer, "_loop", None)
        if writer is not None and loop is not None and loop.is_closed():
            del _connections[connection]
            found.append(
                f"{connection!r}, opened in {test} at:\n{''.join(traceback.format_list(stack))}"
            )
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    """Fail the teardown of a test that leaves a redis-py connection open (its loop closed)."""
    try:
        return (yield)
    finally:
        left = _left_open()
        _current_test[0] = f"(after {item.nodeid})"
        if left:
            raise AssertionError(
                "redis-py connections left open (close every client, pubsub and monitor): "
                + "\n".join(left)
            )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    _current_test[0] = item.nodeid
    return (yield)


@pytest.fixture
def frozen_heap() -> Iterator[None]:
    """For tests that time calls against their bounds: what earlier tests of the session
    left on the heap is collected and frozen out of the collector's scans first, so that a
    full collection of it (seen landing in a measured window, 137 ms long, in a whole-suite
    run) is not timed as the library's. The test's own garbage is collected as usual."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(scope="session")
def redis_server(aiolock_redis_server: RedisServer | ExternalRedis) -> RedisServer | ExternalRedis:
    """One Redis server for the whole session (or the AIOLOCK_TEST_REDIS_URL stand-in)."""
    return aiolock_redis_server


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """One Redis Cluster (3 masters + 3 replicas) for the whole session, started on first use."""
    if find_redis_server_binary() is None:
        pytest.skip("needs a redis-server binary")
    for attempt in range(3):
        # Free ports are picked before they are bound: on a machine busy with other test
        # runs a start can lose a port race (or its wait its time); a new cluster then.
        cluster = LocalCluster()
        try:
            cluster.start()
        except Exception:  # a node that did not start, a wait that timed out
            if attempt == 2:
                raise
            continue
        break
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def healthy_cluster(local_cluster: LocalCluster) -> LocalCluster:
    """The session cluster, healed (what an earlier test killed, paused or left migrating is
    restored) and FLUSHALLed. Roles may differ from the start (failovers)."""
    local_cluster.heal()
    local_cluster.flushall()
    return local_cluster


@pytest.fixture
def cluster_url(healthy_cluster: LocalCluster) -> str:
    """``redis+cluster://`` of a node of the healthy session cluster (for aiolock.from_url)."""
    return "redis+cluster://" + healthy_cluster.url.removeprefix("redis://")


@pytest.fixture
def redis_url(aiolock_redis_url: str) -> str:
    """The session server's URL, emptied first so every test starts on an empty database (and
    brought back first, should an earlier test have paused or killed it)."""
    return aiolock_redis_url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    """An asyncio Redis client on the clean session server, closed at teardown."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def fresh_server() -> Iterator[RedisServer]:
    """A private server that the test may kill, pause or restart; always stopped afterwards."""
    if external_redis_url() is not None:
        pytest.skip("needs its own redis-server (AIOLOCK_TEST_REDIS_URL is set)")
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        if server.is_paused:
            server.resume()
        server.stop()


@pytest.fixture
def proxy(aiolock_proxy: TcpProxy) -> TcpProxy:
    """A started TcpProxy in front of the clean session server; connect through ``proxy.url``."""
    return aiolock_proxy


# --- aiolock fixtures below ---


@pytest.fixture
async def client(redis_client: redis.asyncio.Redis) -> AsyncIterator[aiolock.AioLock]:
    """An aiolock client on the clean session server, closed at teardown."""
    async with aiolock.AioLock(redis_client) as lock_client:
        yield lock_client


@pytest.fixture
async def make_client(redis_url: str) -> AsyncIterator[Callable[..., aiolock.AioLock]]:
    """A factory of further clients (own connection pool each), all closed at teardown."""
    made: list[aiolock.AioLock] = []

    def make(url: str = redis_url, **config: Any) -> aiolock.AioLock:
        made.append(aiolock.from_url(url, **config))
        return made[-1]

    yield make
    for each in made:
        await each.aclose()


WORKER = Path(__file__).with_name("proc_worker.py")


def _worker_env(lock_type: str) -> dict[str, str]:
    return {**os.environ, "AIOLOCK_TEST_LOCK_TYPE": lock_type}


async def run_worker(*args: str, limit: float = 60, lock_type: str = "lock") -> list[str]:
    """Run tests/proc_worker.py in a new process; return its stdout lines (fails on rc != 0)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args, stdout=PIPE, stderr=PIPE, env=_worker_env(lock_type)
    )
    try:
        async with asyncio.timeout(limit):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    return out.decode().split()


class Worker:
    """tests/proc_worker.py in its own process, read line by line; killed at the end."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, *args: str, lock_type: str = "lock") -> Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), *args, stdout=PIPE, env=_worker_env(lock_type)
        )
        return cls(proc)

    async def line(self, within: float = 10) -> str:
        assert self.proc.stdout is not None
        async with asyncio.timeout(within):
            return (await self.proc.stdout.readline()).decode().strip()

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.proc.pid, sig)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        await self.proc.wait()


@pytest.fixture
async def workers() -> AsyncIterator[list[Worker]]:
    """Worker processes started by the test (append them); killed at teardown."""
    started: list[Worker] = []
    yield started
    for worker in started:
        await worker.stop()


@pytest.fixture
async def peers(redis_url: str) -> AsyncIterator[Peers]:
    """Lock users in processes of their own (tests/peers.py: aiolock's, or Redisson's
    scripts), started with ``await peers.start("aiolock" | "redisson", *args)``; closed at
    teardown."""
    group = Peers(redis_url)
    try:
        yield group
    finally:
        await group.aclose()
