"""The serving image run as SageMaker runs it (``IMAGE serve``): scripts/image-test.sh builds it and runs these.

Collected only when $SMTRITON_TEST_IMAGE names the image (tests/conftest.py); the engine comes from
$SMTRITON_CONTAINER_ENGINE or is found (docker with a daemon, else podman). $SMTRITON_TEST_TARGET (cpu or
triton) and $SMTRITON_TEST_BASE say what the image was built as; without them the image's labels do.
Models are the Python-backend test models, which need nothing but the image; every answer is checked
against one computed here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from smtriton.local.serve_process import Mount, ServeContainer, container_engine
from tests.integration.conftest import TEST_MODELS
from tests.integration.contract_client import binary_request, json_request, parse
from tests.integration.test_local_endpoint import Emulator, _offset_model, _tar

IMAGE = os.environ.get("SMTRITON_TEST_IMAGE", "")
TARGET_LABEL = "io.smtriton.target"
BASE_LABEL = "org.opencontainers.image.base.name"
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
START_TIMEOUT_S = 120.0


def _report(line: str) -> None:
    """A line for scripts/image-test.sh's summary (start-up times)."""
    if path := os.environ.get("SMTRITON_IMAGE_REPORT"):
        with open(path, "a") as report:
            report.write(line + "\n")


def _repository(tmp: Path, *names: str) -> Path:
    repo = tmp / "repository"
    for name in names:
        shutil.copytree(TEST_MODELS / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    return repo


def _start(tmp: Path, **kwargs: object) -> tuple[ServeContainer, float]:
    started = time.monotonic()
    container = ServeContainer(IMAGE, tmp / "container.log", **kwargs)  # type: ignore[arg-type]
    try:
        container.wait_healthy(START_TIMEOUT_S)
    except BaseException:
        container.stop(10)
        raise
    return container, time.monotonic() - started


def _check_addsub(url: str) -> None:
    """A JSON and a binary+json invocation of addsub, answered A+B and A-B."""
    r = requests.post(f"{url}/invocations", json=json_request({"INPUT0": A, "INPUT1": B}), timeout=30)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert outputs == {"OUTPUT0": (A + B).flatten().tolist(), "OUTPUT1": (A - B).flatten().tolist()}
    body, content_type = binary_request({"INPUT0": A, "INPUT1": B})
    r = requests.post(f"{url}/invocations", data=body, headers={"Content-Type": content_type}, timeout=30)
    assert r.status_code == 200, r.text
    result = parse(r)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_single_model_endpoint_as_sagemaker_runs_it(tmp_path):
    repo = _repository(tmp_path, "addsub", "ident")
    env = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "addsub"}
    container, startup = _start(tmp_path, env=env, mounts=[Mount(repo, "/opt/ml/model")])
    try:
        _report(f"start-up (launch to /ping 200, single model) {startup:.1f} s")
        assert requests.get(f"{container.url}/ping", timeout=5).status_code == 200
        _check_addsub(container.url)
        r = requests.post(f"{container.url}/invocations", data=b"{not json", timeout=30)
        assert r.status_code == 400
        assert "error" in r.json()
    finally:
        began = time.monotonic()
        assert container.stop(30) == 0, container.log_tail()
    _report(f"stop (SIGTERM, idle): exit 0 in {time.monotonic() - began:.1f} s")


def test_multi_model_endpoint_loads_invokes_and_unloads(tmp_path):
    models = tmp_path / "models"
    shutil.copytree(TEST_MODELS / "addsub", models / "m1" / "model", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"SAGEMAKER_MULTI_MODEL": "true"}
    container, startup = _start(tmp_path, env=env, mounts=[Mount(models, "/opt/ml/models")])
    try:
        _report(f"start-up (multi-model, no models) {startup:.1f} s")
        url = container.url
        r = requests.post(f"{url}/models", json={"model_name": "m1", "url": "/opt/ml/models/m1/model"}, timeout=120)
        assert r.status_code == 200, r.text
        assert [m["modelName"] for m in requests.get(f"{url}/models", timeout=10).json()["models"]] == ["m1"]
        body = json.dumps(json_request({"INPUT0": A, "INPUT1": B}))
        r = requests.post(f"{url}/models/m1/invoke", data=body, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == (A + B).flatten().tolist()
        assert requests.delete(f"{url}/models/m1", timeout=120).status_code == 200
        assert requests.post(f"{url}/models/m1/invoke", data=body, timeout=30).status_code == 404
        outside = {"model_name": "x", "url": "/etc"}
        assert requests.post(f"{url}/models", json=outside, timeout=30).status_code in (400, 404)
    finally:
        assert container.stop(30) == 0, container.log_tail()


def test_non_root_user_with_a_read_only_root_filesystem(tmp_path):
    repo = _repository(tmp_path, "addsub")
    container, _ = _start(tmp_path, mounts=[Mount(repo, "/opt/ml/model")], user="1000:1000", read_only=True)
    try:
        _check_addsub(container.url)
    finally:
        assert container.stop(30) == 0, container.log_tail()


def test_stop_under_load_exits_0_and_answers_every_accepted_request(tmp_path):
    repo = _repository(tmp_path, "slow")
    container, _ = _start(tmp_path, mounts=[Mount(repo, "/opt/ml/model")])
    results: list[str] = []
    halt = threading.Event()

    def client(i: int) -> None:
        body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [i, 1.5]}]})
        while not halt.is_set():
            try:
                r = requests.post(f"{container.url}/invocations", data=body, timeout=30)
            except requests.ConnectionError as exc:  # refused or reset before serve read the request
                refused = re.search(r"refused|reset|aborted", str(exc), re.I)
                results.append("refused" if refused else f"failed: {exc}")
                time.sleep(0.05)
                continue
            ok = r.status_code == 200 and r.json()["outputs"][0]["data"] == [float(i), 1.5]
            results.append("ok" if ok else f"failed: {r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(8)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.5)
        began = time.monotonic()
        code = container.stop(30)
        elapsed = time.monotonic() - began
    finally:
        halt.set()
        for t in threads:
            t.join(30)
        container.stop(10)
    assert code == 0, container.log_tail()
    assert elapsed < 30
    assert results.count("ok") >= 8
    assert [r for r in results if r.startswith("failed")] == []
    _report(f"stop under load: exit {code} in {elapsed:.1f} s, {results.count('ok')} requests answered")


def _image_config() -> dict:
    done = subprocess.run(
        [*container_engine(), "image", "inspect", "--format", "{{json .Config}}", IMAGE],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _target() -> str:
    return os.environ.get("SMTRITON_TEST_TARGET") or _image_config()["Labels"][TARGET_LABEL]


def test_labels_entry_port_and_stop_signal_are_what_sagemaker_reads():
    config = _image_config()
    labels = config["Labels"]
    assert labels["com.amazonaws.sagemaker.capabilities.accept-bind-to-port"] == "true"
    assert labels["com.amazonaws.sagemaker.capabilities.multi-models"] == "true"
    assert not any("bidirectional-streaming" in key for key in labels)
    assert labels[TARGET_LABEL] == _target()
    if base := os.environ.get("SMTRITON_TEST_BASE"):
        assert labels[BASE_LABEL] == base  # what `smtriton deploy` reads to warn about GPU multi-model bases
    assert config["Entrypoint"] == ["/opt/smtriton/bin/serve"]
    assert not config.get("Cmd")
    assert "8080/tcp" in config["ExposedPorts"]
    assert config.get("StopSignal", "SIGTERM") in ("SIGTERM", "15")
    assert not config.get("User")


def test_the_triton_target_keeps_what_nvidias_image_sets():
    """On NVIDIA's image (or its stand-in) the triton target keeps the base's environment, which its
    Triton and NVIDIA's container runtime read, and the base's triton-server user (uid and gid 1000)."""
    if _target() != "triton":
        pytest.skip("the cpu target is not built on NVIDIA's image")
    env = dict(item.split("=", 1) for item in _image_config()["Env"])
    wanted = ("TRITON_SERVER_VERSION", "NVIDIA_TRITON_SERVER_VERSION", "NVIDIA_VISIBLE_DEVICES", "TRITON_SERVER_USER")
    assert [name for name in wanted if not env.get(name)] == [], env
    capabilities = set(env["NVIDIA_DRIVER_CAPABILITIES"].split(","))
    assert "all" in capabilities or {"compute", "utility"} <= capabilities, capabilities
    assert "/opt/tritonserver/bin" in env["PATH"].split(":"), env["PATH"]
    done = subprocess.run(
        [*container_engine(), "run", "--rm", "--entrypoint", "id", IMAGE, env["TRITON_SERVER_USER"]],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("uid=1000("), done.stdout
    assert " gid=1000(" in done.stdout, done.stdout


# Run inside the image with its own interpreter: where serve finds Triton, which Python runs, whether the
# Python backend has a stub for that Python.
PROBE = """
import importlib.util, json, sys
from pathlib import Path
from smtriton.serve.triton.installation import find_triton
triton = find_triton()
stub = Path(triton.python_stub or (triton.backends or Path("/nonexistent")) / "python" / "triton_python_backend_stub")
venv = dict(line.split(" = ", 1) for line in Path(sys.prefix, "pyvenv.cfg").read_text().splitlines() if " = " in line)
print(json.dumps({
    "binary": str(triton.binary),
    "backends": str(triton.backends),
    "native": sorted(triton.native_backends()),
    "stub": stub.is_file(),
    "python": venv["home"],
    "system_site_packages": venv.get("include-system-site-packages") == "true",
    "version": list(sys.version_info[:2]),
    "wheel": importlib.util.find_spec("pytriton") is not None,
}))
"""


def test_serve_finds_the_triton_and_python_its_target_promises(tmp_path):
    """cpu: the wheel's Triton, the slim image's /usr/local Python. triton: the base's own Triton under
    /opt/tritonserver with a stub for the base's /usr/bin Python (3.10 to 3.12), whose packages the
    image's environment sees, and no second Triton."""
    done = subprocess.run(
        [*container_engine(), "run", "--rm", "--user", "1000:1000", "--entrypoint", "/opt/smtriton/bin/python",
         IMAGE, "-c", PROBE],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert "python" in found["native"]
    assert found["stub"], found
    assert (3, 10) <= tuple(found["version"]) <= (3, 12)
    if _target() == "triton":
        assert found["binary"] == "/opt/tritonserver/bin/tritonserver", found
        assert found["backends"] == "/opt/tritonserver/backends", found
        assert found["python"] == "/usr/bin", found
        assert found["system_site_packages"], found  # Python models see what the base installed
        assert not found["wheel"], found
    else:
        assert "/pytriton/tritonserver/" in found["binary"], found
        assert found["python"] == "/usr/local/bin", found
        assert found["wheel"], found
    _report(f"Triton {found['binary']}, native backends {', '.join(found['native'])}; Python "
            f"{'.'.join(map(str, found['version']))} from {found['python']}")  # fmt: skip


@pytest.fixture(autouse=True)
def _no_leftover_containers():
    """Every container a test starts is removed by the time it ends (``run --rm`` plus ``stop``)."""
    yield
    listed = subprocess.run(
        [*container_engine(), "ps", "--all", "--format", "{{.Names}}"], capture_output=True, text=True, timeout=30
    )
    assert not [n for n in listed.stdout.split() if n.startswith("smtriton-serve-")]


def _engine_args() -> list[str]:
    engine = os.environ.get("SMTRITON_CONTAINER_ENGINE")
    return ["--engine", engine] if engine else []


def test_local_endpoint_runs_the_image_for_a_multi_model_endpoint(tmp_path):
    """`smtriton local-endpoint --image`: boto3's invoke_endpoint with TargetModel, as against SageMaker;
    the archives are extracted on this side and loaded from /opt/ml/models inside the container."""
    archives = tmp_path / "archives"
    archives.mkdir()
    for i in range(3):
        _offset_model(tmp_path / f"src{i}" / "addsub", i)
        _tar(tmp_path / f"src{i}", archives / f"model{i}.tar.gz")
    emulator = Emulator(tmp_path, ["--image", IMAGE, *_engine_args(), "--models", str(archives), "--capacity", "2"])
    try:
        for i in [0, 1, 2, 0]:
            body = json.dumps(json_request({"INPUT0": A, "INPUT1": B}))
            r = emulator.client.invoke_endpoint(
                EndpointName="local", Body=body, ContentType="application/json", TargetModel=f"model{i}.tar.gz"
            )
            assert json.loads(r["Body"].read())["outputs"][0]["data"] == (A + B + i).flatten().tolist()
        status = requests.get(f"{emulator.url}/_local/models", timeout=5).json()
        assert status == {"loaded": ["model2.tar.gz", "model0.tar.gz"], "loads": 4, "evictions": 2}
    finally:
        code = emulator.stop()
    assert code == 0
    assert list(emulator.work.iterdir()) == []


def test_local_endpoint_runs_the_image_for_a_single_model_endpoint(tmp_path):
    repo = tmp_path / "repo"
    _offset_model(repo / "addsub", 7)
    _tar(repo, tmp_path / "model.tar.gz")
    emulator = Emulator(tmp_path, ["--image", IMAGE, *_engine_args(), "--model-data", str(tmp_path / "model.tar.gz")])
    try:
        body, content_type = binary_request({"INPUT0": A, "INPUT1": B})
        r = emulator.client.invoke_endpoint(EndpointName="local", Body=body, ContentType=content_type)
        header_length = int(r["ContentType"].split("json-header-size=")[1])
        result = httpclient.InferenceServerClient.parse_response_body(r["Body"].read(), header_length=header_length)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B + 7)
    finally:
        assert emulator.stop() == 0


README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_docker_run_serves_the_demo_text_encoder(tmp_path):
    """The README's container command (its mount and environment) and its first request, against the
    demo text encoder built from model_repository/recipe.toml, answered as the eager torch model does."""
    from smtriton.convert.build import build_repository
    from smtriton.convert.recipe import DEFAULT_RECIPE
    from smtriton.convert.reference import load_reference

    readme = README.read_text()
    run = re.search(r"^docker run .*?serve$", readme.replace("\\\n", " "), re.M | re.S)
    assert run is not None, "the README's docker run command"
    source, target = re.search(r"-v \$PWD/(\S+?):(\S+?):ro", run.group(0)).groups()
    env = dict(re.findall(r"-e (\w+)=(\S+)", run.group(0)))
    request = re.search(r"-d '(\{.*?\})'", readme, re.S)
    assert request is not None, "the README's curl request"
    body = json.loads(request.group(1))

    report = build_repository(DEFAULT_RECIPE, models=[env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"]])
    assert report.output == (README.parent / source).resolve()
    container, startup = _start(tmp_path, env=env, mounts=[Mount(report.output, target)])
    try:
        _report(f"start-up (the README's command, demo text encoder) {startup:.1f} s")
        r = requests.post(f"{container.url}/invocations", json=body, timeout=60)
        assert r.status_code == 200, r.text[:500]
        reference = load_reference(env["SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"])
        dtypes = {"INT64": np.int64, "INT32": np.int32}
        inputs = {
            i["name"]: np.array(i["data"], dtype=dtypes[i["datatype"]]).reshape(i["shape"]) for i in body["inputs"]
        }
        want = reference.run(inputs)
        (out,) = r.json()["outputs"]
        got = np.array(out["data"], dtype=np.float32).reshape(out["shape"])
        np.testing.assert_allclose(got, want[out["name"]], atol=1e-4, rtol=1e-3)
    finally:
        assert container.stop(30) == 0, container.log_tail()
