"""Reference models for tests: what a served model should answer, computed without Triton.

``load_reference(name)`` gives the eager torch module of a recipe entry (same factory, same seed,
so the same weights as the built artifact), seeded random inputs that follow its input spec, and a
runner, so serving tests can send identical inputs to Triton and compare outputs.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from smtriton.convert.recipe import DEFAULT_RECIPE, ModelSpec, load_recipe, source_file
from smtriton.convert.sample_inputs import random_inputs

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Reference:
    spec: ModelSpec
    module: torch.nn.Module | None  # the eager model; None for Python-backend models
    run: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]  # inputs -> expected outputs, by name

    def make_inputs(self, seed: int = 0, **sizes: int) -> dict[str, np.ndarray]:
        """Random inputs by name, full shapes including the batch axis (what a client sends).

        Axis sizes default to the first size the recipe lists for each axis; override with e.g.
        ``make_inputs(3, batch=2, sequence=16)``.
        """
        return random_inputs(self.spec.inputs, {**self.spec.default_sizes(), **sizes}, seed)


def load_reference(name: str, recipe: str | Path = DEFAULT_RECIPE) -> Reference:
    """The reference for model ``name`` of ``recipe``; cached, so the torch model is built once."""
    return _load(name, str(Path(recipe).resolve()))


@functools.cache
def _load(name: str, recipe: str) -> Reference:
    spec = load_recipe(recipe).model(name)
    if spec.format == "python":
        return Reference(spec, None, _python_reference(spec))
    from smtriton.convert.torch_model import load_module, run_module

    module = load_module(spec)
    return Reference(spec, module, functools.partial(run_module, module, spec))


def _python_reference(spec: ModelSpec) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
    """A Python-backend source may define ``reference(inputs)``; it is loaded without Triton."""
    path = source_file(spec)
    module_spec = importlib.util.spec_from_file_location(f"_smtriton_reference_{spec.name}", path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    fn = getattr(module, "reference", None)
    if fn is None:
        raise NotImplementedError(f"{path} defines no reference(inputs) function")
    return fn
