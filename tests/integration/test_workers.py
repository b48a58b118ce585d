"""Several front workers over one Triton: one endpoint whichever worker a request reaches.

Every request goes on a fresh connection (``requests`` without a session), so the kernel hands it to
either worker; the access log, one JSON line per request naming its worker, shows that both served.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.integration.conftest import TEST_MODELS, start_serve
from tests.integration.contract_client import json_request, parse
from tests.integration.harness import (
    ClientsUntilStopped,
    ServeProcess,
    alive,
    connection_accepted_by,
    descendants,
    failing_tritonserver,
    free_port,
    metric_samples,
    post_on,
    triton_pids,
    wait_for,
    worker_pids,
    workers_that_answered,
)

pytestmark = pytest.mark.integration

WORKERS = {"SAGEMAKER_MODEL_SERVER_WORKERS": "2", "SMTRITON_ACCESS_LOG": "true"}
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
ADDSUB = json.dumps(json_request({"INPUT0": A, "INPUT1": B})).encode()
ROUNDS = 24  # requests on fresh connections per check: both workers are reached (checked from the log)


def _archive(root: Path, name: str) -> str:
    url = root / name / "model"
    shutil.copytree(TEST_MODELS / "addsub", url)
    return str(url)


def _load(server: ServeProcess, name: str, url: str) -> requests.Response:
    return requests.post(f"{server.url}/models", json={"model_name": name, "url": url}, timeout=120)


def _invoke(server: ServeProcess, name: str) -> requests.Response:
    return requests.post(f"{server.url}/models/{name}/invoke", data=ADDSUB, timeout=60)


@pytest.fixture(scope="module")
def mme(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("workers-mme")
    root = tmp / "models"
    root.mkdir()
    server = start_serve(tmp, None, None, env=WORKERS, args=["--multi-model", "--model-root", str(root)])
    server.root = root
    assert len(worker_pids(server)) == 2
    yield server
    server.stop()


def test_the_mme_life_cycle_agrees_across_workers(mme):
    url = _archive(mme.root, "agree")
    assert _load(mme, "agree", url).status_code == 200
    for _ in range(ROUNDS):  # the moment the load answered, every worker has the model
        assert requests.get(f"{mme.url}/models/agree", timeout=5).json()["modelName"] == "agree"
        assert {"modelName": "agree", "modelUrl": str(Path(url).parent)} in requests.get(
            f"{mme.url}/models", timeout=5
        ).json()["models"]
        r = _invoke(mme, "agree")
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(parse(r).as_numpy("OUTPUT0"), A + B)
    assert workers_that_answered(mme, "/models/agree/invoke") == {1, 2}
    assert requests.delete(f"{mme.url}/models/agree", timeout=60).status_code == 200
    for _ in range(ROUNDS):  # and the moment the unload answered, none has it
        assert _invoke(mme, "agree").status_code == 404
        assert requests.get(f"{mme.url}/models/agree", timeout=5).status_code == 404
        assert "agree" not in {m["modelName"] for m in requests.get(f"{mme.url}/models", timeout=5).json()["models"]}
    assert requests.delete(f"{mme.url}/models/agree", timeout=60).status_code == 404


def test_racing_duplicate_loads_give_one_200_and_one_409(mme):
    for attempt in range(4):
        name = f"race{attempt}"
        url = _archive(mme.root, name)
        barrier = threading.Barrier(2)

        def load(url: str = url, name: str = name, barrier: threading.Barrier = barrier) -> int:
            barrier.wait(10)
            return _load(mme, name, url).status_code

        with ThreadPoolExecutor(2) as pool:
            statuses = sorted(pool.map(lambda _: load(), range(2)))
        assert statuses == [200, 409]
        assert _invoke(mme, name).status_code == 200
        assert requests.delete(f"{mme.url}/models/{name}", timeout=60).status_code == 200


def test_an_unload_waits_for_invokes_running_on_another_worker(mme, tmp_path):
    """Two invokes on each worker (connections pinned to them), all four running in the model (each
    says so when it starts, and takes 2 s), then an unload: it answers only after every invoke did."""
    url = mme.root / "slowmodel" / "model"
    shutil.copytree(TEST_MODELS / "slow", url)
    started = tmp_path / "started"
    started.mkdir()
    model = url / "1" / "model.py"
    source = model.read_text().replace("time.sleep(0.2)", "time.sleep(2.0)")
    source = source.replace(
        "    def execute(self, requests):\n",
        f"    def execute(self, requests):\n        open({str(started)!r} + '/' + str(id(requests)), 'w').close()\n",
    )
    model.write_text(source)
    assert _load(mme, "slowmodel", str(url)).status_code == 200
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [3, 2.0]}]}).encode()
    connections = [connection_accepted_by(mme, pid) for pid in worker_pids(mme) for _ in range(2)]
    with ThreadPoolExecutor(4) as pool:
        invokes = [pool.submit(post_on, c, "/models/slowmodel/invoke", body) for c in connections]
        assert wait_for(lambda: len(list(started.iterdir())) == 4, 30)  # all four are running in the model
        unload = requests.delete(f"{mme.url}/models/slowmodel", timeout=120)
        assert all(f.done() for f in invokes), "the unload answered before the invokes it waits for"
        assert [f.result() for f in invokes] == [200] * 4
    assert unload.status_code == 200
    assert _invoke(mme, "slowmodel").status_code == 404


def test_a_load_refused_for_memory_is_refused_once_and_no_worker_has_it(tmp_path):
    root = tmp_path / "models"
    url = _archive(root, "big")
    server = start_serve(
        tmp_path,
        None,
        None,
        env={**WORKERS, "SMTRITON_MEMORY_RESERVE_BYTES": str(1 << 50)},
        args=["--multi-model", "--model-root", str(root)],
    )
    try:
        assert len(worker_pids(server)) == 2
        for _ in range(4):  # the owner decides each time, whichever worker is asked
            r = _load(server, "big", url)
            assert r.status_code == 507, r.text
            assert "not enough memory" in r.json()["error"]
        for _ in range(ROUNDS):
            assert requests.get(f"{server.url}/ping", timeout=5).status_code == 200
            assert requests.get(f"{server.url}/models", timeout=5).json() == {"models": []}
            assert _invoke(server, "big").status_code == 404
        assert workers_that_answered(server, "/models/big/invoke") == {1, 2}
    finally:
        server.stop()


def test_an_invoke_out_of_memory_is_507_from_every_worker_and_the_endpoint_goes_on(mme):
    url = _archive(mme.root, "greedy")
    (Path(url) / "1" / "model.py").write_text(
        "import triton_python_backend_utils as pb_utils\n\n\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        error = pb_utils.TritonError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
        "        return [pb_utils.InferenceResponse(error=error) for _ in requests]\n"
    )
    assert _load(mme, "greedy", url).status_code == 200
    assert _load(mme, "modest", _archive(mme.root, "modest")).status_code == 200
    try:
        answers = [_invoke(mme, "greedy") for _ in range(ROUNDS)]
        assert {r.status_code for r in answers} == {507}, [r.text for r in answers]
        assert all("out of memory" in r.json()["error"] for r in answers)
        assert workers_that_answered(mme, "/models/greedy/invoke") == {1, 2}
        for _ in range(ROUNDS):  # the verdict was the owner's on that invoke only: the endpoint serves on
            assert requests.get(f"{mme.url}/ping", timeout=5).status_code == 200
            assert _invoke(mme, "modest").status_code == 200
    finally:
        for name in ("greedy", "modest"):
            requests.delete(f"{mme.url}/models/{name}", timeout=60)


def test_every_worker_answers_503_while_triton_cannot_start(tmp_path, test_repository):
    fake = failing_tritonserver(tmp_path)
    repo = tmp_path / "models"
    shutil.copytree(test_repository, repo)
    server = ServeProcess(repo, "addsub", tmp_path / "serve.log", env={**WORKERS, "TRITONSERVER": str(fake)})
    try:
        assert wait_for(lambda: "tritonserver failed to start" in server.log_text(), 30)
        assert wait_for(lambda: server.log_text().count("Application startup complete") == 2, 30)  # both listen
        pings = [requests.get(f"{server.url}/ping", timeout=5) for _ in range(ROUNDS)]
        assert {(r.status_code, r.text) for r in pings} == {(503, pings[0].text)}
        answers = [requests.post(f"{server.url}/invocations", data=ADDSUB, timeout=5) for _ in range(ROUNDS)]
        assert {(r.status_code, r.text) for r in answers} == {(503, answers[0].text)}
        assert "error" in answers[0].json()
        assert workers_that_answered(server, "/invocations") == {1, 2}
        assert server.poll() is None
    finally:
        server.stop()


def test_triton_restarting_restores_every_workers_view_of_the_models(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    server = start_serve(tmp_path, None, None, env=WORKERS, args=["--multi-model", "--model-root", str(root)])
    try:
        assert _load(server, "kept", _archive(root, "kept")).status_code == 200
        (pid,) = triton_pids(server.marker)
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: requests.get(f"{server.url}/ping", timeout=2).status_code == 503, 5)
        server.wait_healthy(120)
        statuses = [_invoke(server, "kept").status_code for _ in range(ROUNDS)]
        assert statuses == [200] * ROUNDS
        assert workers_that_answered(server, "/models/kept/invoke") == {1, 2}
    finally:
        server.stop()


@pytest.fixture
def sme(tmp_path):
    repo = tmp_path / "models"
    shutil.copytree(TEST_MODELS, repo, ignore=shutil.ignore_patterns("__pycache__"))
    port = free_port()
    server = start_serve(tmp_path, repo, "addsub", env={**WORKERS, "SMTRITON_METRICS_PORT": str(port)})
    yield server
    server.stop()


def test_a_sigkilled_worker_is_replaced_and_the_endpoint_keeps_answering(sme):
    first = worker_pids(sme)
    assert len(first) == 2
    os.kill(first[0], signal.SIGKILL)
    killed_at = time.monotonic()
    outcomes: list[tuple[float, int | str]] = []
    while time.monotonic() - killed_at < 3:  # the other worker answers meanwhile
        sent = time.monotonic() - killed_at
        try:
            outcomes.append((sent, requests.post(f"{sme.url}/invocations", data=ADDSUB, timeout=10).status_code))
        except requests.ConnectionError as exc:
            outcomes.append((sent, f"connection: {exc}"))
    # A connection the kernel had queued for the killed worker's own socket dies with it; from the moment
    # the kernel has closed that socket, every new connection goes to the other worker.
    failed = [(at, outcome) for at, outcome in outcomes if outcome != 200]
    assert len(failed) <= 2, failed
    assert all(at < 0.2 for at, _ in failed), failed
    assert len(outcomes) > 20
    assert wait_for(lambda: len(worker_pids(sme)) == 2 and first[0] not in worker_pids(sme), 10)
    assert re.search(rf"worker \d \(pid {first[0]}\) exited with signal SIGKILL", sme.log_text())
    assert wait_for(lambda: "Application startup complete" in sme.log_text().rsplit("SIGKILL", 1)[1], 10)
    for _ in range(ROUNDS):
        assert requests.post(f"{sme.url}/invocations", data=ADDSUB, timeout=10).status_code == 200
    answered = workers_that_answered(sme, "/invocations")
    assert answered == {1, 2}


def test_metrics_add_up_across_workers(sme):
    for _ in range(ROUNDS):
        assert requests.post(f"{sme.url}/invocations", data=ADDSUB, timeout=10).status_code == 200
    for _ in range(3):
        assert requests.post(f"{sme.url}/invocations", data=b"{bad", timeout=10).status_code == 400
    assert workers_that_answered(sme, "/invocations") == {1, 2}
    samples = metric_samples(sme.metrics_url)
    labels = (("model", "addsub"), ("route", "invocations"))
    assert samples[("smtriton_requests_total", (*labels, ("status", "200")))] == ROUNDS
    assert samples[("smtriton_requests_total", (*labels, ("status", "400")))] == 3
    assert samples[("smtriton_request_seconds_count", labels)] == ROUNDS + 3
    assert samples[("smtriton_inflight_requests", (("route", "invocations"),))] == 0


def test_sigterm_under_load_loses_no_request_and_leaves_no_process(tmp_path, test_repository):
    server = start_serve(tmp_path, test_repository, "slow", env=WORKERS)
    assert len(worker_pids(server)) == 2
    processes = descendants(server.pid)  # Triton and its stubs, the fork server, the workers
    clients = ClientsUntilStopped(server.url)
    try:
        clients.start()
        assert wait_for(lambda: clients.results.count("ok") >= 8, 30)  # under load: answers are coming
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        assert server.wait(40) == 0
        assert time.monotonic() - started < 30  # inside SageMaker's grace
        clients.stop()
        assert clients.results.count("ok") >= 8
        assert clients.failures() == []
        assert workers_that_answered(server, "/invocations") == {1, 2}
        assert triton_pids(server.marker) == []
        assert alive(processes) == []
    finally:
        clients.stop()
        server.stop()


def test_a_worker_draining_a_long_request_under_arrivals_closes_its_upstream_pool_within_the_budget(
    tmp_path, test_repository
):
    """At the edge of the stop budget: a request under way that outlasts the whole drain, and a client
    connected whose request has not arrived (the accept grace waits for it to the end). The worker's
    parts (uvicorn's pauses, the grace, the graceful wait, the app's shutdown) fit in its share: it
    cancels the request, closes its upstream pool and exits on its own, before the pool would kill it."""
    # one worker, whose drain is 5 s of the 10
    env = {**WORKERS, "SAGEMAKER_MODEL_SERVER_WORKERS": "1", "SMTRITON_SHUTDOWN_TIMEOUT_S": "10"}
    server = start_serve(tmp_path, test_repository, "tokens", env={**env, "SMTRITON_TRITON_EXIT_TIMEOUT_S": "5"})
    request = {"inputs": [{"name": "N", "shape": [1], "datatype": "INT32", "data": [1500]}]}  # 30 s of tokens
    silent = None
    try:
        (worker,) = worker_pids(server)
        with requests.post(f"{server.url}/invocations", json=request, stream=True, timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(lines)  # under way

            def read_on() -> None:  # until the worker cancels the stream, cut short
                with contextlib.suppress(requests.RequestException):
                    for _ in lines:
                        pass

            threading.Thread(target=read_on, daemon=True).start()
            silent = connection_accepted_by(server, worker)  # arriving: its request never comes
            mark = len(server.log_text())
            started = time.monotonic()
            server.send_signal(signal.SIGTERM)
            assert server.wait(30) == 0
            elapsed = time.monotonic() - started
        log = server.log_text()[mark:]
        assert "did not drain within" not in log, log[-3000:]
        assert "Application shutdown complete" in log  # the app's shutdown ran: the upstream pool closed
        assert elapsed < 10 + 2  # the budget, and Python's own exit
    finally:
        if silent is not None:
            silent.close()
        server.stop()


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (["--workers", "0"], "--workers=0: must be >= 1"),
        (["--workers", "-3"], "--workers=-3: must be >= 1"),
        (["--workers", "two"], "argument --workers: invalid int value: 'two'"),
        ({"SAGEMAKER_MODEL_SERVER_WORKERS": "0"}, "SAGEMAKER_MODEL_SERVER_WORKERS='0': must be >= 1"),
        ({"SAGEMAKER_MODEL_SERVER_WORKERS": "-2"}, "SAGEMAKER_MODEL_SERVER_WORKERS='-2': must be >= 1"),
        ({"SAGEMAKER_MODEL_SERVER_WORKERS": "many"}, "SAGEMAKER_MODEL_SERVER_WORKERS='many': is not an integer"),
    ],
)
def test_a_bad_worker_count_stops_serve_with_one_line(tmp_path, setting, message):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    args = [sys.executable, "-m", "smtriton.serve", "--model-repository", str(TEST_MODELS), "--port", str(free_port())]
    if isinstance(setting, dict):
        env.update(setting)
    else:
        args += setting
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode in (1, 2)
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]  # one line
    assert message in done.stderr


def test_a_second_serve_on_a_port_in_use_stops_with_one_line(sme, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    args = [sys.executable, "-m", "smtriton.serve", "--model-repository", str(TEST_MODELS), "--default-model"]
    args += ["addsub", "--host", "127.0.0.1", "--port", str(sme.port)]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr == f"cannot listen on 127.0.0.1:{sme.port}: Address already in use\n"
    assert requests.post(f"{sme.url}/invocations", data=ADDSUB, timeout=10).status_code == 200
