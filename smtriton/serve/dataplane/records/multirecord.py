"""Bodies that hold several records: batch transform's mini-batches (docs/contract.md §7).

With ``SplitType=Line`` and ``BatchStrategy=MultiRecord`` SageMaker sends as many whole lines of an input
file as fit ``MaxPayloadInMB`` in one POST, and with ``AssembleWith=Line`` it expects one output line per
input line, in order. A body of ``application/jsonlines`` (or ``application/x-ndjson``), and under
``SAGEMAKER_BATCH`` a JSON body of several lines, is such a mini-batch: each line is one record, the KServe
v2 request it is, read as any request is (:mod:`~smtriton.serve.dataplane.reading.inference`); the answer is one
line per record, in order, each the record's KServe v2 response on one line (``application/jsonlines``).
A trailing newline is not a record; an empty line between records is one, and fails.

A body is worked on in two passes, neither holding the event loop longer than a few milliseconds at a
time. First every record is read and checked against its model
(:mod:`~smtriton.serve.dataplane.records.record_check`) before any reaches Triton, and kept as little as its
sending needs: where it lies in the body and, for a record that may merge with others, the text of its
inputs' data (not a tree of Python values a line: 75,000 records held that way took 1.3 GiB). With
``SMTRITON_FAILED_RECORD=fail`` the first record that fails fails the body there, nothing sent. Then the
records go to Triton, those of one model that agree in all but the batch dimension merged into as few
requests as ``max_batch_size`` allows (:func:`~smtriton.serve.dataplane.batching.coalescing.send_merged`), each
answered as it would have been alone, a bounded number of Triton requests at a time, each request made when
it is its turn; the answer is written in order as the lines come
(:mod:`~smtriton.serve.dataplane.records.record_answers`, which also says what a failure does). Each request goes
as a single stateless one does (``Work.send``: :meth:`~smtriton.serve.dataplane.sending.waiting.Waiting.send`), so
a Triton restart costs the body time: the records already answered are kept, and only the requests still
unanswered wait for the next Triton and go again.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

import orjson

from smtriton.serve.dataplane.answers import JSON_LINES, Answer
from smtriton.serve.dataplane.batching import coalescing, mergeable
from smtriton.serve.dataplane.batching.mergeable import MERGED_BYTES_MAX, Part
from smtriton.serve.dataplane.batching.rule import ModelBatching
from smtriton.serve.dataplane.reading import codec, images
from smtriton.serve.dataplane.reading.codec import media_type
from smtriton.serve.dataplane.reading.inference import Inference
from smtriton.serve.dataplane.records import record_check
from smtriton.serve.dataplane.records.record_answers import (
    AnswerBuffer,
    Failure,
    Line,
    Outcome,
    RecordFailed,
    check_room,
    error_message,
    fails_the_request,
    failure,
    run_window,
)
from smtriton.serve.dataplane.records.record_check import BINARY_OUTPUTS, ModelRules
from smtriton.serve.dataplane.request import Reply
from smtriton.serve.errors import BadRequest, ServeError
from smtriton.serve.triton.client import RequestBody, UpstreamResponse

JSON_LINES_TYPES = frozenset({JSON_LINES, "application/x-ndjson"})
NO_RECORDS = "the body holds no records: send one KServe v2 request (JSON) a line"
EMPTY_LINE = "the line is empty: each line of the body is one KServe v2 request"
NOT_AN_OBJECT = "the record is not a JSON object"
_NOT_SPACE = re.compile(rb"\S")
SLICE_S = 0.005  # the event loop is served at least this often while a body's records are read
# What reading a record keeps, about, besides its text (its place, how it merges, its group), and the
# bodies past which that is compared with the memory free before the work.
RECORD_BYTES = 512
ROOM_CHECK_FROM = 64 << 20
_TAIL = 64 << 10  # bytes looked at, from the end, for the last record


@dataclass(frozen=True, slots=True)
class Work:
    """What a body's records need: how one is read, what its model takes and how its requests merge
    (None: each goes alone), how one goes to Triton and how its answer becomes SageMaker's, whether a
    failure is written as an error line, and the Triton requests in flight at most."""

    read: Callable[[RequestBody], Awaitable[Inference]]
    rules: ModelRules
    model: ModelBatching | None
    send: Callable[[Inference], Awaitable[UpstreamResponse]]
    to_answer: Callable[[UpstreamResponse], Answer]
    error_lines: bool
    in_flight: int


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


def records_end(body: RequestBody) -> int:
    """Where the body's last record ends: the blank lines that end a body are no records (0: none)."""
    at = len(body)
    while at > 0:
        start = max(0, at - _TAIL)
        kept = len(bytes(body[start:at]).rstrip())
        if kept:
            return start + kept
        at = start
    return 0


class _Record:
    """A record read and checked, as little of it as its sending needs: where its line lies in the body,
    how it merges (``part``: its data's text, its key shared with the records like it), or the request it
    was made into when that is not its line as it came (``kept``: re-encoded, or parameters added)."""

    __slots__ = ("kept", "part", "start", "stop")

    def __init__(self, start: int, stop: int, part: Part | None, kept: Inference | None) -> None:
        self.start, self.stop, self.part, self.kept = start, stop, part, kept


async def answer(body: RequestBody, work: Work) -> Reply:
    """The answer to a body of records (the module docstring); 400 for a body without any."""
    end = records_end(body)
    if not end:
        raise BadRequest(NO_RECORDS)
    total = body.count(b"\n", 0, end) + 1
    needed = total * RECORD_BYTES + 2 * len(body)
    if needed >= ROOM_CHECK_FROM:
        check_room(f"{total} records", needed)
    reader = _Reader(body, work, total)
    entries = await reader.read_all(end)
    out = AnswerBuffer(total, work.error_lines, entries)
    jobs = (functools.partial(_send, body, entries, group, work, out) for group in reader.groups)
    await run_window(iter(jobs), work.in_flight, lambda: out.stopped, out.turn)
    await out.finish()
    return out.reply(JSON_LINES)


class _Reader:
    """The first pass: every record of a body read and checked, a slice at a time, into what its sending
    needs, and grouped as its requests will merge (a record joins the latest group of its kind that it
    fits, as :func:`~smtriton.serve.dataplane.batching.merging.groups` does)."""

    def __init__(self, body: RequestBody, work: Work, total: int) -> None:
        self.body, self.work, self.total = body, work, total
        self.groups: list[list[int]] = []
        self._latest: dict[Hashable, list[Any]] = {}  # key -> [its latest group, rows, bytes]
        self._kinds: dict[Hashable, tuple[Hashable, Inference]] = {}  # key -> (the key, its data-less request)
        self._failures: dict[Failure, Failure] = {}  # one object for the records that fail alike
        self._last: tuple[RequestBody, _Record | Failure] | None = None  # the line before, as read

    async def read_all(self, end: int) -> list[_Record | Failure | None]:
        body = self.body
        entries: list[_Record | Failure | None] = []
        start = 0
        slice_end = time.perf_counter() + SLICE_S
        for index in range(self.total):
            stop = body.find(b"\n", start, end)
            if stop < 0:
                stop = end
            line_end = stop - 1 if stop > start and body[stop - 1] == 13 else stop  # a \r\n line break
            entry = await self._entry(index, start, line_end)
            entries.append(entry)
            if isinstance(entry, _Record):
                self._group(index, entry)
            start = stop + 1
            if time.perf_counter() >= slice_end:
                await asyncio.sleep(0)
                slice_end = time.perf_counter() + SLICE_S
        return entries

    async def _entry(self, index: int, start: int, stop: int) -> _Record | Failure:
        line = self.body[start:stop]
        last = self._last
        if last is not None and last[0] == line:  # the same text is read and checked the same way
            found = last[1]
            return found if isinstance(found, Failure) else _Record(start, stop, found.part, found.kept)
        try:
            entry: _Record | Failure = await self._record(line, start, stop)
        except ServeError as exc:
            said = failure(exc.status, exc.message)
            if fails_the_request(said, self.work.error_lines):
                raise RecordFailed(index + 1, self.total, said) from None
            entry = self._failures.setdefault(said, said)
        self._last = (line, entry)
        return entry

    async def _record(self, line: RequestBody, start: int, stop: int) -> _Record:
        first = _NOT_SPACE.search(line)
        if first is None:
            raise BadRequest(EMPTY_LINE)
        if first.group() != b"{":
            raise BadRequest(NOT_AN_OBJECT)
        work = self.work
        inference = await work.read(line)
        header = inference.header if inference.complete else inference.whole_header()
        if header is not None:
            record_check.check(header, work.rules, inference.header_length is not None)
        part = mergeable.part(inference, work.model) if work.model is not None else None
        if part is not None:
            return _Record(start, stop, self._slim(part), None)
        if inference.body is line:
            return _Record(start, stop, None, None)
        binary_header = header if inference.header_length else None  # what a binary one's sending reads
        return _Record(start, stop, None, Inference(inference.body, inference.header_length, binary_header))

    def _slim(self, part: Part) -> Part:
        """``part`` without its parsed values: a JSON record's data is its text, and what it says besides
        (names, types, the other dims, outputs, parameters) is its key's, held once for all of its kind."""
        if part.inference.header_length is not None:
            return part  # re-encoded binary: its header holds no data
        kind = self._kinds.get(part.key)
        if kind is None:
            header = part.inference.header
            assert header is not None
            inputs = [{key: value for key, value in spec.items() if key != "data"} for spec in header["inputs"]]
            kind = self._kinds[part.key] = (part.key, Inference(b"", None, {**header, "inputs": inputs}, False))
        key, request = kind
        return Part(request, key, part.batch, part.request_id, part.tensors)

    def _group(self, index: int, record: _Record) -> None:
        part, model = record.part, self.work.model
        if part is None or model is None:
            self.groups.append([index])
            return
        size = record.stop - record.start
        latest = self._latest.get(part.key)
        fits = latest is not None and latest[1] + part.batch <= model.max_batch_size
        if latest is not None and fits and latest[2] + size <= MERGED_BYTES_MAX:
            latest[0].append(index)
            latest[1] += part.batch
            latest[2] += size
            return
        group = [index]
        self.groups.append(group)
        self._latest[part.key] = [group, part.batch, size]


def _request(body: RequestBody, record: _Record) -> Inference:
    """A record's own request: its line as it came, or what it was made into."""
    return record.kept if record.kept is not None else Inference(body[record.start : record.stop], None, None)


async def _send(
    body: RequestBody, entries: list[_Record | Failure | None], group: list[int], work: Work, out: AnswerBuffer
) -> None:
    """One group of records to Triton (merged, or a record alone), each record's line put in the answer."""
    records: list[_Record] = []
    for index in group:
        record = entries[index]
        assert isinstance(record, _Record)
        records.append(record)
    outcomes: list[UpstreamResponse | Exception]
    if len(records) == 1:
        try:
            outcomes = [await work.send(_request(body, records[0]))]
        except ServeError as exc:
            outcomes = [exc]
    else:
        assert work.model is not None
        parts = [record.part for record in records if record.part is not None]
        # With the first failure failing the body, nothing more goes while its rows are looked into.
        again = None if work.error_lines else out.held()
        outcomes = await coalescing.send_merged(
            work.send, parts, work.model, lambda at: _request(body, records[at]), again
        )
    for index, outcome in zip(group, outcomes, strict=True):
        if isinstance(outcome, Exception) and not isinstance(outcome, ServeError):
            raise outcome  # a bug, raised as it would have been for the record alone
        entries[index] = None  # answered: what was kept of it goes
        out.put(index, line_of(outcome, work.to_answer))


def line_of(outcome: Outcome, to_answer: Callable[[UpstreamResponse], Answer]) -> Line:
    """A record's answer line: its KServe v2 JSON response on one line, or its failure."""
    if isinstance(outcome, ServeError):
        return failure(outcome.status, outcome.message)
    status, content_type, payload = to_answer(outcome)
    if status != 200:
        return failure(status, error_message(payload))
    if content_type != codec.JSON:
        return Failure(400, BINARY_OUTPUTS)
    if b"\n" in payload:  # Triton writes compact JSON; a line break would split the record's answer
        payload = orjson.dumps(orjson.loads(payload))
    return payload
