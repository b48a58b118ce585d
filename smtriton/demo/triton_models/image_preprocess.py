"""Triton Python-backend model ``image_preprocess``: encoded images (BYTES) -> normalised pixels (FP32).

Each element of ``IMAGE`` [batch, 1] is an encoded image (JPEG, PNG, or any format Pillow reads), or
the base64 text of one (what a JSON request can carry). Each is decoded, turned upright (EXIF
orientation), converted to RGB, resized so its shorter side is 256 and centre-cropped to 224 x 224,
then scaled to [0, 1] and normalised with the ImageNet mean and standard deviation: ``PIXEL_VALUES``
[batch, 3, 224, 224], what the demo ResNet takes. The images of all the requests Triton hands over at
once are normalised as one array. A request with an element that is no image gets its own error
(HTTP 400); the others in the batch are answered.

Self-contained (numpy and Pillow, which the serving image ships), so the file works as a model.py in
any repository. ``reference`` computes the same outside Triton for the build's and the tests' checks.
"""

from __future__ import annotations

import base64
import binascii
import io
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported by the build and the tests, outside Triton
    pb_utils = None

SIZE = 224  # the crop the model takes
RESIZE = 256  # the shorter side before cropping
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class ImageError(ValueError):
    """An element that is neither an encoded image nor base64 text of one."""


def _open(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def decode(element: Any) -> Image.Image:
    """An encoded image, or base64 text of one (a ``data:image/...;base64,`` prefix is allowed)."""
    data = element.encode() if isinstance(element, str) else bytes(element)
    try:
        return _open(data)
    except UnidentifiedImageError:
        first_error = "no image format Pillow reads"
    except OSError as exc:  # a known format, damaged
        first_error = str(exc)
    text = data.strip()
    if text.startswith(b"data:") and b"," in text:
        text = text.split(b",", 1)[1]
    try:
        return _open(base64.b64decode(text, validate=True))
    except (binascii.Error, UnidentifiedImageError, OSError, ValueError):
        raise ImageError(f"not an image Pillow can decode, nor base64 of one ({first_error})") from None


def crop(image: Image.Image) -> np.ndarray:
    """Upright RGB, shorter side to RESIZE, centre SIZE x SIZE crop: uint8 [SIZE, SIZE, 3]."""
    image = ImageOps.exif_transpose(image).convert("RGB")
    width, height = image.size
    scale = RESIZE / min(width, height)
    resized = image.resize(
        (max(SIZE, round(width * scale)), max(SIZE, round(height * scale))), Image.Resampling.BILINEAR
    )
    left, top = (resized.width - SIZE) // 2, (resized.height - SIZE) // 2
    return np.asarray(resized.crop((left, top, left + SIZE, top + SIZE)), dtype=np.uint8)


def decode_all(images: np.ndarray) -> np.ndarray:
    """``IMAGE`` [n, 1] -> uint8 [n, SIZE, SIZE, 3]; raises ImageError naming the element."""
    crops = []
    for index, element in enumerate(images.reshape(-1)):
        try:
            crops.append(crop(decode(element)))
        except ImageError as exc:
            raise ImageError(f"IMAGE element {index}: {exc}") from None
    return np.stack(crops) if crops else np.zeros((0, SIZE, SIZE, 3), dtype=np.uint8)


def normalise(crops: np.ndarray) -> np.ndarray:
    """uint8 [n, H, W, 3] -> FP32 [n, 3, H, W], scaled to [0, 1] and normalised per channel."""
    pixels = (crops.astype(np.float32) / 255.0 - MEAN) / STD
    return np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))


def reference(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"PIXEL_VALUES": normalise(decode_all(inputs["IMAGE"]))}


def _error(message: str) -> Any:
    # INVALID_ARG (Triton >= 23.07) makes it a client error (HTTP 400), not a server one.
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    error = pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        decoded: list[np.ndarray | str] = []
        for request in requests:
            try:
                decoded.append(decode_all(pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()))
            except ImageError as exc:
                decoded.append(str(exc))
        good = [d for d in decoded if isinstance(d, np.ndarray)]
        pixels = normalise(np.concatenate(good)) if good else None
        responses, start = [], 0
        for item in decoded:
            if isinstance(item, str):
                responses.append(_error(item))
                continue
            assert pixels is not None
            part = pixels[start : start + len(item)]
            start += len(item)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("PIXEL_VALUES", part)]))
        return responses
