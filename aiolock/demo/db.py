"""The database the lua strategy's orders end up in: one table, each order stored once.

SQLite (stdlib ``sqlite3``, run in a thread) for a file path or ``sqlite:///path``;
PostgreSQL (asyncpg) for ``postgresql://`` / ``postgres://`` URLs. ``order_id`` is the primary
key and ``user_id`` is UNIQUE. Inserting an order that is already there does nothing (a stream
entry delivered twice makes no second row), while a second order for the same user violates
the UNIQUE constraint and fails loudly.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from ..extras import install_hint
from .errors import DemoError

T = TypeVar("T")

_TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]*")


@dataclass(frozen=True, slots=True)
class Order:
    order_id: str
    user_id: int


class OrderStore(Protocol):
    """A table of orders."""

    description: str
    """Which database, for people (no credentials)."""
    table: str

    async def insert(self, orders: Sequence[Order]) -> int:
        """Store the orders not stored yet, in one transaction; returns how many were new."""
        ...

    async def counts(self) -> tuple[int, int]:
        """(rows, distinct users) in the table."""
        ...


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def sqlite_path(url: str) -> str:
    """``sqlite:///relative.db``, ``sqlite:////absolute.db`` or a plain path -> the path."""
    return url.removeprefix("sqlite:///")


@contextmanager
def temporary_sqlite() -> Iterator[str]:
    """The path of a SQLite file in a new temporary directory, removed on exit."""
    with tempfile.TemporaryDirectory(prefix="aiolock-demo-") as directory:
        yield str(Path(directory) / "orders.db")


@asynccontextmanager
async def open_store(url: str, table: str) -> AsyncIterator[OrderStore]:
    """Create ``table`` in the database at ``url``; drop it and disconnect on exit."""
    if not _TABLE_NAME.fullmatch(table):
        raise ValueError(f"not a plain SQL table name: {table!r}")
    store: SqliteStore | PostgresStore
    try:
        if is_postgres(url):
            store = await PostgresStore.connect(url, table)
        else:
            store = await SqliteStore.connect(sqlite_path(url), table)
    except DemoError:
        raise
    except Exception as exc:  # unreachable server, bad URL, no such database...
        raise DemoError(f"cannot open the orders database: {exc!r}") from exc
    try:
        yield store
    finally:
        await store.drop_and_close()


class SqliteStore:
    """Orders in a SQLite file; one connection, used by one thread at a time."""

    def __init__(self, conn: sqlite3.Connection, table: str, path: str) -> None:
        self._conn = conn
        self.table = table
        self._lock = asyncio.Lock()
        self.description = f"SQLite {path}"

    @classmethod
    async def connect(cls, path: str, table: str) -> SqliteStore:
        conn = await asyncio.to_thread(sqlite3.connect, path, check_same_thread=False)
        store = cls(conn, table, path)
        try:
            await store._run(
                conn.execute,
                f"CREATE TABLE {table}"
                " (order_id TEXT PRIMARY KEY, user_id INTEGER NOT NULL UNIQUE)",
            )
        except BaseException:
            await asyncio.to_thread(conn.close)
            raise
        return store

    async def _run(self, call: Callable[..., T], *args: Any) -> T:
        async with self._lock:
            return await asyncio.to_thread(call, *args)

    def _insert(self, rows: list[tuple[str, int]]) -> int:
        with self._conn:  # one transaction: commit, or roll back on error
            cursor = self._conn.executemany(
                f"INSERT INTO {self.table} (order_id, user_id) VALUES (?, ?)"
                " ON CONFLICT (order_id) DO NOTHING",
                rows,
            )
            return cursor.rowcount

    async def insert(self, orders: Sequence[Order]) -> int:
        return await self._run(self._insert, [(o.order_id, o.user_id) for o in orders])

    def _counts(self) -> tuple[int, int]:
        row = self._conn.execute(
            f"SELECT count(*), count(DISTINCT user_id) FROM {self.table}"
        ).fetchone()
        return int(row[0]), int(row[1])

    async def counts(self) -> tuple[int, int]:
        return await self._run(self._counts)

    def _drop_and_close(self) -> None:
        try:
            with self._conn:
                self._conn.execute(f"DROP TABLE IF EXISTS {self.table}")
        finally:
            self._conn.close()

    async def drop_and_close(self) -> None:
        await self._run(self._drop_and_close)


class PostgresStore:
    """Orders in a PostgreSQL table, through a small asyncpg pool."""

    def __init__(self, pool: Any, table: str, url: str) -> None:
        self._pool = pool
        self.table = table
        parts = urlsplit(url)  # no credentials in what is printed
        self.description = f"PostgreSQL {parts.hostname}:{parts.port or 5432}{parts.path}"

    @classmethod
    async def connect(cls, url: str, table: str) -> PostgresStore:
        try:
            import asyncpg
        except ImportError as exc:
            raise DemoError(
                f"a PostgreSQL orders database needs asyncpg ({exc}): {install_hint('postgres')}"
            ) from exc

        pool = await asyncpg.create_pool(url, min_size=1, max_size=4)
        try:
            await pool.execute(
                f"CREATE TABLE {table} (order_id text PRIMARY KEY, user_id bigint NOT NULL UNIQUE)"
            )
        except BaseException:
            await pool.close()
            raise
        return cls(pool, table, url)

    async def insert(self, orders: Sequence[Order]) -> int:
        status: str = await self._pool.execute(
            f"INSERT INTO {self.table} (order_id, user_id)"
            " SELECT * FROM unnest($1::text[], $2::bigint[])"
            " ON CONFLICT (order_id) DO NOTHING",
            [o.order_id for o in orders],
            [o.user_id for o in orders],
        )
        return int(status.rsplit(" ", 1)[-1])  # "INSERT 0 <rows>"

    async def counts(self) -> tuple[int, int]:
        row = await self._pool.fetchrow(
            f"SELECT count(*), count(DISTINCT user_id) FROM {self.table}"
        )
        return int(row[0]), int(row[1])

    async def drop_and_close(self) -> None:
        try:
            await self._pool.execute(f"DROP TABLE IF EXISTS {self.table}")
        finally:
            await self._pool.close()
