"""The local batch transform runner as SageMaker's side of a job: the settings it settles on (the job's,
then the container's answer, then SageMaker's defaults), the mini-batches it cuts a file into, and a job
run against a stand-in container: outputs assembled by line in order, the requests in flight bounded,
failures retried and named by file and line, a failed file left without output, error lines counted as
failed records; and the command's report of them."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiohttp import web
from typer.testing import CliRunner

from smtriton.aws.batch_job import BatchJob, Plan
from smtriton.errors import ToolUsageError
from smtriton.local import transform
from smtriton.local.transform import MiniBatch
from smtriton.serve.dataplane.reading import codec

MIB = 1024 * 1024


LINES = BatchJob(content_type="application/jsonlines", split_type="Line")  # a job of JSON Lines split by line


@pytest.mark.parametrize(
    ("job", "answered", "plan"),
    [
        (LINES, {"BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 6, "MaxConcurrentTransforms": 2},
         Plan("MultiRecord", 6 * MIB, 2)),
        (replace(LINES, batch_strategy="SingleRecord", max_payload_mb=1, max_concurrent=5),
         {"BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 6, "MaxConcurrentTransforms": 2},
         Plan("SingleRecord", 1 * MIB, 5)),
        (LINES, None, Plan("SingleRecord", 6 * MIB, 1)),  # no /execution-parameters: SageMaker's own
        (LINES, {"MaxPayloadInMB": 0, "BatchStrategy": "SINGLE_RECORD"}, Plan("SingleRecord", None, 1)),
        (LINES, {"MaxPayloadInMB": "6", "MaxConcurrentTransforms": True}, Plan("SingleRecord", 6 * MIB, 1)),
    ],
)  # fmt: skip
def test_the_jobs_settings_win_then_the_containers_answer_then_sagemakers_defaults(job, answered, plan):
    assert job.settle(answered) == plan


def test_the_container_is_told_only_what_the_job_gives_as_sagemaker_tells_it():
    assert LINES.environment() == {"SAGEMAKER_BATCH": "true"}
    assert replace(LINES, batch_strategy="MultiRecord", max_payload_mb=0, max_concurrent=3).environment() == {
        "SAGEMAKER_BATCH": "true",
        "SAGEMAKER_BATCH_STRATEGY": "MULTI_RECORD",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "0",
        "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "3",
    }


def write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def test_multi_record_packs_whole_lines_up_to_the_payload_and_single_record_sends_one(tmp_path):
    lines = [b"a" * 3 + b"\n", b"b" * 5 + b"\n", b"c" * 2 + b"\n", b"d" * 12 + b"\n", b"e" * 4]
    path = write(tmp_path / "f.jsonl", b"".join(lines))
    assert transform.count_records(path, "Line") == 5
    assert list(transform.mini_batches(path, "Line", "MultiRecord", 10)) == [
        MiniBatch(1, 2, lines[0] + lines[1]),
        MiniBatch(3, 1, lines[2]),
        MiniBatch(4, 1, lines[3], too_large=True),  # 13 bytes: SageMaker cannot send it
        MiniBatch(5, 1, lines[4]),
    ]
    assert [b.records for b in transform.mini_batches(path, "Line", "MultiRecord", None)] == [5]
    assert [b.first for b in transform.mini_batches(path, "Line", "SingleRecord", 100)] == [1, 2, 3, 4, 5]
    assert list(transform.mini_batches(path, "None", "MultiRecord", 100)) == [MiniBatch(1, 1, b"".join(lines))]
    assert transform.count_records(write(tmp_path / "g", b"x\n\n"), "Line") == 2
    assert transform.count_records(write(tmp_path / "e", b""), "Line") == 0


def test_every_file_under_the_input_keeps_its_place_under_the_output(tmp_path):
    write(tmp_path / "in" / "b" / "2.jsonl", b"x")
    write(tmp_path / "in" / "1.jsonl", b"x")
    files = transform.input_files(tmp_path / "in")
    assert [name for _, name in files] == [Path("1.jsonl"), Path("b/2.jsonl")]
    assert transform.input_files(tmp_path / "in" / "1.jsonl") == [(tmp_path / "in" / "1.jsonl", Path("1.jsonl"))]
    with pytest.raises(ToolUsageError, match="does not exist"):
        transform.input_files(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ToolUsageError, match="holds no files"):
        transform.input_files(tmp_path / "empty")


class Container:
    """A stand-in for the serving container: answers each line with its reversal, one line each, slowly
    enough that requests overlap; a line "fail" is refused (400, naming its line in the request, as serve
    does), "flaky" fails once (503), "unparsable" is refused as serve refuses a body it cannot parse
    (with the list of the bodies it takes), and "bad" is answered with an error line in its place."""

    def __init__(self, answered: dict[str, object] | None) -> None:
        self.answered = answered
        self.in_flight = 0
        self.most_in_flight = 0
        self.bodies: list[bytes] = []
        self.flaky_seen = False
        self.url = ""

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Container]:
        app = web.Application()
        app.add_routes([web.get("/execution-parameters", self._parameters), web.post("/invocations", self._invoke)])
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        try:
            yield self
        finally:
            await runner.cleanup()

    async def _parameters(self, request: web.Request) -> web.Response:
        if self.answered is None:
            return web.Response(status=404)
        return web.json_response(self.answered)

    async def _invoke(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.bodies.append(body)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        lines = body.decode().splitlines()
        if "fail" in lines:
            return web.json_response({"error": f"line {lines.index('fail') + 1} of {len(lines)}: refused"}, status=400)
        if "flaky" in lines and not self.flaky_seen:
            self.flaky_seen = True
            return web.json_response({"error": "restarting"}, status=503)
        if "unparsable" in lines:
            error = f"failed to parse the request JSON buffer: Invalid value; {codec.ACCEPTED_BODIES}"
            return web.json_response({"error": error}, status=400)
        answers = ['{"error":"the model refuses bad"}' if line == "bad" else line[::-1] for line in lines]
        return web.Response(body="".join(answer + "\n" for answer in answers).encode())


@contextlib.contextmanager
def in_a_thread(container: Container) -> Iterator[Container]:
    """The stand-in served from a thread of its own, for a command that runs its own event loop."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    stop = loop.create_future()

    async def serve() -> None:
        async with container.running():
            started.set()
            await stop

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    thread.start()
    try:
        assert started.wait(10)
        yield container
    finally:
        loop.call_soon_threadsafe(stop.set_result, None)
        thread.join(10)
        loop.close()


def run_job(tmp_path: Path, job: BatchJob, answered: dict[str, object] | None) -> tuple[transform.Summary, Container]:
    files = transform.input_files(tmp_path / "in")

    async def main() -> tuple[transform.Summary, Container]:
        async with Container(answered).running() as container:
            plan = job.settle(answered)
            done: list[int] = []
            summary = await transform.run_job(container.url, job, files, tmp_path / "out", plan, done.append)
            assert sum(done) == summary.records
            return summary, container

    return asyncio.run(main())


def test_a_job_assembles_each_files_answers_by_line_in_order_with_requests_in_flight_bounded(tmp_path):
    lines = [f"record-{i:03}" for i in range(200)]
    write(tmp_path / "in" / "a.jsonl", "\n".join(lines).encode())  # no newline after the last line
    write(tmp_path / "in" / "b" / "c.jsonl", b"xy\nflaky\n")
    answered = {"BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 1, "MaxConcurrentTransforms": 3}
    job = replace(LINES, max_payload_mb=0, batch_strategy="SingleRecord")
    summary, container = run_job(tmp_path, job, answered)
    assert (summary.records, summary.requests, summary.failed_records) == (202, 202, 0)
    assert len(container.bodies) == 203  # the 503 was retried
    assert container.most_in_flight == 3
    assert (tmp_path / "out" / "a.jsonl.out").read_text().splitlines() == [line[::-1] for line in lines]
    assert (tmp_path / "out" / "b" / "c.jsonl.out").read_text() == "yx\nykalf\n"
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["a.jsonl.out", "b", "c.jsonl.out"]


def test_without_a_strategy_the_containers_multi_record_packs_lines_up_to_its_payload(tmp_path):
    lines = [("r" * 1000) + str(i) for i in range(3000)]  # ~3 MB
    write(tmp_path / "in" / "a.jsonl", "".join(line + "\n" for line in lines).encode())
    summary, container = run_job(tmp_path, LINES, {"BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 1})
    assert summary.requests == len(container.bodies) == 3
    assert all(len(body) <= MIB for body in container.bodies)
    assert (tmp_path / "out" / "a.jsonl.out").read_text().splitlines() == [line[::-1] for line in lines]


def test_a_failed_request_is_named_by_file_and_lines_and_its_file_gets_no_output(tmp_path):
    write(tmp_path / "in" / "bad.jsonl", b"a\nb\nfail\nc\n")
    write(tmp_path / "in" / "good.jsonl", b"a\n")
    write(tmp_path / "in" / "huge.jsonl", b"a\n" + b"x" * (MIB + 1) + b"\n")
    summary, container = run_job(tmp_path, replace(LINES, max_payload_mb=1), {"BatchStrategy": "MULTI_RECORD"})
    assert summary.failures == [
        "bad.jsonl: line 3 (its request: lines 1-4): 400 refused",
        f"huge.jsonl: line 2: {MIB + 2} bytes, more than MaxPayloadInMB allows ({MIB} bytes)",
    ]
    assert (summary.failed_records, summary.failed_files, summary.files) == (5, 2, 3)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["good.jsonl.out"]
    assert [body for body in container.bodies if b"fail" in body] == [b"a\nb\nfail\nc\n"]  # a 4xx is not retried


def test_the_command_refuses_what_sagemaker_would_before_starting_anything(tmp_path):
    from smtriton.cli import app

    write(tmp_path / "in" / "a.jsonl", b"{}\n")
    for args, message in [
        ([], "give exactly one of --model-data"),
        (["--endpoint-url", "http://127.0.0.1:9", "--split-type", "TFRecord"], "TFRecord splitting sends binary"),
        (["--endpoint-url", "http://127.0.0.1:9", "--max-payload-mb", "101"], "must be 0-100"),
        (["--model-data", str(tmp_path / "nope")], "does not exist"),
    ]:
        result = CliRunner().invoke(app, ["local-transform", str(tmp_path / "in"), str(tmp_path / "out"), *args])
        assert result.exit_code == 2, result.output
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert message in line


def test_a_failed_record_is_named_by_its_line_in_the_file_not_in_its_request(tmp_path):
    lines = [("r" * 1000) + str(i) for i in range(3000)]
    lines[2499] = "fail"  # line 2500 of the file, in the third request
    write(tmp_path / "in" / "a.jsonl", "".join(line + "\n" for line in lines).encode())
    job = replace(LINES, max_payload_mb=1)
    summary, _ = run_job(tmp_path, job, {"BatchStrategy": "MULTI_RECORD"})
    batches = list(transform.mini_batches(tmp_path / "in" / "a.jsonl", "Line", "MultiRecord", MIB))
    (hit,) = [b for b in batches if b.first <= 2500 < b.first + b.records]
    assert hit.first > 1
    assert summary.failures == [
        f"a.jsonl: line 2500 (its request: lines {hit.first}-{hit.first + hit.records - 1}): 400 refused"
    ]


def test_error_lines_count_as_failed_records_named_by_their_lines(tmp_path):
    write(tmp_path / "in" / "a.jsonl", b"xy\nbad\nzz\nbad\n")
    write(tmp_path / "in" / "b.jsonl", b"ok\n")
    summary, _ = run_job(tmp_path, replace(LINES, batch_strategy="SingleRecord"), None)
    assert (summary.records, summary.failed_records, summary.error_lines, summary.failed_files) == (5, 2, 2, 0)
    assert summary.failures == [
        "a.jsonl: line 2: error line: the model refuses bad",
        "a.jsonl: line 4: error line: the model refuses bad",
    ]
    assert summary.records_per_second is not None
    # the job completes with them, as SageMaker's would: the output keeps each in its place
    assert (tmp_path / "out" / "a.jsonl.out").read_text().splitlines() == [
        "yx",
        '{"error":"the model refuses bad"}',
        "zz",
        '{"error":"the model refuses bad"}',
    ]


def local_transform(tmp_path: Path, container: Container, *args: str) -> tuple[int, list[str]]:
    from smtriton.cli import app

    with in_a_thread(container):
        argv = ["local-transform", str(tmp_path / "in"), str(tmp_path / "out"), "--endpoint-url", container.url, *args]
        result = CliRunner().invoke(app, argv)
    return result.exit_code, [line for line in result.stderr.splitlines() if line.strip()]


def test_the_report_fails_a_job_whose_records_were_answered_with_error_lines(tmp_path):
    write(tmp_path / "in" / "a.jsonl", b"xy\nbad\nzz\n")
    code, said = local_transform(tmp_path, Container({"BatchStrategy": "MULTI_RECORD"}), "--content-type",
                                 "application/jsonlines", "--split-type", "Line")  # fmt: skip
    assert code == 1
    assert "failed: a.jsonl: line 2: error line: the model refuses bad" in said
    assert any(line.endswith("records/s; 1 failed (1 answered with an error line)") for line in said)
    assert said[-1] == (
        "error: 1 of 3 records failed, 1 as error lines (named above; the output keeps them in their place, as "
        "SageMaker's job would)"
    )
    assert (tmp_path / "out" / "a.jsonl.out").exists()


def test_a_job_whose_every_record_failed_shows_no_throughput(tmp_path):
    write(tmp_path / "in" / "a.jsonl", b"fail\nfail\n")
    code, said = local_transform(tmp_path, Container(None), "--content-type", "application/jsonlines",
                                 "--split-type", "Line", "--batch-strategy", "MultiRecord")  # fmt: skip
    assert code == 1
    (summary,) = [line for line in said if line.startswith("2 records in 1 requests")]
    assert "records/s" not in summary
    assert summary.endswith("; 2 failed")


def test_a_body_serve_cannot_parse_is_said_without_every_content_type_serve_takes(tmp_path):
    write(tmp_path / "in" / "a.json", b"unparsable\n")
    code, said = local_transform(tmp_path, Container(None))
    assert code == 1
    assert (
        "failed: a.json: line 1: 400 failed to parse the request JSON buffer: Invalid value (sent as application/json)"
        in said
    )
    assert not any("serve takes" in line for line in said)
