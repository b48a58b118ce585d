"""The invoke helper and `smtriton invoke` end to end: real boto3 `sagemaker-runtime` -> the local endpoint
emulator -> serve -> Triton, for JSON and binary+json, single-model and multi-model endpoints."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from smtriton.aws.invoke import BINARY_JSON, JSON, decode_response, encode_request, header_length, invoke
from tests.integration.harness import no_aws_environment
from tests.integration.test_local_endpoint import SMTRITON, Emulator, _offset_model, _tar

pytestmark = pytest.mark.integration

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


@pytest.fixture(scope="module")
def mme(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("invoke-mme")
    (tmp / "archives").mkdir()
    for offset in (10, 20):
        _offset_model(tmp / f"src{offset}" / "addsub", offset)
        _tar(tmp / f"src{offset}", tmp / "archives" / f"addsub{offset}.tar.gz")
    emulator = Emulator(tmp, ["--models", str(tmp / "archives"), "--capacity", "2"])
    yield emulator
    emulator.stop()


@pytest.fixture(scope="module")
def sme(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("invoke-sme")
    _offset_model(tmp / "repo" / "addsub", 5)
    _tar(tmp / "repo", tmp / "model.tar.gz")
    emulator = Emulator(tmp, ["--model-data", str(tmp / "model.tar.gz")])
    yield emulator
    emulator.stop()


@pytest.mark.parametrize("binary", [True, False], ids=["binary+json", "json"])
def test_sme_invoke_decodes_outputs_into_numpy(sme, binary):
    result = invoke(sme.client, "local", {"INPUT0": A, "INPUT1": B}, binary=binary)
    assert result.content_type.startswith(BINARY_JSON if binary else JSON)
    assert (result.model_name, result.invoked_variant) == ("addsub", "AllTraffic")
    assert result.outputs["OUTPUT0"].dtype == np.int32
    assert result.outputs["OUTPUT0"].shape == (1, 16)
    np.testing.assert_array_equal(result.outputs["OUTPUT0"], A + B + 5)
    np.testing.assert_array_equal(result.outputs["OUTPUT1"], A - B)


@pytest.mark.parametrize("binary", [True, False], ids=["binary+json", "json"])
def test_mme_invoke_routes_by_target_model(mme, binary):
    for offset in (10, 20, 10):
        result = invoke(
            mme.client,
            "local",
            {"INPUT0": A, "INPUT1": B},
            binary=binary,
            outputs=["OUTPUT0"],
            target_model=f"addsub{offset}.tar.gz",
        )
        assert result.content_type.startswith(BINARY_JSON if binary else JSON)
        assert result.model_name == f"addsub{offset}.tar.gz"
        assert list(result.outputs) == ["OUTPUT0"]  # only what was asked for
        np.testing.assert_array_equal(result.outputs["OUTPUT0"], A + B + offset)


def test_container_errors_surface_as_model_error(mme):
    with pytest.raises(mme.client.exceptions.ModelError) as err:
        invoke(mme.client, "local", {"INPUT0": A}, target_model="addsub10.tar.gz")
    assert err.value.response["OriginalStatusCode"] == 400


def test_binary_request_body_carries_raw_tensor_bytes_and_its_header_size():
    body, content_type = encode_request({"INPUT0": A}, binary=True)
    size = header_length(content_type)
    header = json.loads(body[:size])
    assert header["inputs"][0]["parameters"] == {"binary_data_size": A.nbytes}
    assert body[size:] == A.tobytes()
    body, content_type = encode_request({"TEXT": np.array([["a", "bc"]])}, binary=False)
    assert content_type == JSON
    assert json.loads(body)["inputs"][0] == {"name": "TEXT", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "bc"]}
    decoded = decode_response(
        b'{"model_name":"m","outputs":[{"name":"Y","datatype":"FP32","shape":[2],"data":[1,2]}]}', JSON
    )
    np.testing.assert_array_equal(decoded.outputs["Y"], np.array([1, 2], dtype=np.float32))
    assert decoded.outputs["Y"].dtype == np.float32


def test_invoke_command_prints_and_saves_outputs(mme, tmp_path):
    from typer.testing import CliRunner

    from smtriton.cli import app

    np.save(tmp_path / "a.npy", A)
    env = {
        "AWS_ENDPOINT_URL": mme.url,
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    # INPUT1 names its own dtype (the default, float32, would be refused): issue 15.7's per-input dtype.
    args = ["invoke", "local", "--input", f"INPUT0={tmp_path / 'a.npy'}", "--input", f"INPUT1={B.tolist()}:INT32",
            "--target-model", "addsub20.tar.gz", "--save", str(tmp_path / "out")]  # fmt: skip
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    assert "OUTPUT0" in result.stdout
    assert "int32" in result.stdout
    assert "[1, 16]" in result.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "OUTPUT0.npy"), A + B + 20)

    failed = CliRunner().invoke(app, [*args[:4], "--target-model", "addsub20.tar.gz"], env=env)
    assert failed.exit_code == 1
    assert "answered 400" in failed.output


def test_invoke_command_takes_an_endpoint_url_as_the_aws_cli_does(mme, tmp_path):
    """`--endpoint-url` points the one call at the local endpoint (no AWS_ENDPOINT_URL in the environment),
    and an endpoint name it does not serve is SageMaker's ValidationError, in one line."""
    from typer.testing import CliRunner

    from smtriton.cli import app

    env = {"AWS_ENDPOINT_URL": None, "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": None, "AWS_PROFILE": None,
           "AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local", "AWS_REGION": "us-east-1"}  # fmt: skip
    inputs = ["--input", f"INPUT0={A.tolist()}:INT32", "--input", f"INPUT1={B.tolist()}:INT32"]
    args = ["invoke", "local", "--endpoint-url", mme.url, *inputs, "--target-model", "addsub10.tar.gz",
            "--save", str(tmp_path / "out")]  # fmt: skip
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    assert "OUTPUT0" in result.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "OUTPUT0.npy"), A + B + 10)

    other = CliRunner().invoke(app, ["invoke", "elsewhere", "--endpoint-url", mme.url, *inputs], env=env)
    assert other.exit_code == 1
    (line,) = other.stderr.strip().splitlines()
    assert line.startswith("error: ValidationError: Endpoint elsewhere"), line


BYTES_MODEL_CONFIG = """name: "bytes_len"
backend: "python"
max_batch_size: 8
input [{ name: "IMAGE", data_type: TYPE_STRING, dims: [1] }]
output [{ name: "LENGTH", data_type: TYPE_INT64, dims: [1] },
        { name: "CHECKSUM", data_type: TYPE_INT64, dims: [1] }]
"""
BYTES_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            items = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy().reshape(-1)
            length = np.array([[len(v)] for v in items], dtype=np.int64)
            checksum = np.array([[sum(v) % 2**31] for v in items], dtype=np.int64)
            outputs = [pb_utils.Tensor("LENGTH", length), pb_utils.Tensor("CHECKSUM", checksum)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""


def test_invoke_sends_a_files_bytes_as_one_bytes_element(tmp_path):
    """`--input IMAGE=@photo.jpg`, curl's convention: the bytes arrive whole, as one element of a batch of
    one; asked to travel as JSON they are refused in one line. No AWS configuration is needed for it."""
    model = tmp_path / "repo" / "bytes_len"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(BYTES_MODEL_CONFIG)
    (model / "1" / "model.py").write_text(BYTES_MODEL)
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(bytes(range(256)) * 40 + b"\xff\xd8\x00")  # not UTF-8, with NUL bytes
    emulator = Emulator(tmp_path, ["--model-data", str(tmp_path / "repo")])
    env = no_aws_environment(tmp_path / "home")
    invoke_cmd = [SMTRITON, "invoke", "local", "--endpoint-url", emulator.url, "--input", f"IMAGE=@{photo}"]
    try:
        done = subprocess.run([*invoke_cmd, "--save", str(tmp_path / "out")], capture_output=True, text=True,
                              timeout=120, env=env)  # fmt: skip
        as_json = subprocess.run([*invoke_cmd, "--json"], capture_output=True, text=True, timeout=120, env=env)
        missing = subprocess.run([*invoke_cmd[:-1], "IMAGE=@nowhere.jpg"], capture_output=True, text=True,
                                 timeout=120, env=env)  # fmt: skip
    finally:
        emulator.stop()
    assert done.returncode == 0, done.stderr
    assert np.load(tmp_path / "out" / "LENGTH.npy").tolist() == [[len(photo.read_bytes())]]
    assert np.load(tmp_path / "out" / "CHECKSUM.npy").tolist() == [[sum(photo.read_bytes()) % 2**31]]
    assert as_json.returncode == 2
    (line,) = as_json.stderr.strip().splitlines()
    assert "IMAGE: BYTES that are not UTF-8 text cannot travel as JSON" in line, line
    assert missing.returncode == 2
    (line,) = missing.stderr.strip().splitlines()
    assert "No such file or directory: nowhere.jpg" in line, line
