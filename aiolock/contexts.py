"""``async with`` blocks that say so when they are used with ``with``.

:func:`async_only` is :func:`contextlib.asynccontextmanager` whose context managers raise a
TypeError naming the fix on ``with`` (Python's own message names only an internal class),
as ``with lock:`` does.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Generic, NoReturn, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class AsyncOnly(AbstractAsyncContextManager[T], Generic[T]):
    """An async context manager that refuses ``with``."""

    __slots__ = ("_manager", "_what")

    def __init__(self, manager: AbstractAsyncContextManager[T], what: str) -> None:
        self._manager = manager
        self._what = what

    async def __aenter__(self) -> T:
        return await self._manager.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._manager.__aexit__(exc_type, exc, tb)

    def __enter__(self) -> NoReturn:
        raise TypeError(f"use 'async with {self._what}(...)', not 'with'")

    def __exit__(self, *args: object) -> None:  # pragma: no cover - __enter__ always raises
        pass


def async_only(
    func: Callable[P, AsyncIterator[T]],
) -> Callable[P, AbstractAsyncContextManager[T]]:
    """:func:`contextlib.asynccontextmanager`, refusing ``with`` with a message."""
    made = asynccontextmanager(func)
    what = func.__name__

    @functools.wraps(func)
    def manager(*args: P.args, **kwargs: P.kwargs) -> AbstractAsyncContextManager[T]:
        return AsyncOnly(made(*args, **kwargs), what)

    return manager
