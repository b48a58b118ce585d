"""The perf command's refusals and its one-line failure, through the `smtriton` group as a user meets them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from smtriton import cli
from smtriton.local.serve_process import free_port

ADDSUB = Path(__file__).resolve().parents[1] / "integration" / "models" / "addsub"
SMTRITON = str(Path(sys.executable).parent / "smtriton")


def perf(*args: str):
    return CliRunner().invoke(cli.app, ["perf", *args])


class _PingOnly(BaseHTTPRequestHandler):
    """Answers GET /ping, hangs up on every request: a server that is there and fails every invocation."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/ping" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads perf's output, not the stand-in's."""


@pytest.fixture
def failing_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PingOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--body-format", "xml"], "--body-format"),
        (["--arrival", "burst"], "--arrival"),
        (["--chart-latency", "p75"], "--chart-latency"),
        (["--concurrency", "0"], "--concurrency"),
        (["--rate", "fast"], "--rate"),
        ([], "--model-dir"),
    ],
)
def test_what_cannot_be_run_is_a_usage_error(args: list[str], message: str):
    result = perf("http://127.0.0.1:1", *args)
    assert result.exit_code == 2
    assert message in result.output


def test_https_urls_are_refused_with_what_to_do_instead():
    result = perf("https://example.com", "--model-dir", str(ADDSUB))
    assert result.exit_code == 2
    assert "endpoint: give its name" in result.output


@pytest.mark.parametrize("target", ["url", "endpoint"])
def test_a_url_where_nothing_listens_is_one_line_before_any_step(target: str):
    """Checked first (GET /ping, or one invocation through boto3): no run of thousands of refused
    connections ending in 'no request succeeded'."""
    url = f"http://127.0.0.1:{free_port()}"
    args = [url] if target == "url" else ["my-endpoint", "--endpoint-url", url]
    result = CliRunner().invoke(cli.app, ["perf", *args, "--model-dir", str(ADDSUB), "--duration", "5"],
                                env=NO_AWS | {"AWS_MAX_ATTEMPTS": "1"})  # fmt: skip
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: nothing answers"), line
    assert url in line, line
    assert "no request succeeded" not in line


def test_a_server_not_ready_is_one_line(failing_server: str):
    result = perf(f"{failing_server}/not-serve", "--model-dir", str(ADDSUB))
    assert result.exit_code == 1, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: GET {failing_server}/not-serve/ping answered 404: no serve ready"), line


def test_a_run_where_nothing_answered_fails_with_the_errors_by_status(tmp_path: Path, failing_server: str):
    out = tmp_path / "r.json"
    result = perf(failing_server, "--model-dir", str(ADDSUB), "--concurrency", "2",
                  "--warmup", "0", "--duration", "0.2", "--json", str(out))  # fmt: skip
    assert result.exit_code == 1
    assert 'no request succeeded (errors by status: {"connection":' in result.output
    (step,) = json.loads(out.read_text())["steps"]  # the results are written all the same
    assert step["ok"] == 0
    assert step["errors"]["connection"] > 0


def test_when_nothing_succeeds_there_is_no_hint_about_the_client(failing_server: str):
    """Every request refused at once keeps the client's one core busy; that is no reason to suspect the client."""
    result = perf(failing_server, "--model-dir", str(ADDSUB), "--concurrency", "1",
                  "--warmup", "0", "--duration", "0.3")  # fmt: skip
    assert result.exit_code == 1
    assert "no request succeeded" in result.output
    assert "client may be the limit" not in result.output
    assert "saturated" not in result.output
    assert "fell behind" not in result.output


# An environment where boto3 finds neither a region nor credentials (no files, no instance role).
NO_AWS = {
    "AWS_REGION": None, "AWS_DEFAULT_REGION": None, "AWS_PROFILE": None, "AWS_ACCESS_KEY_ID": None,
    "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None, "AWS_ENDPOINT_URL": None,
    "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": None,
    "AWS_CONTAINER_CREDENTIALS_FULL_URI": None, "AWS_WEB_IDENTITY_TOKEN_FILE": None,
}  # fmt: skip
KEYS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (NO_AWS | KEYS, "error: no AWS region: pass --region or set AWS_REGION"),
        (NO_AWS | {"AWS_REGION": "us-east-1"}, "error: no AWS credentials found"),
    ],
    ids=["no region", "no credentials"],
)
def test_an_endpoint_without_region_or_credentials_is_one_line(env: dict[str, str | None], line: str):
    result = CliRunner().invoke(cli.app, ["perf", "my-endpoint", "--model-dir", str(ADDSUB), "--concurrency", "1",
                                          "--warmup", "0", "--duration", "0.2"], env=env)  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    (error,) = result.stderr.strip().splitlines()
    assert error.startswith(line), error


def test_aws_region_is_read_as_the_aws_sdks_read_it(failing_server: str):
    """AWS_REGION is enough (botocore alone reads only AWS_DEFAULT_REGION): the run starts, and an
    endpoint URL that fails every request ends in the one failure line, with no client hint."""
    env = NO_AWS | KEYS | {"AWS_REGION": "us-east-1"}
    result = CliRunner().invoke(cli.app, ["perf", "my-endpoint", "--endpoint-url", failing_server,
                                          "--model-dir", str(ADDSUB), "--concurrency", "1", "--warmup", "0",
                                          "--duration", "0.2"], env=env)  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "invoke_endpoint my-endpoint" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith('error: no request succeeded (errors by status: {"connection"'), last
    assert "client may be the limit" not in result.stderr


@pytest.mark.parametrize("columns", [80, 60])
def test_the_table_is_whole_on_a_narrow_terminal(columns: int, failing_server: str):
    """Through the entry point at the terminal width a user has: every header whole, nothing cut off."""
    env = {**os.environ, "COLUMNS": str(columns)}
    done = subprocess.run(
        [SMTRITON, "perf", failing_server, "--model-dir", str(ADDSUB), "--concurrency", "1,16",
         "--warmup", "0", "--duration", "0.3"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    table = done.stderr.split("smtriton perf: ", 1)[1].split("error: ", 1)[0]
    assert "…" not in table
    words = table.split()
    for header in ("step", "req/s", "p50", "p90", "p99", "p99.9", "ms", "errors", "client", "CPU"):
        assert header in words, (header, table)
    assert any(word.startswith("c=16") for word in words)
    assert "connection:" in words


def test_the_live_line_shows_the_current_rate_and_restarts_with_each_step():
    from rich.console import Console
    from rich.live import Live

    from smtriton.perf.cli import LiveLine

    shown: list[str] = []
    live = Live(console=Console(file=None, force_terminal=False))
    live.update = lambda text, **_: shown.append(str(text))  # type: ignore[method-assign]
    line = LiveLine(live)
    line("c=1", "warm-up", 0.5, 100)
    line("c=1", "measure", 1.0, 400)
    line("c=8", "warm-up", 0.25, 50)
    assert shown[0].endswith("100 answered  200/s now")
    assert shown[1].endswith("400 answered  600/s now")
    assert shown[2].startswith("c=8  warm-up")
    assert shown[2].endswith("50 answered  200/s now")
