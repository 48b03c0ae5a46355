"""A hold's life as one table (issue 18, h11's style): :data:`aiolock.holds.TRANSITIONS` maps
(state, event) to the next state, :func:`aiolock.holds.move` is the only writer of a hold's
state once the record is made, and a pair not in the table raises without changing the hold.

The table holds exactly the transitions the suite performs (traced over the quick suite and
the slow suites of holds, locks, cancellation, watchdog, waiting, multi-locks, semaphores,
permits, fair locks, read-write locks, failovers and restarts): widening it needs a path that
takes the new pair, and a test of that path."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

import aiolock
from aiolock.holds import (
    TRANSITIONS,
    Hold,
    HoldEvent,
    HoldState,
    HoldStateError,
    Owner,
    move,
)

PACKAGE = Path(__file__).resolve().parent.parent / "aiolock"

S, E = HoldState, HoldEvent

#: every transition, and why it happens
EXPECTED = {
    (S.ACQUIRING, E.GRANTED): S.HELD,  # the first grant of a new record
    (S.HELD, E.GRANTED): S.HELD,  # a nested (reentrant) count
    (S.RELEASED, E.GRANTED): S.HELD,  # the next generation on a record kept by its turn
    (S.LOST, E.GRANTED): S.HELD,  # the same after a loss (its cleanup kept the record)
    (S.HELD, E.RELEASING): S.RELEASING,  # the release of the last count starts
    (S.HELD, E.RELEASED): S.RELEASED,  # its owner force-unlocked it; the server said last
    (S.RELEASING, E.RELEASED): S.RELEASED,  # the release was confirmed
    (S.HELD, E.LOST): S.LOST,  # renewal found it gone, lease ran out, task ended, closed
    (S.RELEASING, E.LOST): S.LOST,  # its release failed or could not be confirmed
}


def _hold(state: HoldState) -> Hold:
    hold = Hold("table", Owner("client:1"))
    hold.state = state  # a test may set it; the package may not (see below)
    return hold


def test_the_table_is_the_expected_one() -> None:
    assert TRANSITIONS == EXPECTED


@pytest.mark.parametrize(("state", "event"), list(EXPECTED))
def test_each_legal_transition_moves_the_hold(state: HoldState, event: HoldEvent) -> None:
    hold = _hold(state)
    move(hold, event)
    assert hold.state is EXPECTED[state, event]


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (state, event)
        for state in HoldState
        for event in HoldEvent
        if (state, event) not in EXPECTED
    ],
)
def test_an_illegal_transition_raises_and_changes_nothing(
    state: HoldState, event: HoldEvent
) -> None:
    hold = _hold(state)
    with pytest.raises(HoldStateError) as info:
        move(hold, event)
    assert hold.state is state
    error = info.value
    assert isinstance(error, RuntimeError)
    assert (error.hold, error.hold_state, error.event) == (hold, state, event)
    message = str(error)
    assert "'table'" in message and "client:1" in message
    assert state.name in message and event.name in message


def test_a_new_record_is_acquiring() -> None:
    assert Hold("new", Owner("client:1")).state is HoldState.ACQUIRING


def _state_writes() -> set[tuple[str, str]]:
    """Where the package writes an attribute called ``state``: (module, function)."""
    found: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)

        def visit(node: ast.AST, where: str, module: str = module) -> None:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                where = f"{where}.{node.name}" if where else node.name
            if isinstance(node, ast.Attribute) and node.attr == "state":
                if isinstance(node.ctx, ast.Store | ast.Del):
                    found.add((module, where))
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in {"setattr", "delattr"}
                and any(isinstance(arg, ast.Constant) and arg.value == "state" for arg in node.args)
            ):
                found.add((module, where))
            for child in ast.iter_child_nodes(node):
                visit(child, where)

        visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), "")
    return found


def test_move_is_the_only_writer_of_hold_state() -> None:
    """Besides the record's birth (ACQUIRING), nothing in the package writes a ``state``
    attribute but :func:`move`: every transition goes through the table."""
    assert _state_writes() == {("aiolock.holds", "Hold.__init__"), ("aiolock.holds", "move")}


# -- the callers that used to fire meaningless transitions --


async def test_force_unlock_skips_a_waiter_never_granted(client: aiolock.AioLock) -> None:
    """A force-unlock ends the holds of this client on the lock, not the records of owners
    still waiting for it (ACQUIRING: nothing of them to end); such a waiter goes on and
    takes the lock once it is free."""
    lock = client.lock("states-force-waiter")
    assert await lock.try_lock()
    owner = client.new_owner()
    waiter = asyncio.create_task(lock.try_lock(5, owner=owner))
    runtime = client.unchecked_runtime
    async with asyncio.timeout(5):
        while runtime.leases.get(lock.name, owner) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    waiting = runtime.leases.get(lock.name, owner)
    assert waiting is not None and waiting.state is HoldState.ACQUIRING
    assert await lock.force_unlock()
    assert waiting.lost is None  # not marked lost: it never held anything
    assert await asyncio.wait_for(waiter, 5)
    assert runtime.leases.get(lock.name, owner) is waiting
    assert lock.statistics(owner=owner).held
    await lock.unlock(owner=owner)


async def test_force_unlock_skips_an_explicit_owners_record_never_granted(
    client: aiolock.AioLock,
) -> None:
    """The record of an acquire not granted yet (an explicit owner's: a task's first
    acquire makes none until its grant; here made by hand, as an acquire makes it) is left
    as it is: it is not "released" (a transition from ACQUIRING the table does not have)."""
    lock = client.lock("states-force-own-acquiring")
    runtime = client.unchecked_runtime
    hold = runtime.leases.for_acquire(lock.name, client.new_owner(), "lock")
    assert hold is not None
    assert not await lock.force_unlock()
    assert hold.state is HoldState.ACQUIRING
    assert runtime.holds_of(lock.name) == [hold]
    runtime.leases.forget_if_idle(hold)
    assert runtime.holds_of(lock.name) == []


async def test_a_release_confirmed_after_its_owner_force_unlocked_it_is_no_transition(
    client: aiolock.AioLock,
) -> None:
    """The owner force-unlocks its own hold while the release of its last count is in
    flight (RELEASING -> RELEASED), then that release is confirmed: the hold is over already,
    and the late confirmation is no error (RELEASED -> RELEASED is not in the table; the
    registry does not fire it)."""
    lock = client.lock("states-released-twice")
    assert await lock.try_lock()
    leases = client.unchecked_runtime.leases
    (hold,) = client.holds_of(lock.name)
    leases.releasing(hold)  # the unlock of the last count starts
    assert await lock.force_unlock()  # meanwhile, the owner force-unlocks it
    assert hold.state is HoldState.RELEASED
    assert leases.released(hold) is None  # the unlock's confirmation arrives
    assert hold.state is HoldState.RELEASED
    assert client.holds_of(lock.name) == []
