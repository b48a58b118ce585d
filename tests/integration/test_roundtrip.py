"""The conversion toolchain end to end, on CPU, for the demo models:

source (recipe entry) -> ONNX / TorchScript (`smtriton convert`) -> config.pbtxt from the artifact
(`smtriton config`) -> `smtriton validate` -> `smtriton package sme|mme` (twice: byte-identical) ->
safe extraction -> the real `serve` + Triton load the extracted archive -> `/invocations` (and the
MME invoke route) answer what the eager torch model computes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests
from typer.testing import CliRunner

from smtriton import model_config
from smtriton.cli import app
from smtriton.convert.reference import load_reference
from smtriton.local.archive import safe_extract
from tests.integration.conftest import start_serve
from tests.integration.contract_client import binary_request, json_request, parse

pytestmark = pytest.mark.integration

CONVERSIONS = [("resnet_onnx", "onnx"), ("resnet_torchscript", "torchscript"), ("text_encoder", "onnx")]
RENAMES = {"text_encoder": "encoder"}  # packaged under another name: directory and config rewritten
ATOL, RTOL = 1e-4, 1e-3


def cli(*args: object) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("roundtrip") / "repo"
    for model, fmt in CONVERSIONS:
        cli("convert", fmt, "-m", model, "-o", repo, "--no-config", "--trials", "1")
    cli(
        "config",
        repo / "resnet_onnx",
        "--max-batch-size",
        "8",
        "--preferred-batch-size",
        "4",
        "--preferred-batch-size",
        "8",
        "--max-queue-delay-us",
        "100",
        "--instance-kind",
        "KIND_CPU",
        "--warmup",
    )
    cli("config", repo / "resnet_torchscript", "--instance-kind", "KIND_CPU", "--parameter", "INFERENCE_MODE=true")
    cli("config", repo / "text_encoder", "--max-batch-size", "16", "--instance-kind", "KIND_CPU",
        "--warmup", "--warmup-size", "sequence=8")  # fmt: skip
    return repo


def test_configs_come_from_the_artifacts(repository):
    onnx_config = model_config.read(repository / "resnet_onnx")
    assert [(i.name, list(i.dims)) for i in onnx_config.input] == [("pixel_values", [3, 224, 224])]
    assert [(o.name, list(o.dims)) for o in onnx_config.output] == [("logits", [1000])]
    assert len(onnx_config.model_warmup) == 1
    ts_config = model_config.read(repository / "resnet_torchscript")
    assert ts_config.max_batch_size == 8  # recorded in model.pt's signature at export
    assert [i.name for i in ts_config.input] == ["INPUT__0"]
    assert [o.name for o in ts_config.output] == ["OUTPUT__0"]
    text = model_config.read(repository / "text_encoder")
    assert [(o.name, list(o.dims)) for o in text.output] == [("last_hidden_state", [-1, 128]), ("pooler_output", [128])]


def test_generated_repository_validates(repository):
    cli("validate", repository)
    cli("validate", repository, "--mme")


@pytest.fixture(scope="module")
def sme_archives(repository, tmp_path_factory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("sme")
    renames = [f"--rename={old}={new}" for old, new in RENAMES.items()]
    cli("package", "sme", repository, "-o", out / "a" / "model.tar.gz", *renames)
    cli("package", "sme", repository, "-o", out / "b" / "model.tar.gz", *renames)
    return out / "a" / "model.tar.gz", out / "b" / "model.tar.gz"


def test_packaging_the_same_repository_twice_gives_identical_bytes(sme_archives):
    first, second = sme_archives
    assert first.read_bytes() == second.read_bytes()
    assert first.with_name("model.tar.gz.sha256").read_text() == second.with_name("model.tar.gz.sha256").read_text()


@pytest.fixture(scope="module")
def extracted(sme_archives, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("opt_ml_model") / "model"
    safe_extract(sme_archives[0], root)
    assert sorted(p.name for p in root.iterdir()) == ["encoder", "resnet_onnx", "resnet_torchscript"]
    assert model_config.read(root / "encoder").name == "encoder"
    return root


def _check(result, reference, inputs) -> None:
    expected = reference.run(inputs)
    for output in reference.spec.outputs:
        got = result.as_numpy(output.name)
        np.testing.assert_allclose(got, expected[output.name], atol=ATOL, rtol=RTOL, err_msg=output.name)


@pytest.fixture(scope="module", params=["resnet_onnx", "resnet_torchscript", "text_encoder"])
def sme_server(request, extracted, tmp_path_factory) -> Iterator[tuple[object, str, str]]:
    source = request.param
    served = RENAMES.get(source, source)
    server = start_serve(tmp_path_factory.mktemp(f"sme_{served}"), extracted, served)
    yield server, source, served
    server.stop()


def test_serve_loads_the_extracted_archive_and_matches_torch(sme_server):
    server, source, served = sme_server
    reference = load_reference(source)
    inputs = reference.make_inputs(21, batch=2)
    body, content_type = binary_request(inputs)
    r = requests.post(f"{server.url}/invocations", data=body, headers={"Content-Type": content_type}, timeout=60)
    assert r.status_code == 200, r.text[:500]
    result = parse(r)
    assert result.get_response()["model_name"] == served
    _check(result, reference, inputs)


def test_mme_archives_load_and_answer(repository, tmp_path_factory):
    """One archive per model; the ONNX models (TorchScript took the SME path above, and loads slowly)."""
    tmp = tmp_path_factory.mktemp("mme")
    names = ["resnet_onnx", "text_encoder"]
    cli("package", "mme", repository, "-o", tmp / "archives", *(f"--model={n}" for n in names))
    assert sorted(p.name for p in (tmp / "archives").glob("*.tar.gz")) == [f"{n}.tar.gz" for n in names]
    root = tmp / "models"
    for name in names:
        safe_extract(tmp / "archives" / f"{name}.tar.gz", root / name / "model")
    server = start_serve(tmp, None, None, args=["--multi-model", "--model-root", str(root)])
    try:
        for name in names:
            url = str(root / name / "model")
            r = requests.post(f"{server.url}/models", json={"model_name": name, "url": url}, timeout=120)
            assert r.status_code == 200, r.text
            reference = load_reference(name)
            inputs = reference.make_inputs(22)
            r = requests.post(f"{server.url}/models/{name}/invoke", json=json_request(inputs), timeout=60)
            assert r.status_code == 200, r.text[:500]
            _check(parse(r), reference, inputs)
    finally:
        server.stop()
