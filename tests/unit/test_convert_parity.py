"""Parity comparison and the seeded inputs it runs on."""

from __future__ import annotations

import numpy as np

from smtriton.convert.parity import ParityReport, compare
from smtriton.convert.recipe import TensorSpec
from smtriton.convert.sample_inputs import random_inputs


def cases(n: int = 3):
    rng = np.random.default_rng(0)
    return [(f"case {i}", {"x": rng.standard_normal((2, 5)).astype(np.float32)}) for i in range(n)]


def test_identical_runners_pass_with_zero_error():
    report = compare(lambda x: {"y": x["x"] * 2}, lambda x: {"y": x["x"] * 2}, cases(), atol=1e-5, rtol=1e-4)
    assert report.passed
    assert report.cases == 3
    assert report.max_abs == 0.0
    assert report.max_rel == 0.0


def test_small_error_is_measured_and_passes_within_tolerance():
    report = compare(lambda x: {"y": x["x"]}, lambda x: {"y": x["x"] + 1e-6}, cases(), atol=1e-5, rtol=1e-4)
    assert report.passed
    assert 5e-7 < report.max_abs < 2e-6


def test_error_above_tolerance_fails_and_names_the_case():
    report = compare(lambda x: {"y": x["x"]}, lambda x: {"y": x["x"] + 1e-2}, cases(), atol=1e-4, rtol=1e-3)
    assert not report.passed
    assert report.outputs[0].mismatched > 0
    assert "FAILED" in report.summary()
    assert "case" in report.summary()


def test_shape_dtype_and_missing_outputs_are_problems():
    report = compare(
        lambda x: {"y": x["x"], "z": x["x"]},
        lambda x: {"y": x["x"].astype(np.float64)},
        cases(1),
        atol=1e-4,
        rtol=1e-3,
    )
    assert not report.passed
    assert len(report.problems) == 2


def test_matching_nans_are_equal():
    nan = {"y": np.array([np.nan, 1.0])}
    assert compare(lambda x: nan, lambda x: nan, [("c", {})], atol=0, rtol=0).passed


def test_report_round_trips_through_a_dict():
    report = compare(lambda x: {"y": x["x"]}, lambda x: {"y": x["x"] + 1e-6}, cases(), atol=1e-5, rtol=1e-4)
    assert ParityReport.from_dict(report.to_dict()) == report


def test_random_inputs_follow_dtype_shape_range_and_seed():
    specs = [
        TensorSpec("ids", "INT64", ("batch", "sequence"), (0, 1000)),
        TensorSpec("mask", "INT32", ("batch", "sequence"), (0, 2)),
        TensorSpec("pixels", "FP32", ("batch", 3, 8, 8)),
        TensorSpec("text", "BYTES", ("batch", 1)),
    ]
    arrays = random_inputs(specs, {"batch": 3, "sequence": 7}, seed=5)
    assert arrays["ids"].dtype == np.int64
    assert arrays["ids"].shape == (3, 7)
    assert arrays["ids"].min() >= 0
    assert arrays["ids"].max() < 1000
    assert set(np.unique(arrays["mask"])) <= {0, 1}
    assert arrays["mask"].dtype == np.int32
    assert arrays["pixels"].dtype == np.float32
    assert arrays["pixels"].shape == (3, 3, 8, 8)
    assert arrays["text"].dtype == np.object_
    assert isinstance(arrays["text"][0, 0], bytes)
    again = random_inputs(specs, {"batch": 3, "sequence": 7}, seed=5)
    assert all(np.array_equal(arrays[k], again[k]) for k in ("ids", "mask", "pixels"))
    other = random_inputs(specs, {"batch": 3, "sequence": 7}, seed=6)
    assert not np.array_equal(arrays["pixels"], other["pixels"])


def test_integer_and_boolean_outputs_must_be_equal():
    """A class id or a token id is right or wrong: 1001 is not 1000 within any relative tolerance."""
    ids = {"ids": np.array([[1000, 50100]], dtype=np.int64), "mask": np.array([True, False])}
    off_by_little = {"ids": np.array([[1001, 50123]], dtype=np.int64), "mask": np.array([True, True])}
    report = compare(lambda x: ids, lambda x: off_by_little, [("c", {})], atol=1e-3, rtol=1e-2)
    assert not report.passed
    by_name = {o.name: o for o in report.outputs}
    assert (by_name["ids"].mismatched, by_name["ids"].max_abs) == (2, 23.0)
    assert by_name["mask"].mismatched == 1
    assert "ids: 2/2 elements out of tolerance" in report.summary()
    assert compare(lambda x: ids, lambda x: ids, [("c", {})], atol=0.5, rtol=0.5).passed


def test_the_image_pipelines_class_ids_are_compared_exactly():
    want = {"CLASS_IDS": np.array([[281, 282, 285, 287, 291]], dtype=np.int64)}
    got = {"CLASS_IDS": np.array([[281, 282, 285, 291, 287]], dtype=np.int64)}  # two swapped ranks
    assert not compare(lambda x: want, lambda x: got, [("c", {})], atol=5e-2, rtol=5e-2).passed
