"""The demo image pipeline's Python models outside Triton: decoding, resizing, normalising, top-5, and
their execute() with a stand-in of triton_python_backend_utils, as the stub calls it."""

from __future__ import annotations

import base64
import importlib.util
import io
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from smtriton.convert.recipe import TensorSpec
from smtriton.demo import images
from smtriton.demo.triton_models import image_postprocess, image_preprocess
from smtriton.demo.triton_models.image_preprocess import MEAN, STD, ImageError

RNG = np.random.default_rng(3)


def encoded(pixels: np.ndarray, fmt: str, **options: Any) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt, **options)
    return buffer.getvalue()


def column(*elements: Any) -> np.ndarray:
    return np.array([[e] for e in elements], dtype=np.object_)


def test_jpeg_and_png_of_any_size_become_normalised_224_crops():
    jpeg = encoded(images.picture(RNG, 640, 360), "JPEG")
    png = encoded(images.picture(RNG, 180, 300), "PNG")
    pixels = image_preprocess.reference({"IMAGE": column(jpeg, png)})["PIXEL_VALUES"]
    assert pixels.shape == (2, 3, 224, 224)
    assert pixels.dtype == np.float32
    assert pixels.flags.c_contiguous


def test_a_flat_colour_comes_out_as_its_normalised_value_everywhere():
    colour = np.array([200, 30, 90], dtype=np.uint8)
    png = encoded(np.broadcast_to(colour, (250, 330, 3)).copy(), "PNG")
    pixels = image_preprocess.reference({"IMAGE": column(png)})["PIXEL_VALUES"][0]
    want = (colour / 255.0 - MEAN) / STD
    np.testing.assert_allclose(pixels.reshape(3, -1), np.repeat(want[:, None], 224 * 224, axis=1), rtol=1e-6)


def test_the_shorter_side_is_resized_to_256_and_the_centre_cropped():
    # Left third red, middle green, right blue (900 x 300): after the resize to 768 x 256 the centre
    # 224 columns lie inside the green band.
    band = np.zeros((300, 900, 3), np.uint8)
    band[:, :300, 0] = band[:, 300:600, 1] = band[:, 600:, 2] = 255
    crop = image_preprocess.crop(Image.open(io.BytesIO(encoded(band, "PNG"))))
    assert crop.shape == (224, 224, 3)
    assert (crop[:, :, 1] == 255).all()
    assert (crop[:, :, [0, 2]] == 0).all()


def test_base64_text_and_data_urls_decode_like_the_raw_bytes():
    png = encoded(images.picture(RNG, 240, 240), "PNG")
    text = base64.b64encode(png).decode()
    forms = column(png, text, text.encode(), f"data:image/png;base64,{text}")
    pixels = image_preprocess.reference({"IMAGE": forms})["PIXEL_VALUES"]
    for other in pixels[1:]:
        np.testing.assert_array_equal(other, pixels[0])


def test_exif_orientation_is_applied_before_cropping():
    upright = images.picture(RNG, 200, 320)  # portrait
    stored = np.ascontiguousarray(np.rot90(upright, k=1))  # as a camera stores it, turned on its side
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to view"
    tagged = encoded(stored, "PNG", exif=exif)
    pixels = image_preprocess.reference({"IMAGE": column(tagged, encoded(upright, "PNG"))})["PIXEL_VALUES"]
    np.testing.assert_array_equal(pixels[0], pixels[1])


def test_an_element_that_is_no_image_is_named_in_the_error():
    good = encoded(images.picture(RNG, 100, 100), "PNG")
    with pytest.raises(ImageError, match=r"^IMAGE element 1: not an image Pillow can decode, nor base64 of one"):
        image_preprocess.reference({"IMAGE": column(good, b"hello")})
    with pytest.raises(ImageError, match="IMAGE element 0"):
        image_preprocess.reference({"IMAGE": column(good[: len(good) // 2])})  # a PNG cut short


def test_top_5_is_the_highest_logits_first_with_their_softmax_scores():
    logits = np.array([[0.0, 5.0, 1.0, 5.0, -2.0, 3.0, 2.0]], dtype=np.float32)
    ids, scores = image_postprocess.top_k(logits)
    assert ids.tolist() == [[1, 3, 5, 6, 2]]  # the tie of 1 and 3 keeps the lower index first
    assert ids.dtype == np.int64
    softmax = np.exp(logits[0] - 5.0) / np.exp(logits[0] - 5.0).sum()
    np.testing.assert_allclose(scores[0], softmax[[1, 3, 5, 6, 2]], rtol=1e-6)
    assert scores.dtype == np.float32


def test_sample_images_are_seeded_decodable_jpegs_and_pngs():
    spec = [TensorSpec("IMAGE", "BYTES", ("batch", 1)), TensorSpec("scale", "FP32", ("batch",))]
    first = images.encoded_images(spec, {"batch": 6}, seed=4)
    assert first["IMAGE"].shape == (6, 1)
    assert first["IMAGE"].dtype == np.object_
    assert first["scale"].shape == (6,)
    again = images.encoded_images(spec, {"batch": 6}, seed=4)
    assert first["IMAGE"].tolist() == again["IMAGE"].tolist()
    formats = {Image.open(io.BytesIO(e)).format for e in first["IMAGE"].reshape(-1)}
    assert formats == {"JPEG", "PNG"}


# --- execute(), as Triton's Python stub calls it ------------------------------------------------------


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array


class TritonError:
    INVALID_ARG = 3

    def __init__(self, message: str, code: int | None = None) -> None:
        self.message, self.code = message, code


class Response:
    def __init__(self, output_tensors: list[Tensor], error: TritonError | None = None) -> None:
        self.outputs = {t.name: t.array for t in output_tensors}
        self.error = error


def load_as_triton_would(module: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The model file imported afresh with a stand-in pb_utils, as the stub imports model.py."""
    fake = types.ModuleType("triton_python_backend_utils")
    fake.Tensor, fake.TritonError, fake.InferenceResponse = Tensor, TritonError, Response  # type: ignore[attr-defined]
    fake.get_input_tensor_by_name = lambda request, name: Tensor(name, request[name])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    spec = importlib.util.spec_from_file_location(f"model_{module.__name__}", Path(str(module.__file__)))
    assert spec is not None
    assert spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded.TritonPythonModel()


def test_preprocess_answers_each_request_and_fails_only_the_bad_one(monkeypatch):
    model = load_as_triton_would(image_preprocess, monkeypatch)
    two = column(encoded(images.picture(RNG, 300, 200), "JPEG"), encoded(images.picture(RNG, 224, 224), "PNG"))
    one = column(encoded(images.picture(RNG, 260, 400), "PNG"))
    responses = model.execute([{"IMAGE": two}, {"IMAGE": column(b"not an image")}, {"IMAGE": one}])
    assert [r.error is None for r in responses] == [True, False, True]
    assert responses[1].error.code == TritonError.INVALID_ARG
    assert responses[1].error.message.startswith("IMAGE element 0: not an image")
    np.testing.assert_array_equal(responses[0].outputs["PIXEL_VALUES"], image_preprocess.reference({"IMAGE": two})[
        "PIXEL_VALUES"])  # fmt: skip
    np.testing.assert_array_equal(responses[2].outputs["PIXEL_VALUES"], image_preprocess.reference({"IMAGE": one})[
        "PIXEL_VALUES"])  # fmt: skip


def test_postprocess_ranks_all_requests_at_once_and_splits_the_answers(monkeypatch):
    model = load_as_triton_would(image_postprocess, monkeypatch)
    a, b = RNG.standard_normal((2, 1000)).astype(np.float32), RNG.standard_normal((3, 1000)).astype(np.float32)
    responses = model.execute([{"LOGITS": a}, {"LOGITS": b}])
    for request, response in zip((a, b), responses, strict=True):
        want = image_postprocess.reference({"LOGITS": request})
        assert response.outputs["CLASS_IDS"].tolist() == want["CLASS_IDS"].tolist()
        np.testing.assert_array_equal(response.outputs["SCORES"], want["SCORES"])
