"""The transport's pluggable "where is the master" step, without Sentinel: a resolver that
the test points at a replica, then at the master (real servers, a real replica answering
READONLY). What Sentinel adds on top is tested in tests/test_sentinel.py."""

from __future__ import annotations

import asyncio

import pytest

from aiolock import Config
from aiolock.testing import RedisServer
from aiolock.transport import (
    LinkIdentity,
    NotSent,
    OutcomeUnknown,
    ServerSettings,
    StandaloneTransport,
    is_readonly,
    pack,
)
from aiolock.transport.resolve import Resolver
from tests.test_replica_acks import pair, servers  # noqa: F401  (fixtures)


class Pointed(Resolver):
    """A resolver whose master the test sets."""

    def __init__(self, server: RedisServer, *, moves: bool) -> None:
        self.server = server
        self.moves = moves

    @property
    def what(self) -> str:
        return "the test's master"

    async def resolve(self, settings: ServerSettings, deadline: float) -> ServerSettings:
        return settings.at(*self.server.address)


async def test_a_readonly_reply_retires_the_link_and_the_next_send_finds_the_master(
    servers: tuple[RedisServer, RedisServer],  # noqa: F811
) -> None:
    master, replica = servers
    resolver = Pointed(replica, moves=False)  # no ROLE check: the link reaches the replica
    transport = StandaloneTransport(ServerSettings(), Config(), resolver=resolver)
    try:
        call = await transport.send(pack(("SET", "moved", "1")), key="moved")
        assert is_readonly(await call.future)  # it wrote nothing
        assert transport.send_now(pack(("PING",)), key=None) is None  # retired
        resolver.server = master
        call = await transport.send(pack(("SET", "moved", "1")), key="moved")
        assert await call.future == b"OK"
        assert transport.statistics().links_opened == 2
    finally:
        await transport.aclose()


async def test_a_moving_master_is_checked_with_role_and_old_links_count_as_fenced(
    servers: tuple[RedisServer, RedisServer],  # noqa: F811
) -> None:
    master, replica = servers
    resolver = Pointed(replica, moves=True)
    transport = StandaloneTransport(ServerSettings(), Config(command_timeout=1), resolver=resolver)
    try:
        with pytest.raises(NotSent, match="not a master"):
            await transport.send(pack(("PING",)), key=None)
        resolver.server = master
        for _ in range(200):  # the connector backs off after the refusal: try until it is past
            try:
                call = await transport.send(pack(("PING",)), key=None)
                break
            except NotSent:
                await asyncio.sleep(0.05)
        assert await call.future == b"PONG"
        # A link dropped on another server (the old master) can run nothing on the master.
        gone = OutcomeUnknown("lost", LinkIdentity(f"{replica.host}:{replica.port}", 7, None))
        assert await transport.fence(gone, None)
        # One dropped on the master itself is fenced there, with CLIENT KILL.
        here = OutcomeUnknown("lost", LinkIdentity(f"{master.host}:{master.port}", 10**9, None))
        assert await transport.fence(here, None)
        assert transport.statistics().fences == 2
    finally:
        await transport.aclose()
