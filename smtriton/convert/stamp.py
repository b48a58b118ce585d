"""Build stamps: skip a model whose inputs have not changed since it was built.

A stamp (``<model>/.build-stamp.json``) records a key hashed from the model's recipe entry, the
source files that shape its artifact (factory module, Python-backend source, checkpoint, this
builder's own modules) and the versions of the tools that export it. Checking it imports nothing
heavy, so an up-to-date repository is confirmed in well under a second. The stamp is written last,
inside the model's temporary directory, so its presence means the model was built completely.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smtriton.convert.recipe import ModelSpec
from smtriton.convert.recipe_code import factory_file, samples_file, source_file
from smtriton.convert.tensorrt_profiles import sha256_file

STAMP_FILE = ".build-stamp.json"
STAMP_VERSION = 1

# Distributions whose version changes what the exported artifacts or configs contain.
TOOL_DISTRIBUTIONS = (
    "torch", "transformers", "onnx", "onnxscript", "onnx-ir", "onnxruntime", "numpy", "protobuf", "tritonclient",
    "onnxslim",
)  # fmt: skip

# This builder's modules: a change to any of them may change the artifacts (or what the build checks).
BUILDER_MODULES = (
    "smtriton.dtypes", "smtriton.model_config", "smtriton.repo.artifacts", "smtriton.convert.build",
    "smtriton.convert.config", "smtriton.convert.export", "smtriton.convert.export_onnx",
    "smtriton.convert.export_torchscript", "smtriton.convert.onnx_tools", "smtriton.convert.recipe",
    "smtriton.convert.recipe_parse", "smtriton.convert.sample_inputs", "smtriton.convert.signature",
    "smtriton.convert.stamp", "smtriton.convert.torch_model", "smtriton.convert.pipeline",
    "smtriton.convert.runners", "smtriton.convert.recipe_code", "smtriton.repo.ensemble",
)  # fmt: skip


@dataclass(frozen=True)
class StampInputs:
    spec: Mapping[str, Any]  # the model's recipe table, as written
    files: Mapping[str, str]  # label -> sha256 of a source file
    versions: Mapping[str, str]  # distribution -> version

    def key(self) -> str:
        payload = {"stamp": STAMP_VERSION, "spec": self.spec, "files": self.files, "versions": self.versions}
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()


def tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for dist in TOOL_DISTRIBUTIONS:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "absent"
    return versions


def _module_path(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    return Path(spec.origin)


def stamp_inputs(
    spec: ModelSpec, built_from: Mapping[str, str] | None = None, host: Mapping[str, str] | None = None
) -> StampInputs:
    """``built_from``: what the models ``spec`` is built from are (label -> key); ``host``: further
    versions the artifact depends on (a plan's TensorRT and GPU)."""
    files = {f"builder:{m.rsplit('.', 1)[-1]}": sha256_file(_module_path(m)) for m in BUILDER_MODULES}
    if spec.factory is not None:
        files["factory"] = sha256_file(factory_file(spec))
    if spec.source is not None:
        files["source"] = sha256_file(source_file(spec))
    if spec.samples is not None:
        files["samples"] = sha256_file(samples_file(spec))
    if spec.checkpoint is not None:
        files["checkpoint"] = sha256_file(spec.checkpoint)
    files.update(built_from or {})
    return StampInputs(spec=spec.raw, files=files, versions={**tool_versions(), **(host or {})})


def read_stamp(model_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((model_dir / STAMP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def recorded_entry(model_dir: Path) -> dict[str, Any] | None:
    """The recipe entry (its table, as written) the model in ``model_dir`` was built from; None for a model
    this tool did not build. It travels with the repository, so a later step (a TensorRT build inside
    the serving image, where the recipe file is not) still knows the model's inputs and batching."""
    entry = (read_stamp(model_dir) or {}).get("entry")
    return entry if isinstance(entry, dict) else None


def entry_json(table: Mapping[str, Any]) -> dict[str, Any]:
    """A recipe table as the stamp stores it: JSON, a TOML date or time as its text."""
    loaded: dict[str, Any] = json.loads(json.dumps(dict(table), default=str))
    return loaded


def is_up_to_date(model_dir: Path, key: str) -> bool:
    """The stamp's key matches and every file it recorded is still there with its size."""
    stamp = read_stamp(model_dir)
    if stamp is None or stamp.get("key") != key:
        return False
    files = stamp.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for rel, size in files.items():
        path = model_dir / rel
        if not path.is_file() or path.stat().st_size != size:
            return False
    return True


def write_stamp(model_dir: Path, inputs: StampInputs, extra: Mapping[str, Any] | None = None) -> None:
    """Record the key and the model directory's files; call after everything else is written."""
    files = {
        p.relative_to(model_dir).as_posix(): p.stat().st_size
        for p in sorted(model_dir.rglob("*"))
        if p.is_file() and p.name != STAMP_FILE
    }
    stamp = {"key": inputs.key(), "files": files, "versions": dict(inputs.versions), **(extra or {})}
    (model_dir / STAMP_FILE).write_text(json.dumps(stamp, indent=2, sort_keys=True) + "\n", encoding="utf-8")
