"""Content-type parsing of docs/contract.md §3.1 (project rules) and the response type of §3.3."""

import pytest

from smtriton.serve.dataplane.reading import codec
from smtriton.serve.errors import BadRequest

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


def test_custom_attributes_are_added_to_json_and_binary_requests():
    import orjson

    body, length = codec.add_request_parameters(b'{"inputs":[],"parameters":{"a":1}}', None, {"k": "v"})
    assert length is None
    assert orjson.loads(body)["parameters"] == {"a": 1, "k": "v"}
    header = b'{"inputs":[{"name":"X","parameters":{"binary_data_size":4}}]}'
    body, length = codec.add_request_parameters(header + b"\x00\x01\x02\x03", len(header), {"k": "v"})
    assert body.endswith(b"\x00\x01\x02\x03")
    assert orjson.loads(body[:length])["parameters"] == {"k": "v"}
    assert codec.add_request_parameters(b"\x00" * 8, 0, {"k": "v"}) == (b"\x00" * 8, 0)  # raw mode
    assert codec.add_request_parameters(b"{not json", None, {"k": "v"}) == (b"{not json", None)


def test_response_parameter_is_read_from_the_json_part_only():
    response = b'{"model_name":"m","model_version":"1","parameters":{"sagemaker_custom_attributes":"x=1"},"outputs":[]}'
    assert codec.response_parameter(response, None, "sagemaker_custom_attributes") == "x=1"
    assert codec.response_parameter(response + b"\x00binary", len(response), "sagemaker_custom_attributes") == "x=1"
    assert codec.response_parameter(b'{"outputs":[]}', None, "sagemaker_custom_attributes") is None
    blob = b'{"outputs":[]}' + b'"sagemaker_custom_attributes"'
    assert codec.response_parameter(blob, 14, "sagemaker_custom_attributes") is None


def test_decompression_is_bounded():
    import gzip
    import zlib

    from smtriton.serve.errors import PayloadTooLarge

    assert codec.decompress(gzip.compress(b"abc"), "gzip", 10) == b"abc"
    assert codec.decompress(zlib.compress(b"abc"), "deflate", 10) == b"abc"
    assert codec.decompress(b"abc", None, 10) == b"abc"
    with pytest.raises(PayloadTooLarge):
        codec.decompress(gzip.compress(b"x" * 1000), "gzip", 999)
    with pytest.raises(BadRequest):
        codec.decompress(gzip.compress(b"abc")[:-3], "gzip", 10)
