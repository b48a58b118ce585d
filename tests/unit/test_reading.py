"""The one reading of a request (smtriton/serve/dataplane/reading/inference.py): what it refuses because Triton
could read the request otherwise, and what it refuses because it would crash Triton."""

from __future__ import annotations

import json
import sys

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smtriton.serve.dataplane.reading import inference
from smtriton.serve.dataplane.reading.inference import (
    KNOWN_HEADER_BYTES,
    KNOWN_HEADERS,
    MAX_JSON_DEPTH,
    SMALL_JSON,
    JsonTooDeep,
    RepeatedKey,
    Unreadable,
    check_json_depth,
    read,
)
from smtriton.serve.errors import BadRequest
from smtriton.serve.triton.input_arena import InputArena

TRANSCODE = 64 * 1024
PADDING = b" " * (SMALL_JSON + 1)  # whitespace that takes a body to the large reader


def nested(depth: int) -> bytes:
    """A KServe-shaped request whose JSON nests ``depth`` levels deep."""
    return b'{"inputs":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def large(body: bytes) -> bytes:
    """The same request, past the size up to which requests are read whole."""
    return body[:-1] + PADDING + body[-1:]


# ----- depth --------------------------------------------------------------------------------------------
def test_bodies_within_the_limit_pass():
    check_json_depth(nested(MAX_JSON_DEPTH))
    check_json_depth(b'{"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4]]}]}')


def test_many_brackets_that_do_not_nest_deep_pass():
    wide = b'{"inputs":[{"name":"x","data":[' + b",".join([b"[1]"] * 5000) + b"]}]}"
    check_json_depth(wide)
    read(wide, None)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5000, 200_000])
def test_deeper_bodies_are_refused_by_either_reader(depth):
    with pytest.raises(JsonTooDeep, match="nested deeper than 1024 levels"):
        check_json_depth(nested(depth))
    with pytest.raises(JsonTooDeep):
        read(nested(depth), None, TRANSCODE)


@pytest.mark.parametrize("body", [b"[" * 200_000, b'{"a":' * 3000, b"[" * 2000 + b"1"])
def test_malformed_bodies_with_more_brackets_than_the_limit_are_refused(body):
    """simdjson checks the balance before the depth: such a body could still be deep for Triton."""
    with pytest.raises(BadRequest, match="failed to parse the request JSON buffer: The JSON document has"):
        check_json_depth(body)
    with pytest.raises(BadRequest, match="failed to parse the request JSON buffer"):
        read(body, None)


def test_only_the_json_part_of_a_binary_body_counts():
    header = b'{"inputs":[{"name":"x","shape":[50000],"datatype":"UINT8","parameters":{"binary_data_size":200000}}]}'
    read(header + b"[" * 200_000, len(header))
    with pytest.raises(JsonTooDeep):
        check_json_depth(nested(5000) + b"BIN", len(nested(5000)))


# ----- sizes that lie -------------------------------------------------------------------------------------
LYING = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[899970039,4],"data":[1,2,3,4,5,6,7,8]}]}'


@pytest.mark.parametrize("size", ["small", "large"])
def test_a_json_input_declaring_more_elements_than_its_body_can_carry_is_refused_by_name(size):
    shape = large if size == "large" else bytes
    with pytest.raises(BadRequest, match=r"input 'INPUT0' declares shape \[899970039, 4\]: 3599880156 elements"):
        read(shape(LYING), None, TRANSCODE)
    read(shape(b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2,4],"data":[1,2,3,4,5,6,7,8]}]}'), None)
    # every input of a request shares the one body: two shapes that each fit may not fit together
    body = b'{"inputs":[{"name":"a","shape":[50],"data":[1]},{"name":"b","shape":[50],"data":[1]}]}'
    if size == "small":
        with pytest.raises(BadRequest, match=r"input 'b' declares shape \[50\]: 50 elements, .* inputs before it"):
            read(body, None)


@pytest.mark.parametrize(
    "shape", [b"[-100000,-100000]", b"[1e12]", b"[4.0]", b"[9223372036854775808]", b'["4"]', b"4", b"[true]"]
)
def test_a_shape_that_is_no_list_of_sizes_is_refused(shape):
    """Triton would refuse most of these itself, but must not be the one to see them: its reader and
    ours need not agree on what such a number is."""
    body = b'{"inputs":[{"name":"x","shape":' + shape + b',"datatype":"FP32","data":[1]}]}'
    with pytest.raises(BadRequest, match="input 'x': shape must be a list of non-negative integers"):
        read(body, None)
    with pytest.raises(BadRequest, match="input 'x': shape must be a list of non-negative integers"):
        read(large(body), None)


def test_binary_data_is_sized_by_triton_and_may_not_come_with_json_data():
    header = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[899970039,4],"parameters":{"binary_data_size":32}}]}'
    read(header + b"\0" * 32, len(header))  # binary+json: Triton compares the size with the shape before allocating
    read(header, None)  # a JSON-only request has no binary part: Triton says it expected 32 more bytes
    both = b'{"inputs":[{"name":"x","shape":[899970039],"data":[1],"parameters":{"binary_data_size":4}}]}'
    with pytest.raises(BadRequest, match="input 'x' has both data and binary_data_size"):
        read(both + b"\0" * 4, len(both))  # whichever Triton took, one of the two readings could lie


def test_bytes_after_the_first_json_value_are_ignored_as_triton_does():
    honest = b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}'
    assert read(honest + b' {"inputs":[{"name":"y"}]} \x00\xff', None).header == orjson.loads(honest)
    with pytest.raises(BadRequest, match="declares shape"):  # what Triton reads is what is checked
        read(LYING + b" " + honest, None)


def test_inputs_in_shared_memory_are_left_to_triton():
    shm = b'{"inputs":[{"name":"x","shape":[1000000000],"parameters":{"shared_memory_region":"r"}}]}'
    read(shm, None)


def test_no_request_at_all_is_said_in_tritons_words():
    for odd in (b"[1,2]", b"5", b'"text"'):
        with pytest.raises(BadRequest, match="Unable to parse 'inputs': the request is not a JSON object"):
            read(odd, None)
    assert read(b'{"inputs":5}', None).header == {"inputs": 5}  # Triton says what is wrong with it


# ----- two readers, one request ----------------------------------------------------------------------------
REPEATS = [
    # the request: the lying shape first, as Triton would read it
    b'{"inputs":[{"name":"INPUT0","shape":[899970039,4],"shape":[2,4],"datatype":"FP32","data":[1,2,3,4,5,6,7,8]}]}',
    b'{"inputs":[{"name":"x","shape":[1],"data":[1]}],"inputs":[{"name":"x","shape":[1],"data":[1]}]}',
    b'{"inputs":[{"name":"x","shape":[1],"data":[1],"data":[2]}]}',
    b'{"inputs":[{"name":"x","shape":[1],"data":[1],"parameters":{"a":1,"a":2}}]}',
    b'{"inputs":[{"name":"x","shape":[1],"data":[1]}],"parameters":{"sequence_id":1,"sequence_id":2}}',
    b'{"inputs":[{"name":"x","shape":[1],"data":[1]}],"outputs":[{"name":"y","name":"z"}]}',
    b'{"inputs":[{"name":"x","sh\\u0061pe":[899970039],"shape":[1],"data":[1]}]}',  # an escaped key is the same key
]


@pytest.mark.parametrize("body", REPEATS)
@pytest.mark.parametrize("size", ["small", "large"])
def test_a_key_repeated_in_one_object_is_refused_by_name_at_every_level(body, size):
    with pytest.raises(RepeatedKey, match="repeats the key"):
        read(large(body) if size == "large" else body, None, TRANSCODE)


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
@pytest.mark.parametrize("size", ["small", "large"])
def test_nan_and_infinity_which_triton_reads_as_numbers_are_refused(literal, size):
    body = b'{"inputs":[{"name":"INPUT0","shape":[62500000,4],"datatype":"FP32","data":[' + literal + b",2,3,4]}]}"
    with pytest.raises(Unreadable, match="failed to parse the request JSON buffer"):
        read(large(body) if size == "large" else body, None, TRANSCODE)


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs":[{"name":"\xff","shape":[1],"data":[1]}]}',  # not UTF-8: Triton's reader lets it through
        b'{"inputs":[{"name":"x","shape":[1],"data":[123456789012345678901234567890]}]}',  # past 64 bits
        b"{not json",
    ],
)
def test_what_the_front_cannot_read_is_refused_not_forwarded(body):
    """Forwarding what the front could not read would let Triton read, unchecked, what it will."""
    with pytest.raises(BadRequest, match="failed to parse the request JSON buffer"):
        read(large(body) if b"123456789012345678901234567890" in body else body, None)


def test_a_parameter_past_64_bits_is_refused_rather_than_changed():
    body = b'{"inputs":[{"name":"x","shape":[1],"data":[1]}],"parameters":{"big":123456789012345678901234567890}}'
    with pytest.raises(BadRequest, match="parameter 'big' is an integer past 64 bits"):
        read(body, None)


def test_parameters_the_front_adds_are_set_in_what_was_read():
    body = b'{"inputs":[{"name":"x","shape":[1],"datatype":"INT64","data":[9007199254740993]}],"parameters":{"p":1}}'
    inference = read(body, None).with_parameters({"sagemaker_custom_attributes": "a=1"})
    assert orjson.loads(inference.body) == {
        "inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [9007199254740993]}],
        "parameters": {"p": 1, "sagemaker_custom_attributes": "a=1"},
    }
    header = b'{"inputs":[{"name":"x","shape":[2],"datatype":"UINT8","parameters":{"binary_data_size":2}}]}'
    binary = read(header + b"\x01\x02", len(header)).with_parameters({"k": True})
    assert binary.header_length is not None
    assert binary.body[binary.header_length :] == b"\x01\x02"
    assert orjson.loads(binary.body[: binary.header_length])["parameters"] == {"k": True}
    raw = read(b"\x01\x02", 0)
    assert raw.with_parameters({"k": True}) is raw  # raw mode has no JSON to carry them


def test_a_large_binary_json_part_with_keys_triton_does_not_read_takes_the_parameters_the_front_adds(tmp_path):
    """Its reading leaves those keys out (Triton ignores them): what is written back from it never meets
    a value that was not read, whether the front adds parameters or hands the tensors over shared memory."""
    spec = b'{"name":"x","shape":[2],"datatype":"UINT8","parameters":{"binary_data_size":2},"note":{"n":1}}'
    header = b'{"inputs":[%s],"comment":"%s"}' % (spec, b"c" * SMALL_JSON)
    inference = read(header + b"\x01\x02", len(header))
    assert inference.header == {
        "inputs": [{"name": "x", "shape": [2], "datatype": "UINT8", "parameters": {"binary_data_size": 2}}]
    }
    served = inference.with_parameters({"sagemaker_custom_attributes": "a=1"})
    assert served.header_length is not None
    assert served.body[served.header_length :] == b"\x01\x02"
    assert orjson.loads(served.body[: served.header_length]) == {
        **inference.header,
        "parameters": {"sagemaker_custom_attributes": "a=1"},
    }
    arena = InputArena(1 << 20, directory=tmp_path)
    try:
        written = orjson.loads(arena.request(inference.header, [2], (0, 1)))
    finally:
        arena.close()
    assert written["inputs"][0]["parameters"]["shared_memory_byte_size"] == 2


def test_a_large_json_body_without_inputs_goes_to_triton_to_be_refused_in_its_words():
    for body in (b'{"x":1}', b'{"inputs":5}'):
        assert read(large(body), None, TRANSCODE).complete


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs":[{"name":"x","shape":[1],"datatype":"INT64","data":[%s]}]}',
        b'{"inputs":[{"name":"x","shape":[%s],"datatype":"INT64","data":[1]}]}',
        b'{"inputs":[{"name":"x","shape":[1],"datatype":"INT64","data":[1]}],"parameters":{"p":%s}}',
        b'{"inputs":[{"name":"x","shape":[1],"datatype":"INT64","parameters":{"p":-%s},"data":[1]}]}',
        b'{"inputs":[{"name":"x","shape":[%s],"datatype":"INT64","parameters":{"binary_data_size":8}}]}',
    ],
    ids=["data", "shape", "parameter", "input-parameter", "binary-shape"],
)
def test_an_integer_past_pythons_limit_on_digits_is_refused_not_a_crash(body):
    """Python's int() refuses more than 4,300 digits; rapidjson cannot hold such a number either."""
    digits = b"7" * (sys.get_int_max_str_digits() + 1)
    binary = b"binary_data_size" in body
    with pytest.raises(Unreadable, match="a number is too big: an integer of over 4300 digits"):
        read(body % digits + bytes(8) * binary, len(body % digits) if binary else None)


# ----- a binary request's JSON part, read once ---------------------------------------------------------
def binary_request(name: str, padding: int = 0) -> tuple[bytes, int]:
    header = b'{"inputs":[{"name":"%s","shape":[1,2],"datatype":"UINT8","parameters":{"binary_data_size":2}}]}' % (
        name.encode()
    )
    header += b" " * padding
    return header + b"\x01\x02", len(header)


def test_a_binary_json_part_sent_again_is_read_once_and_gives_the_same_reading(monkeypatch):
    reads: list[bytes] = []
    read_json = inference.read_json_text
    monkeypatch.setattr(inference, "read_json_text", lambda part: reads.append(bytes(part)) or read_json(part))
    monkeypatch.setattr(inference, "_known", {})
    body, length = binary_request("x")
    first, again = read(body, length), read(body[:length] + b"\x03\x04", length)
    assert again.header is first.header
    assert again.body[length:] == b"\x03\x04"  # the request's own bytes, its reading shared
    other = read(*binary_request("y"))
    assert other.header is not None
    assert other.header["inputs"][0]["name"] == "y"
    assert len(reads) == 2  # x once, y once
    json_body = body[:length]
    assert read(json_body, None).header == read(json_body, None).header
    assert len(reads) == 4  # a JSON body carries its data: read every time


def test_a_refused_json_part_is_refused_every_time_it_is_sent(monkeypatch):
    monkeypatch.setattr(inference, "_known", {})
    header = (
        b'{"inputs":[{"name":"x","shape":[1],"shape":[899970039],"datatype":"UINT8",'
        b'"parameters":{"binary_data_size":1}}]}'
    )
    for _ in range(2):
        with pytest.raises(RepeatedKey):
            read(header + b"\x01", len(header))
    assert inference._known == {}


def test_the_readings_kept_are_bounded_in_number_and_size(monkeypatch):
    known: dict[bytes, object] = {}
    monkeypatch.setattr(inference, "_known", known)
    read(*binary_request("x", padding=KNOWN_HEADER_BYTES))  # too long to keep
    assert known == {}
    for index in range(KNOWN_HEADERS):
        read(*binary_request(f"x{index}"))
    assert len(known) == KNOWN_HEADERS
    read(*binary_request("one more"))  # full: what was kept is forgotten, this one kept
    assert len(known) == 1


def test_a_large_request_not_re_encoded_keeps_its_data_for_the_parameters_it_gets():
    body = orjson.dumps({"inputs": [{"name": "t", "shape": [4000], "datatype": "BYTES", "data": ["ab"] * 4000}]})
    assert len(body) > SMALL_JSON
    inference = read(body, None, TRANSCODE)
    assert inference.body is body
    assert not inference.complete
    assert orjson.loads(inference.with_parameters({"k": 1}).body)["inputs"][0]["data"] == ["ab"] * 4000


def test_a_large_numeric_request_is_re_encoded_from_what_was_read():
    data = list(range(20_000))
    body = orjson.dumps({"inputs": [{"name": "X", "shape": [20_000], "datatype": "INT64", "data": data}], "x": [1]})
    inference = read(body, None, TRANSCODE)
    assert inference.header_length is not None
    assert inference.header == {
        "inputs": [{"name": "X", "shape": [20_000], "datatype": "INT64", "parameters": {"binary_data_size": 160_000}}]
    }  # the key Triton does not read is not carried over
    assert len(inference.body) == inference.header_length + 160_000


# ----- generated: repeated keys with lying and honest values, in either order --------------------------------
HONEST = {"name": "INPUT0", "shape": [2, 4], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6, 7, 8], "parameters": {}}
LIES = {
    "shape": [899970039, 4],
    "name": "OTHER",
    "datatype": "FP64",
    "data": [1],
    "parameters": {"binary_data_size": 8},
}


def _object(pairs: list[tuple[str, object]]) -> str:
    return "{" + ",".join(f"{json.dumps(key)}:{json.dumps(value)}" for key, value in pairs) + "}"


@st.composite
def requests_with_a_repeat(draw: st.DrawFn) -> bytes:
    """A request repeating one key at one level Triton reads, the lying value first or last."""
    level = draw(st.sampled_from(["input", "request", "parameters", "output"]))
    lie_first = draw(st.booleans())
    spec = list(HONEST.items())
    outputs: list[tuple[str, object]] = [("name", "OUTPUT0")]
    top_parameters: list[tuple[str, object]] = [("p", 1)]
    if level == "input":
        key = draw(st.sampled_from(sorted(LIES)))
        extra = (key, LIES[key])
        spec = [extra, *spec] if lie_first else [*spec, extra]
    elif level == "parameters":
        extra = ("p", 2**62)
        top_parameters = [extra, *top_parameters] if lie_first else [*top_parameters, extra]
    elif level == "output":
        outputs = [("name", "OUTPUT1"), *outputs] if lie_first else [*outputs, ("name", "OUTPUT1")]
    members = [
        f'"inputs":[{_object(spec)}]',
        f'"outputs":[{_object(outputs)}]',
        f'"parameters":{_object(top_parameters)}',
    ]
    if level == "request":
        lying = '"inputs":[' + _object([*LIES.items()]) + "]"
        members = [lying, *members] if lie_first else [*members, lying]
    return ("{" + ",".join(members) + "}").encode()


@settings(max_examples=200, deadline=None)
@given(body=requests_with_a_repeat(), size=st.sampled_from(["small", "large"]))
def test_generated_repeats_are_refused_whichever_value_comes_first(body, size):
    with pytest.raises(RepeatedKey):
        read(large(body) if size == "large" else body, None, TRANSCODE)
