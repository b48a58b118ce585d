"""Output signature of a torch model, found by running it rather than trusting a hand-written spec.

Outputs are probed at the first size of every axis, then once per axis at another size: a dimension
that moves with an axis is dynamic (named after the axis when it equals its size), the rest are
fixed. Declared output dtypes and shapes in the recipe are checked against the probe.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from smtriton import dtypes
from smtriton.convert.recipe import BATCH_AXIS, Dim, ModelSpec, RecipeError, TensorSpec
from smtriton.convert.sample_inputs import sample_inputs
from smtriton.convert.torch_model import run_module


def probe_outputs(module: torch.nn.Module, spec: ModelSpec) -> tuple[TensorSpec, ...]:
    base = spec.default_sizes()
    base_out = _first_run(module, spec, base)
    variants: dict[str, tuple[dict[str, int], dict[str, tuple[int, ...]]]] = {}
    for axis, sizes in spec.axes.items():
        other = next((s for s in reversed(sizes) if s != base[axis]), base[axis] + 1)
        moved = {**base, axis: other}
        out = run_module(module, spec, sample_inputs(spec, moved, seed=0))
        variants[axis] = (moved, {name: a.shape for name, a in out.items()})

    probed: list[TensorSpec] = []
    for declared in spec.outputs:
        array = base_out[declared.name]
        where = f"model {spec.name!r}: output {declared.name!r}"
        try:
            dtype = dtypes.from_torch(getattr(torch, array.dtype.name))
        except (AttributeError, ValueError):
            raise RecipeError(f"{where}: dtype {array.dtype} has no Triton equivalent") from None
        dims: list[Dim] = []
        for d, size in enumerate(array.shape):
            dims.append(size)
            for axis, (moved, shapes) in variants.items():
                if len(shapes[declared.name]) != array.ndim:
                    raise RecipeError(f"{where}: rank changes with axis {axis!r}")
                if shapes[declared.name][d] != size:
                    named = size == base[axis] and shapes[declared.name][d] == moved[axis]
                    dims[-1] = axis if named else f"{declared.name}_dim{d}"
                    break
        probed.append(_reconcile(TensorSpec(declared.name, dtype, tuple(dims)), declared.dtype, declared.shape, where))
        if spec.max_batch_size > 0 and probed[-1].shape[:1] != (BATCH_AXIS,):
            raise RecipeError(f"{where}: first dimension does not follow the batch size, shape {dims}")
    return tuple(probed)


def _first_run(module: torch.nn.Module, spec: ModelSpec, sizes: dict[str, int]) -> dict[str, Any]:
    """The model's first forward pass, on inputs shaped as declared: where it fails (torch's words, such as
    "mat1 and mat2 shapes cannot be multiplied"), the message also names each input's declared shape."""
    inputs = sample_inputs(spec, sizes, seed=0)
    try:
        return run_module(module, spec, inputs)
    except RecipeError:
        raise
    except Exception as exc:  # whatever forward() raises on inputs it cannot take
        sent = ", ".join(
            f"{t.name} {t.dtype} [{', '.join(map(str, t.shape))}] (sent {list(inputs[t.name].shape)})"
            for t in spec.inputs
        )
        what = "dtype" if _DTYPE_ERROR.search(str(exc)) else "shape"
        where = "--input" if spec.from_flags else f"the recipe's input {what}s"
        raise RecipeError(
            f"model {spec.name!r}: forward() failed on inputs as declared: {sent}; torch's error is about a "
            f"{what}: if one is wrong, correct {where} ({type(exc).__name__}: {exc})"
        ) from None


# torch's words when forward() gets a tensor of a dtype it cannot take (an embedding's FP32 indices,
# FP64 into FP32 weights, integers into a convolution or a GRU), rather than of a shape.
_DTYPE_ERROR = re.compile(
    r"scalar types?\b|\bdtype\b|\b(?:Float|Double|Half|BFloat16|Long|Int|Short|Char|Byte|Bool)Tensor\b|"
    r"\btype \(\w+\) and \w+ type \(\w+\)",
    re.IGNORECASE,
)


def _reconcile(probed: TensorSpec, dtype: str | None, shape: tuple[Dim, ...] | None, where: str) -> TensorSpec:
    """Declared values win where they agree with the probe (axis names); disagreement is an error."""
    if dtype is not None and dtype != probed.dtype:
        raise RecipeError(f"{where}: declared dtype {dtype}, the model returns {probed.dtype}")
    if shape is None:
        return probed
    agrees = len(shape) == len(probed.shape) and all(
        (isinstance(a, str) and isinstance(b, str)) or a == b for a, b in zip(shape, probed.shape, strict=True)
    )
    if not agrees:
        raise RecipeError(f"{where}: declared shape {list(shape)}, the model returns {list(probed.shape)}")
    return TensorSpec(probed.name, probed.dtype, shape)
