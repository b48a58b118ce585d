"""TensorRT knobs: precision and the batch size a plan is optimised for are fixed when the plan is built,
so a trial that changes them serves a plan rebuilt from the ONNX file the served plan came from.

The knobs ride in the candidate config as parameters under :data:`BUILD_PREFIX`, so the search compares
and stores candidates as it does every other knob; :meth:`PlanBuilder.split` takes them out before
anything is written or served. What the served plan was built with comes from its sidecar (written by
``smtriton convert tensorrt``): its profiles, precision and the ONNX file's sha256. A rebuilt plan keeps
every profile's other axes and spans the batch axis 1..max_batch_size of the candidate, so a trial
that changes max_batch_size gets a plan that accepts it. Plans are cached by what they were built with
(``WORK_DIR/engines/``), sharing one timing cache; TensorRT itself is needed only when one is built.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smtriton.convert.tensorrt_profiles import (
    AxisRange,
    Profile,
    Sidecar,
    profile_batch_limits,
    read_sidecar,
    sha256_file,
    sidecar_path,
    write_sidecar,
)
from smtriton.errors import ToolUsageError
from smtriton.model_config import ModelConfig
from smtriton.serve.triton.tensorrt_check import PLAN_FILENAME, is_tensorrt, served_versions
from smtriton.tune.knobs import Knob, param_knob

BUILD_PREFIX = "smtriton.tune."
PRECISION = "trt_precision"
OPT_BATCH = "trt_opt_batch"

# build_plan(onnx, plan, options) -> Sidecar: smtriton.convert.tensorrt_build.build_plan, or a stand-in in tests.
Build = Callable[[Path, Path, Any], Sidecar]


def _opt_size(name: str, mbs: int) -> int:
    """The batch size a symbolic ``trt_opt_batch`` names for this max_batch_size (a number names itself)."""
    return {"1": 1, "half": max(1, mbs // 2), "max": mbs}.get(name) or min(max(1, int(name)), mbs)


def _opt_name(size: int, mbs: int) -> str:
    for name in ("max", "half", "1"):
        if _opt_size(name, mbs) == size:
            return name
    return str(size)


@dataclass(frozen=True)
class Built:
    """A plan for a trial: the served one (``rebuilt`` False) or one built for its knobs."""

    plan: Path
    rebuilt: bool
    seconds: float = 0.0


class PlanBuilder:
    """The served plan, the ONNX file it was built from, and the plans built from it for trials."""

    def __init__(self, model_dir: Path, config: ModelConfig, onnx: Path, work_dir: Path, build: Build | None = None):
        self.plan = _served_plan(model_dir, config)
        sidecar = read_sidecar(self.plan)
        if sidecar is None:
            raise ToolUsageError(
                f"{self.plan} has no sidecar ({sidecar_path(self.plan).name}): rebuilding needs the profiles and "
                "precision it was built with; build it with `smtriton convert tensorrt`"
            )
        if not onnx.is_file():
            raise ToolUsageError(f"--onnx {onnx}: no such file")
        self.onnx_sha256 = sha256_file(onnx)
        if sidecar.onnx_sha256 and sidecar.onnx_sha256 != self.onnx_sha256:
            raise ToolUsageError(
                f"{self.plan} was not built from {onnx} (their sha256 differ): give the ONNX it came from"
            )
        self.sidecar = sidecar
        self.onnx = onnx
        self.cache = work_dir / "engines"
        self._build = build
        self.batch_axis = _batch_axis(sidecar) if int(config.max_batch_size) > 0 else None

    def knobs(self, config: ModelConfig) -> list[Knob]:
        """Precision, then (batching models) the batch size the profile is optimised for; the served
        plan's own values are the baseline's."""
        knobs = [param_knob(PRECISION, BUILD_PREFIX + PRECISION, ("fp32", "fp16"), self.sidecar.precision)]
        if self.batch_axis is not None:
            mbs = self.sidecar.max_batch_size or int(config.max_batch_size)
            served = _opt_name(self.served_opt(), mbs)
            knobs.append(param_knob(OPT_BATCH, BUILD_PREFIX + OPT_BATCH, ("1", "half", "max"), served))
        return knobs

    def served_opt(self) -> int:
        assert self.batch_axis is not None
        return _axis_ranges(self.sidecar, 0)[self.batch_axis].opt

    @staticmethod
    def split(candidate: ModelConfig) -> tuple[ModelConfig, dict[str, str]]:
        """The config Triton is given, without the build knobs, and those knobs' values."""
        config = ModelConfig()
        config.CopyFrom(candidate)
        build = {}
        for key in [k for k in config.parameters if k.startswith(BUILD_PREFIX)]:
            build[key.removeprefix(BUILD_PREFIX)] = config.parameters[key].string_value
            del config.parameters[key]
        return config, build

    def profiles(self, config: ModelConfig, build: Mapping[str, str]) -> list[Profile]:
        """Every profile of the served plan, its batch axis spanning 1..max_batch_size and optimised for
        the knob's size (else the served plan's, within the new range)."""
        mbs = int(config.max_batch_size)
        profiles: list[Profile] = []
        for index in range(len(self.sidecar.profiles)):
            axes = dict(_axis_ranges(self.sidecar, index))
            if self.batch_axis is not None and mbs > 0:
                served = axes[self.batch_axis].opt
                opt = _opt_size(build[OPT_BATCH], mbs) if OPT_BATCH in build else min(served, mbs)
                axes[self.batch_axis] = AxisRange(1, opt, mbs)
            profiles.append(axes)
        return profiles

    def options(self, config: ModelConfig, build: Mapping[str, str]) -> Any:
        from smtriton.convert.tensorrt_build import BuildOptions

        return BuildOptions(
            profiles=self.profiles(config, build),
            precision=build.get(PRECISION, self.sidecar.precision),
            workspace_bytes=self.sidecar.workspace_bytes,
            timing_cache=self.cache / "timing.cache",
            version_compatible=self.sidecar.version_compatible,
            hardware_compatibility=self.sidecar.hardware_compatibility,
        )

    def needs_build(self, config: ModelConfig, build: Mapping[str, str]) -> bool:
        """Whether the served plan differs from what this candidate asks for."""
        if build.get(PRECISION, self.sidecar.precision) != self.sidecar.precision:
            return True
        return [dict(p) for p in self.profiles(config, build)] != [
            _axis_ranges(self.sidecar, i) for i in range(len(self.sidecar.profiles))
        ]

    def plan_for(self, config: ModelConfig, build: Mapping[str, str]) -> Built:
        """The served plan when the candidate changes nothing it was built with; else one built for it
        (once: later trials with the same build settings reuse it)."""
        if not self.needs_build(config, build):
            return Built(self.plan, rebuilt=False)
        options = self.options(config, build)
        profiles = [{a: [r.min, r.opt, r.max] for a, r in sorted(p.items())} for p in options.profiles]
        what = {"onnx": self.onnx_sha256, "precision": options.precision, "profiles": profiles}
        folder = self.cache / hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]
        plan = folder / PLAN_FILENAME
        if read_sidecar(plan) is not None:
            return Built(plan, rebuilt=True)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "build.json").write_text(json.dumps(what, indent=2) + "\n", encoding="utf-8")
        started = time.monotonic()
        sidecar = (self._build or _build_with_tensorrt)(self.onnx, plan, options)
        sidecar.max_batch_size = int(config.max_batch_size)  # as `smtriton convert tensorrt` records it
        write_sidecar(plan, sidecar)
        return Built(plan, rebuilt=True, seconds=round(time.monotonic() - started, 2))

    def version_file(self) -> str:
        """The served plan's path inside the model folder (``1/model.plan``): where a rebuilt one goes."""
        return f"{self.plan.parent.name}/{self.plan.name}"

    def files(self, built: Built) -> dict[str, Path]:
        """What a trial's model folder holds instead of the served plan: the built plan and its sidecar."""
        if not built.rebuilt:
            return {}
        name = self.version_file()
        return {name: built.plan, str(sidecar_path(Path(name))): sidecar_path(built.plan)}

    def copy_into(self, built: Built, model_dir: Path) -> list[Path]:
        """Put a rebuilt plan (and its sidecar) where the served one lives under ``model_dir``."""
        written = []
        for relative, source in self.files(built).items():
            target = model_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            written.append(target)
        return written


def _build_with_tensorrt(onnx: Path, plan: Path, options: Any) -> Sidecar:
    from smtriton.convert.tensorrt_build import build_plan

    return build_plan(onnx, plan, options)


def served_batch_limit(model_dir: Path, config: ModelConfig) -> int | None:
    """The largest batch a TensorRT model's served plan accepts (from its sidecar); None for other
    models, or a plan without a sidecar. A max_batch_size above it cannot load without a rebuild."""
    if not is_tensorrt(config, model_dir) or int(config.max_batch_size) <= 0:
        return None
    try:
        sidecar = read_sidecar(_served_plan(model_dir, config))
    except ToolUsageError:
        return None
    limits = profile_batch_limits(sidecar) if sidecar is not None else {}
    return min(limits.values()) if limits else None


def _served_plan(model_dir: Path, config: ModelConfig) -> Path:
    """The plan Triton serves: the newest version its version policy loads, ``default_model_filename``."""
    versions = served_versions(config, model_dir)
    if not versions:
        raise ToolUsageError(f"{model_dir}: no version folder (1/, 2/, ...) that Triton would serve a plan from")
    plan = versions[-1] / (config.default_model_filename or PLAN_FILENAME)
    if not plan.is_file():
        raise ToolUsageError(f"{plan}: no such plan")
    return plan


def _batch_axis(sidecar: Sidecar) -> str:
    """The axis name of every input's first dimension: what Triton batches along."""
    names = {str(t["shape"][0]) for t in sidecar.inputs if t["shape"]}
    if len(names) != 1 or next(iter(names)).lstrip("-").isdigit():
        raise ToolUsageError(
            "the plan's inputs do not share one named batch axis (recorded in its sidecar); "
            f"first dimensions: {sorted(names)}"
        )
    return names.pop()


def _axis_ranges(sidecar: Sidecar, index: int) -> dict[str, AxisRange]:
    """One recorded profile as axis name -> range, read through the inputs' named dimensions."""
    axes: dict[str, AxisRange] = {}
    profile = sidecar.profiles[index]
    for tensor in sidecar.inputs:
        shapes = profile.get(tensor["name"])
        if shapes is None:
            continue
        for dim, axis in enumerate(tensor["shape"]):
            if isinstance(axis, str) and axis not in axes:
                axes[axis] = AxisRange(shapes["min"][dim], shapes["opt"][dim], shapes["max"][dim])
    return axes
