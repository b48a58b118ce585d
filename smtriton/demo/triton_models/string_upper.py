"""Triton Python-backend model ``string_upper``: BYTES ``TEXT`` -> BYTES ``UPPER``, upper-cased UTF-8.

It exists so BYTES tensors can be tested end to end. ``reference`` computes the expected outputs
outside Triton (the tests import this file directly, where ``triton_python_backend_utils`` is absent).
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported by tests, outside Triton
    pb_utils = None


def upper(text: np.ndarray) -> np.ndarray:
    """Upper-case every element; elements are UTF-8 ``bytes`` (or ``str``), results UTF-8 ``bytes``."""
    out = np.empty(text.shape, dtype=np.object_)
    for index, item in np.ndenumerate(text):
        value = item.decode("utf-8") if isinstance(item, bytes) else str(item)
        out[index] = value.upper().encode("utf-8")
    return out


def reference(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"UPPER": upper(inputs["TEXT"])}


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            try:
                result = upper(text)
            except UnicodeDecodeError as exc:
                # INVALID_ARG (Triton >= 23.07) makes it a client error (HTTP 400), not a server one.
                code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
                message = f"TEXT must be UTF-8: {exc}"
                error = pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("UPPER", result)]))
        return responses
