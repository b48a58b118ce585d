"""The answer of a body of records: its lines written in order into one buffer as they come, a failure
failing the request at its first failing record (or written as a short error line), and the window that
keeps a bounded number of a body's requests in flight, taking no more once the request has failed."""

from __future__ import annotations

import asyncio

import pytest

from smtriton.serve.dataplane.reading import codec
from smtriton.serve.dataplane.records.record_answers import (
    ERROR_CHARS,
    AnswerBuffer,
    Failure,
    RecordFailed,
    failure,
    run_window,
)


def test_lines_are_written_in_order_as_they_come_each_held_only_until_its_turn():
    out = AnswerBuffer(4, error_lines=False)
    out.put(2, b"c")
    out.put(1, b"b")
    assert out.buffer == b""
    assert sorted(out.waiting) == [1, 2]
    out.put(0, b"a")
    assert (out.buffer, out.waiting) == (b"a\nb\nc\n", {})
    out.put(3, b"d")
    assert out.reply("application/jsonlines").body == b"a\nb\nc\nd\n"


def test_failures_known_before_anything_was_sent_are_written_in_their_turn_encoded_once():
    bad = Failure(400, "the record has no 'inputs' array")
    known: list[object] = [None, bad, bad, None] + [bad] * 10_000
    out = AnswerBuffer(len(known), error_lines=True, known=known)
    out.put(3, b"d")
    assert out.buffer == b""
    out.put(0, b"a")
    asyncio.run(out.finish())
    lines = bytes(out.reply("application/jsonlines").body).split(b"\n")
    assert lines[:4] == [b"a", b'{"error":"the record has no \'inputs\' array"}', lines[1], b"d"]
    assert len(lines) == len(known) + 1
    assert len(out._error_lines) == 1


def test_the_request_fails_at_its_first_failing_record_and_stops():
    out = AnswerBuffer(5, error_lines=False)
    out.put(0, b"a")
    out.put(3, Failure(500, "later"))
    assert out.stopped
    out.put(1, Failure(400, "first"))
    with pytest.raises(RecordFailed) as caught:
        out.reply("application/jsonlines")
    assert (caught.value.status, caught.value.message) == (400, "line 2 of 5: first")
    retried = AnswerBuffer(2, error_lines=True)
    retried.put(1, Failure(503, "Triton is restarting"))  # the server's state: never an error line
    assert retried.stopped


def test_a_failure_says_its_error_without_the_help_of_a_single_requests_refusal_and_short():
    said = failure(400, f"failed to parse the request JSON buffer: Expecting value at 1; {codec.ACCEPTED_BODIES}")
    assert said == Failure(400, "failed to parse the request JSON buffer: Expecting value at 1")
    assert len(failure(500, "x" * 1000).message) == ERROR_CHARS


def test_the_window_runs_a_bounded_number_of_jobs_made_as_it_goes_and_none_once_stopped():
    made: list[int] = []
    ran: list[int] = []
    in_flight = most = 0
    stopped = False

    async def job(index: int) -> None:
        nonlocal in_flight, most, stopped
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        ran.append(index)
        stopped = stopped or index == 20

    def jobs():
        for index in range(100):
            made.append(index)
            yield lambda index=index: job(index)

    asyncio.run(run_window(jobs(), 4, lambda: stopped))
    assert most == 4
    assert 20 in ran
    assert len(made) < 30  # made as places freed up, and none taken once stopped


def test_a_job_that_raises_stops_the_others():
    cancelled: list[int] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(1)
            raise

    async def broken() -> None:
        raise KeyError("a bug")

    jobs = iter([slow, broken, slow])
    with pytest.raises(KeyError, match="a bug"):
        asyncio.run(asyncio.wait_for(run_window(jobs, 2, lambda: False), 5))
    assert cancelled == [1]


def test_while_a_failed_merged_request_is_looked_into_no_job_is_taken():
    out = AnswerBuffer(2, error_lines=False)
    started: list[int] = []

    async def job(index: int) -> None:
        started.append(index)
        if index == 0:
            with out.held():
                await asyncio.sleep(0.05)
                assert started == [0]  # the other worker waited for its turn
        out.put(index, b"x")

    asyncio.run(run_window(iter([lambda: job(0), lambda: job(1)]), 2, lambda: out.stopped, out.turn))
    assert started == [0, 1]
    assert out.reply("application/jsonlines").body == b"x\nx\n"
