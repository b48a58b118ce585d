"""Contract rules of the routes, in-process on the ASGI app and the real data plane, in front of a
stand-in speaking Triton's HTTP API (tests/unit/triton_stand_in.py)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Coroutine
from typing import Any

import orjson
import pytest

from smtriton.serve.dataplane.plane import EMPTY_BODY
from smtriton.serve.settings import Settings
from smtriton.serve.triton.request_body import BodyPieces, HeldBody, contiguous
from tests.unit.triton_stand_in import TritonStandIn, call


@pytest.mark.parametrize(("healthy", "status"), [(True, 200), (False, 503)])
def test_ping_answers_health_with_an_empty_body(healthy, status):
    answer = call("GET", "/ping", healthy=healthy)
    assert (answer.status, answer.body) == (status, b"")
    assert answer.reached_triton == []  # /ping reads the state, never Triton


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/ping"), ("HEAD", "/ping"), ("GET", "/invocations"), ("PUT", "/invocations")]
)
def test_wrong_methods_on_the_data_routes_are_405_in_json(method, path):
    answer = call(method, path)
    assert (answer.status, answer.headers[b"content-type"], json.loads(answer.body)) == (
        405,
        b"application/json",
        {"error": "Method Not Allowed"},
    )


def test_invocations_forward_the_decompressed_body_and_custom_attributes_both_ways():
    body = b'{"inputs":[],"parameters":{"sagemaker_custom_attributes":"back"}}'
    headers = [
        (b"content-type", b"application/json"),
        (b"content-encoding", b"gzip"),
        (b"x-amzn-sagemaker-custom-attributes", b"trace=1"),
    ]
    triton = TritonStandIn()
    triton.answer = (200, b'{"parameters":{"sagemaker_custom_attributes":"back"},"outputs":[]}')
    answer = call("POST", "/invocations", gzip.compress(body), headers, triton=triton)
    assert answer.status == 200
    ((path, sent, sent_headers),) = answer.reached_triton
    assert path == "/v2/models/m/infer"
    assert orjson.loads(sent) == {"inputs": [], "parameters": {"sagemaker_custom_attributes": "trace=1"}}
    assert "Content-Encoding" not in sent_headers
    assert answer.headers[b"x-amzn-sagemaker-custom-attributes"] == b"back"


def test_a_body_over_the_limit_is_413_before_anything_is_forwarded():
    assert call("POST", "/invocations", b"x" * 1025).status == 413
    declared = call("POST", "/invocations", b"", [(b"content-length", b"5000")])
    assert (declared.status, declared.reached_triton) == (413, [])


def test_invocations_on_a_multi_model_endpoint_and_invoke_on_a_single_model_one_are_refused():
    answer = call("POST", "/invocations", b"{}", default_model=None)
    assert answer.status == 400
    assert json.loads(answer.body)["error"].startswith("this is a multi-model endpoint")
    answer = call("POST", "/models/m/invoke", b"{}")
    assert (answer.status, json.loads(answer.body)) == (404, {"error": "model 'm' is not loaded"})


@pytest.mark.parametrize("path", ["/nowhere", "/v2/models/x", "/ping/", "/models/a/b"])
def test_unknown_paths_are_404_naming_the_route_asked_for(path):
    answer = call("GET", path)
    assert (answer.status, json.loads(answer.body)) == (404, {"error": f"no route for GET {path}"})


def test_a_batch_payload_of_0_is_answered_as_0_and_the_body_limit_stays():
    settings = Settings.from_env({"SAGEMAKER_BATCH": "true", "SAGEMAKER_MAX_PAYLOAD_IN_MB": "0"})
    answer = call("GET", "/execution-parameters", settings=settings)
    assert json.loads(answer.body)["MaxPayloadInMB"] == 0
    assert settings.max_payload_bytes == 1024 * 1024 * 1024
    declared = call("POST", "/invocations", b"", [(b"content-length", b"%d" % (1025 * 1024 * 1024))], settings=settings)
    assert declared.status == 413


@pytest.mark.parametrize("body", [b"", b" \n"])
def test_an_empty_body_triton_refuses_is_told_so(body):
    triton = TritonStandIn()  # as Triton refuses an empty (raw mode) body for a model of two inputs
    triton.answer = (400, b'{"error":"Raw request must only have 1 input (found 1) to be deduced but got 2 inputs"}')
    answer = call("POST", "/invocations", body, [(b"content-type", b"application/json")], triton=triton)
    assert (answer.status, json.loads(answer.body)) == (400, {"error": EMPTY_BODY})


LARGE_BODIES = Settings(max_payload_bytes=1 << 20, max_header_bytes=2048)
HUGE_INTEGER = b"7" * 5000  # past Python's 4,300 digits


@pytest.mark.parametrize(
    ("body", "content_type", "refusal"),
    [
        (b'{"inputs":[{"name":"x","shape":[1],"datatype":"INT64","data":[%s]}]}', b"application/json", ""),
        (b'{"inputs":[{"name":"x","shape":[%s],"datatype":"INT64","data":[1]}]}', b"application/json", ""),
        (b'{"inputs":[],"parameters":{"p":%s}}', b"application/json", ""),
        (
            b'{"inputs":[{"name":"x","shape":[1],"datatype":"INT64","data":[%s]}]}\n',
            b"application/jsonlines",
            "line 1 of 1: ",
        ),
    ],
    ids=["data", "shape", "parameter", "json-lines-record"],
)
def test_an_integer_of_more_digits_than_python_reads_is_400_before_triton(body, content_type, refusal):
    answer = call("POST", "/invocations", body % HUGE_INTEGER, [(b"content-type", content_type)], settings=LARGE_BODIES)
    assert (answer.status, answer.headers[b"content-type"]) == (400, b"application/json")
    assert json.loads(answer.body)["error"].startswith(
        f"{refusal}failed to parse the request JSON buffer: a number is too big: an integer of over 4300 digits"
    )
    assert answer.reached_triton == []


def test_custom_attributes_reach_triton_on_a_binary_request_whose_json_part_is_large():
    """Its keys Triton does not read are not carried over: Triton ignores them."""
    header = b'{"inputs":[{"name":"x","shape":[2],"datatype":"UINT8","parameters":{"binary_data_size":2}}],"note":"%s"}'
    header %= b"n" * 20_000
    headers = [
        (b"content-type", b"application/vnd.sagemaker-triton.binary+json;json-header-size=%d" % len(header)),
        (b"x-amzn-sagemaker-custom-attributes", b"trace=1"),
    ]
    answer = call("POST", "/invocations", header + b"\x01\x02", headers, settings=LARGE_BODIES)
    assert answer.status == 200, answer.body
    ((_, sent, sent_headers),) = answer.reached_triton
    length = int(sent_headers["Inference-Header-Content-Length"])
    assert orjson.loads(sent[:length]) == {
        "inputs": [{"name": "x", "shape": [2], "datatype": "UINT8", "parameters": {"binary_data_size": 2}}],
        "parameters": {"sagemaker_custom_attributes": "trace=1"},
    }
    assert sent[length:] == b"\x01\x02"


def _at_once(read: Coroutine[Any, Any, HeldBody]) -> HeldBody:
    """What a read of a body already whole returns (it never waits): no event loop, whose own
    allocations would blur the measure below."""
    try:
        read.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    raise AssertionError("the read waited")


def test_a_large_body_read_whole_is_gathered_held_once():
    import tracemalloc

    piece = bytes(range(256)) * 256
    tracemalloc.start()
    try:
        body = BodyPieces([bytes(bytearray(piece)) for _ in range(512)])  # 32 MiB as the reader holds it
        whole = body.gathered()  # one buffer, each piece let go once copied
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert whole == piece * 512
    assert body.pieces == []
    assert peak < 1.3 * len(whole)  # a join holds the pieces and their copy at once: 2x


def test_a_body_in_many_pieces_is_held_once_as_its_pieces():
    import tracemalloc

    from smtriton.serve.http.body import BodyReader

    piece = bytes(range(256)) * 256  # 64 KiB, as the parser hands a large body over
    pieces = 512  # 32 MiB in all
    reader = BodyReader(1 << 30)
    fed = []
    tracemalloc.start()
    try:
        for _ in range(pieces):
            fed.append(bytes(bytearray(piece)))  # a new object each time, as the parser's pieces are
            reader.feed(fed[-1])
        reader.finish()
        body = _at_once(reader.read())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(body, BodyPieces)
    assert len(body) == pieces * len(piece)
    assert body.pieces[-1] is fed[-1]  # the pieces as they came: nothing copied
    assert body.prefix(len(piece) + 1) == piece + piece[:1]
    assert contiguous(body) == piece * pieces
    assert peak < 1.05 * len(body)  # held once: a growing buffer or a join would hold more
    single = BodyReader(1 << 30)
    single.feed(piece)
    single.finish()
    assert _at_once(single.read()) is piece  # a body in one piece is passed on as it came, no copy
    empty = BodyReader(1 << 30)
    empty.finish()
    assert _at_once(empty.read()) == b""


@pytest.mark.parametrize("size", [1, 7, 100])
def test_a_body_trickled_in_small_pieces_is_held_in_about_its_bytes(size):
    """Small pieces are joined as they come: kept apart, a trickle of 1-byte segments cost 9 times its
    bytes (a list slot each; a larger small piece an object too), which 200 slow connections made tens
    of MiB."""
    import tracemalloc

    from smtriton.serve.http.body import BodyReader

    connections, each = 50, 17_000  # bytes each connection has sent so far
    data = (bytes(range(256)) * (each // 256 + 1))[:each]
    readers = [BodyReader(1 << 30) for _ in range(connections)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for reader in readers:
            for at in range(0, each, size):
                reader.feed(data[at : at + size])  # a new object each time, as the parser's pieces are
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 1.15 * connections * each
    for reader in readers:
        reader.finish()
        body = _at_once(reader.read())
        assert contiguous(body) == data
        assert isinstance(body, BodyPieces)
        assert len(body.pieces) == 2  # 16 KiB joined, then the rest


def test_large_pieces_stay_as_they_came_between_small_ones_joined():
    from smtriton.serve.http.body import JOIN_BELOW, BodyReader

    large, other, last = bytes(range(256)) * 256, bytes(256) * 256, b"f" * 100
    reader = BodyReader(1 << 30)
    for piece in (b"a", b"b", large, b"c", b"d", b"e", other, last):
        reader.feed(piece)
    reader.finish()
    body = _at_once(reader.read())
    assert isinstance(body, BodyPieces)
    assert body.pieces == [b"ab", large, b"cde", other, last]
    assert body.pieces[1] is large  # not copied
    assert body.pieces[3] is other
    assert body.pieces[4] is last  # a lone small piece, as a large body's last one often is: not copied either
    small = BodyReader(1 << 30)
    for piece in (b"x" * (JOIN_BELOW - 3), b"y", b"z"):
        small.feed(piece)
    small.finish()
    assert _at_once(small.read()) == b"x" * (JOIN_BELOW - 3) + b"yz"  # all joined in one: a plain buffer
