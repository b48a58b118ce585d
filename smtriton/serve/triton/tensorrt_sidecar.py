"""The TensorRT plan sidecar (``model.plan.json``) and the rule for where a plan can run.

A plan runs only on the TensorRT version and GPU architecture it was built with. The builder
(``smtriton convert tensorrt``) therefore writes ``model.plan.json`` beside ``model.plan``: TensorRT
version, GPU name and compute capability, precision, profiles, I/O signature and the plan's sha256.
This module lives in ``serve`` (the only package the serving image ships) so that `serve` can refuse
a plan built for another runtime; the build-time tools re-export it from ``smtriton.convert.tensorrt_profiles``. It is
standard library only, so any host can read and check a sidecar.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SIDECAR_FORMAT = "smtriton.tensorrt-plan/1"
SIDECAR_SUFFIX = ".json"  # model.plan -> model.plan.json

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "strongly-typed")
HARDWARE_LEVELS = ("none", "ampere-plus", "same-compute-capability")


class SidecarError(ValueError):
    """A sidecar that cannot be read."""


@dataclass(frozen=True)
class RuntimeInfo:
    """Where a plan is about to run (or was built)."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: str  # "8.6"


@dataclass
class Sidecar:
    tensorrt_version: str
    gpu_name: str
    compute_capability: str
    precision: str  # one of PRECISIONS
    strongly_typed: bool
    profiles: list[dict[str, dict[str, list[int]]]]  # per profile: input -> {"min", "opt", "max"}
    inputs: list[dict[str, Any]]  # TensorSig.to_dict(): name, dtype, shape (-1 or axis name when dynamic)
    outputs: list[dict[str, Any]]
    plan_sha256: str
    onnx_sha256: str | None = None
    workspace_bytes: int | None = None
    version_compatible: bool = False
    hardware_compatibility: str = "none"  # one of HARDWARE_LEVELS
    builder: str = "smtriton"
    max_batch_size: int | None = None  # what the conversion batched for: `smtriton config`'s default
    format: str = SIDECAR_FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sidecar:
        if data.get("format") != SIDECAR_FORMAT:
            raise SidecarError(f"unknown sidecar format {data.get('format')!r} (expected {SIDECAR_FORMAT})")
        known = set(cls.__dataclass_fields__)
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise SidecarError(f"incomplete sidecar: {exc}") from None


def sidecar_path(plan: Path) -> Path:
    return plan.with_name(plan.name + SIDECAR_SUFFIX)


def read_sidecar(plan: Path) -> Sidecar | None:
    """The sidecar of ``plan``; None when there is none."""
    path = sidecar_path(plan)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SidecarError(f"{path.name}: not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SidecarError(f"{path.name}: not a JSON object")
    return Sidecar.from_dict(data)


def write_sidecar(plan: Path, sidecar: Sidecar) -> Path:
    path = sidecar_path(plan)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(sidecar.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def _capability(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def check_compatibility(sidecar: Sidecar, runtime: RuntimeInfo) -> list[str]:
    """Why this plan cannot run on ``runtime`` (empty when it can).

    TensorRT loads a plan only with the exact TensorRT version that built it (major.minor.patch),
    unless it was built version-compatible (then any later runtime of the same major), and only on
    the GPU architecture it was built on, unless built hardware-compatible (Ampere or newer; or any
    GPU of the same compute capability).
    """
    problems: list[str] = []
    built, here = _version_tuple(sidecar.tensorrt_version), _version_tuple(runtime.tensorrt_version)
    if sidecar.version_compatible:
        if not (built[:1] == here[:1] and here >= built):
            problems.append(
                f"plan built version-compatible with TensorRT {sidecar.tensorrt_version}; TensorRT "
                f"{runtime.tensorrt_version} here is not a later release of the same major version"
            )
    elif built != here:
        problems.append(
            f"plan built with TensorRT {sidecar.tensorrt_version}, this runtime has TensorRT "
            f"{runtime.tensorrt_version}; rebuild it inside the serving image"
        )
    built_cc, here_cc = _capability(sidecar.compute_capability), _capability(runtime.compute_capability)
    level = sidecar.hardware_compatibility
    if level == "ampere-plus":
        if here_cc < (8, 0):
            problems.append(
                f"plan built for Ampere or newer GPUs; {runtime.gpu_name} has compute capability "
                f"{runtime.compute_capability}"
            )
    elif built_cc != here_cc:
        problems.append(
            f"plan built on {sidecar.gpu_name} (compute capability {sidecar.compute_capability}), this GPU is "
            f"{runtime.gpu_name} (compute capability {runtime.compute_capability}); rebuild it on the "
            "instance type that serves it"
        )
    elif level != "same-compute-capability" and sidecar.gpu_name != runtime.gpu_name:
        problems.append(
            f"plan built on {sidecar.gpu_name}, this GPU is {runtime.gpu_name} (same compute capability, but "
            "TensorRT tunes a plan for one GPU model); rebuild it on the instance type that serves it"
        )
    return problems
