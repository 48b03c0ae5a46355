"""How to reach one Redis server, taken from a ``redis.asyncio.Redis`` through public API.

The caller's client only lends its settings (its pool's ``connection_class`` and
``connection_kwargs``): address or unix socket, TLS, username and password or credential
provider, database, client name. aiolock opens its own connections with them and never
reads redis-py's private state.
"""

from __future__ import annotations

import errno
import os
import ssl
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.credentials import CredentialProvider

_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Everything needed to open and set up a connection to one server."""

    host: str | None = "localhost"
    port: int = 6379
    #: a unix socket path (then host and port are unused)
    path: str | None = None
    ssl_context: ssl.SSLContext | None = None
    username: str | None = None
    password: str | None = None
    credential_provider: CredentialProvider | None = None
    db: int = 0
    client_name: str | None = None

    @property
    def address(self) -> str:
        """``host:port`` or the socket path, for messages."""
        return self.path if self.path is not None else f"{self.host}:{self.port}"

    def at(self, host: str, port: int) -> ServerSettings:
        """The same settings for another server (a cluster node, a promoted replica)."""
        return ServerSettings(
            host,
            port,
            None,
            self.ssl_context,
            self.username,
            self.password,
            self.credential_provider,
            self.db,
            self.client_name,
        )

    async def credentials(self) -> tuple[str, ...]:
        """The AUTH arguments: (), (password,) or (username, password)."""
        if self.credential_provider is not None:
            return tuple(await self.credential_provider.get_credentials_async())
        if self.password is None:
            return ()
        if self.username:
            return (self.username, self.password)
        return (self.password,)

    @classmethod
    def from_redis(cls, redis: Redis) -> ServerSettings:
        """The settings of ``redis``'s connection pool."""
        pool = redis.connection_pool
        return cls.from_kwargs(pool.connection_class, pool.connection_kwargs)

    @classmethod
    def from_kwargs(cls, connection_class: type[Any], kwargs: dict[str, Any]) -> ServerSettings:
        common: dict[str, Any] = {
            "username": kwargs.get("username"),
            "password": kwargs.get("password"),
            "credential_provider": kwargs.get("credential_provider"),
            "db": int(kwargs.get("db") or 0),
            "client_name": kwargs.get("client_name"),
        }
        if issubclass(connection_class, UnixDomainSocketConnection):
            return cls(host=None, path=str(kwargs["path"]), **common)
        if not issubclass(connection_class, Connection):
            raise TypeError(
                f"aiolock cannot open connections of {connection_class.__name__}; "
                "use a redis.asyncio.Redis on a host/port, a unix socket or TLS"
            )
        context = _ssl_context(kwargs) if issubclass(connection_class, SSLConnection) else None
        return cls(
            host=str(kwargs.get("host", "localhost")),
            port=int(kwargs.get("port", 6379)),
            ssl_context=context,
            **common,
        )


def _cert_reqs(value: object) -> ssl.VerifyMode:
    """redis-py's ``ssl_cert_reqs``: a VerifyMode, ``"none"``/``"optional"``/``"required"``,
    or None (none)."""
    if value is None:
        return ssl.CERT_NONE
    if isinstance(value, str):
        try:
            return _CERT_REQS[value.lower()]
        except KeyError:
            raise ValueError(
                f"ssl_cert_reqs must be 'none', 'optional' or 'required', not {value!r}"
            ) from None
    if isinstance(value, int):
        return ssl.VerifyMode(value)
    raise TypeError(f"ssl_cert_reqs must be a str or an ssl.VerifyMode, not {value!r}")


def _ssl_context(kwargs: dict[str, Any]) -> ssl.SSLContext:
    """An SSLContext from redis-py's ``ssl_*`` connection arguments, with its defaults
    (certificate required, host name checked) and its rule: no host name check when no
    certificate is asked for (``ssl_cert_reqs="none"``)."""
    context = ssl.create_default_context()
    reqs = _cert_reqs(kwargs.get("ssl_cert_reqs", "required"))
    context.check_hostname = bool(kwargs.get("ssl_check_hostname", True)) and (
        reqs != ssl.CERT_NONE
    )
    context.verify_mode = reqs
    for flag in kwargs.get("ssl_include_verify_flags") or ():
        context.verify_flags |= flag
    for flag in kwargs.get("ssl_exclude_verify_flags") or ():
        context.verify_flags &= ~flag
    if kwargs.get("ssl_certfile"):
        _check_files(kwargs, "ssl_certfile", "ssl_keyfile")
        context.load_cert_chain(
            certfile=kwargs["ssl_certfile"],
            keyfile=kwargs.get("ssl_keyfile"),
            password=kwargs.get("ssl_password"),
        )
    if kwargs.get("ssl_ca_certs") or kwargs.get("ssl_ca_data") or kwargs.get("ssl_ca_path"):
        _check_files(kwargs, "ssl_ca_certs", "ssl_ca_path")
        context.load_verify_locations(
            cafile=kwargs.get("ssl_ca_certs"),
            capath=kwargs.get("ssl_ca_path"),
            cadata=kwargs.get("ssl_ca_data"),
        )
    if kwargs.get("ssl_min_version") is not None:
        context.minimum_version = kwargs["ssl_min_version"]
    if kwargs.get("ssl_ciphers") is not None:
        context.set_ciphers(kwargs["ssl_ciphers"])
    return context


def _check_files(kwargs: dict[str, Any], *names: str) -> None:
    """A missing certificate file raises FileNotFoundError naming the option and the path
    (the ssl module's own says only "No such file or directory")."""
    for name in names:
        path = kwargs.get(name)
        if path and not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, f"{name}: no such file or directory", path)
