"""Seeded sample inputs that follow a recipe's input spec.

The same function feeds the exporters' example inputs, the build-time parity check and the tests
that compare Triton with torch, so all of them see inputs of the declared dtypes, shapes and ranges.
Random values by default; an entry whose inputs random values cannot stand in for (encoded images)
names a ``samples`` function with :func:`random_inputs`'s signature.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from smtriton import dtypes
from smtriton.convert.recipe import ModelSpec, RecipeError, TensorSpec
from smtriton.convert.recipe_code import import_function

# Words with non-ASCII letters so BYTES tensors exercise real UTF-8, not just ASCII.
_WORDS = ("triton", "sagemaker", "über", "straße", "café", "naïve", "ßeta", "δέλτα", "ok", "")


def sample_inputs(spec: ModelSpec, sizes: Mapping[str, int], seed: int | Sequence[int] = 0) -> dict[str, np.ndarray]:
    """Inputs of ``spec`` at the given axis sizes: from its ``samples`` function, else random."""
    if spec.samples is None:
        return random_inputs(spec.inputs, sizes, seed)
    arrays = import_function(spec, spec.samples, "samples")(spec.inputs, sizes, seed)
    for tensor in spec.inputs:
        array = arrays.get(tensor.name) if isinstance(arrays, Mapping) else None
        want = tensor.resolve(sizes)
        if not isinstance(array, np.ndarray) or array.shape != want or array.dtype != dtypes.numpy_dtype(tensor.dtype):
            got = f"{array.dtype}{list(array.shape)}" if isinstance(array, np.ndarray) else type(array).__name__
            raise RecipeError(
                f"model {spec.name!r}: samples {spec.samples} gave {got} for input {tensor.name!r}, "
                f"not {dtypes.numpy_dtype(tensor.dtype)}{list(want)}"
            )
    return dict(arrays)


def random_inputs(
    inputs: Sequence[TensorSpec], sizes: Mapping[str, int], seed: int | Sequence[int] = 0
) -> dict[str, np.ndarray]:
    """Name -> array for every input; ``sizes`` gives each named axis, ``seed`` makes it reproducible."""
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for spec in inputs:
        shape = spec.resolve(sizes)
        if spec.dtype in dtypes.FLOAT:
            arrays[spec.name] = rng.standard_normal(shape).astype(dtypes.numpy_dtype(spec.dtype))
        elif spec.dtype in dtypes.INTEGER:
            assert spec.range is not None, "the recipe requires a range for integer inputs"
            low, high = spec.range
            arrays[spec.name] = rng.integers(low, high, size=shape, dtype=dtypes.numpy_dtype(spec.dtype))
        elif spec.dtype == "BOOL":
            arrays[spec.name] = rng.integers(0, 2, size=shape).astype(np.bool_)
        elif spec.dtype == "BYTES":
            picks = rng.integers(0, len(_WORDS), size=(*shape, 2))
            flat = [f"{_WORDS[a]} {_WORDS[b]}".strip().encode() for a, b in picks.reshape(-1, 2)]
            arrays[spec.name] = np.array(flat, dtype=np.object_).reshape(shape)
        else:  # pragma: no cover - dtypes.BUILD_DTYPES and this function move together
            raise ValueError(f"{spec.name}: no random generator for {spec.dtype}")
    return arrays
