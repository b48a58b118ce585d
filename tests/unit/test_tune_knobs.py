"""The knobs: which a backend is offered, and that each changes the config through the protobuf only
where it says, into a config Triton accepts (preferred sizes never above max_batch_size)."""

from __future__ import annotations

from smtriton.model_config import parse, to_text
from smtriton.tune.knobs import apply, describe, key, knobs_for

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
    assert names(TORCH) == ["instance_count", "torch_inference_mode", "torch_disable_optimized_execution"]


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
    changed = apply(base, {"torch_inference_mode": "false", "torch_disable_optimized_execution": "true"},
                    knobs_for(base))  # fmt: skip
    assert changed.parameters["INFERENCE_MODE"].string_value == "false"
    assert changed.parameters["DISABLE_OPTIMIZED_EXECUTION"].string_value == "true"


def test_a_candidate_has_one_key_whatever_the_order():
    assert key({"a": 1, "b": "x"}) == key({"b": "x", "a": 1})
    assert describe({}) == "baseline"
    assert describe({"instance_count": 2, "dynamic_batching": 0}) == "instance_count=2 dynamic_batching=0"
