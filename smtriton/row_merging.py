"""Whether the front may merge a model's requests along the batch dimension: the one rule that the
server follows and the build tools report.

Merging is exact only for a model whose answer to a row depends on that row alone. Triton's native
backends for ONNX Runtime, PyTorch, TensorRT, TensorFlow and OpenVINO run a batch as one tensor
concatenated along the batch dimension, so a row's answer is what it is alone (as their batching
computes it). A Python model is handed the batch as a list of requests and may answer each from all
its rows (a tokenizer that pads to its longest text): merged with another client's request, its
answer would change. Such a model, and any other backend, merges only when its config declares each
row's answer its own (``parameters { key: "smtriton_merge_rows" value: { string_value: "true" } }``);
``"false"`` keeps any model's requests apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MERGE_ROWS_PARAMETER = "smtriton_merge_rows"
# Backends (as Triton resolves a platform to one) that run a batch as one concatenated tensor. The
# project's Python-based stand-ins of the first three go by the same names and concatenate too.
CONCATENATING_BACKENDS = frozenset({"onnxruntime", "pytorch", "libtorch", "tensorrt", "tensorflow", "openvino"})
_PLATFORM_BACKENDS = {
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
}


@dataclass(frozen=True, slots=True)
class RowMerging:
    """Whether rows of different requests may share one Triton request, and why, in words."""

    allowed: bool
    reason: str


class BadDeclaration(ValueError):
    """``smtriton_merge_rows`` holds something other than "true" or "false"."""


def declared(value: str | None) -> bool | None:
    """The config's ``smtriton_merge_rows`` as a choice (None: not declared)."""
    if value is None:
        return None
    word = value.strip().lower()
    if word not in ("true", "false"):
        raise BadDeclaration(f'parameter {MERGE_ROWS_PARAMETER} is "true" or "false", not {value!r}')
    return word == "true"


def row_merging(backend: str, platform: str, parameter: str | None) -> RowMerging:
    """What the rule says of a model of ``backend`` (or ``platform``) whose config holds ``parameter`` as
    ``smtriton_merge_rows`` (None: absent). A value that is neither "true" nor "false" never merges."""
    try:
        choice = declared(parameter)
    except BadDeclaration as exc:
        return RowMerging(False, str(exc))
    if choice is not None:
        return RowMerging(choice, f"{MERGE_ROWS_PARAMETER} is {'true' if choice else 'false'}")
    name = backend or _PLATFORM_BACKENDS.get(platform, "")
    if name in CONCATENATING_BACKENDS:
        return RowMerging(True, f"backend {name} runs a batch as one tensor")
    return RowMerging(
        False,
        f"backend {name or platform or '(none)'} may answer a row from the whole request; "
        f'declare {MERGE_ROWS_PARAMETER} "true" if each row\'s answer is its own',
    )


def config_parameter(parameters: Mapping[str, object] | None) -> str | None:
    """``smtriton_merge_rows``'s string value in a config as Triton's JSON gives it, if any."""
    if not isinstance(parameters, Mapping):
        return None
    entry = parameters.get(MERGE_ROWS_PARAMETER)
    if isinstance(entry, Mapping):
        value = entry.get("string_value")
        return value if isinstance(value, str) else ""
    return None
