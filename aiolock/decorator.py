"""A lock around a call: the ``locked`` decorator, lock names made from a call's arguments
(``"order:{order_id}"``), and :class:`Holding`, the hold that the decorator and the FastAPI
dependency (:mod:`aiolock.fastapi`) keep for a call or a request.

Built on the public lock API only (``lock``, ``try_lock``, ``on_lost``, ``async with``): the
lock types know nothing of it. Nothing here imports a web framework.
"""

from __future__ import annotations

import functools
import inspect
import re
import string
from collections.abc import Callable, Coroutine, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, Protocol, TypeVar, get_args

from .errors import LockTimeout
from .guard import Guard
from .keys import check_lease, check_seconds

if TYPE_CHECKING:
    from .lock import Lock
    from .rwlock import ReadWriteLock

P = ParamSpec("P")
T = TypeVar("T")

#: The lock types a decorator or a dependency can hold: the lock, the fair lock, and either
#: side of a read-write lock (of the name). Not the fenced lock (its token would be out of
#: reach) nor the composites (they span clients).
LockKind = Literal["lock", "fair_lock", "read_lock", "write_lock"]
KINDS: tuple[str, ...] = get_args(LockKind)

#: What names the lock of a call: a template, or a function of the call's arguments.
Namer = Callable[[tuple[Any, ...], dict[str, Any]], str]

_FIELD_ROOT = re.compile(r"[.\[]")


def check_kind(kind: object) -> str:
    """``kind`` if it is one of :data:`KINDS`, else ValueError (TypeError if not a str)."""
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, not {type(kind).__name__}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}; got {kind!r}")
    return kind


def check_times(wait_time: float | None, lease_time: float | None) -> None:
    """Refuse a bad ``wait_time`` or ``lease_time`` when the decorator or dependency is made
    (the lock would refuse them at every call)."""
    if wait_time is not None:
        check_seconds(wait_time, "wait_time")
    if lease_time is not None:
        check_lease(lease_time, "lease_time")


class LockMaker(Protocol):
    """What the decorator and the FastAPI dependency need of a client (an
    :class:`~aiolock.AioLock`): its lock factories."""

    def lock(self, name: str) -> Lock: ...

    def fair_lock(self, name: str) -> Lock: ...

    def read_write_lock(self, name: str) -> ReadWriteLock: ...


def make_lock(client: LockMaker, kind: str, name: str) -> Lock:
    """The lock object of ``kind`` called ``name`` (cheap: no Redis call)."""
    if kind == "lock":
        return client.lock(name)
    if kind == "fair_lock":
        return client.fair_lock(name)
    rw = client.read_write_lock(name)
    return rw.read_lock() if kind == "read_lock" else rw.write_lock()


class Template:
    """A lock name with named fields, in :meth:`str.format` syntax: ``"order:{order_id}"``,
    ``"user:{user.id}"``, ``"order:{request.match_info[order_id]}"``. A field names a value
    (a parameter of the decorated function, a path or query parameter of a request), then
    optionally attributes and items of it. Literal braces are doubled: ``"{{tag}}:{id}"``.
    """

    __slots__ = ("fields", "text")

    def __init__(self, text: str) -> None:
        #: the template
        self.text = text
        #: the values it needs, in order of first use (the part of each field before any
        #: ``.attribute`` or ``[item]``)
        self.fields: tuple[str, ...] = tuple(dict.fromkeys(self._roots(text)))

    def _roots(self, text: str) -> list[str]:
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise ValueError(f"lock name template {self.text!r} is malformed: {exc}") from None
        roots: list[str] = []
        for _, field, spec, _ in parsed:
            if field is None:
                continue
            root = _FIELD_ROOT.split(field, maxsplit=1)[0]
            if not root.isidentifier():
                raise ValueError(
                    f"lock name template {self.text!r} has the field {{{field}}}: name a "
                    "parameter in each field (e.g. {order_id}), not a position"
                )
            roots.append(root)
            if spec and "{" in spec:  # a nested field in the format spec: {amount:{width}}
                roots.extend(self._roots(spec))
        return roots

    def __repr__(self) -> str:
        return f"Template({self.text!r})"

    def render(self, values: Mapping[str, Any]) -> str:
        """The name, with every field filled from ``values`` (which has them all)."""
        try:
            return self.text.format_map(values)
        except Exception as exc:  # an attribute or item of a value that is not there
            exc.add_note(f"aiolock: while making the lock name from {self.text!r}")
            raise

    def missing(self, values: Mapping[str, Any]) -> list[str]:
        """The fields that ``values`` has no value for."""
        return [field for field in self.fields if field not in values]


def call_namer(name: str | Callable[..., str], func: Callable[..., Any]) -> Namer:
    """How a call of ``func`` names its lock: ``name`` filled from the call's bound arguments
    (defaults applied), or ``name`` called with the call's own arguments. Raises TypeError
    now if the template names a value ``func`` cannot be given."""
    signature = read_signature(func)
    where = f"{getattr(func, '__qualname__', func)!s}{signature}"
    if callable(name):
        return _callable_namer(name, signature, where)
    if not isinstance(name, str):
        raise TypeError(
            f"the lock name must be a str template or a callable, not {type(name).__name__}"
        )
    template = Template(name)
    params = signature.parameters
    varkw = next((p.name for p in params.values() if p.kind is p.VAR_KEYWORD), None)
    for field in template.fields:
        if field not in params and varkw is None:
            raise TypeError(
                f"lock name template {name!r} names {field!r}, which is not a parameter of {where}"
            )

    def namer(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        values = _bind(signature, args, kwargs, where)
        if varkw is not None and varkw in values:
            values = {**values[varkw], **values}  # its keys, and itself by its name
        missing = template.missing(values)
        if missing:
            raise TypeError(
                f"{where} was called without {', '.join(map(repr, missing))}, which the "
                f"lock name template {name!r} needs"
            )
        return template.render(values)

    return namer


def _callable_namer(name: Callable[..., str], signature: inspect.Signature, where: str) -> Namer:
    def namer(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        _bind(signature, args, kwargs, where)  # a bad call fails as a bad call
        made = name(*args, **kwargs)
        if not isinstance(made, str):
            raise TypeError(
                f"the lock name function of {where} returned {type(made).__name__}, not a str"
            )
        return made

    return namer


def _bind(
    signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any], where: str
) -> dict[str, Any]:
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{where}: {exc}") from None
    bound.apply_defaults()
    return bound.arguments


class Holding:
    """One hold of ``lock`` for a call or a request: ``async with Holding(...) as lock:``.

    Entering takes the lock: waiting as long as it takes (``wait_time`` None) or at most
    ``wait_time`` seconds, then raising :class:`~aiolock.LockTimeout` (and holding nothing).
    With ``lease_time`` the hold expires after it and is never renewed; without it the
    watchdog renews it. Exiting releases it as ``async with lock:`` does (the body's own
    exception wins over a failed release).

    A lost hold (its lease ran out, it was force-unlocked, renewal could not be confirmed,
    the client closed): with ``guard`` the body is cancelled at once, as ``Lock.guard()``
    cancels its body (``finally`` blocks still run), and :class:`~aiolock.LockLostError`
    is raised from the ``async with``; without ``guard`` the body runs on and the exit
    raises LockLostError (if the body raised nothing itself).

    The cancellation is the one every guard makes (:class:`aiolock.guard.Guard`): it tells
    itself apart from any other cancellation of the task as asyncio's own timeouts do, so a
    cancellation from outside still wins; the loss is raised at once, what is left of the
    release going on in the background.
    """

    __slots__ = ("_guard", "_guarding", "_lease", "_wait", "lock")

    def __init__(
        self, lock: Lock, *, wait_time: float | None, lease_time: float | None, guard: bool
    ) -> None:
        self.lock = lock
        self._wait = wait_time
        self._lease = lease_time
        self._guard = guard
        self._guarding: Guard | None = None

    async def __aenter__(self) -> Lock:
        lock = self.lock
        if self._wait is None:
            await lock.lock(self._lease)
        elif not await lock.try_lock(self._wait, self._lease):
            raise LockTimeout(
                f"lock {lock.name!r} not acquired within {self._wait} s", name=lock.name
            )
        if self._guard:
            # Held from here: nothing below suspends before the exit is owed.
            guarding = Guard(
                f"the hold on {lock.name!r}", lock.on_lost, self._release, self._release_lost
            )
            await guarding.__aenter__()  # never suspends unless it fails (it releases then)
            self._guarding = guarding
        return lock

    async def _release(self, exc: BaseException | None) -> None:
        await self.lock.__aexit__(type(exc) if exc is not None else None, exc, None)

    async def _release_lost(self) -> None:
        self.lock.release_lost()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        guarding, self._guarding = self._guarding, None
        if guarding is not None:
            await guarding.__aexit__(exc_type, exc, tb)
        else:
            await self.lock.__aexit__(exc_type, exc, tb)


def locked(
    client_of: Callable[[], LockMaker],
    name: str | Callable[..., str],
    *,
    wait_time: float | None,
    lease_time: float | None,
    kind: str,
    guard: bool,
) -> Callable[[Callable[P, Coroutine[Any, Any, T]]], Callable[P, Coroutine[Any, Any, T]]]:
    """The decorator of :meth:`AioLock.locked` and :func:`aiolock.locked`; ``client_of()``
    gives the client at each call."""
    check_times(wait_time, lease_time)
    check_kind(kind)
    if not (isinstance(name, str) or callable(name)):
        raise TypeError(
            f"the lock name must be a str template or a callable, not {type(name).__name__}"
        )

    def decorate(func: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
        if not inspect.iscoroutinefunction(func):
            what = (
                "an async generator function"
                if inspect.isasyncgenfunction(func)
                else (f"{type(func).__name__} {getattr(func, '__qualname__', func)!s}")
            )
            raise TypeError(
                f"locked() decorates coroutine functions (async def), not {what}; hold a "
                "lock in other code with 'async with client.lock(name):'"
            )
        namer = call_namer(name, func)

        @functools.wraps(func)
        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            lock = make_lock(client_of(), kind, namer(args, kwargs))
            async with Holding(lock, wait_time=wait_time, lease_time=lease_time, guard=guard):
                return await func(*args, **kwargs)

        _keep_signature(call, func)
        return call

    return decorate


def read_signature(func: Callable[..., Any]) -> inspect.Signature:
    """The signature of ``func``, its annotations evaluated where ``func`` was defined if
    they can be already (a forward reference to a name defined later cannot)."""
    try:
        return inspect.signature(func, eval_str=True)
    except Exception:  # a name not defined yet: left as written
        return inspect.signature(func)


def _keep_signature(wrapper: Callable[..., Any], func: Callable[..., Any]) -> None:
    """Give ``wrapper`` the signature of ``func`` with its annotations evaluated. Readers of
    a handler's parameters that evaluate string annotations (``from __future__ import
    annotations``) in the wrapper's globals, this module's, instead of following
    ``__wrapped__`` (FastAPI follows it), then find the names. Left to ``__wrapped__`` when
    they cannot be evaluated yet (a forward reference)."""
    signature = read_signature(func)
    wrapper.__signature__ = signature  # type: ignore[attr-defined]
