"""How a recipe model's outputs are computed from its inputs outside Triton, by whoever asks: a Python
source's ``reference(inputs)``, a chain of an ensemble's steps, the exporter of a format. Both the
references (:mod:`smtriton.convert.reference`) and the built artifacts
(:mod:`smtriton.convert.pipeline`) are run with these, and the build picks its exporter here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from smtriton.convert.recipe import ModelSpec, RecipeError
from smtriton.model_config import ModelConfig
from smtriton.repo import ensemble

if TYPE_CHECKING:
    from smtriton.convert.export import Exporter

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


def exporter_for(fmt: str) -> Exporter:
    """The exporter for a recipe format; imported only here, so unrelated toolchains are never loaded."""
    if fmt == "onnx":
        from smtriton.convert.export_onnx import OnnxExporter

        return OnnxExporter()
    if fmt == "torchscript":
        from smtriton.convert.export_torchscript import TorchScriptExporter

        return TorchScriptExporter()
    raise ValueError(f"no exporter for format {fmt!r}")


def python_reference(name: str, path: Path) -> Runner:
    """The ``reference(inputs)`` a Python-backend source defines, loaded without Triton."""
    module_spec = importlib.util.spec_from_file_location(f"_smtriton_reference_{name}", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, "reference", None)
    if fn is None:
        raise NotImplementedError(f"{path} defines no reference(inputs) function")
    return fn
