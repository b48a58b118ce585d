"""Every demo model through the real serve + Triton, compared with the eager torch model.

Each model is served on its own (SME: one default model per endpoint) from a private repository of
symlinks to the built demo models, so a demo someone runs from `model_repository/` is never touched.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from smtriton.convert.build import build_repository
from smtriton.convert.recipe import DEFAULT_RECIPE
from smtriton.convert.reference import Reference, load_reference
from tests.integration.conftest import start_serve
from tests.integration.contract_client import binary_request, json_request, parse
from tests.integration.harness import ServeProcess

pytestmark = pytest.mark.integration

DEMO_MODELS = ["resnet_onnx", "resnet_torchscript", "text_encoder", "string_upper"]
ATOL, RTOL = 1e-4, 1e-3


@pytest.fixture(scope="session")
def demo_repository() -> Path:
    """The built demo repository (built here if needed; a no-op when up to date)."""
    report = build_repository(DEFAULT_RECIPE)
    failed = [r for r in report.results if r.status == "failed"]
    assert not failed, [(r.name, r.error) for r in failed]
    return report.output


@pytest.fixture(scope="module", params=DEMO_MODELS)
def served(request, demo_repository: Path, tmp_path_factory) -> Iterator[tuple[ServeProcess, Reference]]:
    name = request.param
    tmp = tmp_path_factory.mktemp(name)
    repo = tmp / "repo"
    repo.mkdir()
    (repo / name).symlink_to(demo_repository / name, target_is_directory=True)
    server = start_serve(tmp, repo, None)  # the only model: served as the default, as SageMaker would
    yield server, load_reference(name)
    server.stop()


def _assert_matches(reference: Reference, inputs: dict[str, np.ndarray], result, outputs: list[str]) -> None:
    expected = reference.run(inputs)
    for name in outputs:
        got = result.as_numpy(name)
        want = expected[name]
        assert got.shape == want.shape, name
        if want.dtype == np.object_:
            assert [v.decode() if isinstance(v, bytes) else v for v in got.flatten()] == [
                v.decode() if isinstance(v, bytes) else v for v in want.flatten()
            ]
        else:
            np.testing.assert_allclose(got, want, atol=ATOL, rtol=RTOL, err_msg=name)


def _inputs(reference: Reference, seed: int) -> dict[str, np.ndarray]:
    sizes = {"batch": 2} if reference.spec.max_batch_size > 0 else {}
    return reference.make_inputs(seed, **sizes)


def _post(server: ServeProcess, body: bytes, content_type: str) -> requests.Response:
    r = requests.post(f"{server.url}/invocations", data=body, headers={"Content-Type": content_type}, timeout=60)
    assert r.status_code == 200, r.text[:500]
    return r


@pytest.mark.parametrize("content_type", ["application/json", "application/octet-stream"])
def test_json_request_matches_torch(served, content_type):
    server, reference = served
    inputs = _inputs(reference, seed=11)
    r = _post(server, json.dumps(json_request(inputs)).encode(), content_type)
    assert r.headers["content-type"] == "application/json"
    assert r.json()["model_name"] == reference.spec.name
    _assert_matches(reference, inputs, parse(r), [o.name for o in reference.spec.outputs])


def test_binary_request_with_binary_outputs_matches_torch(served):
    server, reference = served
    inputs = _inputs(reference, seed=12)
    body, content_type = binary_request(inputs)  # outputs=None: tritonclient asks for binary outputs
    r = _post(server, body, content_type)
    assert r.headers["content-type"].startswith("application/vnd.sagemaker-triton.binary+json;json-header-size=")
    _assert_matches(reference, inputs, parse(r), [o.name for o in reference.spec.outputs])


def test_binary_request_with_one_json_output_returns_only_that_output(served):
    server, reference = served
    inputs = _inputs(reference, seed=13)
    first = reference.spec.outputs[0].name
    body, content_type = binary_request(inputs, binary_outputs={first: False})
    r = _post(server, body, content_type)
    assert r.headers["content-type"] == "application/json"
    assert [o["name"] for o in r.json()["outputs"]] == [first]
    _assert_matches(reference, inputs, parse(r), [first])


def test_concurrent_requests_each_get_their_own_result(served):
    from concurrent.futures import ThreadPoolExecutor

    server, reference = served
    cases = [_inputs(reference, seed=100 + i) for i in range(6)]

    def call(inputs):
        body, content_type = binary_request(inputs)
        return parse(_post(server, body, content_type))

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(call, cases))
    for inputs, result in zip(cases, results, strict=True):
        _assert_matches(reference, inputs, result, [o.name for o in reference.spec.outputs])


def test_wrong_shape_is_400_and_the_server_stays_healthy(served):
    server, reference = served
    request = json_request(_inputs(reference, seed=14))
    request["inputs"][0]["shape"] = [*request["inputs"][0]["shape"], 1]
    r = requests.post(f"{server.url}/invocations", data=json.dumps(request), timeout=30)
    assert r.status_code == 400
    assert "error" in r.json()
    assert requests.get(f"{server.url}/ping", timeout=5).status_code == 200
