from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import ServeProcess

TEST_MODELS = Path(__file__).parent / "models"


def start_serve(tmp: Path, repository: Path | None, model: str | None, **kwargs) -> ServeProcess:
    server = ServeProcess(repository, model, tmp / "serve.log", **kwargs)
    try:
        server.wait_healthy()
    except Exception:
        server.stop()
        raise
    return server


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
