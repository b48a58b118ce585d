"""The guard against bodies that would crash Triton: JSON nested deeper than Triton's parser survives."""

from __future__ import annotations

import pytest

from smtriton.serve.dataplane import transcode
from smtriton.serve.dataplane.guard import MAX_JSON_DEPTH, JsonTooDeep, check_json_depth, check_request
from smtriton.serve.errors import BadRequest


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


LYING = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[899970039,4],"data":[1,2,3,4,5,6,7,8]}]}'


def test_a_json_input_declaring_more_elements_than_its_body_can_carry_is_refused_by_name():
    with pytest.raises(BadRequest, match=r"input 'INPUT0' declares shape \[899970039, 4\]: 3599880156 elements"):
        check_request(LYING)
    check_request(b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2,4],"data":[1,2,3,4,5,6,7,8]}]}')
    # every input of a request shares the one body: two shapes that each fit may not fit together
    body = b'{"inputs":[{"name":"a","shape":[50],"data":[1]},{"name":"b","shape":[50],"data":[1]}]}'
    with pytest.raises(BadRequest, match=r"input 'b' declares shape \[50\]: 50 elements, .* with the inputs before it"):
        check_request(body)
    # a negative dimension lies as much as its size (Triton refuses it, but must not be the one to see it)
    with pytest.raises(BadRequest, match="input 'x'"):
        check_request(b'{"inputs":[{"name":"x","shape":[-100000,-100000],"data":[1]}]}')


def test_inputs_whose_data_is_elsewhere_are_left_to_triton():
    header = (
        b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[899970039,4],"parameters":{"binary_data_size":32}}]}'
    )
    check_request(header + b"\0" * 32, len(header))  # binary+json: Triton compares the size before allocating
    shm = b'{"inputs":[{"name":"x","shape":[1000000000],"parameters":{"shared_memory_region":"r"}}]}'
    check_request(shm)
    for odd in (b'{"inputs":[{"name":"x","shape":[1e12],"data":[1]}]}', b'{"inputs":5}', b"[1,2]", b"{bad"):
        check_request(odd)  # no shape Triton would allocate by, or no request at all: Triton's to answer


def test_a_large_lying_request_is_refused_before_it_is_re_encoded():
    padding = b" " * (200 * 1024)  # past the re-encoding threshold
    body = LYING[:-2] + padding + b"]}"
    with pytest.raises(BadRequest, match="input 'INPUT0' declares shape"):
        transcode.to_binary(body)
    honest = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],"data":[1,2]}]}' + padding
    assert transcode.to_binary(honest) is not None
