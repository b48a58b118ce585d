"""A worker's requests to one model, merged while its earlier ones are with Triton
(smtriton/serve/dataplane/batching/coalescing.py), in front of a stand-in ``send`` that answers each request
row by row, as a batching model does, and is held or failed by the test."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from smtriton.serve.dataplane.batching import coalescing, mergeable
from smtriton.serve.dataplane.batching.coalescing import Coalescer
from smtriton.serve.dataplane.batching.rule import ModelBatching
from smtriton.serve.dataplane.reading.inference import Inference, read
from smtriton.serve.errors import TritonUnavailable
from smtriton.serve.metrics import Metrics
from smtriton.serve.triton.client import UpstreamResponse

MODEL = ModelBatching(max_batch_size=4, instances=1)


def request(*values: int, **extra: Any) -> Inference:
    """A request of one row per value; the model answers each row with its value doubled, and fails a
    request holding 13."""
    header = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [len(values), 1], "data": list(values)}]}
    return read(orjson.dumps({**header, **extra}), None)


def doubled(answer: UpstreamResponse) -> list[int]:
    assert answer.status == 200, answer.body
    return list(orjson.loads(answer.body)["outputs"][0]["data"])


class Triton:
    """The stand-in: records each request it is sent (its values), and holds it while ``gate`` is shut."""

    def __init__(self) -> None:
        self.sent: list[list[int]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.failure: Exception | None = None
        self.refusal: UpstreamResponse | None = None

    async def send(self, triton_name: str, inference: Inference) -> UpstreamResponse:
        values = list(orjson.loads(inference.body)["inputs"][0]["data"])
        self.sent.append(values)
        await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        if self.refusal is not None and len(values) > 1:
            return self.refusal
        if 13 in values:
            return UpstreamResponse(400, "application/json", None, orjson.dumps({"error": f"13 among {values}"}))
        output = {"name": "Y", "datatype": "INT32", "shape": [len(values), 1], "data": [2 * v for v in values]}
        body = orjson.dumps({"model_name": triton_name, "model_version": "1", "outputs": [output]})
        return UpstreamResponse(200, "application/json", None, body)


def run(scenario, per_instance: int = 1, workers: int = 1) -> Metrics:
    metrics = Metrics(enabled=False)

    async def main() -> None:
        triton = Triton()
        coalescer = Coalescer(triton.send, per_instance, metrics, workers)
        try:
            await scenario(triton, coalescer)
        finally:
            await coalescer.close()

    asyncio.run(main())
    return metrics


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_request_alone_is_sent_at_once():
    async def scenario(triton: Triton, coalescer: Coalescer) -> None:
        triton.gate.clear()
        first = asyncio.ensure_future(coalescer.infer("m", request(1), MODEL))
        await asyncio.sleep(0)  # one step of the event loop: nothing waits to fill a batch
        assert triton.sent == [[1]]
        triton.gate.set()
        assert doubled(await first) == [2]
        assert doubled(await coalescer.infer("m", request(2), MODEL)) == [4]
        assert triton.sent == [[1], [2]]

    run(scenario)


def two_go_at_once_and_three_merge(model: ModelBatching):
    """Five one-row requests while Triton holds them: a bound of two sends the first two at once, and
    the other three, merged, once those come back."""

    async def scenario(triton: Triton, coalescer: Coalescer) -> None:
        triton.gate.clear()
        calls = [asyncio.ensure_future(coalescer.infer("m", request(v), model)) for v in (1, 2, 3, 4, 5)]
        await settle()
        assert triton.sent == [[1], [2]]
        triton.gate.set()
        answers = [doubled(a) for a in await asyncio.gather(*calls)]
        assert answers == [[2], [4], [6], [8], [10]]
        assert triton.sent[2:] == [[3, 4, 5]]

    return scenario


def test_below_the_bound_requests_go_at_once_and_only_later_ones_merge():
    """The bound is per model instance: two instances at one request each keep two in flight."""
    metrics = run(two_go_at_once_and_three_merge(ModelBatching(max_batch_size=4, instances=2)))
    assert (metrics.merges._value.get(), metrics.merged_requests._value.get()) == (1, 3)


@pytest.mark.parametrize(
    ("instances", "per_instance", "workers", "bound"),
    [(8, 2, 8, 2), (16, 2, 8, 4), (4, 2, 8, 2), (1, 2, 8, 2), (1, 1, 8, 1), (4, 2, 3, 3), (2, 1, 1, 2)],
)
def test_the_bound_is_each_workers_share_of_the_fronts(instances, per_instance, workers, bound):
    """All workers feed one Triton: each keeps its share of ``instances * per_instance`` in flight,
    rounded up, and never less than ``per_instance`` (one instance's worth)."""
    model = ModelBatching(max_batch_size=16, instances=instances)
    assert Coalescer(Triton().send, per_instance, Metrics(enabled=False), workers).bound(model) == bound


def test_a_worker_among_several_merges_beyond_its_share():
    model = ModelBatching(max_batch_size=8, instances=4)  # 8 in flight for the front: 2 for each of 4 workers
    run(two_go_at_once_and_three_merge(model), per_instance=2, workers=4)


def test_what_waits_goes_in_groups_of_the_models_batch_size_and_by_key():
    async def scenario(triton: Triton, coalescer: Coalescer) -> None:
        triton.gate.clear()
        first = asyncio.ensure_future(coalescer.infer("m", request(1), MODEL))
        await settle()
        inferences = [request(2, 3), request(4), request(5, parameters={"k": "v"}), request(6), request(7, 8)]
        calls = [asyncio.ensure_future(coalescer.infer("m", i, MODEL)) for i in inferences]
        await settle()
        assert triton.sent == [[1]]
        triton.gate.set()
        answers = [doubled(a) for a in await asyncio.gather(first, *calls)]
        assert answers == [[2], [4, 6], [8], [10], [12], [14, 16]]
        # one in flight at a time: 4 rows of the first key, then the other key, then what is left
        assert triton.sent == [[1], [2, 3, 4, 6], [5], [7, 8]]

    run(scenario)


def test_other_models_have_their_own_bound():
    async def scenario(triton: Triton, coalescer: Coalescer) -> None:
        triton.gate.clear()
        calls = [asyncio.ensure_future(coalescer.infer(name, request(1), MODEL)) for name in ("a", "b")]
        await settle()
        assert triton.sent == [[1], [1]]
        triton.gate.set()
        await asyncio.gather(*calls)

    run(scenario)


def test_an_error_in_a_merged_request_is_each_clients_own():
    async def scenario(triton: Triton, coalescer: Coalescer) -> None:
        triton.gate.clear()
        first = asyncio.ensure_future(coalescer.infer("m", request(1), MODEL))
        await settle()
        calls = [asyncio.ensure_future(coalescer.infer("m", request(v), MODEL)) for v in (2, 13, 4)]
        await settle()
        triton.gate.set()
        answers = await asyncio.gather(first, *calls)
        assert triton.sent == [[1], [2, 13, 4], [2], [13], [4]]  # the merge failed: each sent again alone
        assert [a.status for a in answers] == [200, 200, 400, 200]
        assert orjson.loads(answers[2].body) == {"error": "13 among [13]"}
        assert doubled(answers[3]) == [8]

    metrics = run(scenario)
    assert metrics.unmerged_again._value.get() == 3


def test_a_transport_failure_of_a_merged_request_is_each_clients_own():
    async def scenario(triton: Triton, coalescer: Coalescer) -> None:
        triton.gate.clear()
        first = asyncio.ensure_future(coalescer.infer("m", request(1), MODEL))
        await settle()
        calls = [asyncio.ensure_future(coalescer.infer("m", request(v), MODEL)) for v in (2, 3)]
        await settle()
        triton.failure = TritonUnavailable("Triton is not reachable: ClientOSError")
        triton.gate.set()
        results = await asyncio.gather(first, *calls, return_exceptions=True)
        assert all(isinstance(r, TritonUnavailable) for r in results)
        assert results[1] is not results[2]  # each its own exception
        assert triton.sent == [[1], [2, 3]]

    run(scenario)


QUEUE_FULL = UpstreamResponse(503, "application/json", None, b'{"error":"Exceeds maximum queue size"}')


def test_a_merged_request_triton_refuses_as_a_whole_is_each_clients_own_refusal_never_resent():
    async def scenario(triton: Triton, coalescer: Coalescer) -> None:
        triton.gate.clear()
        first = asyncio.ensure_future(coalescer.infer("m", request(1), MODEL))
        await settle()
        calls = [asyncio.ensure_future(coalescer.infer("m", request(v), MODEL)) for v in (2, 3, 4)]
        await settle()
        triton.refusal = QUEUE_FULL
        triton.gate.set()
        answers = await asyncio.gather(first, *calls)
        assert [a.status for a in answers] == [200, 503, 503, 503]
        assert triton.sent == [[1], [2, 3, 4]]  # not sent again row by row to an overloaded Triton

    metrics = run(scenario)
    assert metrics.unmerged_again._value.get() == 0


def merged(triton: Triton, inferences: list[Inference]):
    """``inferences`` through send_merged, as a body's records go (each merged part's own request alone)."""
    parts = [mergeable.part(inference, MODEL) for inference in inferences]
    assert all(part is not None for part in parts)

    async def send(inference: Inference) -> UpstreamResponse:
        return await triton.send("m", inference)

    return coalescing.send_merged(send, parts, MODEL, lambda at: inferences[at])  # type: ignore[arg-type]


def test_send_merged_gives_a_timeout_or_a_refusal_of_merged_records_to_each_never_resent():
    async def scenario(triton: Triton, coalescer: Coalescer) -> None:
        inferences = [request(1), request(2), request(3), request(4)]
        triton.refusal = QUEUE_FULL
        results = await merged(triton, inferences)
        assert [r.status for r in results if isinstance(r, UpstreamResponse)] == [503] * 4
        assert triton.sent == [[1, 2, 3, 4]]

        triton.sent.clear()
        triton.refusal = None
        triton.failure = TimeoutError("Triton did not answer in time")
        results = await merged(triton, inferences)
        assert all(isinstance(r, TimeoutError) for r in results)
        assert len({id(r) for r in results}) == 4  # each its own exception
        assert triton.sent == [[1, 2, 3, 4]]  # one Triton request, not five

    run(scenario)


def test_a_client_that_leaves_while_waiting_is_left_out_and_the_others_are_answered():
    async def scenario(triton: Triton, coalescer: Coalescer) -> None:
        triton.gate.clear()
        first = asyncio.ensure_future(coalescer.infer("m", request(1), MODEL))
        await settle()
        calls = [asyncio.ensure_future(coalescer.infer("m", request(v), MODEL)) for v in (2, 3, 4)]
        await settle()
        calls[1].cancel()
        await settle()
        triton.gate.set()
        assert doubled(await first) == [2]
        assert [doubled(a) for a in await asyncio.gather(calls[0], calls[2])] == [[4], [8]]
        assert triton.sent == [[1], [2, 4]]

    run(scenario)


class LeavingWhenHandedItsPlace(coalescing._Waiting):
    """A waiting request whose client leaves the moment it is handed its place in flight, before its
    coroutine runs again."""

    def __init__(self, part: Any, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(part, loop)
        client = asyncio.current_task()
        assert client is not None

        class Answer(asyncio.Future):  # type: ignore[type-arg]
            def set_result(self, result: Any) -> None:
                super().set_result(result)
                if result is coalescing._SLOT:
                    client.cancel()

        self.answer = Answer()


def test_a_client_handed_the_place_in_flight_as_it_leaves_passes_it_on(monkeypatch):
    async def scenario(triton: Triton, coalescer: Coalescer) -> None:
        triton.gate.clear()
        first = asyncio.ensure_future(coalescer.infer("m", request(1), MODEL))
        await settle()
        with monkeypatch.context() as patched:
            patched.setattr(coalescing, "_Waiting", LeavingWhenHandedItsPlace)
            second = asyncio.ensure_future(coalescer.infer("m", request(2), MODEL))
            await settle()
        third = asyncio.ensure_future(coalescer.infer("m", request(3, parameters={"k": "v"}), MODEL))
        await settle()
        triton.gate.set()
        assert doubled(await first) == [2]
        with pytest.raises(asyncio.CancelledError):
            await second
        assert doubled(await asyncio.wait_for(third, 5)) == [6]  # the place went on to the next waiting
        assert triton.sent == [[1], [3]]

    run(scenario)


def test_requests_that_cannot_merge_do_not_wait():
    async def scenario(triton: Triton, coalescer: Coalescer) -> None:
        triton.gate.clear()
        first = asyncio.ensure_future(coalescer.infer("m", request(1), MODEL))
        alone = asyncio.ensure_future(coalescer.infer("m", request(2, parameters={"priority": 1}), MODEL))
        await settle()
        assert triton.sent == [[1], [2]]
        triton.gate.set()
        await asyncio.gather(first, alone)

    run(scenario)


def test_send_merged_answers_each_as_alone_and_sends_them_again_alone_when_triton_fails_the_rows():
    async def scenario(triton: Triton, coalescer: Coalescer) -> None:
        results = await merged(triton, [request(1), request(2, 3)])
        assert [doubled(r) for r in results if isinstance(r, UpstreamResponse)] == [[2], [4, 6]]
        assert triton.sent == [[1, 2, 3]]
        triton.sent.clear()
        results = await merged(triton, [request(1), request(13), request(5, 6)])
        assert [r.status for r in results if isinstance(r, UpstreamResponse)] == [200, 400, 200]
        assert doubled(results[2]) == [10, 12]  # type: ignore[arg-type]
        assert triton.sent == [[1, 13, 5, 6], [1], [13], [5, 6]]  # failed merged, each sent again alone

    run(scenario)
