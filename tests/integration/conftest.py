from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from smtriton.serve.triton.tensorrt_sidecar import Sidecar, write_sidecar
from tests.integration.harness import ServeProcess

TEST_MODELS = Path(__file__).parent / "models"
PLAN_CONFIG = """name: "{name}"
platform: "tensorrt_plan"
max_batch_size: 8
input [{{ name: "INPUT0", data_type: TYPE_FP32, dims: [16] }}]
output [{{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [16] }}]
"""


def start_serve(tmp: Path, repository: Path | None, model: str | None, **kwargs) -> ServeProcess:
    server = ServeProcess(repository, model, tmp / "serve.log", **kwargs)
    try:
        server.wait_healthy()
    except Exception:
        server.stop()
        raise
    return server


def fake_plan_model(model_dir: Path, tensorrt_version: str) -> Path:
    """A tensorrt_plan model whose (fake) plan has a sidecar saying it was built with ``tensorrt_version``
    on an A10G: enough for serve's compatibility check, which refuses it before Triton sees the bytes.
    The tests using it expect the refusal of a host without TensorRT or GPU (tests/gpu covers the rest)."""
    from smtriton.serve.triton.tensorrt_check import NoRuntime, detect_runtime

    if not isinstance(detect_runtime(), NoRuntime):
        pytest.skip("this host has TensorRT and a GPU: the refusal tested here is the one of hosts without")
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(PLAN_CONFIG.format(name=model_dir.name))
    plan = model_dir / "1" / "model.plan"
    plan.write_bytes(b"not a real plan")
    write_sidecar(plan, Sidecar(tensorrt_version, "NVIDIA A10G", "8.6", "fp16", False, [], [], [], "0" * 64))
    return model_dir


@pytest.fixture(scope="module")
def test_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of the Python test models (each server gets a path no other test uses)."""
    repo = tmp_path_factory.mktemp("repo") / "models"
    shutil.copytree(TEST_MODELS, repo, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


@pytest.fixture(scope="module")
def addsub_server(tmp_path_factory: pytest.TempPathFactory, test_repository: Path) -> Iterator[ServeProcess]:
    server = start_serve(tmp_path_factory.mktemp("addsub"), test_repository, "addsub")
    yield server
    server.stop()
