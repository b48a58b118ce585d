"""Requests that meet a dead Triton, on the real Triton killed from outside (or by a poisoned request):
those sent again after a death go on probation one at a time, and only once Triton serves again; a
turn whose client left, or whose worker died, holds nobody up; a request of a sequence is never sent
again.

``poison_batched`` runs the requests that reach it within 100 ms in one execution, so a poisoned
request kills Triton with the others of its execution in flight; ``delay_ms`` in a request's parameters
makes it take that long, ``initialize_s`` in its config makes each Triton slow to come back.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.integration.conftest import start_serve
from tests.integration.harness import ServeProcess, triton_pids, wait_for, worker_pids

pytestmark = pytest.mark.integration

POISON_MODELS = Path(__file__).parent / "models_poison"
SEQUENCE_MODELS = Path(__file__).parent / "models_sequence"
DIED = "tritonserver exited unexpectedly"


def _poison_server(tmp_path: Path, env: dict[str, str], initialize_s: float = 0) -> ServeProcess:
    repo = tmp_path / "models"
    shutil.copytree(POISON_MODELS / "poison_batched", repo / "poison_batched")
    if initialize_s:
        with (repo / "poison_batched" / "config.pbtxt").open("a") as config:
            config.write(f'parameters {{ key: "initialize_s" value: {{ string_value: "{initialize_s}" }} }}\n')
    # Merging is off: each request reaches Triton as the client sent it, batched by Triton alone.
    return start_serve(tmp_path, repo, "poison_batched", env={"SMTRITON_MERGE_REQUESTS": "false", **env})


def _body(value: int, delay_ms: int = 0) -> bytes:
    request: dict = {"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "INT32", "data": [value]}]}
    if delay_ms:
        request["parameters"] = {"delay_ms": delay_ms}
    return json.dumps(request).encode()


def _post(server: ServeProcess, body: bytes, timeout: float) -> requests.Response:
    headers = {"Content-Type": "application/json"}
    return requests.post(f"{server.url}/invocations", data=body, headers=headers, timeout=timeout)


def _echoed(response: requests.Response, value: int) -> bool:
    return response.status_code == 200 and response.json()["outputs"][0]["data"] == [value]


def _sent_and_left_open(server: ServeProcess, body: bytes) -> socket.socket:
    """A request on a connection of its own whose answer is never read: closing it is its client leaving."""
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    head = (
        "POST /invocations HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    connection.sendall(head.encode() + body)
    return connection


def _kill_triton(server: ServeProcess) -> None:
    (pid,) = triton_pids(server.marker)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: _ping(server) == 503, 5)


def _ping(server: ServeProcess) -> int:
    return requests.get(f"{server.url}/ping", timeout=2).status_code


def _three_suspects_waiting_for_their_turn(server: ServeProcess) -> list[socket.socket]:
    """Three slow requests in flight when Triton is killed, so all three are sent again on probation
    once it serves again: one runs alone (3 s), the two others wait for their turn."""
    connections = [_sent_and_left_open(server, _body(7, delay_ms=3000)) for _ in range(3)]
    time.sleep(0.7)  # in one execution of the model (3 s each)
    _kill_triton(server)
    server.wait_healthy(60)
    time.sleep(1)  # the first suspect runs on probation; the others wait
    return connections


def _answered_when_in_flight_at_a_kill(server: ServeProcess) -> tuple[requests.Response | None, float]:
    """A new request in flight when Triton is killed (so it needs the turn on probation): its answer,
    or None when it had none within 25 s, and how long it took from the kill."""
    answer: list[requests.Response | None] = [None]

    def send() -> None:
        with contextlib.suppress(requests.Timeout):
            answer[0] = _post(server, _body(5, delay_ms=2000), timeout=25)

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(0.7)  # it runs (2 s)
    killed = time.monotonic()
    _kill_triton(server)
    sender.join(30)
    return answer[0], time.monotonic() - killed


def test_suspects_whose_clients_left_while_they_waited_for_probation_hold_nobody_up(tmp_path):
    """Their turns are given back as they leave: the next request sent again after a death has the turn
    as soon as Triton serves, not after their leases (30 s each)."""
    server = _poison_server(tmp_path, {"SAGEMAKER_MODEL_SERVER_WORKERS": "2"})
    connections: list[socket.socket] = []
    try:
        connections = _three_suspects_waiting_for_their_turn(server)
        for connection in connections:
            connection.close()  # every client leaves: the one on probation, and the two waiting
        answer, took = _answered_when_in_flight_at_a_kill(server)
        assert answer is not None, f"no answer within 25 s of the kill\n{server.log_tail()}"
        assert _echoed(answer, 5), answer.text
        assert took < 20, took
        log = server.log_text()
        assert log.count(DIED) == 2
        assert "held its turn for" not in log  # no turn ran out its lease
    finally:
        for connection in connections:
            connection.close()
        server.stop()


def test_suspects_whose_worker_died_while_they_waited_for_probation_hold_nobody_up(tmp_path):
    """One worker: it holds the turn on probation and two more wait for it when it is killed; the owner
    gives all three back with the worker, so the next request sent again goes as soon as Triton serves."""
    server = _poison_server(tmp_path, {"SAGEMAKER_MODEL_SERVER_WORKERS": "1"})
    connections: list[socket.socket] = []
    try:
        connections = _three_suspects_waiting_for_their_turn(server)
        (worker,) = worker_pids(server)
        os.kill(worker, signal.SIGKILL)
        assert wait_for(lambda: len(worker_pids(server)) == 1 and worker not in worker_pids(server), 30)
        server.wait_healthy(30)
        answer, took = _answered_when_in_flight_at_a_kill(server)
        assert answer is not None, f"no answer within 25 s of the kill\n{server.log_tail()}"
        assert _echoed(answer, 5), answer.text
        assert took < 20, took
        assert "held its turn for" not in server.log_text()
    finally:
        for connection in connections:
            connection.close()
        server.stop()


def test_a_restart_slower_than_the_lease_still_sends_the_suspects_again_one_at_a_time(tmp_path):
    """A poisoned request kills Triton with three honest ones in flight in the same execution; Triton
    takes seconds longer than the probation lease (1 s here) to come back. The four are sent again one
    at a time once it serves, each turn taken then: the poisoned one kills Triton alone and is 500, the
    honest ones are answered."""
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": "2", "SMTRITON_PROBATION_LEASE_S": "1"}
    server = _poison_server(tmp_path, env, initialize_s=4)
    try:
        with ThreadPoolExecutor(5) as pool:
            blocker = pool.submit(_post, server, _body(1, delay_ms=1500), 120)
            time.sleep(0.5)  # it runs; the next four wait behind it for one execution together
            poisoned = pool.submit(_post, server, _body(666), 120)
            honest = [pool.submit(_post, server, _body(7), 120) for _ in range(3)]
            assert _echoed(blocker.result(), 1)
            answers = [future.result() for future in honest]
            assert [answer.status_code for answer in answers] == [200] * 3, [answer.text for answer in answers]
            assert all(_echoed(answer, 7) for answer in answers)
            assert poisoned.result().status_code == 500, poisoned.result().text
            assert "Triton died twice in a row while running this request" in poisoned.result().json()["error"]
        log = server.log_text()
        assert log.count(DIED) == 2  # the poisoned request sent twice, never a third time
        assert log.count("in flight at two Triton deaths in a row") == 1
        server.wait_healthy(60)
        assert _echoed(_post(server, _body(7), 30), 7)
    finally:
        server.stop()


def _value(value: float, **parameters: object) -> bytes:
    request: dict = {"inputs": [{"name": "VALUE", "shape": [1, 1], "datatype": "FP32", "data": [value]}]}
    request["parameters"] = parameters
    return json.dumps(request).encode()


def test_a_request_of_its_own_sequence_is_never_sent_again_after_a_triton_death(tmp_path):
    """A request that sets ``sequence_id`` itself is not stateless: in flight when Triton dies, it is
    503 saying its sequence was lost (the next Triton knows nothing of it); one that meets Triton down is
    503 at once, not held for the next Triton. The client starts its sequence again once Triton serves."""
    repo = tmp_path / "models"
    shutil.copytree(SEQUENCE_MODELS / "accumulate", repo / "accumulate")
    server = start_serve(tmp_path, repo, "accumulate", env={"SAGEMAKER_MODEL_SERVER_WORKERS": "2"})
    try:
        assert _post(server, _value(2.0, sequence_id=77, sequence_start=True), 30).status_code == 200
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(_post, server, _value(3.0, sequence_id=77, delay_ms=3000), 60)
            time.sleep(1)  # it runs (3 s)
            _kill_triton(server)
            started = time.monotonic()
            down = _post(server, _value(4.0, sequence_id=77), 60)
            assert time.monotonic() - started < 2, down.text
            assert down.status_code == 503, down.text
            assert "sequence" in down.json()["error"], down.text
            lost = in_flight.result()
            assert lost.status_code == 503, lost.text
            assert "sequence" in lost.json()["error"], lost.text
            assert "not sent again" in lost.json()["error"], lost.text
        server.wait_healthy(60)
        assert server.log_text().count(DIED) == 1
        again = _post(server, _value(6.0, sequence_id=77, sequence_start=True), 30)
        assert again.status_code == 200, again.text
        assert again.json()["outputs"][0]["data"] == [6.0]
    finally:
        server.stop()
