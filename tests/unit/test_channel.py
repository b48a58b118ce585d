"""The channel between serve's main process and a front worker, over a real socketpair."""

from __future__ import annotations

import asyncio
import socket

import pytest

from smtriton.serve.channel import STARTING, Channel, ChannelClosed, EndpointState
from smtriton.serve.errors import Conflict, ModelNotFound, ServeError


async def _pair(left_handler, right_handler) -> tuple[Channel, Channel, list[asyncio.Task[None]]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    left = await Channel.open(a, left_handler)
    right = await Channel.open(b, right_handler)
    return left, right, [asyncio.create_task(left.run()), asyncio.create_task(right.run())]


def _unused(op, message):
    raise AssertionError(f"unexpected {op}")


def test_a_call_returns_the_result_and_an_error_keeps_its_status():
    async def scenario() -> None:
        def owner(op, message):
            if op == "describe":
                return {"modelName": message["name"]}
            if op == "load":
                raise Conflict(f"model '{message['name']}' is already loaded")
            raise ModelNotFound(message["name"])

        worker, main, tasks = await _pair(_unused, owner)
        assert await worker.call("describe", name="m") == {"modelName": "m"}
        with pytest.raises(ServeError) as conflict:
            await worker.call("load", name="m")
        assert (conflict.value.status, conflict.value.message) == (409, "model 'm' is already loaded")
        with pytest.raises(ServeError) as missing:
            await worker.call("unload", name="gone")
        assert missing.value.status == 404
        await worker.close()
        await main.close()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_messages_are_taken_in_order_and_waiting_calls_do_not_hold_later_ones():
    async def scenario() -> None:
        seen: list[str] = []
        release = asyncio.Event()

        def worker_side(op, message):
            seen.append(f"{op}:{message.get('name')}")  # the ordered part, before anything is awaited
            if op == "model_draining":
                return release.wait()  # what is left to wait for: later messages go on meanwhile
            return None

        main, worker, tasks = await _pair(_unused, worker_side)
        draining = asyncio.create_task(main.call("model_draining", name="a"))
        await asyncio.sleep(0)  # the call is written as its task starts
        main.notify("state", name="s1")
        added = await main.call("model_added", name="b")
        assert added is None
        assert seen == ["model_draining:a", "state:s1", "model_added:b"]
        assert not draining.done()
        release.set()
        assert await draining is True
        await main.close()
        await worker.close()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_a_bug_in_a_handler_is_a_500_for_the_caller():
    async def scenario() -> None:
        def broken(op, message):
            raise KeyError("missing")

        worker, main, tasks = await _pair(_unused, broken)
        with pytest.raises(ServeError) as failed:
            await worker.call("list")
        assert failed.value.status == 500
        assert "KeyError" in failed.value.message
        await worker.close()
        await main.close()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_calls_pending_when_the_other_side_goes_fail_at_once():
    async def scenario() -> None:
        never = asyncio.Event()

        def stuck(op, message):
            return never.wait()

        worker, main, tasks = await _pair(_unused, stuck)
        pending = asyncio.create_task(worker.call("load", name="m"))
        await asyncio.sleep(0.05)
        await main.close()
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(pending, 5)
        assert worker.closed.is_set()
        with pytest.raises(ChannelClosed):
            await worker.call("list")
        worker.notify("state")  # a notice to a closed channel is dropped, not raised
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_a_call_times_out_when_no_reply_comes():
    async def scenario() -> None:
        never = asyncio.Event()
        worker, main, tasks = await _pair(_unused, lambda op, message: never.wait())
        with pytest.raises(asyncio.TimeoutError):
            await worker.call("load", 0.1, name="m")
        await worker.close()
        await main.close()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_the_endpoint_state_crosses_as_it_is():
    state = EndpointState(True, True, "", 8001, 8002, decoupled=True)
    assert EndpointState.from_wire(state.to_wire()) == state
    assert not STARTING.healthy
    assert not STARTING.serving
