"""Bodies of several records (batch transform's mini-batches): which bodies are read so, where their records
end, and the answer, one line a record in order; every record read and checked before the first is sent,
a failing record failing the whole request by its line (nothing more sent) or written as a short error
line in its place; records that agree merged, the event loop served while a large body is read, and a body
that cannot fit the memory free refused before the work."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from smtriton.serve.dataplane.answers import to_sagemaker
from smtriton.serve.dataplane.batching.rule import ModelBatching
from smtriton.serve.dataplane.reading.inference import Inference, read
from smtriton.serve.dataplane.records import multirecord, record_answers
from smtriton.serve.dataplane.records.record_answers import Failure, RecordFailed
from smtriton.serve.dataplane.records.record_check import ModelRules, model_rules
from smtriton.serve.errors import NotReady, PayloadTooLarge, ServeError
from smtriton.serve.host import cgroups
from smtriton.serve.triton.client import UpstreamResponse
from tests.unit.loop_gaps import gaps_while

RECORD = b'{"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"FP32","data":[1,2]}]}'
BJ = "application/vnd.sagemaker-triton.binary+json;json-header-size=10"
ROWS = model_rules(
    "rows",
    {
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0"}],
    },
)


def record(*values: float) -> bytes:
    data = list(values)
    return orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, len(data)], "datatype": "FP32", "data": data}]})


@pytest.mark.parametrize(
    ("content_type", "body", "batch", "several"),
    [
        ("application/jsonlines", RECORD, False, True),  # JSON Lines always, one line too
        ("application/x-ndjson; charset=utf-8", RECORD + b"\n" + RECORD, False, True),
        ("Application/JSONLines", RECORD, True, True),
        ("application/json", RECORD + b"\n" + RECORD, False, False),  # outside batch: one request, as native
        ("application/json", RECORD + b"\n" + RECORD, True, True),
        (None, RECORD + b"\r\n" + RECORD + b"\n", True, True),
        ("application/json", RECORD + b"\n", True, False),  # a trailing newline is no second record
        ("application/json", RECORD + b"\n  \n", True, False),
        ("application/json", b'{\n  "inputs": []\n}\n', True, False),  # one document over several lines
        ("application/json", b'{"a": "}\n{"', True, False),  # the first line is no whole object
        (BJ, RECORD + b"\n" + RECORD, True, False),  # binary+json stays one request a body
        ("image/png", RECORD + b"\n" + RECORD, True, False),
    ],
)
def test_which_bodies_hold_records(content_type, body, batch, several):
    assert multirecord.holds_records(content_type, body, batch) is several


def test_records_end_with_the_last_line_that_holds_anything():
    assert multirecord.records_end(b"a\r\nb\n\nc\n\n \n") == 7
    assert multirecord.records_end(bytearray(b"a\nb")) == 3
    assert multirecord.records_end(b"\n\n") == 0
    assert multirecord.records_end(b"x" + b"\n" * 200_000) == 1  # blank lines past one look at the tail


def answer_of(body: bytes) -> UpstreamResponse:
    return UpstreamResponse(200, "application/json", None, body)


def failed(status: int, message: str) -> UpstreamResponse:
    return UpstreamResponse(status, "application/json", None, orjson.dumps({"error": message}))


class Triton:
    """The stand-in: answers each request with itself (a merged one row by row, each row's values
    doubled), but ``outcomes`` by the request's body; records what it is sent and how many at once."""

    def __init__(self, outcomes: dict[bytes, UpstreamResponse | ServeError] | None = None) -> None:
        self.outcomes = outcomes or {}
        self.sent: list[bytes] = []
        self.in_flight = self.most = 0

    async def send(self, inference: Inference) -> UpstreamResponse:
        body = bytes(inference.body)
        self.sent.append(body)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.001 * (len(self.sent) % 3))
        self.in_flight -= 1
        outcome = self.outcomes.get(body, answer_of(body))
        if isinstance(outcome, ServeError):
            raise outcome
        if body.startswith(b'{"inputs":[{"name":"INPUT0","datatype"'):  # merged: answered as a batching model does
            spec = orjson.loads(body)["inputs"][0]
            doubled = {
                "name": "OUTPUT0",
                "datatype": "FP32",
                "shape": spec["shape"],
                "data": [2 * v for v in spec["data"]],
            }
            return answer_of(orjson.dumps({"model_name": "rows", "model_version": "1", "outputs": [doubled]}))
        return outcome


async def read_line(line: bytes | bytearray) -> Inference:
    return read(line, None)


def work(triton: Triton, error_lines: bool = False, **kwargs) -> multirecord.Work:
    settings = {"rules": ModelRules("m"), "model": None, "in_flight": 4} | kwargs
    return multirecord.Work(
        read_line,
        settings["rules"],
        settings["model"],
        triton.send,
        to_sagemaker,
        error_lines,
        settings["in_flight"],
    )


def answer(lines: list[bytes], triton: Triton, error_lines: bool = False, **kwargs):
    body = b"\n".join(lines) + b"\n"
    return asyncio.run(multirecord.answer(body, work(triton, error_lines, **kwargs)))


def test_the_answer_is_one_line_a_record_in_order_each_sent_alone_a_bounded_number_at_once():
    records = [record(i, i) for i in range(40)]
    triton = Triton()
    reply = answer(records, triton)
    assert (reply.status, reply.content_type) == (200, "application/jsonlines")
    assert reply.body == b"".join(r + b"\n" for r in records)
    assert sorted(triton.sent) == sorted(records)
    assert triton.most == 4


def test_a_record_triton_refuses_fails_the_request_naming_its_line_and_stops_what_is_not_sent():
    records = [record(i) for i in range(100)]
    triton = Triton({records[2]: failed(400, "unexpected inference input 'NOPE'")})
    with pytest.raises(RecordFailed) as caught:
        answer(records, triton, in_flight=1)
    assert (caught.value.status, caught.value.message) == (400, "line 3 of 100: unexpected inference input 'NOPE'")
    assert triton.sent == records[:3]  # one at a time: nothing after the failure was sent


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (b"{not json", "failed to parse the request JSON buffer: Expecting property name enclosed in double quotes "
                       "at 1"),
        (b"  ", "the line is empty: each line of the body is one KServe v2 request"),
        (b"[1]", "the record is not a JSON object"),
        (b"{}", "the record has no 'inputs' array"),
        (b'{"inputs":[{"name":"NOPE","shape":[1,1],"datatype":"FP32","data":[1]}]}',
         "unexpected inference input 'NOPE' for model 'rows'"),
    ],
)  # fmt: skip
def test_every_record_is_read_and_checked_before_any_reaches_triton(bad, error):
    triton = Triton()
    with pytest.raises(RecordFailed) as caught:
        answer([*(record(i) for i in range(100)), bad, record(1)], triton, rules=ROWS)
    assert (caught.value.status, caught.value.message) == (400, f"line 101 of 102: {error}")
    assert triton.sent == []


def test_error_lines_keep_the_alignment_short_and_the_first_failure_in_order_is_named():
    records = [record(i) for i in range(4)]
    triton = Triton({records[0]: failed(400, "bad"), records[2]: NotReady("Triton is restarting")})
    with pytest.raises(RecordFailed, match="line 1 of 4: bad"):
        answer(records, triton)
    triton = Triton({records[1]: failed(500, "the model broke")})
    reply = answer([records[0], records[1], b"{no", records[3]], triton, error_lines=True)
    lines = reply.body.split(b"\n")
    assert reply.status == 200
    assert len(lines) == 5  # four lines, each ended by a newline
    assert lines[-1] == b""
    assert [lines[0], lines[3]] == [records[0], records[3]]  # the third record failed its reading: never sent
    assert orjson.loads(lines[1]) == {"error": "the model broke"}
    assert orjson.loads(lines[2]) == {
        "error": "failed to parse the request JSON buffer: Expecting property name enclosed in double quotes at 1"
    }
    assert len(triton.sent) == 3


def test_an_error_line_says_its_error_short_whatever_triton_said():
    long = "x" * 5000
    triton = Triton({RECORD: failed(400, long)})
    reply = answer([RECORD], triton, error_lines=True)
    message = orjson.loads(reply.body)["error"]
    assert len(message) == record_answers.ERROR_CHARS
    assert message.endswith("…")


@pytest.mark.parametrize("status", [503, 504, 507])
def test_the_servers_state_is_never_an_error_line(status):
    records = [record(i) for i in range(3)]
    triton = Triton({records[1]: failed(status, "not now")})
    with pytest.raises(RecordFailed) as caught:
        answer(records, triton, error_lines=True)
    assert (caught.value.status, caught.value.message) == (status, "line 2 of 3: not now")


def test_many_records_that_fail_alike_cost_a_short_line_each_and_no_triton_request():
    triton = Triton()
    reply = asyncio.run(multirecord.answer(b"[1]\n" * 50_000, work(triton, error_lines=True)))
    lines = bytes(reply.body).split(b"\n")
    assert len(lines) == 50_001
    assert set(lines[:-1]) == {b'{"error":"the record is not a JSON object"}'}
    assert triton.sent == []


def test_records_that_agree_are_merged_as_max_batch_size_allows_and_each_answered_as_alone():
    lengths = [1, 2, 2, 3, 1, 3, 3, 2] * 5
    records = [record(*([float(i)] * n)) for i, n in enumerate(lengths)]
    triton = Triton()
    reply = answer(records, triton, rules=ROWS, model=ModelBatching(max_batch_size=8, instances=1))
    got = [orjson.loads(line)["outputs"][0]["data"] for line in reply.body.splitlines()]
    assert got == [[2.0 * i] * n for i, n in enumerate(lengths)]
    assert len(triton.sent) == 6  # 8, 8 / 8, 8 / 8, 8 records of lengths 1 / 2 / 3: two requests each


def test_a_body_without_records_and_a_binary_answer_are_refused_in_words():
    with pytest.raises(ServeError, match="holds no records"):
        asyncio.run(multirecord.answer(b"\n \n", work(Triton())))
    binary = UpstreamResponse(200, "application/octet-stream", 2, b"{}xx")
    line = multirecord.line_of(binary, to_sagemaker)
    assert isinstance(line, Failure)
    assert "binary_data_output" in line.message


def test_an_answer_written_over_lines_becomes_one_line():
    assert multirecord.line_of(answer_of(b'{"a":\n 1}'), to_sagemaker) == b'{"a":1}'


def test_the_event_loop_is_served_while_a_large_body_is_read():
    body = b"\n".join([RECORD] * 20_000)
    _, gaps = asyncio.run(gaps_while(multirecord.answer(body, work(Triton(), in_flight=16))))
    assert len(gaps) > 20
    assert max(gaps) < 0.25  # slices of a few milliseconds (generous: this machine is shared)


def test_a_body_that_cannot_fit_the_memory_free_is_413_before_any_record_is_read(monkeypatch):
    monkeypatch.setattr(cgroups, "available_memory", lambda group: 16 << 20)
    read_at_all = []

    async def reading(line: bytes | bytearray) -> Inference:
        read_at_all.append(line)
        return read(line, None)

    how = work(Triton())
    how = multirecord.Work(reading, *(getattr(how, field) for field in ("rules", "model", "send", "to_answer")),
                           how.error_lines, how.in_flight)  # fmt: skip
    with pytest.raises(PayloadTooLarge) as caught:
        asyncio.run(multirecord.answer(b"{}\n" * 200_000, how))
    assert caught.value.status == 413
    assert caught.value.message.startswith("this body (200000 records) needs about ")
    assert caught.value.message.endswith("and the container has 16 MiB free: send smaller mini-batches")
    assert read_at_all == []
