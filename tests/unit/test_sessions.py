"""The stateful sessions' pure logic: what a request asks of its session, and the owner's table."""

from __future__ import annotations

import asyncio
import json

import pytest

from smtriton.serve.dataplane.reading import inference
from smtriton.serve.dataplane.sending import sessions
from smtriton.serve.dataplane.sending.sessions import SESSION_SEQUENCES, SessionRequest
from smtriton.serve.errors import BadRequest
from smtriton.serve.owner import sessions as owner_sessions
from smtriton.serve.owner.sessions import SessionTable

INFER = json.dumps({"inputs": [{"name": "VALUE", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}).encode()
ID = "0123456789abcdef0123456789abcdef"


def infer_with(**parameters: object) -> bytes:
    return json.dumps({**json.loads(INFER), "parameters": parameters}).encode()


def read_request(header: str, body: bytes, header_length: int | None) -> SessionRequest:
    """What the request asks of its session, from its JSON part as the request's one reading read it."""
    return sessions.read_request(header, inference.read(body, header_length).header)


@pytest.mark.parametrize(
    ("header", "body", "expected"),
    [
        ("NEW_SESSION", INFER, SessionRequest(None)),
        (" NEW_SESSION ", INFER, SessionRequest(None)),
        (ID, INFER, SessionRequest(ID)),
        (f"{ID}; Expires=2026-11-25T10:00:00Z", INFER, SessionRequest(ID)),  # NewSessionId sent back whole
        ("a-b--c", INFER, SessionRequest("a-b--c")),
        ("NEW_SESSION", b'{"requestType": "NEW_SESSION"}', SessionRequest(None, "open")),
        (ID, b'{"requestType": "CLOSE"}', SessionRequest(ID, "close")),
        (ID, infer_with(sagemaker_session_close=True), SessionRequest(ID, close=True)),
        (ID, infer_with(sagemaker_session_close="yes"), SessionRequest(ID)),  # only true closes
        (ID, infer_with(other=1), SessionRequest(ID)),
        # A body that is an inference request is one, whatever else it holds.
        (ID, json.dumps({**json.loads(INFER), "requestType": "CLOSE"}).encode(), SessionRequest(ID)),
    ],
)
def test_what_a_request_asks_of_its_session(header, body, expected):
    assert read_request(header, body, None) == expected


@pytest.mark.parametrize(
    ("header", "body", "message"),
    [
        ("", INFER, "invalid X-Amzn-SageMaker-Session-Id"),
        ("-leading-dash", INFER, "invalid X-Amzn-SageMaker-Session-Id"),
        ("trailing-", INFER, "invalid X-Amzn-SageMaker-Session-Id"),
        ("has space", INFER, "invalid X-Amzn-SageMaker-Session-Id"),
        ("x" * 257, INFER, "invalid X-Amzn-SageMaker-Session-Id"),
        ("new-session", INFER, None),  # a well-formed id: unknown to the table, not malformed
        ("NEW_SESSION", b'{"requestType": "CLOSE"}', "NEW_SESSION cannot close a session"),
        ("NEW_SESSION", infer_with(sagemaker_session_close=True), "NEW_SESSION cannot close a session"),
        (ID, b'{"requestType": "NEW_SESSION"}', "a session is opened with X-Amzn-SageMaker-Session-Id: NEW_SESSION"),
        (ID, infer_with(sequence_id=5), "may not set sequence_id, sequence_start, sequence_end"),
        (ID, infer_with(sequence_start=True), "may not set"),
        (ID, infer_with(sequence_end=False), "may not set"),
    ],
)
def test_malformed_session_requests_are_refused(header, body, message):
    if message is None:
        assert read_request(header, body, None) == SessionRequest(header)
        return
    with pytest.raises(BadRequest) as refused:
        read_request(header, body, None)
    assert message in refused.value.message


def test_binary_json_requests_are_read_from_their_json_part():
    header = json.dumps({"inputs": [{"name": "VALUE", "shape": [1, 1], "datatype": "FP32"}], "parameters": {}})
    closing = header.replace('"parameters": {}', '"parameters": {"sagemaker_session_close": true}').encode()
    assert read_request(ID, closing + b"\x00" * 4, len(closing)) == SessionRequest(ID, close=True)
    assert read_request(ID, b"\x00" * 4, 0) == SessionRequest(ID)  # raw binary: no JSON to read


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (INFER, False),
        (infer_with(sequence_id=7), False),
        (infer_with(sequence_id=SESSION_SEQUENCES - 1), False),
        (infer_with(sequence_id=SESSION_SEQUENCES), True),
        (infer_with(sequence_id=2**64 - 1), True),
        (infer_with(sequence_id=str(SESSION_SEQUENCES)), False),  # a string id is another sequence
    ],
)
def test_only_the_sessions_range_of_sequence_ids_is_theirs(body, names):
    assert sessions.names_a_session_sequence(inference.read(body, None).parameters) is names


def test_an_escaped_key_names_the_same_sequence():
    """The reading decodes keys as Triton does: an escape cannot hide a session's sequence id."""
    body = INFER[:-1] + b', "parameters": {"sequence_\\u0069d": %d}}' % SESSION_SEQUENCES
    assert sessions.names_a_session_sequence(inference.read(body, None).parameters)


def test_expiry_is_written_as_sagemaker_does():
    assert sessions.expires_text(0) == "1970-01-01T00:00:00Z"
    assert sessions.expires_text(1_790_000_000.9) == "2026-09-21T14:13:20Z"


# ----- the table -----------------------------------------------------------------------------------------
def test_sessions_get_unguessable_ids_and_sequences_in_their_own_range():
    table = SessionTable(ttl_s=60)
    opened = [table.open("m", idle_s=5, now=100.0) for _ in range(200)]
    assert len({s.id for s in opened}) == 200
    assert len({s.sequence_id for s in opened}) == 200
    assert all(len(s.id) == 32 and int(s.id, 16) >= 0 for s in opened)
    assert all(SESSION_SEQUENCES <= s.sequence_id < 2 * SESSION_SEQUENCES for s in opened)
    assert all(s.expires_at == 160.0 and not s.started for s in opened)


def test_a_session_is_found_for_its_model_only():
    table = SessionTable(ttl_s=60)
    session = table.open("m", idle_s=5, now=100.0)
    assert table.get(session.id, "m", now=101.0) is session
    with pytest.raises(BadRequest, match="belongs to another model"):
        table.get(session.id, "other", now=101.0)
    with pytest.raises(BadRequest, match="is not open here"):
        table.get("f" * 32, "m", now=101.0)


@pytest.mark.parametrize(
    ("now", "why"),
    [(105.5, "idle for more than 5 s"), (160.0, "past its expiry")],
)
def test_an_expired_session_is_refused_once_with_why_then_forgotten(now, why):
    table = SessionTable(ttl_s=60)
    session = table.open("m", idle_s=5, now=100.0)
    if now >= 160:  # kept busy: only the time to live ends it
        for t in range(101, 160, 4):
            table.use(session.id, "m", now=float(t))
    with pytest.raises(BadRequest) as refused:
        table.get(session.id, "m", now=now)
    assert refused.value.message == f"session '{session.id}' has expired ({why}): open a new one"
    with pytest.raises(BadRequest, match="is not open here"):
        table.get(session.id, "m", now=now)


def test_only_a_request_moves_the_idle_clock_not_its_answer():
    table = SessionTable(ttl_s=60)
    session = table.open("m", idle_s=5, now=100.0)
    table.use(session.id, "m", now=101.0)  # sent at 101; Triton's idle clock restarts when it arrives
    table.answered(session.id)  # answered at, say, 104: the clock does not move
    assert session.started
    assert table.use(session.id, "m", now=105.9) is session
    with pytest.raises(BadRequest, match=r"idle for more than 5 s"):
        table.use(session.id, "m", now=111.0)
    table.answered(session.id)  # an answer for a session forgotten meanwhile is nothing to do
    assert session.id not in table.sessions


def test_forget_drop_model_and_clear():
    table = SessionTable(ttl_s=60)
    a, b, c = (table.open(model, idle_s=5, now=100.0) for model in ("m", "m", "n"))
    assert table.forget(a.id) is a
    assert table.forget(a.id) is None
    assert table.drop_model("m") == [b.id]
    assert list(table.sessions) == [c.id]
    table.clear()
    assert table.sessions == {}


def test_expired_sessions_are_swept_as_new_ones_open(monkeypatch):
    table = SessionTable(ttl_s=60)
    old = table.open("m", idle_s=5, now=100.0)
    table.open("m", idle_s=5, now=100.5)  # within the sweep interval: nothing swept
    assert old.id in table.sessions
    fresh = table.open("m", idle_s=5, now=110.0)
    assert list(table.sessions) == [fresh.id]


def test_the_table_is_bounded(monkeypatch):
    monkeypatch.setattr(owner_sessions, "MAX_OPEN", 3)
    table = SessionTable(ttl_s=60)
    for _ in range(3):
        table.open("m", idle_s=5, now=100.0)
    with pytest.raises(BadRequest, match="too many open sessions"):
        table.open("m", idle_s=5, now=100.0)
    assert len(table.open("m", idle_s=5, now=106.0).id) == 32  # the idle ones were swept first


class ConfigReader:
    """Triton's client as the session keeper uses it: each model's config, read how often."""

    def __init__(self, configs: dict[str, dict[str, object]]) -> None:
        self.configs = configs
        self.reads: list[str] = []

    async def model_config(self, model: str) -> dict[str, object]:
        self.reads.append(model)
        return self.configs[model]


def _keeper(clock: list[float], reader: ConfigReader) -> owner_sessions.SessionKeeper:
    return owner_sessions.SessionKeeper(1200.0, lambda: reader, clock=lambda: clock[0])  # type: ignore[arg-type,return-value]


def test_sessions_expire_on_the_monotonic_clock_whatever_the_wall_clock_does(monkeypatch):
    clock = [1000.0]
    reader = ConfigReader({"seq": {"sequence_batching": {"max_sequence_idle_microseconds": "3000000"}}})
    keeper = _keeper(clock, reader)
    opened = asyncio.run(keeper.open("seq"))
    monkeypatch.setattr(owner_sessions.time, "time", lambda: 0.0)  # the wall clock jumps back decades...
    clock[0] += 2.0
    assert keeper.use(opened["id"], "seq")["sequence_id"] == opened["sequence_id"]  # ...nothing moves
    monkeypatch.setattr(owner_sessions.time, "time", lambda: 4e9)  # ...and forward a century
    clock[0] += 2.0
    assert keeper.use(opened["id"], "seq")["start"] is True  # still open: 2 s idle of 3
    clock[0] += 3.5  # idle past the model's 3 s, by the monotonic clock alone
    with pytest.raises(BadRequest, match="idle for more than 3 s"):
        keeper.use(opened["id"], "seq")


def test_a_models_idle_time_is_read_once_and_forgotten_with_the_model():
    clock = [0.0]
    reader = ConfigReader({"seq": {"sequence_batching": {"max_sequence_idle_microseconds": "3000000"}}})
    keeper = _keeper(clock, reader)
    first = asyncio.run(keeper.open("seq"))
    asyncio.run(keeper.open("seq"))
    assert reader.reads == ["seq"]  # read once while the model stays
    reader.configs["seq"] = {"sequence_batching": {"max_sequence_idle_microseconds": "9000000"}}  # loaded anew
    keeper.forget_model("seq")  # unloaded (or loaded again): its sessions end, its idle time is read anew
    with pytest.raises(BadRequest, match="is not open here"):
        keeper.use(first["id"], "seq")
    renewed = asyncio.run(keeper.open("seq"))
    assert reader.reads == ["seq", "seq"]
    clock[0] += 5.0  # past the old model's 3 s, inside the new one's 9 s
    assert keeper.use(renewed["id"], "seq")["start"] is True
