"""The requests the benchmark sends, and how an answer is decoded and compared with the anchor's.

Bodies are built the way clients build them: JSON with ``json.dumps``-style numbers (a float32 image
becomes Python floats, as ``array.tolist()`` gives them), binary+json with ``tritonclient``'s own
``generate_request_body`` (outputs then come back binary, as SageMaker binary clients ask).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

BINARY_JSON_PREFIX = "application/vnd.sagemaker-triton.binary+json;json-header-size="
REPO_ROOT = Path(__file__).resolve().parent.parent
DEMO_REPOSITORY = REPO_ROOT / "model_repository"
TEST_REPOSITORY = REPO_ROOT / "tests" / "integration" / "models"
TEXT_TOKENS = 32  # a short sentence; the demo text encoder takes 7..32 tokens in its recipe


def not_built(repository: Path, model: str) -> str | None:
    """Why ``model`` cannot be served from ``repository`` (with the command that builds it), or None."""
    if (repository / model / "config.pbtxt").is_file():
        return None
    return (
        f"{repository / model} is not built: .venv/bin/smtriton build-repository "
        f"model_repository/recipe.toml --output model_repository --model {model}"
    )


def with_instances(repository: Path, model: str, count: int, work: Path) -> Path:
    """A repository holding a copy of ``model`` whose every instance group has ``count`` instances."""
    from smtriton import model_config

    target = work / f"repository-{model}-x{count}"
    if not target.exists():
        shutil.copytree(repository / model, target / model)
        config = model_config.read(target / model)
        for group in config.instance_group:
            group.count = count
        model_config.write(config, target / model)
    return target


@dataclass(frozen=True)
class Scenario:
    name: str
    label: str
    model: str
    repository: Path
    content_type: str
    body: bytes
    inputs: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)


def _json_body(tensors: dict[str, tuple[str, np.ndarray]]) -> bytes:
    inputs = [
        {"name": name, "shape": list(array.shape), "datatype": datatype, "data": array.ravel().tolist()}
        for name, (datatype, array) in tensors.items()
    ]
    return orjson.dumps({"inputs": inputs})


def _binary_body(tensors: dict[str, tuple[str, np.ndarray]]) -> tuple[str, bytes]:
    import tritonclient.http as httpclient

    inputs = []
    for name, (datatype, array) in tensors.items():
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=True)
        inputs.append(tensor)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs)
    return f"{BINARY_JSON_PREFIX}{json_size}", body


def build_scenarios() -> list[Scenario]:
    rng = np.random.default_rng(0)
    tiny = {
        "INPUT0": ("INT32", rng.integers(-1000, 1000, size=(1, 16), dtype=np.int32)),
        "INPUT1": ("INT32", rng.integers(-1000, 1000, size=(1, 16), dtype=np.int32)),
    }
    image = {"pixel_values": ("FP32", rng.standard_normal((1, 3, 224, 224), dtype=np.float32))}
    text = {
        "input_ids": ("INT64", rng.integers(0, 1000, size=(1, TEXT_TOKENS), dtype=np.int64)),
        "attention_mask": ("INT32", np.ones((1, TEXT_TOKENS), dtype=np.int32)),
    }
    tiny_json = _json_body(tiny)
    tiny_ct, tiny_bin = _binary_body(tiny)
    image_ct, image_bin = _binary_body(image)
    text_ct, text_bin = _binary_body(text)
    plain = {name: array for name, (_, array) in {**tiny, **image, **text}.items()}

    def make(name: str, label: str, model: str, repository: Path, content_type: str, body: bytes) -> Scenario:
        tensors = tiny if model == "addsub" else image if model == "resnet_onnx" else text
        return Scenario(name, label, model, repository, content_type, body, {k: plain[k] for k in tensors})

    return [
        make("tiny_json", "tiny tensor, JSON", "addsub", TEST_REPOSITORY, "application/json", tiny_json),
        make(
            "tiny_octet",
            "tiny tensor, JSON as octet-stream",
            "addsub",
            TEST_REPOSITORY,
            "application/octet-stream",
            tiny_json,
        ),
        make("tiny_binary", "tiny tensor, binary+json", "addsub", TEST_REPOSITORY, tiny_ct, tiny_bin),
        make("image_binary", "1x3x224x224 FP32, binary+json", "resnet_onnx", DEMO_REPOSITORY, image_ct, image_bin),
        make(
            "image_json",
            "1x3x224x224 FP32, JSON",
            "resnet_onnx",
            DEMO_REPOSITORY,
            "application/json",
            _json_body(image),
        ),
        make(
            "text_binary",
            f"text encoder 1x{TEXT_TOKENS}, binary+json",
            "text_encoder",
            DEMO_REPOSITORY,
            text_ct,
            text_bin,
        ),
    ]


# ----- answers ---------------------------------------------------------------------------------
def decode(content_type: str, body: bytes) -> tuple[str, dict[str, np.ndarray]]:
    """(encoding, outputs) of a 200 answer: ``json`` or ``binary``, name -> array."""
    from tritonclient.utils import triton_to_np_dtype

    if content_type.startswith(BINARY_JSON_PREFIX):
        size = int(content_type[len(BINARY_JSON_PREFIX) :])
        header, offset, encoding = orjson.loads(body[:size]), size, "binary"
    else:
        header, offset, encoding = orjson.loads(body), 0, "json"
    outputs = {}
    for out in header["outputs"]:
        dtype = triton_to_np_dtype(out["datatype"])
        nbytes = (out.get("parameters") or {}).get("binary_data_size")
        if nbytes is not None:
            array = np.frombuffer(body[offset : offset + nbytes], dtype=dtype)
            offset += nbytes
        else:
            array = np.asarray(out["data"], dtype=dtype)
        outputs[out["name"]] = array.reshape(out["shape"])
    if offset != len(body) and encoding == "binary":
        raise ValueError(f"{len(body) - offset} bytes left after the outputs")
    return encoding, outputs


def compare(reference: tuple[str, dict[str, np.ndarray]], answer: tuple[str, dict[str, np.ndarray]]) -> str | None:
    """None when ``answer`` matches ``reference`` (same encoding, names, shapes, values), else why not."""
    if reference[0] != answer[0]:
        return f"encoding {answer[0]}, anchor's is {reference[0]}"
    ref, got = reference[1], answer[1]
    if set(ref) != set(got):
        return f"outputs {sorted(got)}, anchor's are {sorted(ref)}"
    for name, expected in ref.items():
        value = got[name]
        if value.shape != expected.shape or value.dtype != expected.dtype:
            return f"{name}: {value.dtype}{list(value.shape)}, anchor's is {expected.dtype}{list(expected.shape)}"
        if expected.dtype.kind == "f":
            if not np.allclose(value, expected, rtol=1e-5, atol=1e-6):
                return f"{name}: max abs difference {float(np.max(np.abs(value - expected))):.3g}"
        elif not np.array_equal(value, expected):
            return f"{name}: values differ"
    return None


def check(answer: tuple[int, str, bytes], reference: tuple[str, dict[str, np.ndarray]] | None) -> str | None:
    """None when an HTTP answer is a correct one (200, decodes, equals the anchor's), else why not."""
    status, content_type, body = answer
    if status != 200:
        return f"status {status}: {body[:200].decode('utf-8', errors='replace')}"
    try:
        decoded = decode(content_type, body)
    except (ValueError, KeyError, TypeError) as exc:
        return f"undecodable answer ({content_type}): {exc}"
    return None if reference is None else compare(reference, decoded)


def self_check(scenario: Scenario, decoded: tuple[str, dict[str, np.ndarray]]) -> str | None:
    """An independent check of the anchor's answer where the model's definition is known (addsub)."""
    if scenario.model != "addsub":
        return None
    a, b, outputs = scenario.inputs["INPUT0"], scenario.inputs["INPUT1"], decoded[1]
    if not (np.array_equal(outputs.get("OUTPUT0"), a + b) and np.array_equal(outputs.get("OUTPUT1"), a - b)):
        return "addsub answer is not (INPUT0 + INPUT1, INPUT0 - INPUT1)"
    return None
