"""Triton's model configuration (``config.pbtxt``): parse, read, write and rename it in one place.

The server (MME staging, the TensorRT plan check) and the build tools (config generation, packaging,
validation) all go through Triton's own ModelConfig protobuf (tritonclient's copy) and protobuf's text
format, never through text edits, so what they read and write is exactly what Triton parses. Only
protobuf and tritonclient[grpc] are imported: both are in the runtime image.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from smtriton.errors import ToolUsageError

CONFIG_FILE = "config.pbtxt"
ModelConfig = model_config_pb2.ModelConfig
PLATFORM_BACKENDS = {  # platform -> the backend Triton resolves it to ("": an ensemble runs none)
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorrt_plan": "tensorrt",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
    "ensemble": "",
}


class ConfigParseError(ToolUsageError, ValueError):
    """A ``config.pbtxt`` that is not a ModelConfig in text format (or not UTF-8 text).

    ``path`` is the file and ``reason`` protobuf's (or the decoder's) own message, so that each caller
    words the error its way and still names the file and the exact place.
    """

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def parse(text: str) -> model_config_pb2.ModelConfig:
    """A ModelConfig from its text format; raises protobuf's ``text_format.ParseError``."""
    return text_format.Parse(text, ModelConfig())


def config_path(path: str | Path) -> Path:
    """The ``config.pbtxt`` of a model directory, or ``path`` itself when it names the file."""
    path = Path(path)
    return path / CONFIG_FILE if path.is_dir() else path


def read(path: str | Path) -> model_config_pb2.ModelConfig:
    """Read a ``config.pbtxt`` (or the one in a model directory).

    Raises :class:`ConfigParseError` when it does not parse and ``OSError`` when it cannot be read.
    """
    file = config_path(path)
    try:
        return parse(file.read_text(encoding="utf-8"))
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise ConfigParseError(file, str(exc)) from None


def to_text(config: model_config_pb2.ModelConfig) -> str:
    """The config in the text format Triton reads (what :func:`write` puts in the file)."""
    return str(text_format.MessageToString(config))


def write(config: model_config_pb2.ModelConfig, model_dir: str | Path) -> Path:
    """Write ``<model_dir>/config.pbtxt`` atomically (temp file, then rename): Triton, or a reader
    racing the writer, never sees half a config."""
    path = Path(model_dir) / CONFIG_FILE
    tmp = path.with_name(f".{CONFIG_FILE}.tmp")
    tmp.write_text(to_text(config), encoding="utf-8")
    os.replace(tmp, path)
    return path


def rename(config: model_config_pb2.ModelConfig, name: str | None, steps: Mapping[str, str]) -> bool:
    """Give the model a new ``name`` (None keeps it) and re-point the ensemble steps that use a model
    in ``steps`` (old name -> new name), in place; True when the config changed.

    A renamed model is served under its new name only if every ensemble using it says so too, so both
    change together.
    """
    changed = False
    if name is not None and config.name != name:
        config.name = name
        changed = True
    for step in config.ensemble_scheduling.step:
        if step.model_name in steps:
            step.model_name = steps[step.model_name]
            changed = True
    return changed


def served_name(config: model_config_pb2.ModelConfig, model_dir: Path) -> str:
    """The name Triton serves a model under: its config's ``name``, or its directory's when empty."""
    return str(config.name) or model_dir.name


def backend_of(config: model_config_pb2.ModelConfig) -> str:
    """The backend Triton runs ``config`` on: its platform's, else the one it names ("" for an ensemble)."""
    return PLATFORM_BACKENDS.get(config.platform) or str(config.backend)


def is_ensemble(config: model_config_pb2.ModelConfig) -> bool:
    """An ensemble runs no artifact of its own, only the models its steps name."""
    return bool(config.platform == "ensemble")


def data_type_name(value: int) -> str:
    """The config enum name of a tensor's ``data_type`` (``TYPE_FP32``; ``TYPE_INVALID`` when unset)."""
    return str(model_config_pb2.DataType.Name(value))
