"""``config.pbtxt`` generation: a dict parsed into Triton's ModelConfig protobuf, written as text format.

Never templated: ``ParseDict`` rejects a misspelt field or a wrong enum the moment it is built, and
``text_format`` writes exactly what Triton parses.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from scripts import dtypes
from scripts.recipe import BATCH_AXIS, ModelSpec, TensorSpec

ModelConfig = model_config_pb2.ModelConfig

# Recipe format -> (ModelConfig field, value). Triton maps each platform to its backend.
PLATFORMS: dict[str, tuple[str, str]] = {
    "onnx": ("platform", "onnxruntime_onnx"),
    "torchscript": ("platform", "pytorch_libtorch"),
    "python": ("backend", "python"),
}

CONFIG_FILE = "config.pbtxt"


def config_dims(tensor: TensorSpec, max_batch_size: int) -> list[int]:
    """Config dims: the batch axis is implicit when Triton batches; other named axes are -1."""
    shape = tensor.shape[1:] if max_batch_size > 0 and tensor.shape[:1] == (BATCH_AXIS,) else tensor.shape
    return [d if isinstance(d, int) else -1 for d in shape]


def config_dict(spec: ModelSpec, outputs: Sequence[TensorSpec]) -> dict[str, Any]:
    """The ModelConfig as a JSON-shaped dict (protobuf field names), from the spec and probed outputs."""
    key, value = PLATFORMS[spec.format]
    config: dict[str, Any] = {
        "name": spec.name,
        key: value,
        "max_batch_size": spec.max_batch_size,
        "input": [_io(t, spec.max_batch_size) for t in spec.inputs],
        "output": [_io(t, spec.max_batch_size) for t in outputs],
    }
    if spec.dynamic_batching is not None:
        batching: dict[str, Any] = {}
        if spec.dynamic_batching.preferred_batch_size:
            batching["preferred_batch_size"] = list(spec.dynamic_batching.preferred_batch_size)
        if spec.dynamic_batching.max_queue_delay_microseconds:
            batching["max_queue_delay_microseconds"] = spec.dynamic_batching.max_queue_delay_microseconds
        config["dynamic_batching"] = batching
    if spec.instance_groups:
        config["instance_group"] = [{"count": g.count, "kind": g.kind} for g in spec.instance_groups]
    if spec.parameters:
        config["parameters"] = {k: {"string_value": v} for k, v in spec.parameters.items()}
    return config


def _io(tensor: TensorSpec, max_batch_size: int) -> dict[str, Any]:
    return {
        "name": tensor.name,
        "data_type": dtypes.config_type(tensor.dtype),
        "dims": config_dims(tensor, max_batch_size),
    }


def build_config(data: dict[str, Any]) -> model_config_pb2.ModelConfig:
    """Parse the dict into the protobuf; unknown fields or enum values raise ParseError."""
    return json_format.ParseDict(data, ModelConfig())


def model_config(spec: ModelSpec, outputs: Sequence[TensorSpec]) -> model_config_pb2.ModelConfig:
    return build_config(config_dict(spec, outputs))


def write_config(config: model_config_pb2.ModelConfig, model_dir: str | Path) -> Path:
    """Write ``<model_dir>/config.pbtxt`` atomically (temp file, then rename)."""
    path = Path(model_dir) / CONFIG_FILE
    tmp = path.with_name(f".{CONFIG_FILE}.tmp")
    tmp.write_text(text_format.MessageToString(config), encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_config(path: str | Path) -> model_config_pb2.ModelConfig:
    """Parse a ``config.pbtxt`` (or a model directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_FILE
    return text_format.Parse(path.read_text(encoding="utf-8"), ModelConfig())
