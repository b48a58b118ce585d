"""The knobs: which a backend is offered, and that each changes the config through the protobuf only
where it says, into a config Triton accepts (preferred sizes never above max_batch_size)."""

from __future__ import annotations

from smtriton.model_config import parse, to_text
from smtriton.tune.knobs import KIND, apply, describe, key, knobs_for

BATCHING_ONNX = """
name: "enc" platform: "onnxruntime_onnx" max_batch_size: 16
input { name: "ids" data_type: TYPE_INT64 dims: -1 }
output { name: "out" data_type: TYPE_FP32 dims: 128 }
instance_group { count: 1 kind: KIND_CPU }
dynamic_batching { preferred_batch_size: 8 preferred_batch_size: 16 max_queue_delay_microseconds: 100 }
"""
TORCH = """
name: "r" platform: "pytorch_libtorch" max_batch_size: 0
input { name: "x" data_type: TYPE_FP32 dims: 3 }
output { name: "y" data_type: TYPE_FP32 dims: 3 }
"""


def names(text: str) -> list[str]:
    return [k.name for k in knobs_for(parse(text))]


def test_each_backend_is_offered_only_the_knobs_it_reads():
    assert names(BATCHING_ONNX) == ["instance_count", "dynamic_batching", "max_batch_size", "preferred_batch_size",
                                    "ort_intra_op_threads", "ort_graph_level"]  # fmt: skip
    # no batching knob for a model that cannot batch; PyTorch's own parameters instead of ORT's
    assert names(TORCH) == ["instance_count", "torch_inference_mode", "torch_disable_optimized_execution",
                            "torch_jit_executor", "torch_jit_profiling"]  # fmt: skip


def test_the_baseline_reads_back_its_own_values():
    config = parse(BATCHING_ONNX)
    read = {k.name: k.read(config) for k in knobs_for(config)}
    assert read == {"instance_count": 1, "dynamic_batching": 100, "max_batch_size": 16,
                    "preferred_batch_size": "half,max", "ort_intra_op_threads": "", "ort_graph_level": 0}  # fmt: skip


def test_changes_touch_only_their_fields():
    base = parse(BATCHING_ONNX)
    knobs = knobs_for(base)
    changed = apply(base, {"instance_count": 2, "ort_intra_op_threads": "1", "ort_graph_level": 1}, knobs)
    assert changed.instance_group[0].count == 2
    assert changed.instance_group[0].kind == base.instance_group[0].kind
    assert changed.parameters["intra_op_thread_count"].string_value == "1"
    assert changed.optimization.graph.level == 1
    changed.instance_group[0].count = 1
    del changed.parameters["intra_op_thread_count"]
    changed.ClearField("optimization")
    assert to_text(changed) == to_text(base)  # nothing else moved
    assert to_text(apply(base, {}, knobs)) == to_text(base)


def test_a_smaller_max_batch_size_drops_the_preferred_sizes_above_it():
    base = parse(BATCHING_ONNX)
    knobs = knobs_for(base)
    smaller = apply(base, {"max_batch_size": 8}, knobs)
    assert list(smaller.dynamic_batching.preferred_batch_size) == [8]
    # symbolic preferences follow max_batch_size, whatever order the changes come in
    both = apply(base, {"preferred_batch_size": "half,max", "max_batch_size": 32}, knobs)
    assert list(both.dynamic_batching.preferred_batch_size) == [16, 32]


def test_batching_off_removes_the_batcher_and_preferences_then_mean_nothing():
    base = parse(BATCHING_ONNX)
    knobs = knobs_for(base)
    off = apply(base, {"dynamic_batching": "off"}, knobs)
    assert not off.HasField("dynamic_batching")
    assert apply(base, {"dynamic_batching": "off", "preferred_batch_size": "max"}, knobs) == off


def test_pytorch_knobs_are_model_parameters():
    base = parse(TORCH)
    changes = {"torch_inference_mode": "false", "torch_disable_optimized_execution": "true",
               "torch_jit_executor": "false", "torch_jit_profiling": "false"}  # fmt: skip
    changed = apply(base, changes, knobs_for(base))
    assert changed.parameters["INFERENCE_MODE"].string_value == "false"
    assert changed.parameters["DISABLE_OPTIMIZED_EXECUTION"].string_value == "true"
    assert changed.parameters["ENABLE_JIT_EXECUTOR"].string_value == "false"
    assert changed.parameters["ENABLE_JIT_PROFILING"].string_value == "false"


def test_only_the_pytorch_parameters_that_are_safe_for_every_model_are_tried():
    tried = {k.name for k in knobs_for(parse(TORCH), gpu=True) if k.name.startswith("torch_")}
    assert tried == {"torch_inference_mode", "torch_disable_optimized_execution", "torch_jit_executor",
                     "torch_jit_profiling"}  # fmt: skip
    # Unset, each reads as the backend's default, so the baseline is not counted as a change.
    assert {k.name: k.read(parse(TORCH)) for k in knobs_for(parse(TORCH)) if k.name.startswith("torch_jit")} == {
        "torch_jit_executor": "true",
        "torch_jit_profiling": "true",
    }


def test_a_candidate_has_one_key_whatever_the_order():
    assert key({"a": 1, "b": "x"}) == key({"b": "x", "a": 1})
    assert describe({}) == "baseline"
    assert describe({"instance_count": 2, "dynamic_batching": 0}) == "instance_count=2 dynamic_batching=0"


TWO_GROUPS = """
name: "r" platform: "pytorch_libtorch" max_batch_size: 0
input { name: "x" data_type: TYPE_FP32 dims: 3 }
output { name: "y" data_type: TYPE_FP32 dims: 3 }
instance_group { count: 1 kind: KIND_GPU gpus: 0 }
instance_group { count: 2 kind: KIND_GPU gpus: 1 }
"""
PLAN = """
name: "p" platform: "tensorrt_plan" max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: 3 }
output { name: "y" data_type: TYPE_FP32 dims: 3 }
"""


def test_instance_count_sets_every_group_and_keeps_where_each_runs():
    base = parse(TWO_GROUPS)
    knobs = knobs_for(base, 4, gpu=True)
    count = next(k for k in knobs if k.name == "instance_count")
    assert count.read(base) == "mixed"  # no single count: any value tried sets both groups
    changed = apply(base, {"instance_count": 3}, knobs)
    assert [(g.count, list(g.gpus)) for g in changed.instance_group] == [(3, [0]), (3, [1])]
    assert count.read(changed) == 3


def test_cpu_against_gpu_instances_is_tried_only_on_a_gpu_host_and_where_both_run():
    assert "instance_kind" not in names(TORCH)  # no GPU here
    assert [k.name for k in knobs_for(parse(TORCH), gpu=True)][:2] == ["instance_kind", "instance_count"]
    assert "instance_kind" not in [k.name for k in knobs_for(parse(PLAN), gpu=True)]  # a plan is GPU-only
    base = parse(TWO_GROUPS)
    knobs = knobs_for(base, gpu=True)
    kind = knobs[0]
    assert kind.read(parse(TORCH)) == "KIND_AUTO"
    assert kind.read(base) == "KIND_GPU"
    on_cpu = apply(base, {"instance_kind": "KIND_CPU"}, knobs)
    assert [(KIND.Name(g.kind), list(g.gpus), g.count) for g in on_cpu.instance_group] == [
        ("KIND_CPU", [], 1),
        ("KIND_CPU", [], 2),
    ]
    assert kind.read(on_cpu) == "KIND_CPU"
    on_gpu = apply(parse(TORCH), {"instance_kind": "KIND_GPU"}, knobs_for(parse(TORCH), gpu=True))
    assert to_text(on_gpu).count("kind: KIND_GPU") == 1


def test_a_plan_is_offered_cuda_graphs_as_an_optimization():
    base = parse(PLAN)
    knobs = knobs_for(base)
    assert [k.name for k in knobs][-1] == "trt_cuda_graphs"
    graphs = apply(base, {"trt_cuda_graphs": True}, knobs)
    assert graphs.optimization.cuda.graphs
    assert knobs[-1].read(base) is False
