"""Bodies that hold several records: batch transform's mini-batches (docs/contract.md §7).

With ``SplitType=Line`` and ``BatchStrategy=MultiRecord`` SageMaker sends as many whole lines of an input
file as fit ``MaxPayloadInMB`` in one POST, and with ``AssembleWith=Line`` it expects one output line per
input line, in order. A body of ``application/jsonlines`` (or ``application/x-ndjson``), and under
``SAGEMAKER_BATCH`` a JSON body of several lines, is such a mini-batch: each line is one record, the KServe
v2 request it is, read as any request is (:mod:`~smtriton.serve.dataplane.reading`); the answer is one
line per record, in order, each the record's KServe v2 response on one line (``application/jsonlines``).
A trailing newline is not a record; an empty line between records is one, and fails.

The records of a body go to Triton through one call, :data:`RunRecords`: the step that merges records of
one model into fuller Triton requests and splits Triton's answers back, each record answered as it
would have been alone (:func:`through` the upstream's merge, :mod:`smtriton.serve.dataplane.coalescing`;
:func:`concurrently` runs them one by one), a bounded number of Triton requests at a time.

A record that fails fails the whole request with its status and an error naming its line (the job fails
loudly, as SageMaker expects); with ``SMTRITON_FAILED_RECORD=error-line`` it becomes an ``{"error": ...}``
line in its place instead, so that the output keeps its alignment, except for the failures that are the
server's state rather than the record's (503, 504, 507), which still fail the request so SageMaker retries.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import orjson

from smtriton.serve.dataplane import codec, images
from smtriton.serve.dataplane.answers import JSON_LINES, Answer
from smtriton.serve.dataplane.reading import Inference
from smtriton.serve.dataplane.request import Reply
from smtriton.serve.errors import BadRequest, ServeError, error_body
from smtriton.serve.triton.client import RequestBody, UpstreamResponse

JSON_LINES_TYPES = frozenset({JSON_LINES, "application/x-ndjson"})
# Failures that say the server cannot answer now, not that the record is wrong: never written as a line.
RETRYABLE = frozenset({503, 504, 507})
NO_RECORDS = "the body holds no records: send one KServe v2 request (JSON) a line"
EMPTY_LINE = "the line is empty: each line of the body is one KServe v2 request"
_NOT_SPACE = re.compile(rb"\S")

# One record's answer to Triton, or why it got none.
Outcome = UpstreamResponse | ServeError
# The merge step: the records of one body, all for one Triton model -> each record's own outcome, in order.
RunRecords = Callable[[str, Sequence[Inference]], Awaitable[list[Outcome]]]


@dataclass(frozen=True, slots=True)
class Failure:
    """A record that got no answer line: the status and the error it would have got alone."""

    status: int
    message: str


# One line of the answer: the record's answer (without its newline), or its failure.
Line = bytes | Failure


class RecordFailed(ServeError):
    """The first failing record of a body, failing the whole request with its own status."""

    def __init__(self, line: int, total: int, failure: Failure) -> None:
        super().__init__(f"line {line} of {total}: {failure.message}")
        self.status = failure.status


def media_type(content_type: str | None) -> str:
    return (content_type or "").partition(";")[0].strip().lower()


def holds_records(content_type: str | None, body: RequestBody, batch: bool) -> bool:
    """Whether a body is read as several records: JSON Lines always; under batch transform
    (``batch``) also a body read as JSON whose first line is a whole JSON object and is followed by more."""
    media = media_type(content_type)
    if media in JSON_LINES_TYPES:
        return True
    if not batch or media == codec.BINARY_JSON or media in images.IMAGE_TYPES:
        return False
    return several_documents(body)


def several_documents(body: RequestBody) -> bool:
    """Whether ``body`` is JSON documents a line (its first line one whole object, and more lines after
    it), not one document written over several lines."""
    end = body.find(b"\n")
    if end < 0 or _NOT_SPACE.search(body, end + 1) is None:
        return False
    first = body[:end].strip()
    if not (first.startswith(b"{") and first.endswith(b"}")):
        return False
    try:
        orjson.loads(first)
    except orjson.JSONDecodeError:
        return False
    return True


def split_lines(body: RequestBody) -> list[RequestBody]:
    """The records of a body, one a line (``\\r\\n`` taken as a line break too); the blank lines that end
    it are no records."""
    lines = body.split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def through(
    infer_all: Callable[[str, Sequence[Inference], int], Awaitable[list[UpstreamResponse | Exception]]], bound: int
) -> RunRecords:
    """:data:`RunRecords` by a merging step (the upstream's ``infer_all``) that answers each record or the
    error it met, ``bound`` Triton requests at a time; an error that is no request's failure (a bug) is
    raised, as it would have been for the record alone."""

    async def run(triton_name: str, inferences: Sequence[Inference]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for result in await infer_all(triton_name, inferences, bound):
            if isinstance(result, Exception) and not isinstance(result, ServeError):
                raise result
            outcomes.append(result)
        return outcomes

    return run


def concurrently(infer: Callable[[str, Inference], Awaitable[UpstreamResponse]], bound: int) -> RunRecords:
    """:data:`RunRecords` that sends each record alone, ``bound`` at a time, in order."""

    async def run(triton_name: str, inferences: Sequence[Inference]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(inferences)
        indices = iter(range(len(inferences)))

        async def worker() -> None:
            for index in indices:  # shared: each worker takes the next record not yet taken
                try:
                    outcomes[index] = await infer(triton_name, inferences[index])
                except ServeError as exc:
                    outcomes[index] = exc

        await asyncio.gather(*(worker() for _ in range(min(bound, len(inferences)))))
        return [outcome for outcome in outcomes if outcome is not None]

    return run


async def answer(
    lines: Sequence[RequestBody],
    read: Callable[[RequestBody], Awaitable[Inference]],
    run: RunRecords,
    triton_name: str,
    to_answer: Callable[[UpstreamResponse], Answer],
    error_lines: bool,
) -> Reply:
    """The answer to a body of records: each line read (``read``), all run through ``run``, each answer
    mapped (``to_answer``) to its line; a failure as the module says."""
    if not lines:
        raise BadRequest(NO_RECORDS)
    results: list[Line | None] = [None] * len(lines)
    inferences: list[Inference] = []
    where: list[int] = []
    for index, line in enumerate(lines):
        failure: Failure | None = None
        if not line.strip():
            failure = Failure(400, EMPTY_LINE)
        else:
            try:
                inferences.append(await read(line))
                where.append(index)
            except ServeError as exc:
                failure = Failure(exc.status, exc.message)
        if failure is not None:
            if not error_lines or failure.status in RETRYABLE:
                raise RecordFailed(index + 1, len(lines), failure)  # before anything reaches Triton
            results[index] = failure
    outcomes = await run(triton_name, inferences) if inferences else []
    for index, outcome in zip(where, outcomes, strict=True):
        results[index] = line_of(outcome, to_answer)
    return assemble([result for result in results if result is not None], error_lines, JSON_LINES)


def line_of(outcome: Outcome, to_answer: Callable[[UpstreamResponse], Answer]) -> Line:
    """A record's answer line: its KServe v2 JSON response on one line, or its failure."""
    if isinstance(outcome, ServeError):
        return Failure(outcome.status, outcome.message)
    status, content_type, payload = to_answer(outcome)
    if status != 200:
        return Failure(status, error_message(payload))
    if content_type != codec.JSON:
        return Failure(
            400,
            "the record asked for binary outputs (binary_data_output): an answer line carries JSON; "
            "leave binary_data_output out of the records",
        )
    if b"\n" in payload:  # Triton writes compact JSON; a line break would split the record's answer
        payload = orjson.dumps(orjson.loads(payload))
    return payload


def error_message(payload: bytes) -> str:
    """The message of an ``{"error": ...}`` body."""
    try:
        message = orjson.loads(payload).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    return message if isinstance(message, str) else payload.decode("utf-8", "replace") or "inference failed"


def assemble(lines: Sequence[Line], error_lines: bool, content_type: str) -> Reply:
    """One answer line per record, in order, each ended by a newline; the first failure fails the whole
    request unless ``error_lines`` writes it as an ``{"error": ...}`` line (a retryable one never is)."""
    parts: list[bytes] = []
    for number, line in enumerate(lines, 1):
        if isinstance(line, Failure):
            if not error_lines or line.status in RETRYABLE:
                raise RecordFailed(number, len(lines), line)
            line = error_body(line.message)
        parts.append(line)
    parts.append(b"")
    return Reply(200, content_type, b"\n".join(parts))
