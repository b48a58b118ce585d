"""A recipe ensemble run outside Triton: its steps in the order of their tensors, each step by a runner
the caller picks, so a pipeline is proven the way a model is.

- :func:`chain` runs the steps with any runners: the eager references (the expected answers, in
  :mod:`smtriton.convert.reference`) or the built artifacts.
- :func:`artifact_runner` runs what the build wrote, each model as its backend loads it: ONNX with ONNX
  Runtime, TorchScript with ``torch.jit.load``, a Python model's ``reference`` from the copied
  ``model.py``, a TensorRT plan with TensorRT; nested ensembles recursively.

The build compares the two on sample inputs of the ensemble (:func:`smtriton.convert.parity.compare`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from smtriton import dtypes, model_config
from smtriton.convert.artifacts import find_artifact
from smtriton.convert.recipe import TORCH_FORMATS, ModelSpec, Recipe, RecipeError, TensorSpec
from smtriton.model_config import ModelConfig
from smtriton.repo import ensemble

Runner = Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]


def steps_config(spec: ModelSpec) -> ModelConfig:
    """The tensor graph of a recipe ensemble (names only), for ordering its steps."""
    config = ModelConfig(name=spec.name, platform="ensemble")
    for tensor in spec.inputs:
        config.input.add(name=tensor.name)
    for step in spec.steps:
        added = config.ensemble_scheduling.step.add(model_name=step.model)
        added.input_map.update(step.input_map)
        added.output_map.update(step.output_map)
    return config


def chain(spec: ModelSpec, runner_for: Callable[[str], Runner]) -> Runner:
    """Run ``spec``'s steps, each by ``runner_for(model name)``, on the ensemble's inputs; returns its outputs."""
    order = ensemble.execution_order(steps_config(spec))
    if order is None:
        raise RecipeError(f"model {spec.name!r}: the steps form a cycle")
    runners = [runner_for(step.model) for step in spec.steps]

    def run(inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = dict(inputs)
        for index in order:
            step = spec.steps[index]
            results = runners[index]({key: tensors[tensor] for key, tensor in step.input_map.items()})
            for key, tensor in step.output_map.items():
                tensors[tensor] = results[key]
        return {out.name: tensors[out.name] for out in spec.outputs}

    return run


def artifact_runner(spec: ModelSpec, recipe: Recipe, output: Path) -> Runner:
    """The model ``spec`` as built in the repository ``output`` (its highest version)."""
    if spec.format == "ensemble":
        return chain(spec, lambda name: artifact_runner(recipe.model(name), recipe, output))
    model_dir = output / spec.name
    artifact = find_artifact(model_dir)
    if spec.format in TORCH_FORMATS:
        from smtriton.convert.build import exporter_for

        config = model_config.read(model_dir)
        outputs = [
            TensorSpec(o.name, dtypes.from_config_type(model_config.data_type_name(o.data_type)), tuple(o.dims))
            for o in config.output
        ]
        return exporter_for(spec.format).load(spec, outputs, artifact)
    if spec.format == "python":
        from smtriton.convert.reference import python_reference

        return python_reference(spec.name, artifact)
    from smtriton.convert.trt_build import plan_runner

    return plan_runner(artifact)
