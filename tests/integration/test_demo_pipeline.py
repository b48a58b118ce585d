"""The demo image pipeline (image_preprocess -> resnet_onnx -> image_postprocess, one ensemble built from
the recipe) served by the real serve + Triton, single-model and multi-model, invoked with a JPEG and a PNG
made here and compared with the eager reference's top-5.

Each encoding a client may use is a value of ``ENCODINGS``; :func:`image_request` builds its body: a
KServe tensor (binary+json or JSON), or the image itself as the body (``Content-Type: image/jpeg``).
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from PIL import Image, ImageDraw

from smtriton.convert.build import build_repository
from smtriton.convert.recipe import DEFAULT_RECIPE
from smtriton.convert.recipe_parse import load_recipe
from smtriton.convert.reference import load_reference
from smtriton.repo.package import package_mme
from tests.integration.conftest import start_serve
from tests.integration.contract_client import BJ, parse
from tests.integration.harness import ServeProcess, no_aws_environment
from tests.integration.test_local_endpoint import Emulator

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = "image_pipeline"
ATOL, RTOL = 1e-4, 1e-3
CONTENT_TYPES = {"JPEG": "image/jpeg", "PNG": "image/png"}
ENCODINGS = [
    "binary+json",  # tritonclient's binary tensor extension: the image bytes as they are
    "json",  # KServe JSON: BYTES elements are text, so the image travels as base64
    "raw",  # the image itself, Content-Type image/jpeg or image/png: serve makes it the IMAGE element
]


def drawn_image(fmt: str, size: tuple[int, int]) -> bytes:
    """A picture made here: a colour gradient with shapes on it, encoded as ``fmt`` (the PNG with alpha)."""
    width, height = size
    x, y = np.meshgrid(np.linspace(0, 255, width), np.linspace(0, 255, height))
    rgb = np.stack([x, y, 255 - x], axis=-1).astype(np.uint8)
    image = Image.fromarray(rgb).convert("RGBA" if fmt == "PNG" else "RGB")
    draw = ImageDraw.Draw(image)
    draw.ellipse((width // 5, height // 5, width // 2, height // 2), fill=(250, 240, 20))
    draw.rectangle((width // 2, height // 2, width - 10, height - 10), outline=(10, 10, 10), width=6)
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **({"quality": 92} if fmt == "JPEG" else {}))
    return buffer.getvalue()


@pytest.fixture(scope="module")
def images() -> dict[str, bytes]:
    return {"JPEG": drawn_image("JPEG", (400, 300)), "PNG": drawn_image("PNG", (240, 320))}


def column(encoded: list[bytes]) -> np.ndarray:
    return np.array([[e] for e in encoded], dtype=np.object_)


def image_request(encoded: list[bytes], encoding: str, fmt: str = "JPEG") -> tuple[bytes, str]:
    """(body, content type) carrying ``encoded`` images as the pipeline's IMAGE input [n, 1]."""
    if encoding == "binary+json":
        tensor = httpclient.InferInput("IMAGE", [len(encoded), 1], "BYTES")
        tensor.set_data_from_numpy(column(encoded), binary_data=True)
        body, json_size = httpclient.InferenceServerClient.generate_request_body([tensor])
        return body, f"{BJ};json-header-size={json_size}"
    if encoding == "json":
        data = [base64.b64encode(e).decode() for e in encoded]
        request = {"inputs": [{"name": "IMAGE", "shape": [len(encoded), 1], "datatype": "BYTES", "data": data}]}
        return json.dumps(request).encode(), "application/json"
    assert encoding == "raw"
    assert len(encoded) == 1, "a raw image body is one image"
    return encoded[0], CONTENT_TYPES[fmt]


def _each_key_once(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), f"a key repeated in one JSON object of the answer: {keys}"
    return dict(pairs)


def assert_eager_top5(response: requests.Response, encoded: list[bytes]) -> None:
    assert response.status_code == 200, response.text[:500]
    size = response.headers["content-type"].partition("json-header-size=")[2]
    header = json.loads(response.content[: int(size)] if size else response.content, object_pairs_hook=_each_key_once)
    assert header["parameters"] == {"sequence_id": 0, "sequence_start": False, "sequence_end": False}
    expected = load_reference(PIPELINE).run({"IMAGE": column(encoded)})
    result = parse(response)
    assert result.as_numpy("CLASS_IDS").tolist() == expected["CLASS_IDS"].tolist()
    np.testing.assert_allclose(result.as_numpy("SCORES"), expected["SCORES"], atol=ATOL, rtol=RTOL)


@pytest.fixture(scope="module")
def demo_repository() -> Path:
    """The built demo repository (built here if needed; a no-op when up to date)."""
    report = build_repository(DEFAULT_RECIPE, models=[PIPELINE])
    failed = [r for r in report.results if r.status == "failed"]
    assert not failed, [(r.name, r.error) for r in failed]
    return report.output


def pipeline_models() -> list[str]:
    return [m.name for m in load_recipe().build_order([PIPELINE])]


@pytest.fixture(scope="module")
def sme(demo_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A single-model endpoint serving the pipeline (SAGEMAKER_TRITON_DEFAULT_MODEL_NAME=image_pipeline)."""
    tmp = tmp_path_factory.mktemp("sme")
    repo = tmp / "repo"
    repo.mkdir()
    for name in pipeline_models():
        (repo / name).symlink_to(demo_repository / name, target_is_directory=True)
    server = start_serve(tmp, repo, PIPELINE)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mme(demo_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A multi-model endpoint with the pipeline's archive (`smtriton package mme`) loaded as SageMaker does."""
    tmp = tmp_path_factory.mktemp("mme")
    (archive,) = package_mme(demo_repository, tmp / "archives", models=[PIPELINE])
    assert archive.models == (PIPELINE, "image_postprocess", "image_preprocess", "resnet_onnx")
    url = tmp / "models" / "pipelinehash" / "model"
    url.mkdir(parents=True)
    with tarfile.open(archive.path) as tar:
        tar.extractall(url, filter="data")
    server = start_serve(tmp, None, None, args=["--multi-model", "--model-root", str(tmp / "models")])
    server.root = tmp / "models"
    try:
        r = requests.post(
            f"{server.url}/models",
            json={"model_name": "pipelinehash", "url": str(url)},
            headers={"X-Amzn-SageMaker-Target-Model": archive.path.name},
            timeout=300,
        )
        assert r.status_code == 200, r.text
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture(params=["sme", "mme"])
def invoke_url(request: pytest.FixtureRequest) -> str:
    server: ServeProcess = request.getfixturevalue(request.param)
    return f"{server.url}/invocations" if request.param == "sme" else f"{server.url}/models/pipelinehash/invoke"


def post(url: str, body: bytes, content_type: str) -> requests.Response:
    return requests.post(url, data=body, headers={"Content-Type": content_type}, timeout=120)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_an_image_gets_the_eager_top5(invoke_url, images, encoding, fmt):
    body, content_type = image_request([images[fmt]], encoding, fmt)
    assert_eager_top5(post(invoke_url, body, content_type), [images[fmt]])


@pytest.mark.parametrize("encoding", ["binary+json", "json"])
def test_a_jpeg_and_a_png_in_one_request_get_their_own_rows(invoke_url, images, encoding):
    both = [images["JPEG"], images["PNG"]]
    assert_eager_top5(post(invoke_url, *image_request(both, encoding)), both)


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(sme, images):
    rng = np.random.default_rng(7)
    cases = [
        [drawn_image(fmt, (int(w), int(h)))]
        for fmt, (w, h) in zip(["JPEG", "PNG"] * 4, rng.integers(120, 500, size=(8, 2)), strict=True)
    ]
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda c: post(f"{sme.url}/invocations", *image_request(c, "binary+json")), cases))
    for encoded, response in zip(cases, responses, strict=True):
        assert_eager_top5(response, encoded)


def test_an_element_that_is_no_image_is_a_400_naming_it(sme, images):
    body, content_type = image_request([images["PNG"], b"no image here"], "binary+json")
    r = post(f"{sme.url}/invocations", body, content_type)
    assert r.status_code == 400
    assert "IMAGE element 1: not an image Pillow can decode" in r.json()["error"]
    assert requests.get(f"{sme.url}/ping", timeout=5).status_code == 200


# --- the README's pipeline examples, as a user runs them ---------------------------------------------


def readme_block(first_words: str) -> str:
    from tests.integration.test_readme import examples

    (body,) = [e.body for e in examples() if e.body.startswith(first_words)]
    return body


def test_the_readme_curl_example(sme, images, tmp_path):
    block = readme_block("DEMO_MODEL=image_pipeline bash scripts/demo.sh")
    assert '--default-model "${DEMO_MODEL:-text_encoder}"' in (ROOT / "scripts" / "demo.sh").read_text()
    (tmp_path / "cat.jpg").write_bytes(images["JPEG"])
    curl = "\n".join(block.splitlines()[1:]).replace("http://localhost:8080", sme.url)
    done = subprocess.run(["bash", "-c", curl], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True)
    answer = json.loads(done.stdout)
    outputs = {o["name"]: o["data"] for o in answer["outputs"]}
    expected = load_reference(PIPELINE).run({"IMAGE": column([images["JPEG"]])})
    assert outputs["CLASS_IDS"] == expected["CLASS_IDS"].reshape(-1).tolist()
    np.testing.assert_allclose(outputs["SCORES"], expected["SCORES"].reshape(-1), atol=ATOL, rtol=RTOL)


def test_the_readme_raw_image_example(sme, images, tmp_path):
    curl = readme_block("curl -s http://localhost:8080/invocations -H 'Content-Type: image/jpeg'")
    (tmp_path / "cat.jpg").write_bytes(images["JPEG"])
    command = curl.replace("http://localhost:8080", sme.url)
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    outputs = {o["name"]: o["data"] for o in json.loads(done.stdout)["outputs"]}
    expected = load_reference(PIPELINE).run({"IMAGE": column([images["JPEG"]])})
    assert outputs["CLASS_IDS"] == expected["CLASS_IDS"].reshape(-1).tolist()


# The README's block of endpoints for its boto3 example, by its first words.
BOTO3_ENDPOINTS = "smtriton local-endpoint --model-data model_repository --default-model image_pipeline"


@pytest.mark.parametrize("kind", ["sme", "mme"])
def test_the_readme_boto3_example(demo_repository, images, tmp_path, kind):
    commands = [line.split("#", 1)[0].split() for line in readme_block(BOTO3_ENDPOINTS).splitlines()]
    python = readme_block("import boto3, numpy as np, tritonclient")
    (tmp_path / "cat.jpg").write_bytes(images["JPEG"])
    places = {"model_repository": str(demo_repository), "archives": str(tmp_path / "archives")}
    if kind == "sme":
        line = commands[0]
    else:
        package = [places.get(a, a) for a in commands[1]]
        assert package[:3] == ["smtriton", "package", "mme"]
        done = subprocess.run([sys.executable, "-c", "from smtriton.cli import main; main()", *package[1:]],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        line = commands[2]
        target = re.search(r'TargetModel="([^"]+)"', readme_block(BOTO3_ENDPOINTS))
        assert target is not None
        python = python.replace('EndpointName="local",', f'EndpointName="local", TargetModel="{target.group(1)}",')
    assert line[:2] == ["smtriton", "local-endpoint"]
    args = [places.get(a, a) for a in line[2:]]
    del args[args.index("--port") : args.index("--port") + 2]  # the emulator picks a free one
    emulator = Emulator(tmp_path, args)
    try:
        done = subprocess.run(
            [sys.executable, "-c", python.replace("http://127.0.0.1:8090", emulator.url)],
            cwd=tmp_path, env=no_aws_environment(tmp_path / "home"), capture_output=True, text=True, timeout=120,
        )  # fmt: skip  # as written, on a machine where AWS was never set up
    finally:
        emulator.stop()
    assert done.returncode == 0, done.stderr
    expected = load_reference(PIPELINE).run({"IMAGE": column([images["JPEG"]])})
    printed = re.fullmatch(r"(\[\[.*?\]\]) (\[\[.*\]\])", done.stdout.strip())
    assert printed is not None, done.stdout
    printed_ids, printed_scores = json.loads(printed.group(1)), json.loads(printed.group(2))
    assert printed_ids == expected["CLASS_IDS"].tolist()
    np.testing.assert_allclose(printed_scores, expected["SCORES"], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("content_type", ["image/jpeg", "image/png", "application/x-image"])
def test_an_image_body_to_a_model_without_one_bytes_input_is_415_saying_what_it_takes(
    mme, demo_repository, images, content_type
):
    """resnet_onnx on its own takes FP32 pixels, not an encoded image: 415, the model stays healthy."""
    url = mme.root / "resnethash" / "model"
    if not url.exists():
        shutil.copytree(demo_repository / "resnet_onnx", url)
        load = {"model_name": "resnethash", "url": str(url)}
        assert requests.post(f"{mme.url}/models", json=load, timeout=300).status_code == 200
    r = requests.post(
        f"{mme.url}/models/resnethash/invoke", data=images["JPEG"], headers={"Content-Type": content_type}, timeout=60
    )
    assert r.status_code == 415
    assert r.json()["error"].startswith("model 'resnethash' does not take an image body: that needs one BYTES input")
    assert "pixel_values (FP32 [-1, 3, 224, 224])" in r.json()["error"]
    pixels = np.zeros((1, 3, 224, 224), dtype=np.float32)
    tensor = httpclient.InferInput("pixel_values", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels, binary_data=True)
    body, size = httpclient.InferenceServerClient.generate_request_body([tensor])
    tensor_type = f"application/vnd.sagemaker-triton.binary+json;json-header-size={size}"
    assert post(f"{mme.url}/models/resnethash/invoke", body, tensor_type).status_code == 200
