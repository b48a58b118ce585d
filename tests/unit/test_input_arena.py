"""The worker's shared memory for inputs (smtriton/serve/triton/input_arena.py): which requests may take
it, its slots (taken, given back, retired, refused when ``/dev/shm`` is full), what is copied into a slot
and the JSON request that names it."""

from __future__ import annotations

import asyncio
import errno
import json
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from smtriton.serve.dataplane.reading.inference import read
from smtriton.serve.dataplane.sending.upstream import Upstream
from smtriton.serve.errors import BadRequest, TritonUnavailable, UpstreamTimeout
from smtriton.serve.eventloop import LoopOfFirstUse
from smtriton.serve.metrics import Metrics
from smtriton.serve.triton.client import UpstreamResponse
from smtriton.serve.triton.input_arena import REGION_PREFIX, InputArena, binary_inputs, names_own_region
from smtriton.serve.triton.request_body import BodyPieces

PAGE = 64 * 1024


def spec(name: str, datatype: str, shape: list[int], size: int, **extra: object) -> dict[str, object]:
    return {"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": size}, **extra}


@pytest.fixture
def arena(tmp_path: Path):
    made = InputArena(4 * PAGE, PAGE, directory=tmp_path)
    yield made
    made.close()


def test_only_requests_triton_reads_alike_either_way_take_a_slot():
    two = {"inputs": [spec("A", "FP32", [2, 3], 24), spec("B", "INT64", [1], 8)]}
    assert binary_inputs(two, 100, 132) == [24, 8]
    assert binary_inputs(two, 100, 133) is None  # a byte past the last input
    assert binary_inputs(two, 100, 131) is None  # one short
    for changed in (
        {"inputs": [spec("A", "FP32", [2, 3], 20)]},  # fewer bytes than the shape
        {"inputs": [spec("A", "BYTES", [1], 24)]},  # framed elements: Triton counts them
        {"inputs": [spec("A", "FP32", [2, 3], 24, data=[1])]},
        {"inputs": [{"name": "A", "datatype": "FP32", "shape": [6], "data": [1] * 6}]},
        {"inputs": [spec("A", "FP32", [-1, 3], 24)]},
        {"inputs": [{**spec("A", "FP32", [6], 24), "parameters": {"binary_data_size": 24, "x": 1}}]},
        {"inputs": []},
        {"outputs": []},
    ):
        assert binary_inputs(changed, 100, 124) is None, changed


def test_a_slot_is_as_many_consecutive_pages_as_its_bytes_need(arena):
    assert (arena.pages, arena.page_bytes, arena.byte_size) == (4, PAGE, 4 * PAGE)
    one = arena.take(PAGE)
    two = arena.take(PAGE + 1)
    assert (one, two) == ((0, 1), (1, 2))
    assert arena.take(2 * PAGE) is None  # one page left
    last = arena.take(1)
    assert last == (3, 1)
    assert arena.take(1) is None  # all in use: the request goes in the body
    arena.give_back(one)
    arena.give_back(last)
    assert arena.take(2 * PAGE) is None  # pages 0 and 3 free, but not next to each other
    arena.give_back(two)
    assert arena.take(3 * PAGE) == (0, 3)
    assert arena.take(4 * PAGE + 1) is None  # past the arena


def test_a_retired_slot_is_never_taken_again(arena):
    slot = arena.take(2 * PAGE)
    assert slot is not None
    arena.retire(slot)
    assert arena.retired == 2
    assert arena.take(3 * PAGE) is None
    assert arena.take(2 * PAGE) == (2, 2)


def test_an_arena_smaller_than_a_page_is_one_page_of_its_size(tmp_path):
    small = InputArena(PAGE // 2, PAGE, directory=tmp_path)
    try:
        assert (small.pages, small.page_bytes, small.byte_size, small.largest) == (1, PAGE // 2, PAGE // 2, PAGE // 2)
        assert small.path.stat().st_size == PAGE // 2
        assert small.take(PAGE // 2 + 1) is None
    finally:
        small.close()
    assert not small.path.exists()


def test_pages_get_memory_when_first_taken_and_a_full_dev_shm_refuses_not_faults(arena, monkeypatch):
    calls: list[tuple[int, int]] = []
    fallocate = os.posix_fallocate

    def recorded(fd: int, offset: int, length: int) -> None:
        calls.append((offset, length))
        fallocate(fd, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", recorded)
    first = arena.take(2 * PAGE)
    assert first is not None
    arena.give_back(first)
    assert arena.take(PAGE) == (0, 1)  # has its memory already
    assert calls == [(0, 2 * PAGE)]

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    assert arena.take(PAGE) == (1, 1)  # had its memory
    assert arena.take(PAGE) is None  # would need new memory: refused
    monkeypatch.setattr(os, "posix_fallocate", recorded)
    assert arena.take(PAGE) == (2, 1)  # room again


def test_a_body_is_copied_into_its_slot_from_pieces_or_whole_and_the_request_names_it(arena):
    values = np.arange(6, dtype=np.float32)
    other = np.array([7], dtype=np.int64)
    header = json.dumps({"inputs": [spec("A", "FP32", [6], 24), spec("B", "INT64", [1], 8)]}).encode()
    body = header + values.tobytes() + other.tobytes()
    inference = read(body, len(header))
    assert inference.header is not None
    sizes = binary_inputs(inference.header, len(header), len(body))
    assert sizes == [24, 8]
    arena.take(1)
    slot = arena.take(32)
    assert slot == (1, 1)
    pieces = BodyPieces([body[:10], body[10 : len(header) + 5], body[len(header) + 5 :]])
    arena.fill(slot, pieces, len(header))
    request = json.loads(arena.request(inference.header, sizes, slot))
    assert [item["parameters"] for item in request["inputs"]] == [
        {"shared_memory_region": arena.name, "shared_memory_offset": PAGE, "shared_memory_byte_size": 24},
        {"shared_memory_region": arena.name, "shared_memory_offset": PAGE + 24, "shared_memory_byte_size": 8},
    ]
    assert [item["name"] for item in request["inputs"]] == ["A", "B"]
    with open(arena.path, "rb") as region, mmap.mmap(region.fileno(), 0, access=mmap.ACCESS_READ) as seen:
        assert seen[PAGE : PAGE + 32] == values.tobytes() + other.tobytes()
        arena.fill(slot, body, len(header) + 24)  # a whole body, from an offset
        assert seen[PAGE : PAGE + 8] == other.tobytes()
    assert inference.header["inputs"][0]["parameters"] == {"binary_data_size": 24}  # the read header unchanged


def test_the_region_is_the_workers_alone_and_its_name_can_be_taken_away(arena):
    assert arena.name.startswith(REGION_PREFIX)
    assert arena.key == f"/{arena.name}"
    assert arena.path.stat().st_mode & 0o777 == 0o600
    arena.unlink()
    assert not arena.path.exists()
    assert arena.take(1) == (0, 1)  # still mapped here


def test_a_client_may_not_name_the_fronts_regions():
    assert names_own_region({"shared_memory_region": f"{REGION_PREFIX}123_abc"})
    assert not names_own_region({"shared_memory_region": "theirs"})
    assert not names_own_region(None)
    header = {"name": "A", "datatype": "FP32", "shape": [4]}
    ours = {"shared_memory_region": f"{REGION_PREFIX}1_x", "shared_memory_byte_size": 16}
    for body in (
        {"inputs": [{**header, "parameters": ours}]},
        {"inputs": [{**header, "data": [1, 2, 3, 4]}], "outputs": [{"name": "B", "parameters": ours}]},
    ):
        with pytest.raises(BadRequest, match="is not registered"):
            read(json.dumps(body).encode(), None)


class _Triton:
    """The inference call of a Triton client: records what it was sent, answers once ``answer`` is set
    (or fails with ``failure``)."""

    def __init__(self, failure: BaseException | None = None) -> None:
        self.failure = failure
        self.sent: list[tuple[str, bytes, int | None]] = []
        self.answer = asyncio.Event()

    async def infer(self, model: str, body: bytes, header_length: int | None) -> UpstreamResponse:
        self.sent.append((model, body, header_length))
        await self.answer.wait()
        if self.failure is not None:
            raise self.failure
        return UpstreamResponse(200, "application/json", None, b"{}")


def _through(arena: InputArena, triton: _Triton, client_leaves: bool) -> object:
    """One request through a slot; the client leaving (its task cancelled) before Triton answers or not.
    What the client got."""
    header = json.dumps({"inputs": [spec("A", "UINT8", [PAGE], PAGE)]}).encode()
    inference = read(header + b"x" * PAGE, len(header))
    upstream = Upstream.__new__(Upstream)
    upstream._calls = set()
    upstream._loop = LoopOfFirstUse()
    upstream.metrics = Metrics(enabled=False)
    slot = arena.take(PAGE)
    assert slot is not None

    async def main() -> object:
        call = asyncio.ensure_future(upstream._send_through(triton, arena, slot, "m", inference, [PAGE]))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        if client_leaves:
            call.cancel()
        await asyncio.sleep(0.01)
        assert not (arena._free >> slot[0]) & 1  # Triton has not answered: the slot is still its
        triton.answer.set()
        try:
            got: object = await call
        except BaseException as exc:
            got = exc
        await asyncio.sleep(0.01)  # the call, run on, ends
        return got

    return asyncio.run(main())


@pytest.mark.parametrize("client_leaves", [False, True])
def test_a_slot_is_free_again_once_triton_answered_even_if_the_client_left(arena, client_leaves):
    triton = _Triton()
    got = _through(arena, triton, client_leaves)
    assert isinstance(got, asyncio.CancelledError if client_leaves else UpstreamResponse)
    ((model, body, header_length),) = triton.sent
    assert (model, header_length) == ("m", None)  # a JSON request: the bytes are in the slot
    assert json.loads(body)["inputs"][0]["parameters"]["shared_memory_region"] == arena.name
    assert arena.take(4 * PAGE) == (0, 4)  # all free again
    assert arena.retired == 0


@pytest.mark.parametrize("failure", [UpstreamTimeout("late"), TritonUnavailable("gone")])
def test_a_slot_whose_request_ended_without_an_answer_is_never_used_again(arena, failure):
    got = _through(arena, _Triton(failure), client_leaves=False)
    assert got is failure
    assert arena.take(4 * PAGE) is None
    assert arena.take(3 * PAGE) == (1, 3)
    assert arena.retired == 1
