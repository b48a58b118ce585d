"""The owner's probation desk: one request sent again after a Triton death at a time, endpoint-wide."""

from __future__ import annotations

import asyncio

from smtriton.serve.owner.probation import ProbationDesk


def test_one_request_at_a_time_and_the_next_goes_when_the_first_is_over():
    async def scenario() -> None:
        desk = ProbationDesk()
        first = await desk.grant()
        second = asyncio.ensure_future(desk.grant())
        await asyncio.sleep(0.05)
        assert not second.done()  # the first still runs on probation
        desk.release(first)
        assert await asyncio.wait_for(second, 1) != first
        desk.release(first)  # a stale token changes nothing
        third = asyncio.ensure_future(desk.grant())
        await asyncio.sleep(0.05)
        assert not third.done()
        desk.release(second.result())
        await asyncio.wait_for(third, 1)

    asyncio.run(scenario())


def test_a_grant_lapses_so_a_worker_that_died_holding_it_stops_nobody():
    async def scenario() -> None:
        desk = ProbationDesk(lease_s=0.1)
        lost = await desk.grant()  # its worker never says it is over
        after = await asyncio.wait_for(desk.grant(), 2)
        desk.release(lost)  # too late: it lapsed, the new holder keeps its turn
        waiting = asyncio.ensure_future(desk.grant())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        desk.release(after)
        await asyncio.wait_for(waiting, 1)

    asyncio.run(scenario())
