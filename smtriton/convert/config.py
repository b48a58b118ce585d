"""``config.pbtxt`` generation: a dict parsed into Triton's ModelConfig protobuf (written by
:mod:`smtriton.model_config` in protobuf's text format).

Never templated: ``ParseDict`` rejects a misspelt field or a wrong enum the moment it is built, and
``text_format`` writes exactly what Triton parses. Three sources: a recipe entry with its probed outputs
(``build-repository``, ``convert``); an artifact's own signature plus :class:`ConfigOptions`
(``smtriton config``), so the I/O in the config is what the ONNX graph, TensorRT engine or TorchScript
signature declares; and for an ensemble, its recipe entry plus its step models' configs, which give
the outputs it does not declare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format

from smtriton import dtypes
from smtriton.convert.recipe import BATCH_AXIS, DynamicBatching, InstanceGroup, ModelSpec, TensorSpec
from smtriton.errors import ToolUsageError
from smtriton.model_config import ModelConfig
from smtriton.repo import ensemble
from smtriton.repo.artifacts import Signature, TensorSig

# Recipe format -> (ModelConfig field, value). Triton maps each platform to its backend.
PLATFORMS: dict[str, tuple[str, str]] = {
    "onnx": ("platform", "onnxruntime_onnx"),
    "torchscript": ("platform", "pytorch_libtorch"),
    "python": ("backend", "python"),
}


def config_dims(tensor: TensorSpec, max_batch_size: int) -> list[int]:
    """Config dims: the batch axis is implicit when Triton batches; other named axes are -1."""
    shape = tensor.shape[1:] if max_batch_size > 0 and tensor.shape[:1] == (BATCH_AXIS,) else tensor.shape
    return [d if isinstance(d, int) else -1 for d in shape]


def io_entry(name: str, dtype: str, dims: Sequence[int], max_batch_size: int) -> dict[str, Any]:
    """One config input/output. A batching model's tensor of shape [batch] has no dims left; Triton
    refuses empty dims, so it is declared as ``dims: [1]`` reshaped to ``[]`` (Triton's own convention)."""
    entry: dict[str, Any] = {"name": name, "data_type": dtypes.config_type(dtype), "dims": list(dims)}
    if max_batch_size > 0 and not dims:
        entry["dims"] = [1]
        entry["reshape"] = {"shape": []}
    return entry


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
    options = ConfigOptions(
        max_batch_size=spec.max_batch_size,
        dynamic_batching=spec.dynamic_batching,
        instance_groups=spec.instance_groups,
        parameters=spec.parameters,
    )
    return {**config, **options_dict(options, [])}


@dataclass(frozen=True)
class ConfigOptions:
    """Everything in a config that the artifact does not determine (see ``smtriton config --help``)."""

    max_batch_size: int = 0
    dynamic_batching: DynamicBatching | None = None
    instance_groups: tuple[InstanceGroup, ...] = ()
    parameters: Mapping[str, str] = field(default_factory=dict)  # backend parameters (string values)
    warmup: bool = False  # one warm-up request per instance at load (random floats, zero integers)
    warmup_sizes: Mapping[str, int] = field(default_factory=dict)  # axis -> size for dynamic dims (default 1)
    graph_optimization_level: int | None = None  # ONNX Runtime: -1 basic, 1 extended, 2 off; unset = all
    accelerator: str | None = None  # ONNX Runtime execution accelerator: "tensorrt" (GPU) or "openvino" (CPU)
    accelerator_parameters: Mapping[str, str] = field(default_factory=dict)  # e.g. precision_mode=FP16
    default_model_filename: str | None = None


# Model parameters each backend reads (Triton's pytorch and onnxruntime backends); another key is
# ignored by the backend, so `smtriton config` warns about it. ONNX Runtime also reads session.* keys.
KNOWN_PARAMETERS: dict[str, tuple[str, ...]] = {
    "pytorch_libtorch": (
        "INFERENCE_MODE", "DISABLE_OPTIMIZED_EXECUTION", "DISABLE_CUDNN", "ENABLE_WEIGHT_SHARING",
        "ENABLE_CACHE_CLEANING", "ENABLE_JIT_EXECUTOR", "ENABLE_JIT_PROFILING", "ENABLE_TENSOR_FUSER",
        "ENABLE_NVFUSER", "INTRA_OP_THREAD_COUNT", "INTER_OP_THREAD_COUNT",
    ),
    "onnxruntime_onnx": (
        "intra_op_thread_count", "inter_op_thread_count", "execution_mode", "cudnn_conv_algo_search",
        "gpu_mem_limit", "arena_extend_strategy", "enable_mem_arena", "enable_mem_pattern",
        "memory.enable_memory_arena_shrinkage", "share_session_between_instances",
    ),
}  # fmt: skip


def unknown_parameters(platform: str, parameters: Mapping[str, str]) -> list[str]:
    """Warnings for parameters the platform's backend does not read (none for backends with free keys)."""
    known = KNOWN_PARAMETERS.get(platform)
    if known is None:
        return []
    return [
        f"parameter {key!r} is not one the {platform} backend reads, so it has no effect (known: {', '.join(known)})"
        for key in parameters
        if key not in known and not (platform == "onnxruntime_onnx" and key.startswith("session."))
    ]


# ONNX Runtime execution accelerators Triton's onnxruntime backend knows, and where each goes.
ACCELERATORS = {"tensorrt": "gpu_execution_accelerator", "openvino": "cpu_execution_accelerator"}


class ConfigError(ToolUsageError, ValueError):
    """The options and the artifact's signature do not make a valid Triton config."""


def options_dict(options: ConfigOptions, inputs: Sequence[tuple[str, str, list[int]]]) -> dict[str, Any]:
    """The option-driven part of a ModelConfig dict; ``inputs`` = (name, Triton dtype, config dims) for warmup."""
    config: dict[str, Any] = {}
    if options.dynamic_batching is not None:
        batching: dict[str, Any] = {}
        if options.dynamic_batching.preferred_batch_size:
            batching["preferred_batch_size"] = list(options.dynamic_batching.preferred_batch_size)
        if options.dynamic_batching.max_queue_delay_microseconds:
            batching["max_queue_delay_microseconds"] = options.dynamic_batching.max_queue_delay_microseconds
        config["dynamic_batching"] = batching
    if options.instance_groups:
        config["instance_group"] = [{"count": g.count, "kind": g.kind} for g in options.instance_groups]
    if options.parameters:
        config["parameters"] = {k: {"string_value": v} for k, v in options.parameters.items()}
    if options.default_model_filename:
        config["default_model_filename"] = options.default_model_filename
    optimization: dict[str, Any] = {}
    if options.graph_optimization_level is not None:
        optimization["graph"] = {"level": options.graph_optimization_level}
    if options.accelerator:
        side = ACCELERATORS.get(options.accelerator)
        if side is None:
            raise ConfigError(f"accelerator must be 'tensorrt' or 'openvino', not {options.accelerator!r}")
        entry: dict[str, Any] = {"name": options.accelerator}
        if options.accelerator_parameters:
            entry["parameters"] = dict(options.accelerator_parameters)
        optimization["execution_accelerators"] = {side: [entry]}
    elif options.accelerator_parameters:
        raise ConfigError("accelerator parameters need an accelerator")
    if optimization:
        config["optimization"] = optimization
    if options.warmup and inputs:
        samples = {}
        for name, dtype, dims in inputs:
            # Random integers could index past a vocabulary; zeros are valid for every integer input.
            data = {"random_data": True} if dtype in dtypes.FLOAT else {"zero_data": True}
            samples[name] = {"data_type": dtypes.config_type(dtype), "dims": dims, **data}
        config["model_warmup"] = [{"name": "smtriton_warmup", "batch_size": 1, "inputs": samples}]
    return config


def signature_config(name: str, platform: tuple[str, str], signature: Signature, options: ConfigOptions) -> ModelConfig:
    """A config whose I/O is exactly the artifact's signature; ``platform`` = (field, value)."""
    mbs = options.max_batch_size
    if mbs < 0:
        raise ConfigError("max_batch_size must be >= 0")
    if options.dynamic_batching is not None and mbs == 0:
        raise ConfigError("dynamic batching needs max_batch_size > 0")
    if options.dynamic_batching is not None:
        too_big = [s for s in options.dynamic_batching.preferred_batch_size if not 0 < s <= mbs]
        if too_big:
            raise ConfigError(f"preferred batch sizes {too_big} are not in 1..max_batch_size {mbs}")

    def io(t: TensorSig) -> dict[str, Any]:
        return io_entry(t.name, t.dtype, signature_dims(t, mbs), mbs)

    inputs = [io(t) for t in signature.inputs]
    outputs = [io(t) for t in signature.outputs]
    warm = [
        (t.name, t.dtype, [d if d != -1 else _warm_size(t, i, mbs, options) for i, d in enumerate(cfg["dims"])])
        for t, cfg in zip(signature.inputs, inputs, strict=True)
    ]
    key, value = platform
    data = {"name": name, key: value, "max_batch_size": mbs, "input": inputs, "output": outputs}
    return build_config({**data, **options_dict(options, warm)})


def signature_dims(tensor: TensorSig, max_batch_size: int) -> list[int]:
    """Config dims of an artifact tensor: without its batch dimension when Triton batches; dynamic -> -1."""
    shape = list(tensor.shape)
    if max_batch_size > 0:
        if not shape:
            raise ConfigError(f"{tensor.name!r} is a scalar; a batching model needs a batch dimension")
        if not tensor.is_dynamic(0):
            raise ConfigError(
                f"{tensor.name!r} has a fixed first dimension {shape[0]}, so Triton cannot batch it: use "
                "--max-batch-size 0, or export with a dynamic batch axis"
            )
        shape = shape[1:]
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


def _warm_size(tensor: TensorSig, index: int, mbs: int, options: ConfigOptions) -> int:
    axis = tensor.shape[index + (1 if mbs > 0 else 0)]
    return options.warmup_sizes.get(axis, 1) if isinstance(axis, str) else 1


def _io(tensor: TensorSpec, max_batch_size: int) -> dict[str, Any]:
    return io_entry(tensor.name, tensor.dtype, config_dims(tensor, max_batch_size), max_batch_size)


def build_config(data: dict[str, Any]) -> ModelConfig:
    """Parse the dict into the protobuf; an unknown field or enum value is a ConfigError, one line."""
    try:
        return json_format.ParseDict(data, ModelConfig())
    except json_format.ParseError as exc:
        raise ConfigError(f"not a valid Triton config: {str(exc).splitlines()[0]}") from None


def recipe_config(spec: ModelSpec, outputs: Sequence[TensorSpec]) -> ModelConfig:
    """The config of a recipe entry, with the outputs probed from its torch model."""
    return build_config(config_dict(spec, outputs))


def ensemble_config(spec: ModelSpec, members: Mapping[str, ModelConfig]) -> ModelConfig:
    """The config of a recipe ensemble; ``members`` are its step models' configs (as built). An output
    the entry does not fully declare takes its data type and dims from the step that writes it; one that
    no step writes is left without either, for :func:`smtriton.repo.ensemble.check` to report."""
    mbs = spec.max_batch_size
    data: dict[str, Any] = {
        "name": spec.name,
        "platform": "ensemble",
        "max_batch_size": mbs,
        "input": [_io(t, mbs) for t in spec.inputs],
        "ensemble_scheduling": {
            "step": [
                {"model_name": s.model, "model_version": s.version, "input_map": dict(s.input_map),
                 "output_map": dict(s.output_map)}
                for s in spec.steps
            ]
        },
    }  # fmt: skip
    sources = ensemble.sources(build_config(data), members)
    outputs = []
    for out in spec.outputs:
        source = sources.get(out.name)
        data_type: int | str = dtypes.config_type(out.dtype) if out.dtype else (source.data_type if source else 0)
        if out.shape is not None:
            entry = io_entry(out.name, "FP32", config_dims(TensorSpec(out.name, "FP32", out.shape), mbs), mbs)
        else:
            entry = {"name": out.name, "dims": list(source.dims_for(mbs > 0)) if source else []}
        outputs.append({**entry, "data_type": data_type})
    return build_config({**data, "output": outputs})
