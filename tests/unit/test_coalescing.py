"""A worker's requests to one model, merged while its earlier ones are with Triton
(smtriton/serve/dataplane/batching/coalescing.py), in front of a stand-in ``send`` that answers each request
row by row, as a batching model does, and is held or failed by the test."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest

from smtriton.serve.dataplane.batching import coalescing, mergeable, row_time
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


# ----- only while merging pays: Triton's execution time per row (row_time.py) ----------------------------
MS = 1_000_000  # nanoseconds


def stats(*batches: tuple[int, int, int], versions: int = 1) -> dict[str, Any]:
    """Triton's statistics of a model: per (batch size, executions, ns computing them), the ns split
    between compute input, infer and output; the same for each version loaded."""

    def batch(size: int, count: int, ns: int) -> dict[str, Any]:
        parts = (ns // 4, ns - ns // 4 - ns // 8, ns // 8)
        keys = ("compute_input", "compute_infer", "compute_output")
        return {
            "batch_size": size,
            **{key: {"count": count, "ns": part} for key, part in zip(keys, parts, strict=True)},
        }

    version = {"name": "m", "batch_stats": [batch(*b) for b in batches]}
    return {"model_stats": [{**version, "version": str(v + 1)} for v in range(versions)]}


def test_the_time_per_row_is_the_compute_time_over_the_rows_executed_between_two_readings():
    first = row_time.reading(stats((1, 10, 30 * MS), (4, 5, 40 * MS)))
    assert first == row_time.Reading(70 * MS, 30)
    assert row_time.ms_per_row(None, first) is None  # a first reading only starts the count
    # since then: 2 executions of 1 row (8 ms), 3 of 4 rows (12 ms), 1 of 8 rows (4 ms): 24 ms, 22 rows
    second = row_time.reading(stats((1, 12, 38 * MS), (4, 8, 52 * MS), (8, 1, 4 * MS)))
    assert row_time.ms_per_row(first, second) == pytest.approx(24 / 22)
    assert row_time.reading(stats((2, 3, 6 * MS), versions=2)) == row_time.Reading(12 * MS, 12)  # versions summed


def test_an_interval_without_executions_tells_nothing():
    same = row_time.reading(stats((1, 10, 30 * MS)))
    assert row_time.ms_per_row(same, same) is None
    assert row_time.ms_per_row(row_time.Reading(0, 0), row_time.reading({"model_stats": [{"name": "m"}]})) is None


def test_counters_that_went_back_started_again_within_the_interval():
    """Triton restarted (or the model was loaded again): what it counts now is the interval's."""
    before = row_time.reading(stats((1, 1000, 900 * MS)))
    after = row_time.reading(stats((1, 4, 20 * MS)))
    assert row_time.ms_per_row(before, after) == pytest.approx(5.0)
    assert row_time.ms_per_row(before, row_time.Reading(0, 0)) is None


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (None, "no model_stats"),
        ({"error": "unknown model"}, "no model_stats"),
        ({"model_stats": 3}, "no model_stats"),
        ({"model_stats": [{"batch_stats": [{"batch_size": -1}]}]}, "-1 is no count"),
        ({"model_stats": [{"batch_stats": [7]}]}, "no object"),
    ],
)
def test_what_is_no_statistics_answer_is_refused(answer, why):
    with pytest.raises(ValueError, match=why):
        row_time.reading(answer)


def test_a_verdict_changes_only_on_an_interval_that_executed_rows():
    verdict = row_time.Verdict()
    assert verdict.pays
    assert not verdict.take(stats((1, 10, 60 * MS)), 2.0)  # the first reading: still merging
    assert verdict.pays
    assert verdict.take(stats((1, 20, 110 * MS)), 2.0)  # 5 ms a row
    assert (verdict.pays, verdict.ms) == (False, pytest.approx(5.0))
    assert not verdict.take(stats((1, 20, 110 * MS)), 2.0)  # nothing executed: the verdict stands
    assert not verdict.pays
    assert verdict.take(stats((1, 20, 110 * MS), (8, 10, 80 * MS)), 2.0)  # 1 ms a row
    assert verdict.pays


MODEL_OF_TWO = ModelBatching(max_batch_size=4, instances=2)
SLOW = [stats((1, 1, 5 * MS)), stats((1, 3, 15 * MS))]  # a baseline, then 5 ms a row
FAST = [stats((1, 1, 5 * MS)), stats((1, 1, 5 * MS), (8, 2, 8 * MS))]  # a baseline, then 0.5 ms a row


class TritonStatistics:
    """The stand-in for Triton's statistics of a model: ``answers`` in turn (the last one again and again),
    each held while ``gate`` is shut, or ``failure`` raised; counts the calls."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.answers = list(answers)
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.failure: Exception | None = None

    async def read(self, triton_name: str) -> Any:
        self.calls += 1
        await self.gate.wait()
        if self.failure is not None:
            raise self.failure
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def judged(
    scenario, answers: list[dict[str, Any]], max_row_ms: float = 2.0, read_every_s: float = 0.0, per_instance: int = 1
) -> Metrics:
    """``scenario(triton, statistics, coalescer)`` with a coalescer that judges by ``statistics``
    (``per_instance`` requests in flight per instance before it merges), reading it again after
    ``read_every_s``."""
    metrics = Metrics(enabled=False)

    async def main() -> None:
        triton, statistics = Triton(), TritonStatistics(answers)
        coalescer = Coalescer(triton.send, per_instance, metrics, 1, statistics.read, max_row_ms)
        try:
            await scenario(triton, statistics, coalescer)
        finally:
            await coalescer.close()

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(row_time, "READ_EVERY_S", read_every_s)
        asyncio.run(main())
    return metrics


async def judged_by_two_readings(triton: Triton, coalescer: Coalescer) -> None:
    """Two requests one after the other: the first reading is taken, then the second."""
    for value in (7, 8):
        assert doubled(await coalescer.infer("m", request(value), MODEL)) == [2 * value]
        await settle()
    triton.sent.clear()


def test_a_model_whose_rows_execute_fast_merges():
    async def scenario(triton: Triton, statistics: TritonStatistics, coalescer: Coalescer) -> None:
        await judged_by_two_readings(triton, coalescer)
        triton.gate.clear()
        calls = [asyncio.ensure_future(coalescer.infer("m", request(v), MODEL)) for v in (1, 2, 3, 4)]
        await settle()
        assert triton.sent == [[1]]
        triton.gate.set()
        assert [doubled(a) for a in await asyncio.gather(*calls)] == [[2], [4], [6], [8]]
        assert triton.sent == [[1], [2, 3, 4]]
        assert statistics.calls >= 2

    metrics = judged(scenario, FAST)
    assert (metrics.merges._value.get(), metrics.merging_stopped._value.get()) == (1, 0)


def test_a_model_whose_rows_execute_slowly_has_each_request_sent_at_once_however_many_are_in_flight():
    async def scenario(triton: Triton, statistics: TritonStatistics, coalescer: Coalescer) -> None:
        await judged_by_two_readings(triton, coalescer)
        triton.gate.clear()
        calls = [asyncio.ensure_future(coalescer.infer("m", request(v), MODEL)) for v in range(1, 7)]
        await settle()
        assert triton.sent == [[1], [2], [3], [4], [5], [6]]  # six in flight, the bound is one
        triton.gate.set()
        assert [doubled(a) for a in await asyncio.gather(*calls)] == [[2 * v] for v in range(1, 7)]

    metrics = judged(scenario, SLOW)
    assert (metrics.merges._value.get(), metrics.merging_stopped._value.get()) == (0, 1)


def test_requests_waiting_when_merging_stops_paying_go_at_once_and_one_reading_at_a_time():
    async def scenario(triton: Triton, statistics: TritonStatistics, coalescer: Coalescer) -> None:
        triton.gate.clear()
        first = asyncio.ensure_future(coalescer.infer("m", request(1), MODEL))
        await settle()
        assert statistics.calls == 1  # the baseline, taken
        statistics.gate.clear()
        calls = [asyncio.ensure_future(coalescer.infer("m", request(v), MODEL)) for v in (2, 3, 4)]
        await settle()
        assert triton.sent == [[1]]  # merging pays until a reading says otherwise: they wait
        assert statistics.calls == 2  # three uses, one reading under way
        statistics.gate.set()  # 5 ms a row
        await settle()
        assert triton.sent == [[1], [2], [3], [4]]  # released, each alone, while the first is in flight
        triton.gate.set()
        assert [doubled(a) for a in await asyncio.gather(first, *calls)] == [[2], [4], [6], [8]]

    metrics = judged(scenario, SLOW)
    assert (metrics.merges._value.get(), metrics.merging_stopped._value.get()) == (0, 1)


def test_merging_resumes_when_rows_execute_fast_again():
    async def scenario(triton: Triton, statistics: TritonStatistics, coalescer: Coalescer) -> None:
        await judged_by_two_readings(triton, coalescer)
        statistics.answers = [stats((1, 3, 15 * MS), (8, 10, 40 * MS))]  # 80 rows in 40 ms since
        assert doubled(await coalescer.infer("m", request(9), MODEL)) == [18]
        await settle()
        triton.gate.clear()
        calls = [asyncio.ensure_future(coalescer.infer("m", request(v), MODEL)) for v in (1, 2, 3)]
        await settle()
        triton.gate.set()
        await asyncio.gather(*calls)
        assert triton.sent[1:] == [[1], [2, 3]]

    metrics = judged(scenario, SLOW)
    assert (metrics.merging_stopped._value.get(), metrics.merging_resumed._value.get()) == (1, 1)


def test_a_reading_that_fails_keeps_the_verdict_and_logs_nothing_above_debug(caplog):
    async def scenario(triton: Triton, statistics: TritonStatistics, coalescer: Coalescer) -> None:
        await judged_by_two_readings(triton, coalescer)  # merging does not pay
        statistics.failure = TritonUnavailable("Triton is not reachable: ClientConnectorError", sent=False)
        for _ in range(3):
            triton.gate.clear()
            calls = [asyncio.ensure_future(coalescer.infer("m", request(v), MODEL)) for v in (1, 2, 3)]
            await settle()
            assert triton.sent[-3:] == [[1], [2], [3]]
            triton.gate.set()
            await asyncio.gather(*calls)
        assert statistics.calls >= 5

    caplog.set_level(logging.DEBUG, logger="serve")
    judged(scenario, SLOW)
    assert [record.levelno for record in caplog.records if record.levelno > logging.DEBUG] == []
    assert any("not read" in record.getMessage() for record in caplog.records)


def test_before_a_reading_comes_in_requests_merge_and_a_failed_one_changes_nothing():
    async def scenario(triton: Triton, statistics: TritonStatistics, coalescer: Coalescer) -> None:
        statistics.failure = ValueError("no model_stats in Triton's statistics")
        await two_go_at_once_and_three_merge(MODEL_OF_TWO)(triton, coalescer)
        assert statistics.calls >= 1

    metrics = judged(scenario, SLOW)
    assert metrics.merges._value.get() == 1


def test_a_lane_reads_again_only_once_its_last_reading_is_old_enough():
    async def scenario(triton: Triton, statistics: TritonStatistics, coalescer: Coalescer) -> None:
        for value in range(5):
            await coalescer.infer("m", request(value), MODEL)
            await settle()
        assert statistics.calls == 1
        await asyncio.sleep(0.06)
        await coalescer.infer("m", request(5), MODEL)
        await settle()
        assert statistics.calls == 2
        await coalescer.infer("other", request(5), MODEL)
        await settle()
        assert statistics.calls == 3  # each model its own

    judged(scenario, FAST, read_every_s=0.05)


def test_without_a_bound_on_the_time_per_row_statistics_are_never_read():
    async def scenario(triton: Triton, statistics: TritonStatistics, coalescer: Coalescer) -> None:
        for _ in range(3):
            await two_go_at_once_and_three_merge(MODEL_OF_TWO)(triton, coalescer)
            triton.sent.clear()
        assert statistics.calls == 0

    metrics = judged(scenario, SLOW, max_row_ms=0.0)
    assert metrics.merges._value.get() == 3


def test_a_model_loaded_again_is_judged_afresh():
    async def scenario(triton: Triton, statistics: TritonStatistics, coalescer: Coalescer) -> None:
        await judged_by_two_readings(triton, coalescer)  # merging does not pay
        triton.gate.clear()
        busy = asyncio.ensure_future(coalescer.infer("m", request(1), MODEL))
        await settle()
        coalescer.forget("m")  # loaded again while a request is in flight: the lane stays, judged afresh
        statistics.failure = TritonUnavailable("Triton is not reachable: ClientConnectorError", sent=False)
        calls = [asyncio.ensure_future(coalescer.infer("m", request(v), MODEL)) for v in (2, 3)]
        await settle()
        assert triton.sent == [[1]]  # merging, until a reading says otherwise
        triton.gate.set()
        await asyncio.gather(busy, *calls)
        assert triton.sent == [[1], [2, 3]]

    judged(scenario, SLOW)


# ----- one request in flight per instance where the instances are not the bound (row_time.py) -------------
def test_how_busy_the_instances_were_is_their_compute_time_over_the_time_requests_were_in_flight():
    verdict = row_time.Verdict()
    assert not verdict.take(stats((1, 10, 60 * MS)), 2.0, active_s=1.0, instances=2)  # a baseline
    assert verdict.busy is None  # (until a second reading: as configured)
    assert not verdict.one_each
    verdict.take(stats((1, 10, 60 * MS), (4, 100, 400 * MS)), 2.0, active_s=2.0, instances=2)
    assert verdict.busy == pytest.approx(0.4 / 1.0 / 2)  # 400 ms computed over 1 s, two instances
    assert verdict.one_each
    verdict.take(stats((1, 10, 60 * MS), (4, 400, 1600 * MS)), 2.0, active_s=3.0, instances=2)
    assert verdict.busy == pytest.approx(1.2 / 1.0 / 2)
    assert not verdict.one_each  # 60 % busy: the configured bound again
    verdict.take(stats((1, 10, 60 * MS), (4, 400, 1600 * MS)), 2.0, active_s=9.0, instances=2)
    assert verdict.busy == pytest.approx(0.6)  # nothing executed in between: as it was


@pytest.mark.parametrize(("instances", "workers", "bound"), [(1, 1, 1), (2, 1, 2), (8, 8, 1), (16, 8, 2)])
def test_one_each_keeps_one_request_in_flight_per_instance(instances, workers, bound):
    model = ModelBatching(max_batch_size=16, instances=instances)
    assert Coalescer(Triton().send, 2, Metrics(enabled=False), workers).bound(model, one_each=True) == bound


def test_a_lane_counts_the_time_it_had_requests_in_flight():
    class Clock:
        now = 10.0

        def time(self) -> float:
            return self.now

    clock = Clock()
    lane = coalescing._Lane(MODEL)
    loop: Any = clock
    lane.sent(loop)
    clock.now = 11.0
    lane.sent(loop)  # a second one: the time runs once
    assert lane.active(loop) == pytest.approx(1.0)
    clock.now = 12.0
    lane.answered(loop)
    lane.answered(loop)
    clock.now = 20.0  # nothing in flight: no time counted
    assert lane.active(loop) == pytest.approx(2.0)


def test_a_model_whose_instances_idle_merges_deeper():
    """Below half busy the lane keeps one request in flight per instance: what arrives meanwhile waits
    and goes merged, as many as the model's batch takes."""
    idle = [stats((1, 1, 1 * MS)), stats((1, 1, 1 * MS), (4, 2, 2 * MS))]  # 2 ms computed over the lane's time

    async def scenario(triton: Triton, statistics: TritonStatistics, coalescer: Coalescer) -> None:
        for value in (7, 8):  # two readings, the first request in flight for 5 ms between them
            triton.gate.clear()
            call = asyncio.ensure_future(coalescer.infer("m", request(value), MODEL_OF_TWO))
            await asyncio.sleep(0.005)
            triton.gate.set()
            assert doubled(await call) == [2 * value]
            await settle()
        assert coalescer._lanes["m"].verdict.one_each
        triton.sent.clear()
        triton.gate.clear()
        calls = [asyncio.ensure_future(coalescer.infer("m", request(v), MODEL_OF_TWO)) for v in (1, 2, 3, 4, 5)]
        await settle()
        assert triton.sent == [[1], [2]]  # one each of its two instances (configured: two each)
        triton.gate.set()
        assert [doubled(a) for a in await asyncio.gather(*calls)] == [[2], [4], [6], [8], [10]]
        assert triton.sent == [[1], [2], [3, 4, 5]]

    judged(scenario, idle, per_instance=2)
