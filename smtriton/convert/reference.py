"""Reference models: what a served model should answer, computed without Triton.

``load_reference(name)`` gives the eager torch module of a recipe entry (same factory, same seed,
so the same weights as the built artifact), sample inputs that follow its input spec, and a runner,
so serving tests can send identical inputs to Triton and compare outputs. A Python-backend entry
answers with its source's ``reference(inputs)``; an ensemble with its steps' references run in the
order of their tensors; a TensorRT entry as the ONNX entry it is built from. The build-time parity
check of a pipeline compares the same reference with the built artifacts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from smtriton.convert.recipe import DEFAULT_RECIPE, ModelSpec, Recipe
from smtriton.convert.recipe_code import source_file
from smtriton.convert.recipe_parse import load_recipe
from smtriton.convert.runners import Runner, chain, python_reference
from smtriton.convert.sample_inputs import sample_inputs

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Reference:
    spec: ModelSpec
    module: torch.nn.Module | None  # the eager model; None for Python-backend models and ensembles
    run: Runner  # inputs -> expected outputs, by name

    def make_inputs(self, seed: int = 0, **sizes: int) -> dict[str, np.ndarray]:
        """Sample inputs by name, full shapes including the batch axis (what a client sends).

        Axis sizes default to the first size the recipe lists for each axis; override with e.g.
        ``make_inputs(3, batch=2, sequence=16)``.
        """
        return sample_inputs(self.spec, {**self.spec.default_sizes(), **sizes}, seed)


def load_reference(name: str, recipe: str | Path = DEFAULT_RECIPE) -> Reference:
    """The reference for model ``name`` of ``recipe``; cached, so each torch model is built once."""
    return _load(name, str(Path(recipe).resolve()))


@functools.cache
def _load(name: str, recipe: str) -> Reference:
    loaded = load_recipe(recipe)
    return build_reference(loaded.model(name), loaded, lambda member: _load(member, recipe))


def build_reference(spec: ModelSpec, recipe: Recipe, member: Callable[[str], Reference] | None = None) -> Reference:
    """The reference of ``spec``, built afresh; ``member`` gives the references of the models it is
    built from (default: built afresh too)."""
    member = member or (lambda name: build_reference(recipe.model(name), recipe))
    if spec.format == "python":
        return Reference(spec, None, python_reference(spec.name, source_file(spec)))
    if spec.format == "ensemble":
        return Reference(spec, None, chain(spec, lambda name: member(name).run))
    if spec.format == "tensorrt":
        assert spec.onnx is not None
        return member(spec.onnx)  # the plan answers as the ONNX entry it is built from
    from smtriton.convert.torch_model import load_module, run_module

    module = load_module(spec)
    return Reference(spec, module, functools.partial(run_module, module, spec))
