"""``redis+sentinel://`` URLs: a Sentinel-managed master client made with redis-py.

::

    redis+sentinel://[[username]:password@]host[:port][,host[:port]...]/service[/db][?query]

* ``host:port`` pairs are the Sentinels (port 26379 by default);
* ``service`` is the name the Sentinels monitor the master under (``sentinel monitor <name>``);
* ``db`` is the database number on the master (0 by default);
* ``username``/``password`` are the master's (its ``requirepass`` or ACL user);
* query: ``sentinel_username``, ``sentinel_password`` (the Sentinels' own ``requirepass``),
  ``sentinel_timeout`` (seconds, each Sentinel query; default ``command_timeout``);
* ``rediss+sentinel://`` speaks TLS to the master (``redis_options`` take the ``ssl_*``
  arguments).

The Sentinel itself and the discovery of the master are redis-py's
(``redis.asyncio.sentinel.Sentinel(...).master_for(service)``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.sentinel import Sentinel

SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_PORT = 26379


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SCHEMES


def master_from_url(
    url: str, *, timeout: float, redis_options: dict[str, Any] | None = None
) -> tuple[Redis, Sentinel]:
    """The master client of a ``redis+sentinel://`` URL, and its Sentinel (both to be
    closed by the caller). Raises ValueError for a malformed URL."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(f"not a Sentinel URL (expected {' or '.join(SCHEMES)}): {url!r}")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username = password = None
    if userinfo:
        name, colon, secret = userinfo.partition(":")
        username = unquote(name) or None
        password = unquote(secret) if colon else None
    sentinels: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, colon, port = item.rpartition(":")
        if not colon or host.endswith(":"):  # no port (or an IPv6 address without [])
            host, port = item, ""
        host = host.strip("[]")
        if not host:
            raise ValueError(f"a Sentinel URL needs host[:port] of each Sentinel: {url!r}")
        try:
            sentinels.append((host, int(port) if port else DEFAULT_PORT))
        except ValueError:
            raise ValueError(f"bad Sentinel port {port!r} in {url!r}") from None
    path = [unquote(piece) for piece in parts.path.split("/") if piece]
    if not path or len(path) > 2:
        raise ValueError(f"a Sentinel URL names the service: .../<service>[/<db>]: {url!r}")
    service = path[0]
    try:
        db = int(path[1]) if len(path) == 2 else 0
    except ValueError:
        raise ValueError(f"bad database number {path[1]!r} in {url!r}") from None
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    unknown = set(query) - {"sentinel_username", "sentinel_password", "sentinel_timeout"}
    if unknown:
        raise ValueError(f"unknown Sentinel URL parameters {sorted(unknown)} in {url!r}")
    sentinel_timeout = float(query.get("sentinel_timeout", timeout))
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": sentinel_timeout,
        "socket_connect_timeout": sentinel_timeout,
    }
    if "sentinel_username" in query:
        sentinel_kwargs["username"] = query["sentinel_username"]
    if "sentinel_password" in query:
        sentinel_kwargs["password"] = query["sentinel_password"]
    options: dict[str, Any] = {"db": db, **(redis_options or {})}
    if username is not None:
        options.setdefault("username", username)
    if password is not None:
        options.setdefault("password", password)
    if scheme == "rediss+sentinel":
        options["ssl"] = True
    sentinel = Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    return sentinel.master_for(service, **options), sentinel
