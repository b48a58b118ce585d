"""Content-type parsing of CONTRACT.md §3.1 (project rules) and the response type of §3.3."""

import pytest

from serve import codec
from serve.errors import BadRequest

BJ = "application/vnd.sagemaker-triton.binary+json"


@pytest.mark.parametrize("content_type", [None, "application/json", "text/csv", "application/octet-stream", "x/y"])
def test_non_binary_types_mean_the_whole_body_is_json(content_type):
    assert codec.request_header_length(content_type, 449) is None


@pytest.mark.parametrize(
    "content_type",
    [
        f"{BJ};json-header-size=321",
        f"{BJ}; json-header-size=321",
        f"{BJ.upper()};JSON-HEADER-SIZE = 321",
        f"{BJ};charset=utf-8;json-header-size=321",
        f"{BJ};json-header-size=321;charset=utf-8",
        f' {BJ} ; json-header-size="321"',
    ],
)
def test_binary_json_size_is_parsed_tolerantly(content_type):
    assert codec.request_header_length(content_type, 449) == 321


def test_size_equal_to_body_means_json_only():
    assert codec.request_header_length(f"{BJ};json-header-size=449", 449) == 449


def test_size_zero_and_empty_body_are_raw_mode():
    assert codec.request_header_length(f"{BJ};json-header-size=0", 12) == 0
    assert codec.request_header_length("application/json", 0) == 0
    assert codec.request_header_length(None, 0) == 0


@pytest.mark.parametrize("value", ["abc", "", "321abc", "-123", "1.5", "٣"])
def test_non_numeric_size_is_rejected_not_raw_mode(value):
    with pytest.raises(BadRequest, match="invalid json-header-size"):
        codec.request_header_length(f"{BJ};json-header-size={value}", 449)


def test_size_past_the_body_is_rejected_with_the_native_message():
    with pytest.raises(BadRequest) as err:
        codec.request_header_length(f"{BJ};json-header-size=12345", 449)
    assert err.value.message == "inference header size should be in range (0, 449), got: 12345"
    assert err.value.status == 400


def test_missing_size_parameter_is_rejected():
    with pytest.raises(BadRequest, match="json-header-size"):
        codec.request_header_length(BJ, 449)


def test_binary_type_not_at_the_start_is_rejected_with_the_native_message():
    with pytest.raises(BadRequest, match="expect MIME type for binary data starts with"):
        codec.request_header_length(f"additional-string/{BJ};json-header-size=321", 449)


def test_response_content_type_follows_tritons_header_length():
    assert codec.response_content_type(None) == "application/json"
    assert codec.response_content_type(235) == f"{BJ};json-header-size=235"
