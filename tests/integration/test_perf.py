"""`smtriton perf` against the real serve and Triton (the addsub Python model): a short sweep through the
command line, its JSON checked, and its request count checked against serve's own /metrics count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.integration.conftest import TEST_MODELS, start_serve
from tests.integration.harness import ServeProcess, free_port, metric_samples

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def served(server: ServeProcess) -> float:
    """Requests serve answered 200 on /invocations, by its own Prometheus counter."""
    return sum(
        value
        for (name, labels), value in metric_samples(server.metrics_url).items()
        if name == "smtriton_requests_total" and ("route", "invocations") in labels and ("status", "200") in labels
    )


def perf(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """The perf command as a user runs it, in a child bounded in time (run() kills it on timeout)."""
    code = "from smtriton.cli import main; main()"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SAGEMAKER_"))} | (env or {})
    return subprocess.run(
        [sys.executable, "-c", code, "perf", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=full_env,
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, test_repository: Path):
    env = {"SMTRITON_METRICS_PORT": str(free_port())}
    proc = start_serve(tmp_path_factory.mktemp("perf"), test_repository, "addsub", env=env)
    yield proc
    proc.stop()


def test_a_concurrency_sweep_reports_what_serve_counted(server: ServeProcess, tmp_path: Path):
    before = served(server)
    out = tmp_path / "run.json"
    result = perf(
        server.url, "--model-dir", str(TEST_MODELS / "addsub"), "--concurrency", "1,8,16",
        "--warmup", "0.5", "--duration", "2", "--json", str(out), "--csv", str(tmp_path / "run.csv"),
        "--chart", str(tmp_path / "chart"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    print(result.stderr)  # the table, for the log: requests/s and client CPU on this machine
    report = json.loads(out.read_text())
    steps = report["steps"]
    assert [s["load"] for s in steps] == [1, 8, 16]
    for step in steps:
        assert step["throughput_rps"] > 0
        assert step["errors"] == {}
        assert step["ok"] == step["requests"] > 0
        lat = step["latency_ms"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"]
        assert 0 < step["client_cpu"] < 1.5
    assert not steps[-1]["client_saturated"], "at c=16 the client, not serve, was the limit"
    # serve's own counter saw exactly the requests perf says it completed (warm-ups and drains included)
    assert served(server) - before == sum(s["sent_total"] for s in steps)
    assert (tmp_path / "run.csv").read_text().splitlines()[0].startswith("mode,load,")
    assert (tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    page = (tmp_path / "chart.html").read_text()
    assert "<svg" in page
    assert "c=8" in page
    assert not any(ref in page for ref in ("src=", "href=", "<script", "@import"))  # self-contained


def test_an_open_loop_holds_its_rate(server: ServeProcess, tmp_path: Path):
    out = tmp_path / "run.json"
    result = perf(
        server.url, "--model-dir", str(TEST_MODELS / "addsub"), "--rate", "50", "--arrival", "poisson",
        "--body-format", "json", "--warmup", "0.5", "--duration", "2", "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (step,) = json.loads(out.read_text())["steps"]
    assert step["mode"] == "rate"
    assert step["errors"] == {}
    assert 25 < step["throughput_rps"] < 100  # a Poisson count over 2 s at 50/s
    assert step["latency_ms"]["p50"] <= step["latency_ms"]["p99"]


def test_an_offered_rate_the_model_cannot_meet_shows_the_true_tail_and_the_shortfall(
    tmp_path: Path, test_repository: Path
):
    """The slow model answers after 0.2 s on each of its 4 instances: 20/s at most. Offered 40/s, the
    queue grows through the step; every request due in the window is measured, the last ones included,
    and the step says it fell short."""
    server = start_serve(tmp_path, test_repository, "slow")
    try:
        out = tmp_path / "run.json"
        rate, warmup, duration, service_s, instances = 40, 0.5, 2.0, 0.2, 4
        result = perf(
            server.url, "--model-dir", str(TEST_MODELS / "slow"), "--rate", str(rate), "--arrival", "fixed",
            "--body-format", "json", "--warmup", str(warmup), "--duration", str(duration), "--json", str(out),
        )  # fmt: skip
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    (step,) = json.loads(out.read_text())["steps"]
    due = [k for k in range(int(rate * (warmup + duration))) if warmup <= k / rate < warmup + duration]
    assert step["requests"] == step["ok"] == len(due)  # every request due in the window, none dropped
    assert step["errors"] == {}
    # The k-th request can end no sooner than ceil((k + 1) / 4) service times after the first began, and was
    # due k / rate after it: the tail cannot be much shorter than these floors' (a margin for the order of
    # service).
    floors = [np.ceil((k + 1) / instances) * service_s - k / rate for k in due]
    assert step["latency_ms"]["p99"] >= np.percentile(floors, 99) * 1000 * 0.9
    assert step["short"]
    assert step["offered_rps"] == pytest.approx(rate, rel=0.05)
    assert step["throughput_rps"] <= instances / service_s * 1.1
    assert "fell short of the offered rate" in result.stderr


def test_an_endpoint_by_name_through_boto3_and_the_local_endpoint(test_repository: Path, tmp_path: Path):
    """An endpoint name goes through boto3's invoke_endpoint (SigV4, the SageMaker Runtime API): here the
    local endpoint's, with --endpoint-url; an endpoint that does not exist comes back as errors by status."""
    from tests.integration.test_local_endpoint import Emulator

    emulator = Emulator(tmp_path, ["--model-data", str(test_repository), "--default-model", "addsub",
                                   "--endpoint-name", "demo"])  # fmt: skip
    env = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        out = tmp_path / "run.json"
        common = ["--endpoint-url", emulator.url, "--model-dir", str(TEST_MODELS / "addsub"), "--concurrency", "2",
                  "--warmup", "0.3", "--duration", "1.5", "--json", str(out)]  # fmt: skip
        result = perf("demo", *common, env=env)
        assert result.returncode == 0, result.stderr
        (step,) = json.loads(out.read_text())["steps"]
        assert step["ok"] > 0
        assert step["errors"] == {}
        assert "invoke_endpoint demo" in json.loads(out.read_text())["description"]
        missing = perf("no-such-endpoint", *common, env=env)
        assert missing.returncode == 1
        (step,) = json.loads(out.read_text())["steps"]
        assert step["ok"] == 0
        assert set(step["errors"]) == {"400"}  # SageMaker answers a missing endpoint with a ValidationError
        assert "no request succeeded" in missing.stderr
    finally:
        emulator.stop()


def test_a_multi_model_endpoint_gets_the_target_model(tmp_path: Path):
    """--target-model reaches the endpoint as TargetModel: the local MME endpoint loads that archive, only it."""
    import requests

    from tests.integration.test_local_endpoint import Emulator, _offset_model, _tar

    archives = tmp_path / "archives"
    archives.mkdir()
    for i in range(2):
        _offset_model(tmp_path / f"src{i}" / "addsub", i)
        _tar(tmp_path / f"src{i}", archives / f"model{i}.tar.gz")
    emulator = Emulator(tmp_path, ["--models", str(archives), "--capacity", "2"])
    env = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        out = tmp_path / "run.json"
        result = perf("local", "--endpoint-url", emulator.url, "--target-model", "model1.tar.gz",
                      "--model-dir", str(TEST_MODELS / "addsub"), "--concurrency", "2", "--warmup", "0.5",
                      "--duration", "1", "--json", str(out), env=env)  # fmt: skip
        assert result.returncode == 0, result.stderr
        (step,) = json.loads(out.read_text())["steps"]
        assert step["ok"] > 0
        assert step["errors"] == {}
        status = requests.get(f"{emulator.url}/_local/models", timeout=5).json()
        assert status["loaded"] == ["model1.tar.gz"]
        assert status["loads"] == 1
    finally:
        emulator.stop()


def test_perf_stops_in_one_line_when_serve_goes_away_mid_run(tmp_path: Path, test_repository: Path):
    """Ctrl-C on serve during c=8: perf stops a few seconds later with one line, instead of counting
    connection errors at full speed for the rest of its steps."""
    import signal
    import time

    gone = start_serve(tmp_path, test_repository, "addsub")
    code = "from smtriton.cli import main; main()"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SAGEMAKER_"))}
    run = subprocess.Popen(
        [sys.executable, "-c", code, "perf", gone.url, "--model-dir", str(TEST_MODELS / "addsub"),
         "--concurrency", "8,16", "--warmup", "0.5", "--duration", "60"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        time.sleep(4)
        gone.send_signal(signal.SIGINT)
        stopped_at = time.monotonic()
        _, stderr = run.communicate(timeout=60)
        took = time.monotonic() - stopped_at
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
        gone.stop()
    assert run.returncode == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: the server stopped answering during c=8: "), stderr
    assert last.endswith("; the run stops here")
    assert took < 20, f"perf went on for {took:.0f} s after serve stopped"
