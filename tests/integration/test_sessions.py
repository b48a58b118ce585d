"""SageMaker stateful sessions on a real Triton sequence model (docs/contract.md §8).

``accumulate`` keeps a running total of VALUE per sequence and fails a request of a sequence it never
saw start, so every total below shows that the front gave the session's requests one sequence id, the
start flag on the first and nothing of one session to another. Each request goes on a fresh connection
(``requests`` without a session object): with two front workers the kernel hands them to either.
"""

from __future__ import annotations

import calendar
import json
import re
import shutil
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.integration.conftest import TEST_MODELS, start_serve
from tests.integration.contract_client import BJ, parse
from tests.integration.test_local_endpoint import Emulator
from tests.integration.test_workers import workers_that_answered

pytestmark = pytest.mark.integration

SEQUENCE_MODELS = Path(__file__).parent / "models_sequence"
SESSION = "X-Amzn-SageMaker-Session-Id"
NEW = "X-Amzn-SageMaker-New-Session-Id"
CLOSED = "X-Amzn-SageMaker-Closed-Session-Id"
OPENED = re.compile(r"^([0-9a-f]{32}); Expires=(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z)$")
TTL_S = 1200  # the default SMTRITON_SESSION_TTL_S
IDLE_S = 3.0  # the models' max_sequence_idle_microseconds


def value_request(value: float, **parameters: object) -> bytes:
    request: dict = {"inputs": [{"name": "VALUE", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}
    if parameters:
        request["parameters"] = parameters
    return json.dumps(request).encode()


def total(response: requests.Response) -> float:
    assert response.status_code == 200, response.text
    return float(parse(response).as_numpy("TOTAL").reshape(-1)[0])


def post(url: str, body: bytes, session: str | None = None, content_type: str = "application/json", **headers: str):
    headers["Content-Type"] = content_type
    if session is not None:
        headers[SESSION] = session
    return requests.post(url, data=body, headers=headers, timeout=60)


def opened(response: requests.Response) -> str:
    """The id of the session a response opened (checked against SageMaker's form of the header)."""
    assert response.status_code == 200, response.text
    value = response.headers[NEW]
    assert response.headers[SESSION] == value  # the container's form, which SageMaker passes on as NewSessionId
    match = OPENED.match(value)
    assert match, value
    return match.group(1)


@pytest.fixture(scope="module")
def sessions_server(tmp_path_factory):
    """The SME ``accumulate`` behind two front workers."""
    tmp = tmp_path_factory.mktemp("sessions")
    repo = tmp / "models"
    shutil.copytree(SEQUENCE_MODELS / "accumulate", repo / "accumulate")
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": "2", "SMTRITON_ACCESS_LOG": "true"}
    server = start_serve(tmp, repo, "accumulate", env=env)
    server.invocations = f"{server.url}/invocations"
    yield server
    server.stop()


def test_a_new_session_is_named_with_its_expiry_and_continues_its_sequence(sessions_server):
    url = sessions_server.invocations
    before = time.time()
    first = post(url, value_request(2.5), "NEW_SESSION")
    session = opened(first)
    expires = calendar.timegm(time.strptime(OPENED.match(first.headers[NEW]).group(2), "%Y-%m-%dT%H:%M:%SZ"))
    assert before + TTL_S - 1 <= expires <= time.time() + TTL_S + 1
    assert total(first) == 2.5
    second = post(url, value_request(2.5), session)
    assert total(second) == 5.0
    assert NEW not in second.headers
    assert CLOSED not in second.headers
    # The whole NewSessionId value, expiry and all, names the session too.
    assert total(post(url, value_request(1.0), first.headers[NEW])) == 6.0


def test_two_sessions_keep_their_own_state(sessions_server):
    url = sessions_server.invocations
    a = opened(post(url, value_request(1.0), "NEW_SESSION"))
    b = opened(post(url, value_request(100.0), "NEW_SESSION"))
    assert a != b
    assert [total(post(url, value_request(1.0), a)) for _ in range(3)] == [2.0, 3.0, 4.0]
    assert total(post(url, value_request(1.0), b)) == 101.0
    assert total(post(url, value_request(1.0), a)) == 5.0


def test_an_inference_with_the_close_parameter_closes_the_session(sessions_server):
    url = sessions_server.invocations
    session = opened(post(url, value_request(1.0), "NEW_SESSION"))
    closing = post(url, value_request(2.0, sagemaker_session_close=True), session)
    assert total(closing) == 3.0
    assert closing.headers[CLOSED] == session
    after = post(url, value_request(1.0), session)
    assert after.status_code == 400
    assert after.json() == {"error": f"session '{session}' is not open here: unknown, closed or expired"}


def test_binary_json_requests_continue_and_close_a_session(sessions_server):
    url = sessions_server.invocations

    def binary(value: float, **parameters: object) -> tuple[bytes, str]:
        tensor = httpclient.InferInput("VALUE", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.float32), binary_data=True)
        body, size = httpclient.InferenceServerClient.generate_request_body([tensor], parameters=parameters or None)
        return body, f"{BJ};json-header-size={size}"

    def send(request: tuple[bytes, str], session: str) -> requests.Response:
        return post(url, request[0], session, content_type=request[1])

    session = opened(send(binary(4.0), "NEW_SESSION"))
    assert total(send(binary(1.0), session)) == 5.0
    closing = send(binary(1.0, sagemaker_session_close=True), session)
    assert (total(closing), closing.headers[CLOSED]) == (6.0, session)


def test_a_binary_json_request_whose_json_part_is_large_and_holds_keys_triton_ignores_continues_a_session(
    sessions_server,
):
    url = sessions_server.invocations
    header = json.dumps(
        {
            "inputs": [{"name": "VALUE", "shape": [1, 1], "datatype": "FP32", "parameters": {"binary_data_size": 4}}],
            "comment": "c" * 20_000,
        }
    ).encode()
    body = header + np.array([[2.0]], dtype=np.float32).tobytes()
    content_type = f"{BJ};json-header-size={len(header)}"
    session = opened(post(url, body, "NEW_SESSION", content_type=content_type))
    assert total(post(url, body, session, content_type=content_type)) == 4.0


def test_lmi_control_bodies_open_and_close_a_session_without_inference(sessions_server):
    """AWS's LMI containers' form: ``{"requestType": "NEW_SESSION"}`` and ``{"requestType": "CLOSE"}``."""
    url = sessions_server.invocations
    opening = post(url, b'{"requestType": "NEW_SESSION"}', "NEW_SESSION")
    session = opened(opening)
    assert opening.json() == {"session_id": session, "expires": OPENED.match(opening.headers[NEW]).group(2)}
    # The first inference of the session starts its sequence.
    assert total(post(url, value_request(7.0), session)) == 7.0
    assert total(post(url, value_request(1.0), session)) == 8.0
    closing = post(url, b'{"requestType": "CLOSE"}', session)
    assert (closing.status_code, closing.headers[CLOSED]) == (200, session)
    assert closing.json() == {"closed_session_id": session}
    assert post(url, value_request(1.0), session).status_code == 400
    assert post(url, b'{"requestType": "CLOSE"}', session).status_code == 400  # closed once


def test_a_session_idle_past_the_models_timeout_has_expired(sessions_server):
    url = sessions_server.invocations
    session = opened(post(url, value_request(1.0), "NEW_SESSION"))
    time.sleep(IDLE_S + 0.5)
    late = post(url, value_request(1.0), session)
    assert late.status_code == 400
    assert late.json() == {"error": f"session '{session}' has expired (idle for more than 3 s): open a new one"}
    assert post(url, value_request(1.0), session).status_code == 400  # and is forgotten
    assert total(post(url, value_request(1.0), "NEW_SESSION")) == 1.0  # a new one starts afresh


@pytest.mark.parametrize(
    ("session", "body", "message"),
    [
        ("0123456789abcdef0123456789abcdef", value_request(1.0), "is not open here: unknown, closed or expired"),
        ("not a session!", value_request(1.0), "invalid X-Amzn-SageMaker-Session-Id"),
        ("x" * 300, value_request(1.0), "invalid X-Amzn-SageMaker-Session-Id"),
        ("NEW_SESSION", b'{"requestType": "CLOSE"}', "NEW_SESSION cannot close a session"),
        ("NEW_SESSION", value_request(1.0, sagemaker_session_close=True), "NEW_SESSION cannot close a session"),
        ("NEW_SESSION", value_request(1.0, sequence_id=5), "may not set sequence_id"),
    ],
)
def test_bad_session_requests_are_400_with_a_json_error(sessions_server, session, body, message):
    response = post(sessions_server.invocations, body, session)
    assert response.status_code == 400
    assert message in response.json()["error"]
    assert NEW not in response.headers
    assert requests.get(f"{sessions_server.url}/ping", timeout=5).status_code == 200


def test_a_failed_first_request_opens_no_session(sessions_server):
    bad = json.dumps({"inputs": [{"name": "NOPE", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}).encode()
    response = post(sessions_server.invocations, bad, "NEW_SESSION")
    assert response.status_code == 400
    assert NEW not in response.headers
    assert SESSION not in response.headers


def test_requests_outside_sessions_keep_their_own_sequence_parameters(sessions_server):
    """KServe's sequence parameters still pass through; only the sessions' range of ids is refused."""
    url = sessions_server.invocations
    assert total(post(url, value_request(3.0, sequence_id=77, sequence_start=True))) == 3.0
    assert total(post(url, value_request(3.0, sequence_id=77, sequence_end=True))) == 6.0
    forged = post(url, value_request(3.0, sequence_id=2**62 + 5))
    assert forged.status_code == 400
    assert "belong to stateful sessions" in forged.json()["error"]


def test_a_session_continues_whichever_worker_a_request_reaches(sessions_server):
    url = sessions_server.invocations
    session = opened(post(url, value_request(0.0), "NEW_SESSION"))
    totals = [total(post(url, value_request(1.0), session)) for _ in range(24)]
    assert totals == [float(n) for n in range(1, 25)]
    assert workers_that_answered(sessions_server, "/invocations") == {1, 2}


# ----- multi-model endpoint ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mme_sessions(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mme-sessions")
    root = tmp / "models"
    for name in ("accumulate", "accumulate_stream"):
        shutil.copytree(SEQUENCE_MODELS / name, root / name / "model")
    shutil.copytree(TEST_MODELS / "addsub", root / "addsub" / "model")
    server = start_serve(tmp, None, None, args=["--multi-model", "--model-root", str(root)])
    for name in ("accumulate", "accumulate_stream", "addsub"):
        load = {"model_name": name, "url": str(root / name / "model")}
        assert requests.post(f"{server.url}/models", json=load, timeout=120).status_code == 200
    server.root = root
    yield server
    server.stop()


def test_mme_sessions_and_unloading_a_model_ends_them(mme_sessions):
    url = f"{mme_sessions.url}/models/accumulate/invoke"
    session = opened(post(url, value_request(1.0), "NEW_SESSION"))
    assert total(post(url, value_request(1.0), session)) == 2.0
    # A session belongs to its model.
    other = post(f"{mme_sessions.url}/models/accumulate_stream/invoke", value_request(1.0), session)
    assert other.status_code == 400
    assert other.json() == {"error": f"session '{session}' belongs to another model"}
    assert requests.delete(f"{mme_sessions.url}/models/accumulate", timeout=120).status_code == 200
    load = {"model_name": "accumulate", "url": str(mme_sessions.root / "accumulate" / "model")}
    assert requests.post(f"{mme_sessions.url}/models", json=load, timeout=120).status_code == 200
    after = post(url, value_request(1.0), session)
    assert after.status_code == 400
    assert "is not open here" in after.json()["error"]
    assert total(post(url, value_request(1.0), "NEW_SESSION")) == 1.0


def test_a_model_without_sequence_batching_refuses_a_session(mme_sessions):
    body = json.dumps(
        {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                for n in ("INPUT0", "INPUT1")
            ]
        }
    ).encode()
    response = post(f"{mme_sessions.url}/models/addsub/invoke", body, "NEW_SESSION")
    assert response.status_code == 400
    assert response.json() == {
        "error": "model 'addsub' keeps no state between requests (its config has no sequence_batching): "
        "a stateful session needs a sequence model"
    }
    assert NEW not in response.headers
    # The model still answers requests outside sessions.
    assert post(f"{mme_sessions.url}/models/addsub/invoke", body).status_code == 200


def _streamed_totals(response: requests.Response) -> list[float]:
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/jsonlines"
    lines = [json.loads(line) for line in response.iter_lines() if line]
    assert all("error" not in line for line in lines), lines
    return [line["outputs"][0]["data"][0] for line in lines]


def test_streamed_invocations_continue_a_session_but_cannot_open_one(mme_sessions):
    url = f"{mme_sessions.url}/models/accumulate_stream/invoke"
    refused = post(url, value_request(1.0), "NEW_SESSION")
    assert refused.status_code == 400
    assert "a streamed answer cannot open a session" in refused.json()["error"]
    session = opened(post(url, b'{"requestType": "NEW_SESSION"}', "NEW_SESSION"))
    assert _streamed_totals(post(url, value_request(2.0), session)) == [2.0, 4.0]
    assert _streamed_totals(post(url, value_request(1.0), session)) == [3.0, 6.0]
    closing = post(url, value_request(1.0, sagemaker_session_close=True), session)
    assert closing.headers[CLOSED] == session
    assert _streamed_totals(closing) == [4.0, 8.0]
    assert post(url, value_request(1.0), session).status_code == 400


# ----- the local endpoint, with boto3 -------------------------------------------------------------------
def test_local_endpoint_relays_boto3_session_ids(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(SEQUENCE_MODELS / "accumulate", repo / "accumulate")
    with tarfile.open(tmp_path / "model.tar.gz", "w:gz") as tar:
        tar.add(repo / "accumulate", arcname="accumulate")
    emulator = Emulator(tmp_path, ["--model-data", str(tmp_path / "model.tar.gz")])
    try:
        client = emulator.client

        def invoke(body: bytes, session: str) -> dict:
            return client.invoke_endpoint(
                EndpointName="local", Body=body, ContentType="application/json", SessionId=session
            )

        first = invoke(value_request(5.0), "NEW_SESSION")
        match = OPENED.match(first["NewSessionId"])
        assert match, first["NewSessionId"]
        session = match.group(1)  # as AWS's examples take it
        assert json.loads(first["Body"].read())["outputs"][0]["data"] == [5.0]
        second = invoke(value_request(1.0), session)
        assert json.loads(second["Body"].read())["outputs"][0]["data"] == [6.0]
        assert "NewSessionId" not in second
        assert "ClosedSessionId" not in second
        closing = invoke(b'{"requestType": "CLOSE"}', session)
        assert closing["ClosedSessionId"] == session
        # SageMaker reports the container's 400 for a closed session as a ModelError.
        with pytest.raises(client.exceptions.ModelError) as failed:
            invoke(value_request(1.0), session)
        assert "is not open here" in failed.value.response["OriginalMessage"]
    finally:
        assert emulator.stop() == 0
