"""The knobs `tune` turns, each a named change to a ModelConfig protobuf, and which ones a backend understands.

A candidate is a dict {knob: value} of JSON values (so trials.jsonl can hold and compare it); applying it
edits a copy of the baseline config through the protobuf, never the text, so what is measured is what
:func:`smtriton.model_config.write` later writes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2

from smtriton.model_config import ModelConfig

Changes = Mapping[str, Any]


@dataclass(frozen=True)
class Knob:
    """One setting: the values to try, how to read it from a config and how to set it."""

    name: str
    values: tuple[Any, ...]
    read: Callable[[ModelConfig], Any]
    write: Callable[[ModelConfig, Any], None]


def _same(values: list[Any], default: Any) -> Any:
    """The one value every instance group has; ``mixed`` when they differ (no knob value equals it, so
    any value tried sets every group)."""
    distinct = set(values)
    if not distinct:
        return default
    return distinct.pop() if len(distinct) == 1 else "mixed"


def _instance_count(config: ModelConfig) -> Any:
    """Instances per group (per GPU for a GPU group): each group's count when they agree."""
    return _same([int(g.count or 1) for g in config.instance_group], 1)


def _every_group(config: ModelConfig) -> Any:
    """The config's instance groups, one (Triton's default placement) added when it has none."""
    if not config.instance_group:
        config.instance_group.add()
    return config.instance_group


def _set_instance_count(config: ModelConfig, count: int) -> None:
    for group in _every_group(config):  # every group keeps its kind and GPUs; only how many changes
        group.count = count


KIND = model_config_pb2.ModelInstanceGroup.Kind


def _instance_kind(config: ModelConfig) -> Any:
    """``KIND_CPU``, ``KIND_GPU``...; ``KIND_AUTO`` for a config with no instance group (Triton's choice)."""
    return _same([KIND.Name(g.kind) for g in config.instance_group], "KIND_AUTO")


def _set_instance_kind(config: ModelConfig, kind: str) -> None:
    for group in _every_group(config):
        group.kind = KIND.Value(kind)
        if kind != "KIND_GPU":
            del group.gpus[:]  # Triton refuses GPU ids on a CPU group


def _batching(config: ModelConfig) -> Any:
    """``off``, or the queue delay in µs of the dynamic batcher."""
    if not config.HasField("dynamic_batching"):
        return "off"
    return int(config.dynamic_batching.max_queue_delay_microseconds)


def _set_batching(config: ModelConfig, value: Any) -> None:
    if value == "off":
        config.ClearField("dynamic_batching")
        return
    config.dynamic_batching.max_queue_delay_microseconds = int(value)


def _preferred_sizes(config: ModelConfig) -> list[int]:
    return [int(s) for s in config.dynamic_batching.preferred_batch_size]


def _preferred_for(name: str, mbs: int) -> list[int]:
    """Sizes of a symbolic preference, against the config's own max_batch_size (which another knob may change)."""
    return {"none": [], "max": [mbs], "half,max": sorted({max(1, mbs // 2), mbs})}[name]


def _preferred(config: ModelConfig) -> str:
    """``none``, ``max`` or ``half,max``; another list as its sizes (``4,12``)."""
    sizes = _preferred_sizes(config)
    for name in ("none", "max", "half,max"):
        if sizes == _preferred_for(name, int(config.max_batch_size)):
            return name
    return ",".join(map(str, sizes))


def _set_preferred(config: ModelConfig, value: str) -> None:
    if not config.HasField("dynamic_batching"):
        return  # preferred sizes mean nothing without the batcher; the knob is a no-op then
    del config.dynamic_batching.preferred_batch_size[:]
    config.dynamic_batching.preferred_batch_size.extend(_preferred_for(value, int(config.max_batch_size)))


def _set_max_batch(config: ModelConfig, size: int) -> None:
    config.max_batch_size = size
    # Triton refuses a preferred size above max_batch_size: drop those rather than fail the trial.
    if config.HasField("dynamic_batching"):
        kept = [s for s in _preferred_sizes(config) if s <= size]
        del config.dynamic_batching.preferred_batch_size[:]
        config.dynamic_batching.preferred_batch_size.extend(kept)


def param_knob(name: str, key: str, values: tuple[Any, ...], default: str) -> Knob:
    """A knob held in the config's ``parameters[key]`` (string values); ``default`` when it is unset."""

    def read(config: ModelConfig) -> Any:
        return config.parameters[key].string_value if key in config.parameters else default

    def write(config: ModelConfig, value: Any) -> None:
        config.parameters[key].string_value = str(value)

    return Knob(name, values, read, write)


def _cuda_graphs(config: ModelConfig) -> bool:
    return bool(config.optimization.cuda.graphs)


def _set_cuda_graphs(config: ModelConfig, on: bool) -> None:
    config.optimization.cuda.graphs = bool(on)


def _graph_level(config: ModelConfig) -> int:
    return int(config.optimization.graph.level)


def _set_graph_level(config: ModelConfig, level: int) -> None:
    config.optimization.graph.level = level


# Backends that run on either side of the PCIe bus; a TensorRT plan runs on the GPU only.
EITHER_KIND = ("onnxruntime_onnx", "onnxruntime", "pytorch_libtorch", "pytorch", "python")


def knobs_for(config: ModelConfig, max_instances: int = 2, *, gpu: bool = False) -> list[Knob]:
    """The knobs worth trying on this model, in the order coordinate descent visits them: the big levers
    (where the instances run, how many, batching) first, then the backend's own. ``gpu``: this host has
    an NVIDIA GPU, so CPU against GPU instances is worth a trial."""
    platform = str(config.platform or config.backend)
    knobs = []
    if gpu and platform in EITHER_KIND:
        knobs.append(Knob("instance_kind", ("KIND_CPU", "KIND_GPU"), _instance_kind, _set_instance_kind))
    knobs.append(Knob("instance_count", tuple(range(1, max_instances + 1)), _instance_count, _set_instance_count))
    mbs = int(config.max_batch_size)
    if mbs > 0:
        knobs.append(Knob("dynamic_batching", ("off", 0, 100, 1000), _batching, _set_batching))
        sizes = tuple(sorted({max(1, mbs // 2), mbs, mbs * 2}))
        knobs.append(Knob("max_batch_size", sizes, lambda c: int(c.max_batch_size), _set_max_batch))
        knobs.append(Knob("preferred_batch_size", ("none", "max", "half,max"), _preferred, _set_preferred))
    if platform in ("onnxruntime_onnx", "onnxruntime"):
        knobs.append(param_knob("ort_intra_op_threads", "intra_op_thread_count", ("1", "2"), ""))
        # 0 (unset) is every optimisation; 1 extended; -1 basic (Triton's native numbering).
        knobs.append(Knob("ort_graph_level", (0, 1, -1), _graph_level, _set_graph_level))
    elif platform in ("pytorch_libtorch", "pytorch"):
        knobs.append(param_knob("torch_inference_mode", "INFERENCE_MODE", ("true", "false"), "true"))
        knobs.append(
            param_knob("torch_disable_optimized_execution", "DISABLE_OPTIMIZED_EXECUTION", ("false", "true"), "false")
        )
        # The executor and its shape profiling change how TorchScript runs the graph, not what it computes.
        # Weight sharing, cache cleaning, cuDNN and the backend-wide thread counts are not tried: they are
        # safe only for some models, or do not act per model (the recipe's header says why, for each).
        knobs.append(param_knob("torch_jit_executor", "ENABLE_JIT_EXECUTOR", ("true", "false"), "true"))
        knobs.append(param_knob("torch_jit_profiling", "ENABLE_JIT_PROFILING", ("true", "false"), "true"))
    elif platform in ("tensorrt_plan", "tensorrt"):
        # Captured CUDA graphs of the plan's execution (TensorRT backend): less launch overhead per batch.
        knobs.append(Knob("trt_cuda_graphs", (False, True), _cuda_graphs, _set_cuda_graphs))
    return knobs


def apply(baseline: ModelConfig, changes: Changes, knobs: list[Knob]) -> ModelConfig:
    """A copy of ``baseline`` with ``changes`` made, in the knobs' order (max_batch_size before the
    preferred sizes it bounds, whatever order the dict has)."""
    config = ModelConfig()
    config.CopyFrom(baseline)
    for knob in knobs:
        if knob.name in changes:
            knob.write(config, changes[knob.name])
    unknown = set(changes) - {k.name for k in knobs}
    if unknown:
        raise ValueError(f"unknown knobs {sorted(unknown)}")
    return config


def key(changes: Changes) -> str:
    """The canonical text of a candidate: the same changes always give the same key (resuming matches on it)."""
    return json.dumps(dict(changes), sort_keys=True, separators=(",", ":"))


def describe(changes: Changes) -> str:
    """``instance_count=2 dynamic_batching=100``; ``baseline`` for no change."""
    if not changes:
        return "baseline"
    return " ".join(f"{k}={v}" for k, v in changes.items())
