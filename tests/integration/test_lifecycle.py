"""Process lifecycle: start-up states, SIGTERM, and a serve killed outright."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import requests

from tests.integration.conftest import TEST_MODELS, fake_plan_model, start_serve
from tests.integration.harness import ServeProcess, alive, descendants, free_port, triton_pids

pytestmark = pytest.mark.integration


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _private_repo(tmp_path):
    repo = tmp_path / "models"
    shutil.copytree(TEST_MODELS, repo, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def test_sigterm_stops_serve_with_status_0_and_no_process_left(tmp_path):
    repo = _private_repo(tmp_path)
    server = start_serve(tmp_path, repo, "addsub")
    try:
        assert triton_pids(server.marker), "Triton should be running while serve is healthy"
        processes = descendants(server.pid)
        server.send_signal(signal.SIGTERM)
        assert server.wait(60) == 0
        assert triton_pids(server.marker) == []
        assert alive(processes) == []
    finally:
        server.stop()


def test_triton_and_the_workers_die_with_serve_even_when_serve_is_killed(tmp_path):
    repo = _private_repo(tmp_path)
    server = start_serve(tmp_path, repo, "addsub")
    try:
        processes = descendants(server.pid)
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        assert _wait_for(lambda: not triton_pids(server.marker), 30), "Triton outlived a killed serve"
        assert _wait_for(lambda: not alive(processes), 10), f"left behind: {alive(processes)}"
    finally:
        server.stop()


def test_a_default_model_that_fails_to_load_stops_serve_with_one_line(tmp_path):
    """As NVIDIA's server does: SageMaker learns at once that the endpoint cannot serve, instead of
    waiting out its health check. The reason is Triton's, without the model's traceback."""
    repo = _private_repo(tmp_path)
    (repo / "addsub" / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('broken weights file')\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    env["SMTRITON_WORK_DIR"] = str(tmp_path / "work")
    command = [sys.executable, "-m", "smtriton.serve", "--model-repository", str(repo), "--default-model", "addsub"]
    command += ["--host", "127.0.0.1", "--port", str(free_port())]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert done.stderr == "model 'addsub' failed to load: RuntimeError: broken weights file\n"
    assert "broken weights file" in done.stdout  # the whole story in the log
    assert triton_pids(str(tmp_path / "work")) == []


def test_port_is_bound_before_the_model_is_ready(tmp_path):
    repo = _private_repo(tmp_path)
    (repo / "addsub" / "1" / "model.py").write_text(
        (TEST_MODELS / "addsub" / "1" / "model.py")
        .read_text()
        .replace(
            "class TritonPythonModel:",
            "import time\n\n\nclass TritonPythonModel:\n    def initialize(self, args):\n        time.sleep(4)\n",
        )
    )
    server = ServeProcess(repo, "addsub", tmp_path / "serve.log")
    try:

        def answered_503() -> bool:
            try:
                return requests.get(f"{server.url}/ping", timeout=2).status_code == 503
            except requests.ConnectionError:
                return False

        assert _wait_for(answered_503, 30)
        server.wait_healthy(60)
    finally:
        server.stop()


def test_startup_errors_exit_1_with_the_native_message(tmp_path):
    repo = _private_repo(tmp_path)
    server = ServeProcess(repo, None, tmp_path / "serve.log")
    try:
        assert server.wait(30) == 1
        assert "More than 1 model directory found in model repository" in server.log_text()
    finally:
        server.stop()


def test_a_plan_built_for_another_runtime_exits_1_before_triton_starts(tmp_path):
    repo = tmp_path / "models"
    fake_plan_model(repo / "encoder", tensorrt_version="10.0.0")
    server = ServeProcess(repo, "encoder", tmp_path / "serve.log")
    try:
        assert server.wait(30) == 1
        log = server.log_text()
        assert "ERROR: model encoder cannot be served on this host: encoder/1/model.plan was built for " in log
        assert "NVIDIA A10G (compute capability 8.6) with TensorRT 10.0.0" in log
        assert "no TensorRT runtime" in log
        assert triton_pids(server.marker) == []
    finally:
        server.stop()
