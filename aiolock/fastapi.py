"""The FastAPI dependency that holds a lock for a request (:meth:`AioLock.lock_dependency`,
:func:`aiolock.lock_dependency`).

FastAPI is imported when a dependency is made, not when aiolock is: it stays an optional
dependency. No ``from __future__ import annotations`` here: FastAPI reads the annotation of
the dependency's ``request`` parameter, and must find the class itself.
"""

import math
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from .decorator import Holding, LockMaker, Template, check_kind, check_times, make_lock
from .errors import LockTimeout
from .keys import check_name, check_seconds

if TYPE_CHECKING:
    from starlette.requests import Request

    from .lock import Lock

#: what a client whose lock is busy is told, unless ``detail`` says otherwise
BUSY = "busy: another request holds the lock; try again"


def lock_dependency(
    client_of: "Callable[[], LockMaker]",
    name: "str | Callable[[Request], str]",
    *,
    wait_time: float | None,
    lease_time: float | None,
    kind: str,
    guard: bool,
    status_code: int,
    detail: Any,
    retry_after: float | None,
) -> "Callable[[Request], AsyncIterator[Lock]]":
    """The dependency of :meth:`AioLock.lock_dependency`; ``client_of()`` gives the client
    at each request."""
    try:
        from fastapi import HTTPException, Request
    except ImportError as exc:
        raise ImportError(
            f"lock_dependency() makes a FastAPI dependency, and FastAPI is not installed: "
            f"pip install fastapi ({exc})"
        ) from exc
    check_times(wait_time, lease_time)
    check_kind(kind)
    if isinstance(status_code, bool) or not isinstance(status_code, int):
        raise TypeError(f"status_code must be an int, not {type(status_code).__name__}")
    if not 400 <= status_code <= 599:
        raise ValueError(f"status_code must be an HTTP error status (4xx, 5xx), not {status_code}")
    headers = None
    if retry_after is not None:
        check_seconds(retry_after, "retry_after")
        headers = {"Retry-After": str(math.ceil(retry_after))}
    if detail is None:
        detail = BUSY
    namer = request_namer(name)

    async def hold_lock(request: Request) -> AsyncIterator["Lock"]:
        lock_name = namer(request)
        try:
            check_name(lock_name)
        except ValueError as exc:  # made from the request's values: the request's fault
            why = f"this request names no usable lock name: {exc}"
            raise HTTPException(422, detail=why) from exc
        lock = make_lock(client_of(), kind, lock_name)
        async with AsyncExitStack() as stack:
            holding = Holding(lock, wait_time=wait_time, lease_time=lease_time, guard=guard)
            try:
                await stack.enter_async_context(holding)
            except LockTimeout as exc:
                raise HTTPException(status_code, detail=detail, headers=headers) from exc
            yield lock

    hold_lock.__qualname__ = hold_lock.__name__ = f"hold_lock[{_describe(name)}]"
    return hold_lock


def request_namer(name: "str | Callable[[Request], str]") -> "Callable[[Request], str]":
    """How a request names its lock: ``name`` filled from the request's path parameters,
    then its query parameters; or ``name(request)``."""
    if callable(name):
        return _called(name)
    if not isinstance(name, str):
        raise TypeError(
            f"the lock name must be a str template or a callable, not {type(name).__name__}"
        )
    template = Template(name)

    def namer(request: "Request") -> str:
        values: Mapping[str, Any] = {**request.query_params, **request.path_params}
        missing = template.missing(values)
        if missing:
            from fastapi import HTTPException

            raise HTTPException(
                422,
                detail=(
                    f"the lock name template {name!r} needs "
                    f"{', '.join(map(repr, missing))}: neither a path parameter of this "
                    "route nor a query parameter of this request"
                ),
            )
        return template.render(values)

    return namer


def _called(name: "Callable[[Request], str]") -> "Callable[[Request], str]":
    def namer(request: "Request") -> str:
        made = name(request)
        if not isinstance(made, str):
            raise TypeError(f"the lock name function returned {type(made).__name__}, not a str")
        return made

    return namer


def _describe(name: object) -> str:
    return name if isinstance(name, str) else getattr(name, "__qualname__", "callable")
