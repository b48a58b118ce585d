"""Sample inputs for the demo image pipeline: encoded images, since random bytes are no image.

``encoded_images`` has :func:`smtriton.convert.sample_inputs.random_inputs`'s signature, so a recipe
entry names it as ``samples``: every BYTES input gets seeded JPEG and PNG images of assorted sizes
(smooth colour fields with some noise, so JPEG compresses them as it does photographs), the other
inputs random values.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import numpy as np
from PIL import Image

from smtriton.convert.recipe import TensorSpec
from smtriton.convert.sample_inputs import random_inputs


def picture(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """uint8 [height, width, 3]: a coarse random colour field, smoothly enlarged, with a little noise."""
    coarse = Image.fromarray(rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC), dtype=np.int16)
    noisy = smooth + rng.integers(-12, 13, size=smooth.shape, dtype=np.int16)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def encode(pixels: np.ndarray, fmt: str) -> bytes:
    """``pixels`` (uint8 [H, W, 3]) as a JPEG or PNG file's bytes."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def encoded_images(
    inputs: Sequence[TensorSpec], sizes: Mapping[str, int], seed: int | Sequence[int] = 0
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = random_inputs([t for t in inputs if t.dtype != "BYTES"], sizes, seed)
    for tensor in inputs:
        if tensor.dtype != "BYTES":
            continue
        shape = tensor.resolve(sizes)
        images = []
        for _ in range(int(np.prod(shape))):
            width, height = (int(v) for v in rng.integers(96, 400, size=2))
            images.append(encode(picture(rng, width, height), "JPEG" if rng.random() < 0.5 else "PNG"))
        arrays[tensor.name] = np.array(images, dtype=np.object_).reshape(shape)
    return arrays
