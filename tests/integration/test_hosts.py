"""SageMaker's hosts as they are: `serve` inside a memory cgroup with a limit (v1 on hosts like
SageMaker's Amazon Linux 2 and this project's CI, v2 where that is what the host has).

The cgroup is made here, as a child of this process's own memory cgroup, and `serve` is started inside
it; where no child cgroup can be made (no permission, no delegation) the tests say so and skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from smtriton.serve.host import cgroups
from tests.integration.conftest import TEST_MODELS, start_serve
from tests.integration.contract_client import json_request, parse
from tests.integration.harness import ServeProcess, free_port

pytestmark = pytest.mark.integration

MIB = 1 << 20
LIMIT = 1024 * MIB
RESERVE = 100 * MIB
A = np.arange(16, dtype=np.int32).reshape(1, 16)
ADDSUB = json.dumps(json_request({"INPUT0": A, "INPUT1": A})).encode()


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A child of this process's memory cgroup with a limit of :data:`LIMIT` (and no swap beyond it)."""
    parent = cgroups.memory_group()
    if parent is None:
        pytest.skip("no memory cgroup found for this process")
    child = parent.directory / f"smtriton-test-{uuid.uuid4().hex[:8]}"
    try:
        child.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a child memory cgroup under {parent.directory}: {exc.strerror}")
    try:
        if parent.version == 1:
            (child / "memory.limit_in_bytes").write_text(str(LIMIT))
            swap = child / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(str(LIMIT))
        else:
            (child / "memory.max").write_text(str(LIMIT))
            (child / "memory.swap.max").write_text("0")
    except OSError as exc:
        child.rmdir()
        pytest.skip(f"cannot set a memory limit in {child}: {exc.strerror}")
    yield child
    for _ in range(50):  # the processes that were in it are gone once serve stopped; the kernel may lag
        try:
            child.rmdir()
            break
        except OSError:
            time.sleep(0.1)


def _inside(cgroup: Path) -> list[str]:
    """A launcher that starts serve inside ``cgroup`` (and so Triton, its stubs and the workers)."""
    return ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh"]


def _mme(tmp_path: Path, cgroup: Path | None) -> ServeProcess:
    root = tmp_path / "models"
    root.mkdir(parents=True)
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": "1", "SMTRITON_MEMORY_RESERVE_BYTES": str(RESERVE)}
    args = ["--multi-model", "--model-root", str(root)]
    server = start_serve(tmp_path, None, None, env=env, args=args, launcher=_inside(cgroup) if cgroup else None)
    server.root = root  # type: ignore[attr-defined]
    return server


def _big_archive(root: Path, name: str, size: int) -> str:
    """addsub with a ``size``-byte file beside it (allocated, not written: it costs no time, and its
    bytes are held, as the memory estimate counts them; a sparse file would count as nothing)."""
    url = root / name / "model"
    shutil.copytree(TEST_MODELS / "addsub", url, ignore=shutil.ignore_patterns("__pycache__"))
    with (url / "1" / "weights.bin").open("wb") as weights:
        if size:
            os.posix_fallocate(weights.fileno(), 0, size)
    return str(url)


def _load(server: ServeProcess, name: str, url: str) -> requests.Response:
    return requests.post(f"{server.url}/models", json={"model_name": name, "url": url}, timeout=120)


def test_a_load_past_the_cgroups_limit_is_507_and_the_same_load_without_the_limit_is_not(tmp_path, memory_cgroup):
    limited = _mme(tmp_path / "limited", memory_cgroup)
    try:
        assert "limits: memory: 1024 MiB (cgroup v" in limited.log_text()  # found, and said once at start
        url = _big_archive(limited.root, "big", LIMIT)  # type: ignore[attr-defined]
        refused = _load(limited, "big", url)
        assert refused.status_code == 507, refused.text
        available = int(refused.json()["error"].rsplit(" and ", 1)[1].split(" MiB")[0])
        assert available < LIMIT // MIB  # the cgroup's room, not the host's
        small = _big_archive(limited.root, "small", 8 * MIB)  # type: ignore[attr-defined]
        assert _load(limited, "small", small).status_code == 200
        assert requests.post(f"{limited.url}/models/small/invoke", data=ADDSUB, timeout=30).status_code == 200
    finally:
        limited.stop()
    unlimited = _mme(tmp_path / "unlimited", None)
    try:
        url = _big_archive(unlimited.root, "big", LIMIT)  # type: ignore[attr-defined]
        accepted = _load(unlimited, "big", url)
        assert accepted.status_code == 200, accepted.text
    finally:
        unlimited.stop()


HOG = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.weights = np.ones({size}, dtype=np.uint8)  # every page written: all of it resident

    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("never reached")) for _ in requests]
"""


def test_a_400_after_an_oom_killed_load_stays_a_400(tmp_path, memory_cgroup):
    server = _mme(tmp_path, memory_cgroup)
    try:
        root: Path = server.root  # type: ignore[attr-defined]
        assert _load(server, "small", _big_archive(root, "small", 0)).status_code == 200
        hog = _big_archive(root, "hog", 0)
        (Path(hog) / "1" / "model.py").write_text(HOG.format(size=2 * LIMIT))
        group = cgroups.MemoryGroup(memory_cgroup, cgroups.memory_group().version)  # type: ignore[union-attr]
        kills = group.oom_kills()
        if kills is None:
            pytest.skip("this kernel does not count OOM kills in a cgroup")
        oom = _load(server, "hog", hog)
        assert group.oom_kills() == kills + 1  # the kernel's OOM killer ended the model's process
        assert oom.status_code == 507, oom.text  # and the load says so
        assert requests.get(f"{server.url}/ping", timeout=5).status_code == 200
        wrong = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "INT32", "data": [1, 2, 3]}]})
        for _ in range(3):  # Triton's refusal of a request stays a 400: the OOM kill was before it
            answer = requests.post(f"{server.url}/models/small/invoke", data=wrong, timeout=30)
            assert answer.status_code == 400, answer.text
        assert requests.post(f"{server.url}/models/small/invoke", data=ADDSUB, timeout=30).status_code == 200
    finally:
        server.stop()


BLS_CONFIG = """name: "bls"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0", data_type: TYPE_INT32, dims: [16] },
  { name: "INPUT1", data_type: TYPE_INT32, dims: [16] }
]
output [{ name: "SUM", data_type: TYPE_INT32, dims: [16] }]
"""
BLS_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, name) for name in ("INPUT0", "INPUT1")]
            call = pb_utils.InferenceRequest(model_name="addsub", requested_output_names=["OUTPUT0"], inputs=inputs)
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(answer.error().message())))
                continue
            total = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)]))
        return responses
"""


@pytest.fixture(scope="module")
def bls_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test models and ``bls``, a Python model that calls ``addsub`` (Python backend BLS)."""
    repo = tmp_path_factory.mktemp("bls") / "models"
    shutil.copytree(TEST_MODELS, repo, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "bls" / "1").mkdir(parents=True)
    (repo / "bls" / "config.pbtxt").write_text(BLS_CONFIG)
    (repo / "bls" / "1" / "model.py").write_text(BLS_MODEL)
    return repo


@pytest.mark.parametrize(
    "env",
    [
        {"SMTRITON_LOAD_MODELS": "addsub"},
        {"SMTRITON_LOAD_MODELS": "*"},
        {"SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--load-model=addsub"},  # native's way keeps working
    ],
    ids=["named", "all", "additional-args"],
)
def test_a_bls_model_serves_once_the_models_it_calls_are_loaded_with_it(tmp_path, bls_repository, env):
    server = start_serve(tmp_path, bls_repository, "bls", env=env)
    try:
        assert "model bls is ready (with addsub" in server.log_text()  # /ping waited for both
        answer = requests.post(f"{server.url}/invocations", data=ADDSUB, timeout=30)
        assert answer.status_code == 200, answer.text
        np.testing.assert_array_equal(parse(answer).as_numpy("SUM"), A + A)
    finally:
        server.stop()


def test_without_its_models_a_bls_model_cannot_call_them(tmp_path, bls_repository):
    server = start_serve(tmp_path, bls_repository, "bls")
    try:
        answer = requests.post(f"{server.url}/invocations", data=ADDSUB, timeout=30)
        assert answer.status_code != 200
        assert "addsub" in answer.json()["error"]
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        # what users of NVIDIA's front do (its word-splitting passed the flag on): told the setting to use
        ({"SAGEMAKER_TRITON_LOG_INFO": "false --load-model=addsub"}, "set SMTRITON_LOAD_MODELS=addsub"),
        ({"SMTRITON_LOAD_MODELS": "addsub,nosuch"}, "names nosuch, which"),
    ],
)
def test_models_to_load_are_checked_at_start_in_one_line(bls_repository, env, message):
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEMAKER_", "SMTRITON_"))}
    args = [sys.executable, "-m", "smtriton.serve", "--model-repository", str(bls_repository)]
    args += ["--default-model", "bls", "--port", str(free_port())]
    done = subprocess.run(args, env={**clean, **env}, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr  # one line
    assert message in done.stderr


SMALL_SHM = "40m"  # room for two of the Python backend's 16 MiB regions


def _small_dev_shm() -> list[str]:
    """A launcher that starts serve in a private mount namespace whose /dev/shm is a small tmpfs."""
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size={SMALL_SHM} tmpfs /dev/shm"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a small /dev/shm in a private mount namespace here: {probe.stderr.strip()}")
    return ["unshare", "-m", "sh", "-c", f'mount -t tmpfs -o size={SMALL_SHM} tmpfs /dev/shm && exec "$@"', "sh"]


def test_an_sme_whose_python_instances_cannot_fit_in_dev_shm_stops_with_one_line(tmp_path, test_repository):
    launcher = _small_dev_shm()
    slow = ServeProcess(test_repository, "slow", tmp_path / "slow.log", launcher=launcher)  # 4 instances
    try:
        assert slow.wait(60) == 1
        (line,) = slow.log_text().strip().splitlines()[-1:]
        assert line == (
            "ERROR: the Python backend needs 64 MiB of shared memory for 4 model instances (16 MiB each, "
            "SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE) and /dev/shm has 40 MiB free: give the container more shared "
            "memory, lower SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE, or run fewer instances"
        )
    finally:
        slow.stop()
    (tmp_path / "addsub").mkdir()
    fits = ServeProcess(test_repository, "addsub", tmp_path / "addsub" / "serve.log", launcher=launcher)  # 1 instance
    try:
        fits.wait_healthy()
        assert requests.post(f"{fits.url}/invocations", data=ADDSUB, timeout=30).status_code == 200
    finally:
        fits.stop()


def test_an_mme_load_that_cannot_fit_in_dev_shm_is_507_and_the_endpoint_serves_on(tmp_path):
    launcher = _small_dev_shm()
    root = tmp_path / "models"
    root.mkdir()
    server = start_serve(
        tmp_path, None, None, env={"SAGEMAKER_MODEL_SERVER_WORKERS": "1"}, launcher=launcher,
        args=["--multi-model", "--model-root", str(root)],
    )  # fmt: skip
    try:
        shutil.copytree(TEST_MODELS / "addsub", root / "small" / "model")
        shutil.copytree(TEST_MODELS / "slow", root / "wide" / "model")
        assert _load(server, "small", str(root / "small" / "model")).status_code == 200  # 16 of 40 MiB
        refused = _load(server, "wide", str(root / "wide" / "model"))  # 4 more instances: 64 MiB
        assert refused.status_code == 507, refused.text
        assert refused.json()["error"].startswith("cannot load model 'wide': the Python backend needs 64 MiB")
        assert "/dev/shm has 24 MiB free" in refused.json()["error"]
        assert requests.get(f"{server.url}/ping", timeout=5).status_code == 200
        assert requests.post(f"{server.url}/models/small/invoke", data=ADDSUB, timeout=30).status_code == 200
        assert [m["modelName"] for m in requests.get(f"{server.url}/models", timeout=5).json()["models"]] == ["small"]
    finally:
        server.stop()


PACKED_CONFIG = """name: "packed"
backend: "python"
max_batch_size: 0
input [{ name: "X", data_type: TYPE_INT32, dims: [1] }]
output [{ name: "Y", data_type: TYPE_INT32, dims: [1] }]
parameters: { key: "EXECUTION_ENV_PATH", value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }
"""
PACKED_MODEL = """import numpy as np
import packed_only  # in the packed environment, nowhere else
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        value = np.array([packed_only.VALUE], dtype=np.int32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", value)]) for _ in requests]
"""
# Relocatable, as conda-pack's: wherever Triton unpacks it, its bin/ goes first on PATH, where the
# Python backend's stub finds its interpreter (and so the environment's packages).
ACTIVATE = """_env="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$_env/bin:$PATH"
"""


def _packed_environment(target: Path) -> None:
    """An environment archive as conda-pack lays one out, made from this interpreter: conda is not
    installable from the registries this project builds from, so a venv's layout stands in for it
    (bin/python3, pyvenv.cfg, bin/activate, lib/pythonX.Y/site-packages with a module of its own; the
    packages of this environment reached through a .pth, as a real one would carry them itself)."""
    import sysconfig
    import tarfile

    env = target.parent / "env"
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = env / "lib" / version / "site-packages"
    site.mkdir(parents=True)
    (env / "bin").mkdir()
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    (env / "bin" / "python3").symlink_to(base)
    (env / "bin" / "activate").write_text(ACTIVATE)
    (env / "pyvenv.cfg").write_text(f"home = {base.parent}\ninclude-system-site-packages = false\n")
    (site / "packed_only.py").write_text("VALUE = 42\n")
    (site / "this_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    with tarfile.open(target, "w:gz") as archive:
        archive.add(env, arcname=".")
    shutil.rmtree(env)


def test_a_python_model_runs_in_the_packed_environment_its_config_names(tmp_path):
    repo = tmp_path / "models"
    model = repo / "packed"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(PACKED_CONFIG)
    (model / "1" / "model.py").write_text(PACKED_MODEL)
    _packed_environment(model / "env.tar.gz")
    from smtriton.repo.validate import errors, validate_repository

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert errors(validate_repository(repo, stub_python=python)) == []
    server = start_serve(tmp_path, repo, "packed")
    try:
        assert "Using Python execution env" in server.log_text()
        body = json.dumps({"inputs": [{"name": "X", "shape": [1], "datatype": "INT32", "data": [1]}]})
        answer = requests.post(f"{server.url}/invocations", data=body, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [42]
    finally:
        server.stop()
