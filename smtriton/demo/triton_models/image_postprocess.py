"""Triton Python-backend model ``image_postprocess``: logits (FP32) -> top-5 classes and their scores.

``LOGITS`` [batch, 1000] -> ``CLASS_IDS`` INT64 [batch, 5], the five highest logits' class indices
(highest first; ties keep the lower index), and ``SCORES`` FP32 [batch, 5], their softmax
probabilities. The logits of all the requests Triton hands over at once are ranked as one array.

Self-contained (numpy only), so the file works as a model.py in any repository. ``reference``
computes the same outside Triton for the build's and the tests' checks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported by the build and the tests, outside Triton
    pb_utils = None

TOP_K = 5


def top_k(logits: np.ndarray, k: int = TOP_K) -> tuple[np.ndarray, np.ndarray]:
    """(class indices INT64 [n, k], softmax probabilities FP32 [n, k]) of the k highest logits."""
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k].astype(np.int64)
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    probabilities = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    return ids, np.take_along_axis(probabilities, ids, axis=1).astype(np.float32)


def reference(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ids, scores = top_k(inputs["LOGITS"])
    return {"CLASS_IDS": ids, "SCORES": scores}


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        batches = [pb_utils.get_input_tensor_by_name(r, "LOGITS").as_numpy() for r in requests]
        ids, scores = top_k(np.concatenate(batches))
        responses, start = [], 0
        for batch in batches:
            end = start + len(batch)
            tensors = [pb_utils.Tensor("CLASS_IDS", ids[start:end]), pb_utils.Tensor("SCORES", scores[start:end])]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start = end
        return responses
