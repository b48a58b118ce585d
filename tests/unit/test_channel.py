"""The channel between serve's main process and a front worker, over a real socketpair, and the typed
messages that cross it."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

import orjson
import pytest

from smtriton.serve.errors import BadRequest, Conflict, ModelNotFound, ServeError
from smtriton.serve.ipc.channel import Channel, ChannelClosed
from smtriton.serve.ipc.messages import (
    STARTING,
    Call,
    DescribeModel,
    EndpointState,
    Hello,
    ListModels,
    LoadModel,
    Message,
    ModelAdded,
    ModelDraining,
    StateChanged,
    UnknownMessage,
    UnloadModel,
)
from smtriton.serve.multimodel.records import ModelRecord


async def _pair(left_handler, right_handler) -> tuple[Channel, Channel, list[asyncio.Task[None]]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    left = await Channel.open(a, left_handler)
    right = await Channel.open(b, right_handler)
    return left, right, [asyncio.create_task(left.run()), asyncio.create_task(right.run())]


def _unused(message):
    raise AssertionError(f"unexpected {message}")


def _record(name: str) -> ModelRecord:
    return ModelRecord(name, f"/opt/ml/models/{name}", None, name, [name], name)


def test_a_call_returns_the_result_and_an_error_keeps_its_status():
    async def scenario() -> None:
        def owner(message: Message):
            match message:
                case DescribeModel(name=name):
                    return {"modelName": name}
                case LoadModel(body=body):
                    raise Conflict(f"model '{orjson.loads(body)['model_name']}' is already loaded")
                case UnloadModel(name=name):
                    raise ModelNotFound(name)

        worker, main, tasks = await _pair(_unused, owner)
        assert await worker.call(DescribeModel("m")) == {"modelName": "m"}
        with pytest.raises(ServeError) as conflict:
            await worker.call(LoadModel('{"model_name": "m"}', None))
        assert (conflict.value.status, conflict.value.message) == (409, "model 'm' is already loaded")
        with pytest.raises(ServeError) as missing:
            await worker.call(UnloadModel("gone", None))
        assert missing.value.status == 404
        await worker.close()
        await main.close()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_messages_are_taken_in_order_and_waiting_calls_do_not_hold_later_ones():
    async def scenario() -> None:
        seen: list[Message] = []
        release = asyncio.Event()

        async def drained() -> bool:
            await release.wait()
            return True

        def worker_side(message: Message):
            seen.append(message)  # the ordered part, before anything is awaited
            if isinstance(message, ModelDraining):
                return drained()  # what is left to wait for: later messages go on meanwhile
            return None

        main, worker, tasks = await _pair(_unused, worker_side)
        draining = asyncio.create_task(main.call(ModelDraining("a", 60.0)))
        await asyncio.sleep(0)  # the call is written as its task starts
        state = EndpointState(True, True, "", 8001, 8002)
        main.notify(StateChanged(state))
        added = ModelAdded(_record("b"))
        assert await main.call(added) is None
        assert seen == [ModelDraining("a", 60.0), StateChanged(state), added]
        assert not draining.done()
        release.set()
        assert await draining is True
        await main.close()
        await worker.close()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_a_bug_in_a_handler_is_a_500_for_the_caller():
    async def scenario() -> None:
        def broken(message):
            raise KeyError("missing")

        worker, main, tasks = await _pair(_unused, broken)
        with pytest.raises(ServeError) as failed:
            await worker.call(ListModels(None, None))
        assert failed.value.status == 500
        assert "KeyError" in failed.value.message
        await worker.close()
        await main.close()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_an_answer_with_text_that_is_not_utf8_still_answers_the_call():
    """A refusal naming a folder whose name is not UTF-8 (as ``os`` gives it: a lone surrogate) keeps its
    status, the bytes escaped; a result JSON cannot carry is a 500. Neither leaves the call waiting (the
    reply once failed to be written, and the load request hung)."""

    async def scenario() -> None:
        async def refuse() -> None:
            raise BadRequest("ambiguous model archive: a, m\udcff, n\ud800")

        def owner(message: Message):
            match message:
                case LoadModel():
                    return refuse()  # answered once it is done, as the owner answers a load
                case DescribeModel(name=name):
                    return {"modelName": name + "\udcff"}

        worker, main, tasks = await _pair(_unused, owner)
        with pytest.raises(ServeError) as refused:
            await worker.call(LoadModel("{}", None), 5)
        assert (refused.value.status, refused.value.message) == (400, "ambiguous model archive: a, m\\xff, n\\ud800")
        with pytest.raises(ServeError) as failed:
            await worker.call(DescribeModel("m"), 5)
        assert (failed.value.status, failed.value.message) == (500, "internal error: TypeError")  # orjson's
        assert await worker.call(ListModels(None, None), 5) is None  # the channel still answers
        await worker.close()
        await main.close()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_an_operation_the_other_side_does_not_know_is_a_400_naming_it():
    @dataclass(frozen=True)
    class Unheard(Call[None], op="unheard_of_here"):
        pass

    async def scenario() -> None:
        worker, main, tasks = await _pair(_unused, _unused)
        from smtriton.serve.ipc import messages

        del messages._BY_OP["unheard_of_here"]  # as a side of another version would have it
        with pytest.raises(ServeError) as refused:
            await worker.call(Unheard())
        assert (refused.value.status, refused.value.message) == (400, "unknown operation 'unheard_of_here'")
        await worker.close()
        await main.close()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_calls_pending_when_the_other_side_goes_fail_at_once():
    async def scenario() -> None:
        never = asyncio.Event()

        def stuck(message):
            return never.wait()

        worker, main, tasks = await _pair(_unused, stuck)
        pending = asyncio.create_task(worker.call(LoadModel("{}", None)))
        await asyncio.sleep(0.05)
        await main.close()
        with pytest.raises(ChannelClosed):
            await asyncio.wait_for(pending, 5)
        assert worker.closed.is_set()
        with pytest.raises(ChannelClosed):
            await worker.call(ListModels(None, None))
        worker.notify(StateChanged(STARTING))  # a notice to a closed channel is dropped, not raised
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_a_call_times_out_when_no_reply_comes():
    async def scenario() -> None:
        never = asyncio.Event()
        worker, main, tasks = await _pair(_unused, lambda message: never.wait())
        with pytest.raises(asyncio.TimeoutError):
            await worker.call(LoadModel("{}", None), 0.1)
        await worker.close()
        await main.close()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())


def test_every_field_of_a_message_crosses_as_it_is_nested_records_and_state_included():
    record = _record("m")
    record.decoupled = True
    hello = Hello(3, {"port": 8080}, None, EndpointState(True, True, "", 8001, 8002, decoupled=True), (record,))
    wire = orjson.loads(orjson.dumps({"op": hello.op, "args": hello}))
    assert wire["op"] == "hello"
    back = Message.from_wire(wire["op"], wire["args"])
    assert back == hello
    assert isinstance(back, Hello)
    assert isinstance(back.models[0], ModelRecord)
    assert back.models[0].decoupled
    assert not STARTING.healthy
    assert not STARTING.serving
    with pytest.raises(UnknownMessage):
        Message.from_wire("no_such_operation", {})


def test_two_messages_cannot_share_an_operation():
    with pytest.raises(TypeError, match="two messages named 'load'"):

        class Duplicate(Call[None], op="load"):
            pass
