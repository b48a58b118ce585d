"""The recipe: which models a repository holds and how each is built (``model_repository/recipe.toml``).

This module holds what a recipe says, as types every build step reads; :mod:`smtriton.convert.recipe_parse`
reads and checks the file. Neither imports torch nor protobuf, so deciding that a repository is up to
date stays fast. The format is documented at the top of the demo recipe, which users copy for their
own models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smtriton.errors import ToolUsageError

DEFAULT_RECIPE = Path(__file__).resolve().parents[2] / "model_repository" / "recipe.toml"

FORMATS = ("onnx", "torchscript", "python", "ensemble", "tensorrt")
# Formats built from a torch `factory` (exported, then checked against the eager model).
TORCH_FORMATS = ("onnx", "torchscript")
INSTANCE_KINDS = ("KIND_AUTO", "KIND_CPU", "KIND_GPU")
BATCH_AXIS = "batch"
DEFAULT_AXIS_SIZES = (1, 4)


class RecipeError(ToolUsageError, ValueError):
    """A recipe that cannot be built; the message names the file and the model."""


Dim = int | str


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: Triton dtype and a shape whose strings are named dynamic axes."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]
    range: tuple[int, int] | None = None  # [low, high) of random values, integer inputs only

    def resolve(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """Concrete shape for the given axis sizes."""
        try:
            return tuple(d if isinstance(d, int) else int(sizes[d]) for d in self.shape)
        except KeyError as exc:
            raise ValueError(f"{self.name}: no size given for axis {exc.args[0]!r}") from None

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(d for d in self.shape if isinstance(d, str))


@dataclass(frozen=True)
class OutputSpec:
    """An output as declared: the name, and optionally dtype and shape (probed from torch otherwise)."""

    name: str
    dtype: str | None = None
    shape: tuple[Dim, ...] | None = None

    @property
    def declared(self) -> TensorSpec | None:
        if self.dtype is None or self.shape is None:
            return None
        return TensorSpec(self.name, self.dtype, self.shape)


@dataclass(frozen=True)
class DynamicBatching:
    preferred_batch_size: tuple[int, ...] = ()
    max_queue_delay_microseconds: int = 0


@dataclass(frozen=True)
class InstanceGroup:
    count: int = 1
    kind: str = "KIND_CPU"


# The ``where`` of a model that `smtriton convert` describes from its flags, not from a recipe entry:
# its messages name the flags instead of the recipe's keys.
COMMAND_LINE = "command line"
# The torch.export-based ONNX exporter implements opset 18 on; a lower opset is a conversion after
# the export, which some graphs do not survive.
DYNAMO_OPSET = 18


@dataclass(frozen=True)
class ExportOptions:
    opset: int = 17  # onnx (DYNAMO_OPSET with dynamo, unless the recipe names one)
    dynamo: bool = False  # onnx: False = the TorchScript-based exporter (reliable dynamic axes)
    method: str = "trace"  # torchscript: "trace" or "script"
    freeze: bool = True  # torchscript: torch.jit.freeze after trace/script
    simplify: bool = False  # onnx: simplify the graph (onnxslim, else onnxsim; optional dependencies)
    fp16: bool = False  # onnx: cast weights and compute to FP16, I/O kept FP32 (TensorRT 11 strongly typed builds)


@dataclass(frozen=True)
class ParityOptions:
    trials: int = 3  # fresh random inputs per combination of axis sizes
    atol: float = 1e-4
    rtol: float = 1e-3


# An FP16-cast graph cannot meet FP32 tolerances; these apply unless the recipe sets its own.
FP16_PARITY = ParityOptions(atol=5e-2, rtol=5e-2)


@dataclass(frozen=True)
class EnsembleStep:
    """One step of an ensemble: a recipe model and how its tensors map to the ensemble's."""

    model: str
    input_map: Mapping[str, str]  # the model's input -> the ensemble tensor it reads
    output_map: Mapping[str, str]  # the model's output -> the ensemble tensor it writes
    version: int = -1  # -1: the version Triton serves


@dataclass(frozen=True)
class TensorRTOptions:
    """How a `format = "tensorrt"` entry's plan is built (what `smtriton convert tensorrt` takes)."""

    precision: str = "fp32"  # see tensorrt_profiles.PRECISIONS
    workspace: str | None = None  # e.g. "4GiB"
    optimization_level: int | None = None  # builder optimization level 0..5
    version_compatible: bool = False
    hardware_compatibility: str = "none"  # see tensorrt_profiles.HARDWARE_LEVELS
    # (min, opt, max) of every dynamic axis but the batch: the sizes the plan accepts, which the ONNX
    # entry's parity sizes are not.
    profile: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    format: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[OutputSpec, ...]
    max_batch_size: int
    axes: Mapping[str, tuple[int, ...]]
    dynamic_batching: DynamicBatching | None
    instance_groups: tuple[InstanceGroup, ...]
    parameters: Mapping[str, str]
    export: ExportOptions
    parity: ParityOptions
    base_dir: Path
    factory: str | None = None
    seed: int = 0
    checkpoint: Path | None = None
    source: str | None = None
    samples: str | None = None  # "package.module:function" making sample inputs (default: random values)
    steps: tuple[EnsembleStep, ...] = ()  # ensemble
    onnx: str | None = None  # tensorrt: the recipe's ONNX entry the plan is built from
    tensorrt: TensorRTOptions | None = None  # tensorrt
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)  # as written; hashed by stamps
    from_flags: bool = False  # described by `smtriton convert`'s flags (COMMAND_LINE), not a recipe

    def default_sizes(self) -> dict[str, int]:
        """First listed size of every axis: what sample inputs use unless told otherwise."""
        return {axis: sizes[0] for axis, sizes in self.axes.items()}


@dataclass(frozen=True)
class Recipe:
    path: Path
    models: tuple[ModelSpec, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.models)

    def model(self, name: str) -> ModelSpec:
        for spec in self.models:
            if spec.name == name:
                return spec
        raise KeyError(f"{self.path}: no model named {name!r} (models: {', '.join(self.names)})")

    def build_order(self, names: Sequence[str] | None = None) -> list[ModelSpec]:
        """The named models (default: all) and the models they are built from, each after those it
        needs (an ensemble after its steps' models, a TensorRT plan after its ONNX entry), otherwise in
        recipe order."""
        wanted = set(names if names is not None else self.names)
        pending = [self.model(n) for n in (names or ())]  # unknown names raise KeyError here
        while pending:
            for dependency in dependencies(pending.pop()):
                if dependency not in wanted:
                    wanted.add(dependency)
                    pending.append(self.model(dependency))
        order: list[ModelSpec] = []
        done: set[str] = set()
        while len(order) < len(wanted):
            spec = next(m for m in self.models if m.name in wanted and m.name not in done
                        and set(dependencies(m)) <= done)  # fmt: skip
            order.append(spec)
            done.add(spec.name)
        return order


def dependencies(spec: ModelSpec) -> list[str]:
    """The recipe models ``spec`` is built from."""
    if spec.format == "ensemble":
        return list(dict.fromkeys(step.model for step in spec.steps))
    if spec.format == "tensorrt" and spec.onnx is not None:
        return [spec.onnx]
    return []
