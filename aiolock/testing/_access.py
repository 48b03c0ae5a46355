"""Servers that say no: a restricted ACL user (:func:`acl_user`), a server at ``maxclients``
(:func:`exhaust_connections`)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from urllib.parse import quote, urlsplit, urlunsplit

import redis

_MAXCLIENTS_ERROR = b"max number of clients reached"


@contextlib.contextmanager
def acl_user(url: str, username: str, *rules: str, password: str = "aiolock-test") -> Iterator[str]:
    """Create an ACL user for the ``with`` block; yield a Redis URL that logs in as it.

    The user starts from ``reset resetchannels`` (no commands, keys or channels, on Redis 6.2
    too), is switched on with ``password``, then gets ``rules`` in ``ACL SETUSER`` syntax.
    For example::

        # Every command and key, but no pub/sub channel: SUBSCRIBE and PUBLISH are refused.
        with acl_user(server.url, "no-channels", "~*", "+@all") as url:
            ...
        # Only keys under app:* (and every channel): a lock on "orders" gets NOPERM.
        with acl_user(server.url, "app-only", "~app:*", "&*", "+@all") as url:
            ...
        # Everything but EVALSHA.
        with acl_user(server.url, "no-evalsha", "~*", "&*", "+@all", "-evalsha") as url:
            ...

    At exit the user is deleted (``ACL DELUSER``), which disconnects its clients. Needs Redis
    >= 6.2 (channel rules); ``url`` must be allowed to run ``ACL`` (the default user is).
    """
    if not username or any(char.isspace() for char in username):
        raise ValueError(f"bad ACL user name {username!r}")
    with redis.Redis.from_url(url, socket_timeout=10) as admin:
        # "resetchannels" too: on Redis 6.2 "reset" grants every channel (acl-pubsub-default).
        admin.execute_command(
            "ACL", "SETUSER", username, "reset", "resetchannels", "on", f">{password}", *rules
        )
        try:
            parts = urlsplit(url)
            netloc = f"{quote(username, safe='')}:{quote(password, safe='')}@"
            netloc += parts.netloc.rpartition("@")[2]
            yield urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
        finally:
            with contextlib.suppress(redis.RedisError):
                admin.execute_command("ACL", "DELUSER", username)


@contextlib.contextmanager
def exhaust_connections(url: str, *, limit: int = 1000, timeout: float = 5.0) -> Iterator[int]:
    """Hold the server at ``maxclients`` for the ``with`` block; yield how many were opened.

    Opens plain TCP connections (each checked with a ``PING``) until the server refuses one
    with "max number of clients reached", and keeps them open; any further client is refused
    the same way (redis-py raises ``redis.ConnectionError``). At exit they are closed, and the
    server is given (up to ``timeout``) to notice: it accepts a new client when this returns.
    Start the server with a small limit::

        with RedisServer(["--maxclients", "4"]) as server, exhaust_connections(server.url):
            ...  # connecting now fails

    Raises:
        RuntimeError: the server took ``limit`` connections without refusing one.
        TimeoutError: at exit, the server still refused clients after ``timeout``.
    """
    parts = urlsplit(url)
    address = (parts.hostname or "localhost", parts.port or 6379)
    held: list[socket.socket] = []
    try:
        while True:
            if len(held) >= limit:
                raise RuntimeError(
                    f"{address[0]}:{address[1]} accepted {limit} connections without reaching "
                    "maxclients; start the server with a small --maxclients"
                )
            sock = socket.create_connection(address, timeout=timeout)
            if _accepted(sock):
                held.append(sock)
            else:
                sock.close()
                break
        yield len(held)
    finally:
        for sock in held:
            sock.close()
    if held:  # the server frees the slots when it notices the closes, on its next loop turn
        _wait_accepting(address, timeout)


def _wait_accepting(address: tuple[str, int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with socket.create_connection(address, timeout=timeout) as sock:
            if _accepted(sock):
                return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{address[0]}:{address[1]} still refuses clients")
        time.sleep(0.01)


def _accepted(sock: socket.socket) -> bool:
    """PING a fresh connection: any reply but the maxclients error means it was accepted
    (``-NOAUTH`` too). The server closes a refused connection after its error, so a reset or
    EOF before a reply is a refusal as well."""
    try:
        sock.sendall(b"PING\r\n")
        reply = b""
        while b"\r\n" not in reply:
            chunk = sock.recv(256)
            if not chunk:
                return False
            reply += chunk
    except (ConnectionResetError, BrokenPipeError):
        return False
    return _MAXCLIENTS_ERROR not in reply
