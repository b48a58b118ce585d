"""The owner's probation desk: one request sent again after a Triton death at a time, endpoint-wide; a
turn that no longer waits, or whose worker died, holds nobody up."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from smtriton.serve.owner.probation import ProbationDesk


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 10))


async def _pending(future: asyncio.Future[bool]) -> bool:
    """Whether ``future`` is still undecided once the loop has run what was ready."""
    await asyncio.sleep(0.05)
    return not future.done()


def test_one_turn_at_a_time_in_the_order_asked_and_the_next_goes_when_the_first_is_over():
    async def scenario() -> None:
        desk = ProbationDesk()
        first = desk.grant((1, 1))
        assert first.result() is True  # nobody on probation: at once
        second, third = desk.grant((2, 1)), desk.grant((1, 2))
        assert await _pending(second)  # the first still runs on probation
        desk.release((1, 1))
        assert await asyncio.wait_for(second, 1)
        assert await _pending(third)
        desk.release((1, 1))  # a turn already over changes nothing
        assert await _pending(third)
        desk.release((2, 1))
        assert await asyncio.wait_for(third, 1)

    run(scenario)


def test_a_turn_given_back_while_it_waits_leaves_the_line_at_once():
    """Its client left (or its timeout passed): the turn behind it goes as soon as the running one is
    over, not after the lease of a turn nobody waits for."""

    async def scenario() -> None:
        desk = ProbationDesk()
        desk.grant((1, 1))
        left, next_one = desk.grant((1, 2)), desk.grant((2, 1))
        desk.release((1, 2))
        assert left.result() is False  # given back before it came
        assert desk.waiting == 1
        desk.release((1, 1))
        assert next_one.result() is True

    run(scenario)


def test_a_turn_given_back_right_behind_its_request_is_not_left_in_line():
    """The notice that gives a turn back may come in the same read as the call that asked for it: the
    turn is in line as soon as it is asked for, so the notice finds it."""

    async def scenario() -> None:
        desk = ProbationDesk()
        desk.grant((1, 1))
        asked = desk.grant((2, 1))
        desk.release((2, 1))
        desk.release((1, 1))
        assert asked.result() is False
        assert desk.grant((3, 1)).result()  # nobody holds the turn

    run(scenario)


def test_the_turns_of_a_worker_that_died_go_back_with_it():
    """Running or waiting, none outlives its worker; the other workers' turns go in their order."""

    async def scenario() -> None:
        desk = ProbationDesk()
        desk.grant((7, 1))  # worker 7 runs on probation
        waiting_of_the_dead = desk.grant((7, 2))
        other = desk.grant((8, 1))
        desk.forget(7)
        assert waiting_of_the_dead.result() is False
        assert other.result() is True
        desk.forget(7)  # nothing left of it
        assert await _pending(desk.grant((8, 2)))

    run(scenario)


def test_a_cancelled_wait_leaves_the_line():
    """The owner's end of a channel closed under a wait: the turn is not granted to nobody later."""

    async def scenario() -> None:
        desk = ProbationDesk()
        desk.grant((1, 1))
        cancelled, after = desk.grant((2, 1)), desk.grant((3, 1))
        cancelled.cancel()
        await asyncio.sleep(0)
        assert desk.waiting == 1
        desk.release((1, 1))
        assert after.result() is True

    run(scenario)


def test_a_turn_lapses_so_one_whose_end_was_never_told_stops_nobody_for_long():
    async def scenario() -> None:
        desk = ProbationDesk(lease_s=0.1)
        desk.grant((1, 1))  # never said to be over
        after = desk.grant((2, 1))
        assert await asyncio.wait_for(after, 2)
        desk.release((1, 1))  # too late: it lapsed, the new holder keeps its turn
        waiting = desk.grant((3, 1))
        assert await _pending(waiting)
        desk.release((2, 1))
        assert await asyncio.wait_for(waiting, 1)

    run(scenario)
