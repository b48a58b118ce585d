"""The shared model of an ensemble: its tensor graph checked against Triton's rules, from configs alone."""

from __future__ import annotations

import pytest

from smtriton import model_config
from smtriton.repo import ensemble

PRE_TEXT = """
name: "pre" backend: "python" max_batch_size: 8
input { name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] }
output { name: "PIXELS" data_type: TYPE_FP32 dims: [ 3, 4, 4 ] }
"""
PRE = model_config.parse(PRE_TEXT)
NET = model_config.parse("""
name: "net" platform: "onnxruntime_onnx" max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: [ 3, -1, -1 ] }
input { name: "mask" data_type: TYPE_FP32 dims: [ 4 ] optional: true }
output { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] }
""")
POST = model_config.parse("""
name: "post" backend: "python" max_batch_size: 0
input { name: "LOGITS" data_type: TYPE_FP32 dims: [ -1, 10 ] }
output { name: "IDS" data_type: TYPE_INT64 dims: [ -1, 5 ] }
""")
MEMBERS = {"pre": PRE, "net": NET, "post": POST}

PIPELINE = """
name: "pipeline" platform: "ensemble" max_batch_size: 0
input { name: "IMAGE" data_type: TYPE_STRING dims: [ -1, 1 ] }
output { name: "IDS" data_type: TYPE_INT64 dims: [ -1, 5 ] }
ensemble_scheduling {
  step { model_name: "pre" model_version: -1
         input_map { key: "IMAGE" value: "IMAGE" } output_map { key: "PIXELS" value: "pixels" } }
  step { model_name: "net" model_version: -1
         input_map { key: "x" value: "pixels" } output_map { key: "logits" value: "logits" } }
  step { model_name: "post" model_version: -1
         input_map { key: "LOGITS" value: "logits" } output_map { key: "IDS" value: "IDS" } }
}
"""


def problems(text: str = PIPELINE, members=MEMBERS) -> list[str]:
    return ensemble.check(model_config.parse(text), members)


def test_a_pipeline_across_batching_and_non_batching_models_is_valid():
    # pre and net batch, post does not: [3, 4, 4] meets [3, -1, -1]; net's [10] meets post's [-1, 10]
    # once net's batch dimension is put in front, as Triton compares them.
    assert problems() == []
    assert ensemble.step_models(model_config.parse(PIPELINE)) == ["pre", "net", "post"]


def test_steps_run_in_the_order_of_their_tensors_whatever_order_they_are_listed_in():
    config = model_config.parse(PIPELINE)
    steps = list(config.ensemble_scheduling.step)
    del config.ensemble_scheduling.step[:]
    config.ensemble_scheduling.step.extend([steps[2], steps[0], steps[1]])
    assert ensemble.execution_order(config) == [1, 2, 0]
    assert ensemble.check(config, MEMBERS) == []


def test_sources_give_each_tensor_its_declaration_and_dims_convert_across_batching():
    found = ensemble.sources(model_config.parse(PIPELINE), MEMBERS)
    assert found["IMAGE"].what == "ensemble input 'IMAGE'"
    assert found["logits"].what == "output 'logits' of step 2 (net)"
    assert found["logits"].dims == (10,)
    assert found["logits"].dims_for(batching=False) == (-1, 10)
    assert found["IDS"].dims_for(batching=True) == (5,)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (('dims: [ 3, 4, 4 ]', 'dims: [ 3, 4 ]'),
         "ensemble step 2 (net): tensor 'pixels' is TYPE_FP32 [3, 4] (output 'PIXELS' of step 1 (pre)), net input "
         "'x' is TYPE_FP32 [3, -1, -1]"),
        (('output { name: "PIXELS" data_type: TYPE_FP32', 'output { name: "PIXELS" data_type: TYPE_FP16'),
         "ensemble step 2 (net): tensor 'pixels' is TYPE_FP16 [3, 4, 4] (output 'PIXELS' of step 1 (pre)), net "
         "input 'x' is TYPE_FP32 [3, -1, -1]"),
    ],
)  # fmt: skip
def test_a_tensor_must_agree_with_its_source_in_type_and_shape(edit, expected):
    pre = model_config.parse(PRE_TEXT.replace(*edit))
    assert problems(members={**MEMBERS, "pre": pre}) == [expected]


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (('output_map { key: "logits" value: "logits" }', 'output_map { key: "logits" value: "pixels" }'),
         ["ensemble step 3 (post): tensor 'logits' is neither an ensemble input nor produced by a step",
          "ensemble step 2 (net): tensor 'pixels' is also written by step 1 (pre); a tensor has one source"]),
        (('output_map { key: "PIXELS" value: "pixels" }', 'output_map { key: "PIXELS" value: "IMAGE" }'),
         ["ensemble step 1 (pre): output_map writes tensor 'IMAGE', which is an ensemble input",
          "ensemble step 2 (net): tensor 'pixels' is neither an ensemble input nor produced by a step"]),
        (('input_map { key: "LOGITS" value: "logits" }', 'input_map { key: "LOGITS" value: "IDS" }'),
         ["ensemble steps form a cycle: step 3 (post) reads 'IDS' from step 3 (post)",
          "ensemble step 3 (post): tensor 'IDS' is TYPE_INT64 [-1, 5] (output 'IDS' of step 3 (post)), post input "
          "'LOGITS' is TYPE_FP32 [-1, 10]",
          "ensemble step 2 (net): output 'logits' goes to tensor 'logits', which no step reads and which is no "
          "ensemble output"]),
        (('output { name: "IDS"', 'output { name: "LABELS"'),
         ["ensemble output 'LABELS' is produced by no step",
          "ensemble step 3 (post): output 'IDS' goes to tensor 'IDS', which no step reads and which is no "
          "ensemble output"]),
        (('data_type: TYPE_INT64 dims: [ -1, 5 ] }\\nensemble', 'data_type: TYPE_INT32 dims: [ -1, 5 ] }\\nensemble'),
         ["ensemble output 'IDS' is declared TYPE_INT32 [-1, 5], output 'IDS' of step 3 (post) is TYPE_INT64 "
          "[-1, 5]"]),
        (("max_batch_size: 0", "max_batch_size: 4"),
         ["ensemble step 3 (post): ensemble max_batch_size 4 exceeds the model's 0",
          # A batching ensemble's IMAGE is now [batch, -1, 1]: no longer pre's [batch, 1].
          "ensemble step 1 (pre): tensor 'IMAGE' is TYPE_STRING [-1, 1] (ensemble input 'IMAGE'), pre input "
          "'IMAGE' is TYPE_STRING [1]"]),
        (('input_map { key: "x" value: "pixels" }', 'input_map { key: "mask" value: "pixels" }'),
         ["ensemble step 2 (net): net input 'x' is not mapped (input_map)",
          "ensemble step 2 (net): tensor 'pixels' is TYPE_FP32 [3, 4, 4] (output 'PIXELS' of step 1 (pre)), net "
          "input 'mask' is TYPE_FP32 [4]"]),
    ],
)  # fmt: skip
def test_broken_graphs_are_one_line_per_problem_naming_the_step_and_the_tensor(edit, expected):
    text = PIPELINE.replace(*(e.replace("\\n", "\n") for e in edit))
    assert text != PIPELINE
    found = problems(text)
    assert sorted(found) == sorted(expected)


def test_a_cycle_through_two_steps_names_both_tensors():
    text = PIPELINE.replace('input_map { key: "x" value: "pixels" }', 'input_map { key: "x" value: "back" }').replace(
        'output_map { key: "IDS" value: "IDS" }',
        'output_map { key: "IDS" value: "IDS" } output_map { key: "IDS" value: "back" }',
    )
    config = model_config.parse(text)
    assert ensemble.execution_order(config) is None
    cycle = [p for p in ensemble.check(config, MEMBERS) if "cycle" in p]
    assert cycle == ["ensemble steps form a cycle: step 2 (net) reads 'back' from step 3 (post), step 3 (post) reads "
                     "'logits' from step 2 (net)"]  # fmt: skip


def test_a_step_of_an_unknown_model_has_only_its_graph_checked():
    assert problems(members={"pre": PRE, "post": POST}) == []
    assert problems('name: "e" platform: "ensemble"') == ["ensemble has no ensemble_scheduling steps"]
