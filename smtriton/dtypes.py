"""Triton data types and their numpy / torch counterparts, in one table.

Recipes and configs speak Triton's names (``FP32``, ``INT64``, ``BYTES``); numpy and torch are
looked up from here so that every module agrees on the mapping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

# Triton name -> numpy dtype name. BYTES travels as numpy object arrays of ``bytes``.
NUMPY_NAMES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
}

INTEGER = frozenset({"UINT8", "INT8", "INT16", "INT32", "INT64"})
FLOAT = frozenset({"FP16", "FP32", "FP64"})


def is_known(dtype: str) -> bool:
    return dtype in NUMPY_NAMES


def config_type(dtype: str) -> str:
    """The ModelConfig enum name: ``TYPE_FP32``; BYTES is ``TYPE_STRING`` in config files."""
    return "TYPE_STRING" if dtype == "BYTES" else f"TYPE_{dtype}"


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    import numpy as np

    return np.dtype(NUMPY_NAMES[dtype])


def torch_dtype(dtype: str) -> torch.dtype:
    import torch

    if dtype == "BYTES":
        raise ValueError("BYTES tensors have no torch dtype")
    return getattr(torch, NUMPY_NAMES[dtype])


def from_numpy_name(name: str) -> str:
    """Triton name of a numpy dtype name (``float32`` -> ``FP32``; ``object`` -> ``BYTES``)."""
    for triton, numpy_name in NUMPY_NAMES.items():
        if numpy_name == name:
            return triton
    raise ValueError(f"dtype {name} has no Triton equivalent in this tool")


def from_config_type(config_type: str) -> str:
    """``TYPE_FP32`` -> ``FP32``; ``TYPE_STRING`` -> ``BYTES``; raises for types this tool does not map."""
    name = "BYTES" if config_type == "TYPE_STRING" else config_type.removeprefix("TYPE_")
    if name not in NUMPY_NAMES:
        raise ValueError(f"config data type {config_type} is not supported by this tool")
    return name


def from_torch(dtype: torch.dtype) -> str:
    """Triton name of a torch dtype; raises for dtypes Triton configs cannot express here."""
    try:
        return from_numpy_name(str(dtype).removeprefix("torch."))
    except ValueError:
        raise ValueError(f"torch dtype {dtype} has no Triton equivalent in this tool") from None
