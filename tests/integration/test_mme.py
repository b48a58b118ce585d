"""Multi-model endpoint API (docs/contract.md §2.4, §4) against the real serve + Triton."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.integration.conftest import TEST_MODELS, fake_plan_model, start_serve
from tests.integration.contract_client import binary_request, json_request, parse
from tests.integration.harness import triton_pids

pytestmark = pytest.mark.integration

MME_MODELS = Path(__file__).parent / "models_mme"
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
ADDSUB = json.dumps(json_request({"INPUT0": A, "INPUT1": B})).encode()


def _archive(root: Path, model_name: str, layout: str) -> str:
    """Lay out an extracted archive as SageMaker does: <root>/<model_name>/model; returns the url."""
    url = root / model_name / "model"
    if layout == "root":  # config.pbtxt + versions directly in url
        shutil.copytree(TEST_MODELS / "addsub", url)
    elif layout == "subdir":
        shutil.copytree(TEST_MODELS / "addsub", url / "addsub")
    elif layout == "ensemble":
        shutil.copytree(TEST_MODELS / "addsub", url / "addsub")
        shutil.copytree(MME_MODELS / "ens", url / "ens")
    elif layout == "oom":
        shutil.copytree(TEST_MODELS / "addsub", url)
        (url / "1" / "model.py").write_text(
            "class TritonPythonModel:\n    def initialize(self, args):\n"
            "        raise MemoryError('Failed to allocate memory for weights: out of memory')\n"
        )
    elif layout == "broken":
        shutil.copytree(TEST_MODELS / "addsub", url)
        (url / "1" / "model.py").write_text(
            "class TritonPythonModel:\n    def initialize(self, args):\n"
            "        raise RuntimeError('broken weights file')\n"
        )
    elif layout == "ident":
        shutil.copytree(TEST_MODELS / "ident", url)
    return str(url)


@pytest.fixture(scope="module")
def mme(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mme")
    root = tmp / "models"
    root.mkdir()
    server = start_serve(tmp, None, None, args=["--multi-model", "--model-root", str(root)])
    server.root = root
    yield server
    server.stop()


def _load(server, name: str, url: str, target: str | None = None) -> requests.Response:
    headers = {"Content-Type": "application/json"}
    if target:
        headers["X-Amzn-SageMaker-Target-Model"] = target
    return requests.post(f"{server.url}/models", json={"model_name": name, "url": url}, headers=headers, timeout=120)


def _invoke(server, name: str, body: bytes = ADDSUB, content_type: str = "application/json", **headers: str):
    headers["Content-Type"] = content_type
    return requests.post(f"{server.url}/models/{name}/invoke", data=body, headers=headers, timeout=60)


def _unload(server, name: str, **headers: str) -> requests.Response:
    return requests.delete(f"{server.url}/models/{name}", headers=headers, timeout=300)


def test_ping_is_200_with_no_models(mme):
    assert requests.get(f"{mme.url}/ping", timeout=5).status_code == 200


def test_load_list_describe_invoke_unload_reload(mme):
    url = _archive(mme.root, "hashA", "root")
    r = _load(mme, "hashA", url)
    assert (r.status_code, r.content) == (200, b"")
    assert _load(mme, "hashA", url).status_code == 409
    listed = requests.get(f"{mme.url}/models", timeout=5).json()["models"]
    # The url holds config.pbtxt itself: listed as its repository, as NVIDIA's front end does.
    repository = url.removesuffix("/model")
    assert {"modelName": "hashA", "modelUrl": repository} in listed
    described = requests.get(f"{mme.url}/models/hashA", timeout=5).json()
    assert described == {"modelName": "hashA", "modelUrl": repository}
    r = _invoke(mme, "hashA")
    assert r.status_code == 200
    assert r.json()["model_name"] == "hashA"
    np.testing.assert_array_equal(parse(r).as_numpy("OUTPUT0"), A + B)
    assert _unload(mme, "hashA").status_code == 200
    assert _unload(mme, "hashA").status_code == 404
    assert _invoke(mme, "hashA").status_code == 404
    assert requests.get(f"{mme.url}/models/hashA", timeout=5).status_code == 404
    assert _load(mme, "hashA", url).status_code == 200
    assert _invoke(mme, "hashA").status_code == 200
    assert _unload(mme, "hashA").status_code == 200


def test_target_model_header_names_the_triton_model_and_binds_the_record(mme):
    url = _archive(mme.root, "hashB", "subdir")
    assert _load(mme, "hashB", url, target="modelB.tar.gz").status_code == 200
    # Native answers with the TargetModel as model_name; the header is optional afterwards (docs/contract.md §6 B4, B7).
    r = _invoke(mme, "hashB", **{"X-Amzn-SageMaker-Target-Model": "modelB.tar.gz"})
    assert r.status_code == 200
    assert r.json()["model_name"] == "modelB.tar.gz"
    assert _invoke(mme, "hashB").status_code == 200
    wrong = _invoke(mme, "hashB", **{"X-Amzn-SageMaker-Target-Model": "other.tar.gz"})
    assert wrong.status_code == 400
    assert "does not match" in wrong.json()["error"]
    assert _unload(mme, "hashB").status_code == 200  # no header needed (docs/contract.md §6 B4)


def test_a_model_loaded_without_the_header_can_be_invoked_with_it_naming_the_model(mme):
    """One rule for the header whether or not the load had it: when sent, it names the model."""
    url = _archive(mme.root, "hashH", "root")
    assert _load(mme, "hashH", url).status_code == 200
    assert _invoke(mme, "hashH", **{"X-Amzn-SageMaker-Target-Model": "hashH"}).status_code == 200
    assert _invoke(mme, "hashH", **{"X-Amzn-SageMaker-Target-Model": "other"}).status_code == 400
    assert _unload(mme, "hashH", **{"X-Amzn-SageMaker-Target-Model": "hashH"}).status_code == 200


def test_target_model_with_a_path_is_served_and_shown_as_sent(mme):
    url = _archive(mme.root, "hashP", "root")
    target = "team/resnet.tar.gz"
    assert _load(mme, "hashP", url, target=target).status_code == 200
    body, content_type = binary_request({"INPUT0": A, "INPUT1": B})
    r = _invoke(mme, "hashP", body, content_type)
    assert r.status_code == 200
    result = parse(r)  # the json-header-size was recomputed after the rename
    assert result.get_response()["model_name"] == target
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    assert _unload(mme, "hashP").status_code == 200


def test_ensemble_archive_loads_and_unloads_with_its_members(mme):
    url = _archive(mme.root, "hashE", "ensemble")
    assert _load(mme, "hashE", url, target="ens.tar.gz").status_code == 200
    r = _invoke(mme, "hashE")
    assert r.status_code == 200, r.text
    result = parse(r)
    np.testing.assert_array_equal(result.as_numpy("SUM"), A + B)
    np.testing.assert_array_equal(result.as_numpy("DIFF"), A - B)
    # Members are not reachable through another name (docs/contract.md §6 B7).
    assert _invoke(mme, "hashE", **{"X-Amzn-SageMaker-Target-Model": "addsub"}).status_code == 400
    assert _unload(mme, "hashE").status_code == 200
    assert _load(mme, "hashE", url, target="ens.tar.gz").status_code == 200  # members were released too
    assert _unload(mme, "hashE").status_code == 200


def test_an_ensemble_load_on_a_host_without_gpu_logs_no_cuda_error(mme):
    """Every ensemble load asks Triton for a CUDA stream; without a GPU that fails as expected, and serve
    logs it at debug level like Triton's other CUDA notices, not as an ERROR beside a healthy load."""
    url = _archive(mme.root, "hashS", "ensemble")
    assert _load(mme, "hashS", url, target="ens.tar.gz").status_code == 200
    assert _invoke(mme, "hashS").status_code == 200
    assert _unload(mme, "hashS").status_code == 200
    records = [json.loads(line) for line in mme.log_path.read_text().splitlines() if line.startswith("{")]
    streams = [r for r in records if "unable to create stream" in r["message"] and r["level"] != "DEBUG"]
    assert streams == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{bad json", "JSON object"),
        (b"[]", "JSON object"),
        (b"", "JSON object"),
        (b'{"model_name": 5, "url": "/x"}', "invalid model_name"),
        (b'{"model_name": "x", "url": null}', "'url'"),
        (b'{"model_name": "x"}', "'url'"),
        (b'{"model_name": "../x", "url": "/x"}', "invalid model_name"),
        (b'{"model_name": "x", "url": "/x/\\udcff"}', "JSON object"),  # no JSON text holds a lone surrogate
        (b'{"model_name": "x\\udcff", "url": "/x"}', "JSON object"),
        (b'{"model_name": "x", "url": "/x/\xff"}', "JSON object"),  # nor bytes that are not UTF-8
    ],
)
def test_malformed_load_bodies_are_400_and_the_server_survives(mme, body, message):
    r = requests.post(f"{mme.url}/models", data=body, timeout=10)
    assert r.status_code == 400
    assert message in r.json()["error"]
    assert requests.get(f"{mme.url}/ping", timeout=5).status_code == 200


@pytest.mark.parametrize("layout", ["alone", "ensemble", "ambiguous"])
def test_a_model_folder_whose_name_is_not_utf8_is_a_400_and_the_server_stays_healthy(mme, layout):
    """An archive SageMaker extracted with a model folder named b"m\\xff": once a 500 (alone, or as an
    ensemble's step) or a load request that never got an answer (beside another model)."""
    name = f"hashU{layout}"
    url = mme.root / name / "model"
    bad = url / os.fsdecode(b"m\xff")
    shutil.copytree(TEST_MODELS / "addsub", bad)
    if layout == "ensemble":
        shutil.copytree(MME_MODELS / "ens", url / "ens")
    elif layout == "ambiguous":
        shutil.copytree(TEST_MODELS / "addsub", url / "other")
    headers = {"X-Amzn-SageMaker-Target-Model": "addsub.tar.gz"}
    body = {"model_name": name, "url": str(url)}
    r = requests.post(f"{mme.url}/models", json=body, headers=headers, timeout=30)
    assert (r.status_code, r.headers["content-type"]) == (400, "application/json")
    assert r.json() == {
        "error": "model folder 'm\\xff' of the archive has a name that is not UTF-8: rename it and package the "
        "archive again"
    }
    assert requests.get(f"{mme.url}/ping", timeout=5).status_code == 200
    assert name not in [m["modelName"] for m in requests.get(f"{mme.url}/models", timeout=5).json()["models"]]
    bad.rename(url / "addsub")
    assert requests.post(f"{mme.url}/models", json=body, headers=headers, timeout=120).status_code == 200
    assert _invoke(mme, name).status_code == 200
    assert _unload(mme, name).status_code == 200


def test_urls_outside_the_model_root_are_refused(mme, tmp_path):
    outside = tmp_path / "elsewhere"
    shutil.copytree(TEST_MODELS / "addsub", outside)
    assert _load(mme, "o1", str(outside)).status_code == 400
    assert _load(mme, "o2", f"{mme.root}/../elsewhere").status_code == 400
    link = mme.root / "linked" / "model"
    link.parent.mkdir()
    link.symlink_to(outside, target_is_directory=True)
    assert _load(mme, "o3", str(link)).status_code == 400
    inner = mme.root / "inner" / "model"
    shutil.copytree(TEST_MODELS / "addsub", inner)
    (inner / "1" / "weights.bin").symlink_to("/etc/passwd")
    r = _load(mme, "o4", str(inner))
    assert r.status_code == 400
    assert "symlink" in r.json()["error"]
    assert _load(mme, "o5", str(mme.root / "missing" / "model")).status_code == 400
    (mme.root / "loop").symlink_to("loop")
    for url, says in (
        (str(mme.root / "loop"), "a loop of symlinks"),
        ("/" + "x" * 8000, "longer than 4096 characters"),
        (str(mme.root / ("x" * 300) / "model"), "a path too long"),
        (str(mme.root), "is the model root itself"),
    ):
        r = _load(mme, "o6", url)
        assert r.status_code == 400, r.text
        assert says in r.json()["error"]
    assert "Traceback" not in mme.log_text()
    assert requests.get(f"{mme.url}/ping", timeout=5).status_code == 200


def test_a_url_given_through_an_alias_is_listed_by_its_canonical_path(mme):
    url = _archive(mme.root, "hashAlias", "root")
    assert _load(mme, "hashAlias", f"/proc/self/root{url}").status_code == 200
    listed = requests.get(f"{mme.url}/models/hashAlias", timeout=5).json()
    assert listed == {"modelName": "hashAlias", "modelUrl": str(mme.root / "hashAlias")}
    assert _unload(mme, "hashAlias").status_code == 200


def test_load_failures_are_507_for_oom_and_400_otherwise(mme):
    r = _load(mme, "hashO", _archive(mme.root, "hashO", "oom"))
    assert r.status_code == 507
    assert "out of memory" in r.json()["error"]
    assert "::" not in r.json()["error"]
    assert _load(mme, "hashO", str(mme.root / "hashO" / "model")).status_code == 507  # nothing left behind
    r = _load(mme, "hashX", _archive(mme.root, "hashX", "broken"))
    assert r.status_code == 400
    assert r.json()["error"] == "model 'hashX' failed to load: RuntimeError: broken weights file"
    assert requests.get(f"{mme.url}/ping", timeout=5).status_code == 200


def test_a_load_error_names_the_model_and_the_cause_in_the_callers_terms(mme):
    """An ONNX model folder without its model.onnx: the body says so with the caller's own path; the
    backend's traceback and serve's staging paths go to the log only."""
    url = mme.root / "noonnx" / "model"
    (url / "1").mkdir(parents=True)
    (url / "config.pbtxt").write_text(
        'name: "noonnx"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [{ name: "x", data_type: TYPE_FP32, dims: [1] }]\n'
        'output [{ name: "y", data_type: TYPE_FP32, dims: [1] }]\n'
    )
    r = _load(mme, "noonnx", str(url))
    assert r.status_code == 400
    assert r.json()["error"] == "model 'noonnx' failed to load: no ONNX file at 1/model.onnx"
    logged = next(line for line in mme.log_text().splitlines() if "model noonnx did not load in Triton" in line)
    assert "/managed/noonnx/1/model.onnx" in logged  # Triton's whole message, staging path and all


def test_a_failed_load_names_the_model_as_the_caller_did_and_the_file_inside_the_archive(mme):
    """SageMaker's model_name is a hash of the TargetModel: the caller knows the TargetModel, and the
    folder of the archive, not serve's staging path nor the derived Triton name."""
    url = mme.root / "f776c6" / "model"
    shutil.copytree(TEST_MODELS / "addsub", url / "helper")
    (url / "badtag" / "1").mkdir(parents=True)
    (url / "badtag" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [{ name: "x", data_type: TYPE_FP32, dims: [1] }]\n'
        'output [{ name: "y", data_type: TYPE_FP32, dims: [1] }]\n'
    )
    r = _load(mme, "f776c6", str(url), target="team/badtag.tar.gz")
    assert r.status_code == 400
    assert r.json()["error"] == "model 'team/badtag.tar.gz' failed to load: no ONNX file at badtag/1/model.onnx"
    assert requests.get(f"{mme.url}/models/f776c6", timeout=5).status_code == 404


BLS_ENTRY = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("INPUT0", "INPUT1")]
            call = pb_utils.InferenceRequest(model_name="helper", requested_output_names=["OUTPUT0"], inputs=inputs)
            answer = call.exec()
            if answer.has_error():
                raise RuntimeError(answer.error().message())
            total = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)]))
        return responses
"""
BLS_CONFIG = """backend: "python"
max_batch_size: 8
input [{ name: "INPUT0", data_type: TYPE_INT32, dims: [16] }, { name: "INPUT1", data_type: TYPE_INT32, dims: [16] }]
output [{ name: "SUM", data_type: TYPE_INT32, dims: [16] }]
"""


def _bls_archive(root: Path, model_name: str, offset: int) -> str:
    """An archive of two folders: ``entry``, a Python model that calls ``helper`` by name (BLS), and
    ``helper``, addsub whose sum is off by ``offset`` (so each archive's helper can be told apart)."""
    url = root / model_name / "model"
    (url / "entry" / "1").mkdir(parents=True)
    (url / "entry" / "config.pbtxt").write_text(BLS_CONFIG)
    (url / "entry" / "1" / "model.py").write_text(BLS_ENTRY)
    shutil.copytree(TEST_MODELS / "addsub", url / "helper")
    helper = url / "helper" / "1" / "model.py"
    helper.write_text(helper.read_text().replace("a + b", f"a + b + {offset}"))
    (url / "sagemaker_entry").write_text("entry")
    return str(url)


def test_archives_with_folders_of_the_same_name_each_call_their_own(mme):
    """Two archives each with a ``helper`` folder load side by side, and a BLS call by the folder's name
    reaches the caller's own archive; no folder of an archive takes a name a later load needs."""
    first, second = _bls_archive(mme.root, "bls1", 1), _bls_archive(mme.root, "bls2", 2)
    assert "a + b + 1" in Path(first, "helper", "1", "model.py").read_text()
    assert _load(mme, "bls1", first, target="first.tar.gz").status_code == 200
    r = _load(mme, "bls2", second)
    assert r.status_code == 200, r.text
    for name, offset in (("bls1", 1), ("bls2", 2)):
        r = _invoke(mme, name)
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(parse(r).as_numpy("SUM"), A + B + offset)
    helper = _load(mme, "helper", _archive(mme.root, "helper", "root"))  # a model named like a folder
    assert helper.status_code == 200, helper.text
    assert _load(mme, "entry", _archive(mme.root, "entry", "root"), target="entry").status_code == 200
    np.testing.assert_array_equal(parse(_invoke(mme, "helper")).as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(parse(_invoke(mme, "bls2")).as_numpy("SUM"), A + B + 2)
    for name in ("bls1", "bls2", "helper", "entry"):
        assert _unload(mme, name).status_code == 200
    assert _load(mme, "bls1", first).status_code == 200  # its folders were unloaded with it
    assert _unload(mme, "bls1").status_code == 200


def test_a_python_models_failure_names_the_model_and_its_file_not_the_staging_path(mme):
    url = Path(_archive(mme.root, "pyerr", "root"))
    model = url / "1" / "model.py"
    model.write_text(
        model.read_text().replace(
            "def execute(self, requests):", "def execute(self, requests):\n        raise ValueError('boom')", 1
        )
    )
    assert _load(mme, "pyerr", str(url), target="team/pyerr.tar.gz").status_code == 200
    r = _invoke(mme, "pyerr")
    assert r.status_code == 400
    message = r.json()["error"]
    assert "ValueError: boom" in message
    assert "1/model.py" in message
    assert "team/pyerr.tar.gz" in message
    assert "managed" not in message
    assert "smtriton-" not in message
    assert _unload(mme, "pyerr").status_code == 200


def test_a_plan_built_for_another_runtime_is_refused_with_400_and_nothing_loaded(mme):
    url = fake_plan_model(mme.root / "hashT" / "model", tensorrt_version="10.0.0")
    for _ in range(2):  # a refused load leaves nothing behind: the retry gets the same answer
        r = _load(mme, "hashT", str(url))
        assert r.status_code == 400
        message = r.json()["error"]
        assert message.startswith("model 'hashT' cannot be loaded on this host: model/1/model.plan was built for ")
        assert "NVIDIA A10G (compute capability 8.6) with TensorRT 10.0.0" in message
        assert "no TensorRT runtime" in message  # this host has no TensorRT (nor a GPU)
    assert requests.get(f"{mme.url}/models/hashT", timeout=5).status_code == 404
    assert requests.get(f"{mme.url}/ping", timeout=5).status_code == 200
    assert _load(mme, "hashU", _archive(mme.root, "hashU", "root")).status_code == 200
    assert _invoke(mme, "hashU").status_code == 200
    assert _unload(mme, "hashU").status_code == 200


def test_unknown_names_and_wrong_methods(mme):
    assert _invoke(mme, "nope").status_code == 404
    assert requests.get(f"{mme.url}/models/nope", timeout=5).status_code == 404
    assert requests.delete(f"{mme.url}/models", timeout=5).status_code == 404
    assert requests.get(f"{mme.url}/models/a/b", timeout=5).status_code == 404  # no such route
    assert requests.put(f"{mme.url}/models", timeout=5).status_code == 400
    assert requests.post(f"{mme.url}/invocations", data=ADDSUB, timeout=5).status_code == 400


def test_list_is_paginated_in_load_order(mme):
    names = [f"page{i}" for i in range(3)]
    for name in names:
        assert _load(mme, name, _archive(mme.root, name, "ident")).status_code == 200
    seen, token = [], None
    while True:
        params = {"limit": "2", **({"next_page_token": token} if token else {})}
        body = requests.get(f"{mme.url}/models", params=params, timeout=5).json()
        assert len(body["models"]) <= 2
        seen += [m["modelName"] for m in body["models"]]
        token = body.get("nextPageToken")
        if token is None:
            break
    assert [n for n in seen if n.startswith("page")] == names
    # A token not issued here lists from the beginning, as NVIDIA's front end answers it.
    restarted = requests.get(f"{mme.url}/models", params={"next_page_token": "zz", "limit": "2"}, timeout=5)
    assert restarted.status_code == 200
    assert restarted.json() == requests.get(f"{mme.url}/models", params={"limit": "2"}, timeout=5).json()
    for name in names:
        assert _unload(mme, name).status_code == 200


def test_concurrent_loads_of_one_model_load_it_once(mme):
    url = _archive(mme.root, "hashC", "root")
    with ThreadPoolExecutor(4) as pool:
        codes = sorted(pool.map(lambda _: _load(mme, "hashC", url).status_code, range(4)))
    assert codes == [200, 409, 409, 409]
    with ThreadPoolExecutor(4) as pool:
        codes = sorted(pool.map(lambda _: _unload(mme, "hashC").status_code, range(4)))
    assert codes == [200, 404, 404, 404]


def test_invokes_interleaved_with_loads_and_unloads_never_5xx(mme):
    names = [f"mix{i}" for i in range(4)]
    urls = {n: _archive(mme.root, n, "root") for n in names}
    for n in names[:2]:
        assert _load(mme, n, urls[n]).status_code == 200

    def invoke(i: int) -> tuple[int, np.ndarray | None]:
        r = _invoke(mme, names[i % 4])
        return r.status_code, parse(r).as_numpy("OUTPUT0") if r.status_code == 200 else None

    def churn() -> list[int]:
        codes = []
        for n in names:
            codes.append(_load(mme, n, urls[n]).status_code)
            codes.append(_unload(mme, n).status_code)
            codes.append(_load(mme, n, urls[n]).status_code)
        return codes

    with ThreadPoolExecutor(17) as pool:
        churned = pool.submit(churn)
        answers = list(pool.map(invoke, range(64)))
        management = churned.result(timeout=300)
    codes = [code for code, _ in answers]
    assert set(codes) <= {200, 404}, codes
    for _, output in answers:
        if output is not None:
            np.testing.assert_array_equal(output, A + B)
    assert set(management) <= {200, 409}, management
    assert requests.get(f"{mme.url}/ping", timeout=5).status_code == 200
    for n in names:
        assert _unload(mme, n).status_code == 200


def test_memory_reserve_refuses_a_load_with_507(tmp_path):
    root = tmp_path / "models"
    url = _archive(root, "big", "root")
    server = start_serve(
        tmp_path,
        None,
        None,
        args=["--multi-model", "--model-root", str(root)],
        env={"SMTRITON_MEMORY_RESERVE_BYTES": str(1 << 50)},
    )
    try:
        r = _load(server, "big", url)
        assert r.status_code == 507
        assert "not enough memory" in r.json()["error"]
        assert requests.get(f"{server.url}/ping", timeout=5).status_code == 200
        assert requests.get(f"{server.url}/models", timeout=5).json() == {"models": []}
    finally:
        server.stop()


def test_loaded_models_are_restored_after_triton_dies(tmp_path):
    root = tmp_path / "models"
    url = _archive(root, "hashR", "root")
    server = start_serve(tmp_path, None, None, args=["--multi-model", "--model-root", str(root)])
    try:
        assert _load(server, "hashR", url, target="r.tar.gz").status_code == 200
        (pid,) = triton_pids(server.marker)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 1.5
        while requests.get(f"{server.url}/ping", timeout=2).status_code == 200:
            assert time.monotonic() < deadline, "/ping still 200 after Triton died"
            time.sleep(0.05)
        server.wait_healthy(120)
        r = _invoke(server, "hashR")
        assert r.status_code == 200
        assert r.json()["model_name"] == "r.tar.gz"
    finally:
        server.stop()
