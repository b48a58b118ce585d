"""The answer of a body of several records (JSON Lines, CSV rows): a line a record, in order, in one buffer.

A body's records reach Triton a bounded number of requests at a time (:func:`run_window`), and their
answers come back out of order; each line is written into the answer as soon as the lines before it are,
so the answer is held once, not as a list of lines and then joined. A record that fails fails the whole
request with its status and an error naming its line (the job fails loudly, as SageMaker expects): from
then on nothing more is sent. With error lines (``SMTRITON_FAILED_RECORD=error-line``) it becomes an
``{"error": ...}`` line in its place, so that the output keeps its alignment, except for the failures that
are the server's state rather than the record's (503, 504, 507), which still fail the request so SageMaker
retries. An error line says the record's error in at most :data:`ERROR_CHARS` characters, never the help
text a single request's refusal adds: a body of many bad records is answered in a few dozen bytes a line.

What a body's work will hold is compared with the memory the container has free before any of it is done
(:func:`check_room`): a body that cannot fit is refused with 413, as a large single request is, rather
than the OOM killer choosing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass

import orjson

from smtriton.serve.dataplane.reading import codec
from smtriton.serve.dataplane.request import Reply
from smtriton.serve.errors import PayloadTooLarge, ServeError, error_body
from smtriton.serve.host import cgroups
from smtriton.serve.triton.client import UpstreamResponse

# Failures that say the server cannot answer now, not that the record is wrong: never written as a line.
RETRYABLE = frozenset({503, 504, 507})
# The longest message an error line (or a failing record's error) carries: the answer of a body of bad
# records grows with its records, not with what is said about them.
ERROR_CHARS = 200
_HELP = f"; {codec.ACCEPTED_BODIES}"
_LINES_AT_ONCE = 4096  # lines written in one step (a few milliseconds at most)

# One record's answer from Triton, or why it got none.
Outcome = UpstreamResponse | ServeError


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


def failure(status: int, message: str) -> Failure:
    """A record's failure, its message said short: without the help a single request's refusal adds (the
    request is a line; its error says what is wrong with it), and cut at :data:`ERROR_CHARS`."""
    message = message.replace(_HELP, "")
    if len(message) > ERROR_CHARS:
        message = message[: ERROR_CHARS - 1] + "…"
    return Failure(status, message)


def fails_the_request(line: Failure, error_lines: bool) -> bool:
    """Whether a record's failure fails the whole request rather than becoming an error line."""
    return not error_lines or line.status in RETRYABLE


def error_message(payload: bytes) -> str:
    """The message of an ``{"error": ...}`` body."""
    try:
        message = orjson.loads(payload).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    return message if isinstance(message, str) else payload.decode("utf-8", "replace") or "inference failed"


class AnswerBuffer:
    """The answer of a body of ``total`` records, written in order as the records' lines come: a line
    ``put`` before the lines ahead of it waits until they are written. ``known`` holds a record's
    :class:`Failure` where it was known before anything was sent (its error line is written in its turn)."""

    def __init__(self, total: int, error_lines: bool, known: Sequence[object] = ()) -> None:
        self.total = total
        self.error_lines = error_lines
        self.known = known
        self.buffer = bytearray()
        self.written = 0
        self.waiting: dict[int, Line] = {}
        self.failed: tuple[int, Failure] | None = None  # the request's failure: its first failing record
        self._error_lines: dict[Failure, bytes] = {}  # a failure shared by many records is encoded once
        self._open = asyncio.Event()  # shut while a request that failed is looked into
        self._open.set()
        self._holds = 0

    @property
    def stopped(self) -> bool:
        """Whether the request has failed: nothing more is sent."""
        return self.failed is not None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Nothing more is sent meanwhile (:meth:`turn` waits): while a merged request that failed is sent
        again a record at a time, to learn whether a record of it fails the request."""
        self._holds += 1
        self._open.clear()
        try:
            yield
        finally:
            self._holds -= 1
            if not self._holds:
                self._open.set()

    async def turn(self) -> None:
        """Wait until requests may be sent (:meth:`held`)."""
        await self._open.wait()

    def put(self, index: int, line: Line) -> None:
        """Record ``index``'s line (0-based), written once every line before it is."""
        if isinstance(line, Failure) and fails_the_request(line, self.error_lines):
            if self.failed is None or index < self.failed[0]:
                self.failed = (index, line)
            return
        self.waiting[index] = line
        self._flush(_LINES_AT_ONCE)

    async def finish(self) -> None:
        """Write what is left in order, a slice at a time, the event loop served between them."""
        while self.written < self.total:
            before = self.written
            self._flush(_LINES_AT_ONCE)
            if self.written == before:
                return  # a line is missing: its record failed the request
            await asyncio.sleep(0)

    def _flush(self, most: int) -> None:
        """Write up to ``most`` of the lines that are next in order."""
        known, waiting, buffer = self.known, self.waiting, self.buffer
        end = min(self.total, self.written + most)
        while self.written < end:
            line = waiting.pop(self.written, None)
            if line is None:
                found = known[self.written] if self.written < len(known) else None
                if not isinstance(found, Failure):
                    return
                line = found
            if isinstance(line, Failure):
                encoded = self._error_lines.get(line)
                if encoded is None:
                    encoded = self._error_lines[line] = error_body(line.message)
                line = encoded
            buffer += line
            buffer += b"\n"
            self.written += 1

    def reply(self, content_type: str) -> Reply:
        """The answer, every line ended by a newline; the request's failure raised instead."""
        if self.failed is not None:
            index, line = self.failed
            raise RecordFailed(index + 1, self.total, line)
        assert self.written == self.total, f"{self.written} of {self.total} lines written"
        return Reply(200, content_type, self.buffer)


async def run_window(
    jobs: Iterator[Callable[[], Awaitable[None]]],
    bound: int,
    stopped: Callable[[], bool],
    turn: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run ``jobs`` in their order, at most ``bound`` at once, each taken when a place is free (so that a body
    of many makes them as it goes, not all at once) and once ``turn()`` allows; none is taken once
    ``stopped()``. A job that raises (a bug) stops the others."""

    async def worker() -> None:
        while True:
            if turn is not None:
                await turn()
            if stopped():
                return
            job = next(jobs, None)  # shared: each worker takes the next job not yet taken
            if job is None:
                return
            await job()

    tasks = [asyncio.ensure_future(worker()) for _ in range(bound)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


def check_room(what: str, needed: int) -> None:
    """413 when a body's work, about ``needed`` bytes, cannot fit in the memory the container has free."""
    free = cgroups.available_memory(cgroups.memory_group())
    if free is not None and needed > free:
        raise PayloadTooLarge.saying(
            f"this body ({what}) needs about {needed >> 20} MiB of memory to read and answer, and the "
            f"container has {free >> 20} MiB free: send smaller mini-batches"
        )
