"""What NVIDIA's own SageMaker tests check of the official image, checked here against ours: the MME
model list and description (modelUrl, page tokens) and the start-up messages. Written from the
behaviour those tests expect, not copied from them."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
import requests

from tests.integration.conftest import TEST_MODELS, start_serve
from tests.integration.harness import ServeProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def mme(tmp_path_factory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("conformance")
    root = tmp / "models"
    root.mkdir()
    server = start_serve(tmp, None, None, args=["--multi-model", "--model-root", str(root)])
    server.root = root  # type: ignore[attr-defined]
    yield server
    server.stop()


def _load(server: ServeProcess, name: str, url: str) -> None:
    r = requests.post(f"{server.url}/models", json={"model_name": name, "url": url}, timeout=120)
    assert r.status_code == 200, r.text


def test_model_list_and_description_show_the_repository_of_a_model_url(mme):
    """SageMaker loads ``/opt/ml/models/<id>/model``; when that folder is the model itself, the
    official image lists ``/opt/ml/models/<id>``."""
    url = mme.root / "abc123" / "model"
    shutil.copytree(TEST_MODELS / "addsub", url)
    _load(mme, "m", str(url))
    expected = {"modelName": "m", "modelUrl": str(mme.root / "abc123")}
    assert expected in requests.get(f"{mme.url}/models", timeout=5).json()["models"]
    assert requests.get(f"{mme.url}/models/m", timeout=5).json() == expected
    assert requests.delete(f"{mme.url}/models/m", timeout=300).status_code == 200


def test_a_url_that_holds_model_folders_is_listed_as_given(mme):
    url = mme.root / "def456" / "model"
    shutil.copytree(TEST_MODELS / "addsub", url / "addsub")
    _load(mme, "n", str(url))
    assert requests.get(f"{mme.url}/models/n", timeout=5).json() == {"modelName": "n", "modelUrl": str(url)}
    assert requests.delete(f"{mme.url}/models/n", timeout=300).status_code == 200


@pytest.mark.parametrize("token", ["0", "not-a-token"])
def test_a_page_token_we_did_not_issue_lists_from_the_start(mme, token):
    url = mme.root / f"tok{token[:1]}" / "model"
    shutil.copytree(TEST_MODELS / "ident", url)
    _load(mme, f"tok{token[:1]}", str(url))
    r = requests.get(f"{mme.url}/models", params={"next_page_token": token}, timeout=5)
    assert r.status_code == 200
    assert r.json() == requests.get(f"{mme.url}/models", timeout=5).json()
    assert r.json()["models"]
    assert requests.delete(f"{mme.url}/models/tok{token[:1]}", timeout=300).status_code == 200


def test_one_model_and_no_default_name_logs_nvidias_warning_then_serves_it(tmp_path):
    repository = tmp_path / "models"
    shutil.copytree(TEST_MODELS / "ident", repository / "ident")
    server = start_serve(tmp_path, repository, None)
    try:
        assert requests.get(f"{server.url}/ping", timeout=5).status_code == 200
        assert "WARNING: No SAGEMAKER_TRITON_DEFAULT_MODEL_NAME provided; serving the only model, ident" in (
            server.log_text()
        )
    finally:
        server.stop()


def test_an_invalid_inference_type_prints_nvidias_error_and_exits_1(tmp_path):
    repository = tmp_path / "models"
    shutil.copytree(TEST_MODELS / "ident", repository / "ident")
    server = ServeProcess(repository, "ident", tmp_path / "serve.log", env={"SAGEMAKER_TRITON_INFERENCE_TYPE": "bogus"})
    try:
        assert server.wait(60) == 1
        assert "ERROR: Invalid SAGEMAKER_TRITON_INFERENCE_TYPE 'bogus'" in server.log_text()
    finally:
        server.stop()
