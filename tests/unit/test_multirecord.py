"""Bodies of several records (batch transform's mini-batches): which bodies are read so, how they split
into records, the bound on records in flight, and the answer, one line a record in order, a failing
record failing the whole request by its line or written as an error line in its place."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import orjson
import pytest

from smtriton.serve.dataplane import multirecord
from smtriton.serve.dataplane.answers import to_sagemaker
from smtriton.serve.dataplane.multirecord import Failure, RecordFailed
from smtriton.serve.dataplane.reading import Inference, read
from smtriton.serve.errors import BadRequest, NotReady, ServeError
from smtriton.serve.triton.client import UpstreamResponse

RECORD = b'{"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"FP32","data":[1,2]}]}'
BJ = "application/vnd.sagemaker-triton.binary+json;json-header-size=10"


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


def test_records_are_lines_and_the_blank_lines_that_end_a_body_are_none():
    assert multirecord.split_lines(b"a\r\nb\n\nc\n\n \n") == [b"a", b"b", b"", b"c"]
    assert multirecord.split_lines(bytearray(b"a\nb")) == [bytearray(b"a"), bytearray(b"b")]
    assert multirecord.split_lines(b"\n\n") == []


def answer_of(body: bytes) -> UpstreamResponse:
    return UpstreamResponse(200, "application/json", None, body)


def failed(status: int, message: str) -> UpstreamResponse:
    return UpstreamResponse(status, "application/json", None, orjson.dumps({"error": message}))


async def read_line(line: bytes | bytearray) -> Inference:
    return read(line, None)


def echo(outcomes: dict[int, UpstreamResponse | ServeError] | None = None):
    """A runner answering each record with its own request, but the outcomes given by record index."""
    seen: list[Sequence[Inference]] = []

    async def run(triton_name: str, inferences: Sequence[Inference]) -> list[multirecord.Outcome]:
        seen.append(inferences)
        return [(outcomes or {}).get(i, answer_of(bytes(inf.body))) for i, inf in enumerate(inferences)]

    return run, seen


def answer(lines: list[bytes], run, error_lines: bool = False):
    return asyncio.run(multirecord.answer(lines, read_line, run, "m", to_sagemaker, error_lines))


def test_the_answer_is_one_line_a_record_in_order_and_one_run_for_the_body():
    records = [RECORD.replace(b"[1,2]", f"[{i},{i}]".encode()) for i in range(5)]
    run, seen = echo()
    reply = answer(records, run)
    assert (reply.status, reply.content_type) == (200, "application/jsonlines")
    assert reply.body == b"".join(r + b"\n" for r in records)
    assert [len(inferences) for inferences in seen] == [5]


def test_a_record_triton_refuses_fails_the_request_naming_its_line_and_keeping_its_status():
    run, _ = echo({2: failed(400, "unexpected inference input 'NOPE'")})
    with pytest.raises(RecordFailed) as caught:
        answer([RECORD] * 4, run)
    assert caught.value.status == 400
    assert caught.value.message == "line 3 of 4: unexpected inference input 'NOPE'"


def test_a_record_that_cannot_be_read_fails_before_anything_reaches_triton():
    run, seen = echo()
    with pytest.raises(RecordFailed, match="line 2 of 3: failed to parse the request JSON buffer"):
        answer([RECORD, b"{not json", RECORD], run)
    with pytest.raises(RecordFailed, match="line 2 of 3: the line is empty"):
        answer([RECORD, b"  ", RECORD], run)
    assert seen == []


def test_error_lines_keep_the_alignment_and_the_first_failure_in_order_is_named():
    run, _ = echo({0: failed(400, "bad"), 2: NotReady("Triton is restarting")})
    with pytest.raises(RecordFailed, match="line 1 of 4: bad"):
        answer([RECORD] * 4, run)
    run, _ = echo({1: failed(500, "the model broke")})
    reply = answer([RECORD, RECORD, b"{no", RECORD], run, error_lines=True)
    lines = reply.body.split(b"\n")
    assert reply.status == 200
    assert len(lines) == 5  # four lines, each ended by a newline
    assert lines[-1] == b""
    assert [lines[0], lines[3]] == [RECORD, RECORD]  # the third record failed its reading: the run has three
    assert orjson.loads(lines[1]) == {"error": "the model broke"}
    assert orjson.loads(lines[2])["error"].startswith("failed to parse the request JSON buffer")


@pytest.mark.parametrize("status", [503, 504, 507])
def test_the_servers_state_is_never_an_error_line(status):
    run, _ = echo({1: failed(status, "not now")})
    with pytest.raises(RecordFailed) as caught:
        answer([RECORD] * 3, run, error_lines=True)
    assert (caught.value.status, caught.value.message) == (status, "line 2 of 3: not now")


def test_a_body_without_records_and_a_binary_answer_are_refused_in_words():
    run, _ = echo()
    with pytest.raises(BadRequest, match="holds no records"):
        answer([], run)
    binary = UpstreamResponse(200, "application/octet-stream", 2, b"{}xx")
    line = multirecord.line_of(binary, to_sagemaker)
    assert isinstance(line, Failure)
    assert "binary_data_output" in line.message


def test_an_answer_written_over_lines_becomes_one_line():
    assert multirecord.line_of(answer_of(b'{"a":\n 1}'), to_sagemaker) == b'{"a":1}'


def test_records_run_alone_at_most_bound_at_once_and_answer_in_order():
    in_flight = 0
    most = 0

    async def infer(triton_name: str, inference: Inference) -> UpstreamResponse:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001 * (len(inference.body) % 3))
        in_flight -= 1
        if inference.body == b"x" * 7:
            raise NotReady("gone")
        return answer_of(bytes(inference.body))

    bodies = [b"x" * n for n in range(1, 30)]
    run = multirecord.concurrently(infer, 4)
    outcomes = asyncio.run(run("m", [Inference(b, None, {}) for b in bodies]))
    assert most == 4
    assert isinstance(outcomes[6], NotReady)
    assert [o.body for o in outcomes if isinstance(o, UpstreamResponse)] == [b for b in bodies if len(b) != 7]


def test_through_a_merging_step_each_record_gets_its_answer_or_error_and_a_bug_is_raised():
    seen: list[int] = []

    async def infer_all(triton_name: str, inferences: Sequence[Inference], bound: int) -> list:
        seen.append(bound)
        return [answer_of(b"{}"), NotReady("restarting")][: len(inferences)]

    run = multirecord.through(infer_all, 6)
    outcomes = asyncio.run(run("m", [Inference(b"{}", None, {})] * 2))
    assert seen == [6]
    assert outcomes[0] == answer_of(b"{}")
    assert isinstance(outcomes[1], NotReady)

    async def broken(triton_name: str, inferences: Sequence[Inference], bound: int) -> list:
        return [KeyError("a bug")]

    with pytest.raises(KeyError, match="a bug"):
        asyncio.run(multirecord.through(broken, 1)("m", [Inference(b"{}", None, {})]))
