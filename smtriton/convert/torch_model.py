"""The eager torch model behind a recipe entry: build it from its factory and run it on numpy inputs.

The eager model is the reference every exported artifact is checked against, at build time and in
the serving tests, so it is built one way only: seed, call the factory, load the checkpoint, eval.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from smtriton.convert.recipe import ModelSpec, RecipeError
from smtriton.convert.recipe_code import import_factory


def load_module(spec: ModelSpec) -> torch.nn.Module:
    """The factory's module with weights fixed by ``spec.seed`` (and the checkpoint, if any)."""
    factory = import_factory(spec)
    torch.manual_seed(spec.seed)
    module = factory()
    if not isinstance(module, torch.nn.Module):
        raise RecipeError(f"model {spec.name!r}: factory {spec.factory} returned {type(module).__name__}")
    if spec.checkpoint is not None:
        state = torch.load(spec.checkpoint, map_location="cpu", weights_only=True)
        module.load_state_dict(state)
    return module.eval()


def to_tensors(spec: ModelSpec, inputs: Mapping[str, np.ndarray]) -> tuple[torch.Tensor, ...]:
    """Inputs in forward() order, as the recipe lists them."""
    return tuple(torch.from_numpy(np.ascontiguousarray(inputs[t.name])) for t in spec.inputs)


def output_list(result: Any, spec: ModelSpec) -> list[torch.Tensor]:
    """Normalise a forward() result to a list of tensors in the recipe's output order."""
    outputs = [result] if isinstance(result, torch.Tensor) else result
    if not isinstance(outputs, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in outputs):
        raise RecipeError(
            f"model {spec.name!r}: forward() must return a tensor or a tuple of tensors, got "
            f"{type(result).__name__}; wrap the model (e.g. return model(...).logits)"
        )
    if len(outputs) != len(spec.outputs):
        listed = (
            f"--output-tensor is given {len(spec.outputs)} time(s); give it once per tensor"
            if spec.from_flags
            else f"the recipe lists {len(spec.outputs)} outputs"
        )
        raise RecipeError(f"model {spec.name!r}: forward() returns {len(outputs)} tensors, {listed}")
    return list(outputs)


def run_module(module: torch.nn.Module, spec: ModelSpec, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Eager forward pass: output name -> numpy array."""
    with torch.inference_mode():
        result = module(*to_tensors(spec, inputs))
    return {o.name: t.detach().cpu().numpy() for o, t in zip(spec.outputs, output_list(result, spec), strict=True)}
