"""A batch transform job run on this machine, as SageMaker runs one: before paying for the real one.

SageMaker's side of the job, against a `serve` on loopback (or any container URL). The job is
:class:`~smtriton.aws.batch_job.BatchJob`, `smtriton transform`'s: the same flags, defaults and checks.
It asks ``GET /execution-parameters`` and takes the job's settings first, then the container's answer,
then SageMaker's defaults (``MaxPayloadInMB`` 6, ``MaxConcurrentTransforms`` 1, one record a request);
it splits every file under the input by line (``SplitType=Line``; ``None``, the default: a file is one
request), packs as many whole lines as fit ``MaxPayloadInMB`` into one request with ``MultiRecord`` (one
line with ``SingleRecord``), keeps ``MaxConcurrentTransforms`` requests in flight, retries a request that
fails with a 5xx or no answer, and writes ``<output>/<file>.out``, the answers in order, each ended by a
newline (``AssembleWith=Line``). A file with a failed request gets no output, and the job fails, as
SageMaker's does; the other files go on, so that one run shows every failure. A failure is named by the
line of its file: the record the container's ``line N of M`` names, else the request's lines. An answer
line that is an error (``{"error": ...}``, serve's ``SMTRITON_FAILED_RECORD=error-line``) counts its
record as failed, though the output keeps it, as SageMaker's would.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

from smtriton.aws.batch_job import MIB, BatchJob, Plan
from smtriton.errors import ToolUsageError

DEFAULT_TIMEOUT_S = 600.0  # ModelClientConfig's InvocationsTimeoutInSeconds
DEFAULT_RETRIES = 3  # ModelClientConfig's InvocationsMaxRetries
RETRY_PAUSE_S = 0.5
SHOWN_FAILURES = 10
# A failed request of several records, as serve says it: the record (its line in the request) that failed.
_RECORD_FAILED = re.compile(r"^line (\d+) of (\d+): ")
# The list of bodies serve adds to a refusal of a single request: said once in the docs, not per failure.
_ACCEPTED_BODIES = "; serve takes "
_ERROR_LINE = b'{"error":'


def input_files(source: Path) -> list[tuple[Path, Path]]:
    """Every file under ``source`` (or ``source`` itself), with the name its output takes after it."""
    if source.is_file():
        return [(source, Path(source.name))]
    if not source.is_dir():
        raise ToolUsageError(f"{source} does not exist")
    files = [(path, path.relative_to(source)) for path in sorted(source.rglob("*")) if path.is_file()]
    if not files:
        raise ToolUsageError(f"{source} holds no files to transform")
    return files


@dataclass(frozen=True)
class MiniBatch:
    """One request of a file: its lines ``first``..``first + records - 1`` (1-based), and its body;
    ``too_large``: a single line past the payload limit, which SageMaker refuses to send."""

    first: int
    records: int
    body: bytes
    too_large: bool = False


def count_records(path: Path, split_type: str) -> int:
    """The records a file holds: its lines (a last line without a newline counts), or 1 unsplit."""
    if split_type != "Line":
        return 1
    count, last = 0, b"\n"
    with path.open("rb") as file:
        while chunk := file.read(MIB):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


def mini_batches(path: Path, split_type: str, strategy: str, payload_bytes: int | None) -> Iterator[MiniBatch]:
    """The requests SageMaker makes of a file, in order."""
    if split_type != "Line":
        body = path.read_bytes()
        yield MiniBatch(1, 1, body, payload_bytes is not None and len(body) > payload_bytes)
        return
    lines: list[bytes] = []
    size, first = 0, 1
    with path.open("rb") as file:
        for number, line in enumerate(file, 1):
            if payload_bytes is not None and len(line) > payload_bytes:
                if lines:
                    yield MiniBatch(first, len(lines), b"".join(lines))
                yield MiniBatch(number, 1, line, too_large=True)
                lines, size, first = [], 0, number + 1
                continue
            full = payload_bytes is not None and size + len(line) > payload_bytes
            if lines and (strategy != "MultiRecord" or full):
                yield MiniBatch(first, len(lines), b"".join(lines))
                lines, size, first = [], 0, number
            lines.append(line)
            size += len(line)
    if lines:
        yield MiniBatch(first, len(lines), b"".join(lines))


@dataclass
class Summary:
    """What a job did: records and requests sent, its failures (the first :data:`SHOWN_FAILURES`, one
    line each), how long it took. ``failed_records`` counts the records of failed requests and those
    answered with an error line (``error_lines``, which the output keeps)."""

    records: int = 0
    requests: int = 0
    failed_records: int = 0
    error_lines: int = 0
    files: int = 0
    failed_files: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)
    unshown: int = 0  # failures past the first SHOWN_FAILURES

    def fail(self, failure: str) -> None:
        if len(self.failures) < SHOWN_FAILURES:
            self.failures.append(failure)
        else:
            self.unshown += 1

    @property
    def records_per_second(self) -> float | None:
        """Records answered (not failed) a second; None when none was."""
        answered = self.records - self.failed_records
        return answered / self.seconds if answered > 0 and self.seconds > 0 else None


class _Output:
    """One input file's output: the answers written in order as they come, kept only when all came."""

    def __init__(self, path: Path, assemble_lines: bool) -> None:
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self.assemble_lines = assemble_lines
        self.expected: int | None = None  # mini-batches, once the file is read to its end
        self.waiting: dict[int, bytes] = {}
        self.written = 0
        self.failed = False
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = self.partial.open("wb")

    def answer(self, index: int, body: bytes | None) -> None:
        """The answer to mini-batch ``index`` (None: it failed)."""
        if body is None:
            self.failed = True
        if self.failed or body is None:
            self._finish()
            return
        if self.assemble_lines and not body.endswith(b"\n"):
            body += b"\n"
        self.waiting[index] = body
        while self.written in self.waiting:
            self.file.write(self.waiting.pop(self.written))
            self.written += 1
        self._finish()

    def read_all(self, count: int) -> None:
        self.expected = count
        self._finish()

    def _finish(self) -> None:
        if self.file.closed:
            return
        if self.failed:
            self.file.close()
            self.partial.unlink(missing_ok=True)
        elif self.expected is not None and self.written == self.expected:
            self.file.close()
            self.partial.replace(self.path)


Progress = Callable[[int], None]  # called with the records of each mini-batch done


async def execution_parameters(session: aiohttp.ClientSession, url: str) -> dict[str, object] | None:
    """The container's answer to ``GET /execution-parameters`` (None when it has no such route)."""
    try:
        async with session.get(f"{url}/execution-parameters") as response:
            if response.status != 200:
                return None
            answer = await response.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


async def run_job(
    url: str,
    job: BatchJob,
    files: list[tuple[Path, Path]],
    output: Path,
    plan: Plan,
    progress: Progress = lambda records: None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    retries: int = DEFAULT_RETRIES,
) -> Summary:
    """Run the job's requests against the container at ``url``; outputs under ``output``."""
    summary = Summary(files=len(files))
    failed_files: set[Path] = set()
    queue: asyncio.Queue[tuple[Path, _Output, int, MiniBatch] | None] = asyncio.Queue(maxsize=2 * plan.concurrency)
    headers = {"Content-Type": job.content_type}
    if job.accept:
        headers["Accept"] = job.accept
    by_line = job.split_type == "Line"
    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:

        async def produce() -> None:
            for path, name in files:
                out = _Output(output / name.with_name(name.name + ".out"), by_line)
                count = 0
                for batch in mini_batches(path, job.split_type, plan.strategy, plan.payload_bytes):
                    await queue.put((name, out, count, batch))
                    count += 1
                out.read_all(count)
            for _ in range(plan.concurrency):
                await queue.put(None)

        async def work() -> None:
            while (item := await queue.get()) is not None:
                name, out, index, batch = item
                body: bytes | None = None
                failure: str | None = None
                if batch.too_large:
                    failure = f"{len(batch.body)} bytes, more than MaxPayloadInMB allows ({plan.payload_bytes} bytes)"
                else:
                    body, failure = await _post(session, url, batch.body, headers, retries)
                    summary.requests += 1
                out.answer(index, body)
                summary.records += batch.records
                if failure is not None:
                    failed_files.add(name)
                    summary.failed_records += batch.records
                    summary.fail(f"{name}: {_where(batch, failure, by_line)}")
                elif body is not None and _ERROR_LINE in body:
                    _count_error_lines(summary, name, batch, body)
                progress(batch.records)

        await asyncio.gather(produce(), *(work() for _ in range(plan.concurrency)))
    summary.seconds = time.perf_counter() - started
    summary.failed_files = len(failed_files)
    return summary


def _where(batch: MiniBatch, failure: str, by_line: bool) -> str:
    """``line L: failure``, L the line of the file: the record the container names (``line N of M``, N
    of the request's M), else the request's lines."""
    last = batch.first + batch.records - 1
    lines = f"line {batch.first}" if last == batch.first else f"lines {batch.first}-{last}"
    status, _, message = failure.partition(" ")
    named = _RECORD_FAILED.match(message) if status.isdigit() else None
    if named is not None:
        record, total = int(named.group(1)), int(named.group(2))
        if 1 <= record <= total and (total == batch.records or not by_line):
            request = lines if by_line else "the whole file"
            return f"line {batch.first + record - 1} (its request: {request}): {status} {message[named.end() :]}"
    return f"{lines}: {failure}"


def _count_error_lines(summary: Summary, name: Path, batch: MiniBatch, body: bytes) -> None:
    """Count an answer's error lines (``{"error": ...}`` in a record's place) as failed records."""
    found = 0
    for index, line in enumerate(body.split(b"\n")):
        if not line.startswith(_ERROR_LINE):
            continue
        try:
            said = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(said, dict) and len(said) == 1 and isinstance(said.get("error"), str):
            found += 1
            summary.fail(f"{name}: line {batch.first + index}: error line: {said['error']}")
    failed = min(found, batch.records)
    summary.failed_records += failed
    summary.error_lines += failed


async def _post(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], retries: int
) -> tuple[bytes | None, str | None]:
    """POST one mini-batch: ``(answer, None)``, or ``(None, why it failed)`` after the retries."""
    failure = ""
    for attempt in range(retries + 1):
        if attempt:
            await asyncio.sleep(RETRY_PAUSE_S)
        try:
            async with session.post(f"{url}/invocations", data=body, headers=headers) as response:
                answer = await response.read()
                if response.status == 200:
                    return answer, None
                failure = f"{response.status} {_error_text(answer, headers['Content-Type'])}"
                if response.status < 500:
                    break  # the request's fault: SageMaker does not retry it either
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            failure = f"no answer ({exc.__class__.__name__}{': ' + str(exc) if str(exc) else ''})"
    return None, failure


def _error_text(answer: bytes, content_type: str) -> str:
    """The container's error message: the ``error`` of a JSON answer, else the start of the answer;
    without the list of every body serve takes, the content type the job sent instead."""
    try:
        message = orjson.loads(answer).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    text = message if isinstance(message, str) else answer[:500].decode("utf-8", "replace")
    head, cut, _ = text.partition(_ACCEPTED_BODIES)
    return f"{head} (sent as {content_type})" if cut else text
