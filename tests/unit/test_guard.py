"""The guard against bodies that would crash Triton: JSON nested deeper than Triton's parser survives."""

from __future__ import annotations

import pytest

from smtriton.serve import transcode
from smtriton.serve.errors import BadRequest
from smtriton.serve.guard import MAX_JSON_DEPTH, JsonTooDeep, check_json_depth


def nested(depth: int) -> bytes:
    """A KServe-shaped request whose JSON nests ``depth`` levels deep."""
    return b'{"inputs":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_bodies_within_the_limit_pass():
    check_json_depth(nested(MAX_JSON_DEPTH))
    check_json_depth(b'{"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4]]}]}')


def test_many_brackets_that_do_not_nest_deep_pass():
    wide = b'{"inputs":[{"name":"x","data":[' + b",".join([b"[1]"] * 5000) + b"]}]}"
    check_json_depth(wide)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 200_000])
def test_deeper_bodies_are_refused(depth):
    with pytest.raises(JsonTooDeep, match="nested deeper than 1024 levels"):
        check_json_depth(nested(depth))


@pytest.mark.parametrize("body", [b"[" * 200_000, b'{"a":' * 3000, b"[" * 2000 + b"1"])
def test_malformed_bodies_with_more_brackets_than_the_limit_are_refused(body):
    """simdjson checks the balance before the depth: such a body could still be deep for Triton."""
    with pytest.raises(BadRequest, match="failed to parse the request JSON buffer: The JSON document has"):
        check_json_depth(body)


def test_malformed_json_with_few_brackets_is_left_to_triton():
    check_json_depth(b'{"inputs":[' + b"[1]," * 100 + b"oops")


def test_only_the_json_part_of_a_binary_body_counts():
    header = b'{"inputs":[{"name":"x","parameters":{"binary_data_size":200000}}]}'
    check_json_depth(header + b"[" * 200_000, len(header))
    with pytest.raises(JsonTooDeep):
        check_json_depth(nested(5000) + b"BIN", len(nested(5000)))


def test_the_transcoder_refuses_what_it_parses_too_deep():
    with pytest.raises(JsonTooDeep):
        transcode.to_binary(nested(5000))
    with pytest.raises(BadRequest):
        transcode.to_binary(b"[" * 200_000)
    assert transcode.to_binary(b"[" * 10 + b"oops") is None  # malformed, few brackets: Triton says why
