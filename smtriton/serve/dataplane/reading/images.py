"""Encoded images straight to a model, beyond NVIDIA's front end (docs/contract.md §7).

A body whose Content-Type is ``image/jpeg``, ``image/png`` or ``application/x-image`` (what SageMaker's
built-in image algorithms take) is sent to a model whose one input is BYTES as that input's one element:
no KServe wrapper for the caller to build. It goes to Triton in the binary tensor extension (the bytes
untouched, a 4-byte length before them, as BYTES elements are serialised); the answer is Triton's usual
one. Any other model is refused with 415 and what it takes.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import orjson

from smtriton.serve.dataplane.reading.inference import Inference
from smtriton.serve.errors import BadRequest, UnsupportedMediaType
from smtriton.serve.triton.client import RequestBody

IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "application/x-image"})


def is_image(content_type: str | None) -> bool:
    return content_type is not None and content_type.partition(";")[0].strip().lower() in IMAGE_TYPES


@dataclass(frozen=True)
class ImageInput:
    """The one BYTES input of a model, and the shape of one element of it (batch dimension included)."""

    name: str
    shape: tuple[int, ...]


def image_input(model: str, metadata: dict[str, Any]) -> ImageInput:
    """The input an image goes to, from Triton's metadata of ``model``; 415 when there is none."""
    inputs = metadata.get("inputs")
    inputs = inputs if isinstance(inputs, list) else []
    takes = ", ".join(f"{i.get('name')} ({i.get('datatype')} {i.get('shape')})" for i in inputs if isinstance(i, dict))
    if len(inputs) == 1 and isinstance(inputs[0], dict) and inputs[0].get("datatype") == "BYTES":
        shape = tuple(1 if int(d) < 0 else int(d) for d in inputs[0].get("shape") or [1])
        if math.prod(shape) == 1:
            return ImageInput(str(inputs[0]["name"]), shape)
    raise UnsupportedMediaType(
        f"model '{model}' does not take an image body: that needs one BYTES input of one element, and it takes "
        f"{takes or 'no inputs'}; send a KServe request (JSON or binary+json) instead"
    )


def request(image: RequestBody, to: ImageInput) -> Inference:
    """The binary+json request carrying ``image`` as the input's one element."""
    if not image:
        raise BadRequest("the image body is empty")
    element = struct.pack("<I", len(image)) + image
    header: dict[str, Any] = {
        "inputs": [
            {
                "name": to.name,
                "shape": list(to.shape),
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(element)},
            }
        ]
    }
    head = orjson.dumps(header)
    return Inference(head + element, len(head), header)
