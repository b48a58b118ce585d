"""A recipe ensemble run outside Triton: its steps in the order of their tensors, each step by a runner
the caller picks, so a pipeline is proven the way a model is.

- :func:`smtriton.convert.runners.chain` runs the steps with any runners: the eager references (the expected answers, in
  :mod:`smtriton.convert.reference`) or the built artifacts.
- :func:`artifact_runner` runs what the build wrote, each model as its backend loads it: ONNX with ONNX
  Runtime, TorchScript with ``torch.jit.load``, a Python model's ``reference`` from the copied
  ``model.py``, a TensorRT plan with TensorRT; nested ensembles recursively.

The build compares the two on sample inputs of the ensemble (:func:`smtriton.convert.parity.compare`).
"""

from __future__ import annotations

from pathlib import Path

from smtriton import dtypes, model_config
from smtriton.convert.recipe import TORCH_FORMATS, ModelSpec, Recipe, TensorSpec
from smtriton.convert.runners import Runner, chain, exporter_for, python_reference
from smtriton.repo.artifacts import find_artifact


def artifact_runner(spec: ModelSpec, recipe: Recipe, output: Path) -> Runner:
    """The model ``spec`` as built in the repository ``output`` (its highest version)."""
    if spec.format == "ensemble":
        return chain(spec, lambda name: artifact_runner(recipe.model(name), recipe, output))
    model_dir = output / spec.name
    artifact = find_artifact(model_dir)
    if spec.format in TORCH_FORMATS:
        config = model_config.read(model_dir)
        outputs = [
            TensorSpec(o.name, dtypes.from_config_type(model_config.data_type_name(o.data_type)), tuple(o.dims))
            for o in config.output
        ]
        return exporter_for(spec.format).load(spec, outputs, artifact)
    if spec.format == "python":
        return python_reference(spec.name, artifact)
    from smtriton.convert.tensorrt_build import plan_runner

    return plan_runner(artifact)
