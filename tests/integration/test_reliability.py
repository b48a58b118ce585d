"""Shutdown under load, hostile input, and what must never be exposed (docs/contract.md §1.7, docs/design.md §7)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.conftest import TEST_MODELS, start_serve
from tests.integration.contract_client import BJ
from tests.integration.harness import ClientsUntilStopped, ServeProcess, failing_tritonserver, triton_pids, wait_for

pytestmark = pytest.mark.integration


def test_sigterm_under_load_finishes_every_accepted_request(tmp_path, test_repository):
    server = start_serve(tmp_path, test_repository, "slow")
    clients = ClientsUntilStopped(server.url, second=1.5)
    try:
        clients.start()
        time.sleep(1.5)
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        code = server.wait(40)
        elapsed = time.monotonic() - started
        clients.stop()
        assert code == 0
        assert elapsed < 30
        assert clients.results.count("ok") >= 8
        assert clients.failures() == []
        assert triton_pids(server.marker) == []
    finally:
        clients.stop()
        server.stop()


def test_triton_listens_on_loopback_only(addsub_server):
    (pid,) = triton_pids(addsub_server.marker)
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"--http-address=127.0.0.1" in cmdline
    assert b"--grpc-address=127.0.0.1" in cmdline
    assert b"--allow-metrics=false" in cmdline
    assert b"--allow-sagemaker=false" in cmdline
    ports = {int(a.split(b"=")[1]) for a in cmdline if a.startswith((b"--http-port=", b"--grpc-port="))}
    assert len(ports) == 2
    listening: dict[int, list[str]] = {port: [] for port in ports}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.rsplit(":", 1)
            if state == "0A" and int(port_hex, 16) in ports:  # 0A = LISTEN
                listening[int(port_hex, 16)].append(address)
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, as IPv4 or IPv4-mapped IPv6
    for port, addresses in listening.items():
        assert addresses, port
        assert set(addresses) <= loopback, (port, addresses)  # nothing on 0.0.0.0 or ::


def _triton_args(server: ServeProcess) -> dict[str, str]:
    """The flags of the server's tritonserver, as any process of this PID namespace reads them."""
    (pid,) = triton_pids(server.marker)
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return dict(arg.split("=", 1) for arg in args if arg.startswith("--") and "=" in arg)


def test_tritons_control_apis_answer_serve_alone(addsub_server, tmp_path):
    """Another process on the host's loopback cannot load a model into Triton (a Python model sent in
    the request, whose import writes a file), read a config or map shared memory, over HTTP or gRPC;
    serve still loads, serves and reads configs; the value that opens them is never logged."""
    import base64

    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    from smtriton.serve.triton.access import HEADER

    args = _triton_args(addsub_server)
    triton = f"http://127.0.0.1:{args['--http-port']}"
    written = tmp_path / "evil-ran"
    config = {
        "backend": "python",
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    model = f"open({str(written)!r}, 'w').write('ran')\nclass TritonPythonModel:\n    pass\n"
    body = {"parameters": {"config": json.dumps(config), "file:1/model.py": base64.b64encode(model.encode()).decode()}}
    load = requests.post(f"{triton}/v2/repository/models/evil/load", json=body, timeout=60)
    assert load.status_code == 403, load.text
    for method, path in (
        ("POST", "/v2/repository/index"),
        ("POST", "/v2/repository/models/addsub/unload"),
        ("GET", "/v2/models/addsub/config"),
        ("GET", "/v2/systemsharedmemory/status"),
        ("POST", "/v2/systemsharedmemory/region/r/register"),
        ("POST", "/v2/logging"),
        ("POST", "/v2/trace/setting"),
    ):
        assert requests.request(method, f"{triton}{path}", data=b"{}", timeout=10).status_code == 403, path
    with grpc.insecure_channel(f"127.0.0.1:{args['--grpc-port']}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError, match="restricted"):
            stub.RepositoryModelLoad(service_pb2.RepositoryModelLoadRequest(model_name="evil"), timeout=30)
        with pytest.raises(grpc.RpcError, match="restricted"):
            stub.ModelConfig(service_pb2.ModelConfigRequest(name="addsub"), timeout=10)
    assert not written.exists()
    assert requests.get(f"{triton}/v2/models/evil/ready", timeout=5).status_code != 200
    ok = {
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))} for n in ("INPUT0", "INPUT1")
        ]
    }
    assert requests.post(f"{addsub_server.url}/invocations", json=ok, timeout=10).status_code == 200
    (key,) = [value.rsplit(f"{HEADER}=", 1)[1] for name, value in args.items() if name == "--http-restricted-api"]
    assert len(key) >= 32
    assert key not in addsub_server.log_text()


def test_request_bodies_never_reach_the_logs(addsub_server):
    marker = "zq-body-marker-7741"
    good = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
        ],
        "id": marker,
    }
    requests.post(f"{addsub_server.url}/invocations", json=good, timeout=10)
    requests.post(f"{addsub_server.url}/invocations", data=f'{{"{marker}": [', timeout=10)
    last = {"Content-Type": BJ, "X-Amzn-SageMaker-Inference-Id": "bodies-done"}
    requests.post(f"{addsub_server.url}/invocations", data=marker.encode() * 10, headers=last, timeout=10)
    deadline = time.monotonic() + 10  # the last failure's log line is written: everything before it too
    while '"bodies-done"' not in addsub_server.log_text():
        assert time.monotonic() < deadline, "the failed request was never logged"
        time.sleep(0.05)
    assert marker not in addsub_server.log_text()


_content_types = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "application/json",
            "application/octet-stream",
            "text/csv",
            "application/jsonlines",
            BJ,
            f"{BJ};json-header-size=",
        ]
    ),
    st.builds(lambda n: f"{BJ};json-header-size={n}", st.integers(-(10**12), 10**12)),
    st.builds(lambda s: f"{BJ};json-header-size={s}", st.text(max_size=12)),
    st.text(max_size=60).filter(lambda s: "\n" not in s and "\r" not in s),
)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)
_bodies = st.one_of(
    st.binary(max_size=512),
    _json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(
        lambda name, shape, dtype, data: json.dumps(
            {"inputs": [{"name": name, "shape": shape, "datatype": dtype, "data": data}]}
        ).encode(),
        st.sampled_from(["INPUT0", "INPUT1", "x", ""]),
        st.lists(st.integers(-2, 20), max_size=3),
        st.sampled_from(["INT32", "FP32", "BYTES", "BOOL", "nope"]),
        st.lists(st.integers(-5, 5) | st.text(max_size=3), max_size=20),
    ),
    st.just(b"[" * 3000 + b"]" * 3000),  # deeply nested
)


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(body=_bodies, content_type=_content_types, route=st.sampled_from(["/invocations", "/models/x/invoke"]))
def test_fuzzed_requests_never_get_a_5xx(addsub_server, body, content_type, route):
    # Raw UTF-8 bytes: headers with non-Latin-1 text must reach the server too, not fail in the client.
    headers = {"Content-Type": content_type.encode()} if content_type is not None else {}
    try:
        r = requests.post(f"{addsub_server.url}{route}", data=body, headers=headers, timeout=10)
    except requests.exceptions.InvalidHeader:
        return  # the client library refuses to send it; nothing reached the server
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code != 200:
        if r.content == b"Invalid HTTP request received.":
            assert r.status_code == 400  # refused by the HTTP parser (e.g. control bytes in a header)
        else:
            assert "error" in r.json()


def test_server_is_healthy_after_the_fuzzing(addsub_server):
    assert requests.get(f"{addsub_server.url}/ping", timeout=5).status_code == 200


def test_triton_killed_under_load_fails_fast_restarts_and_serves_again_when_waiting_is_off(tmp_path, test_repository):
    """With SMTRITON_WAIT_FOR_TRITON=false a Triton death is 503s while it restarts (by default requests
    wait instead: tests/integration/test_faults.py)."""
    repo = tmp_path / "models"  # a path of its own: the Triton to kill is the one serving it
    shutil.copytree(test_repository, repo)
    server = start_serve(tmp_path, repo, "slow", env={"SMTRITON_WAIT_FOR_TRITON": "false"})
    outcomes: list[tuple[float, int]] = []
    stop = threading.Event()
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]})

    def client() -> None:
        while not stop.is_set():
            try:
                r = requests.post(f"{server.url}/invocations", data=body, timeout=30)
                outcomes.append((time.monotonic(), r.status_code))
            except requests.ConnectionError:
                outcomes.append((time.monotonic(), -1))

    threads = [threading.Thread(target=client) for _ in range(6)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.0)
        (pid,) = triton_pids(server.marker)
        killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        while requests.get(f"{server.url}/ping", timeout=2).status_code == 200:
            assert time.monotonic() - killed_at < 1.0, "/ping still 200 a second after Triton died"
            time.sleep(0.02)
        server.wait_healthy(120)
        recovered_at = time.monotonic()
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(30)
        during = [code for at, code in outcomes if killed_at <= at < recovered_at]
        after = [code for at, code in outcomes if at >= recovered_at + 0.5]
        assert set(during) <= {200, 503}, during  # failed fast and clean, never a hang or a 500
        assert 503 in during
        assert after
        assert set(after) == {200}
        assert "tritonserver exited unexpectedly" in server.log_text()
    finally:
        stop.set()
        server.stop()


def test_a_triton_that_dies_at_start_backs_off_and_ping_fails(tmp_path, test_repository):
    fake = failing_tritonserver(tmp_path)
    repo = tmp_path / "models"  # a path of its own: stop() kills every Triton serving its repository
    shutil.copytree(test_repository, repo)
    server = ServeProcess(repo, "addsub", tmp_path / "serve.log", env={"TRITONSERVER": str(fake)})
    try:
        deadline = time.monotonic() + 30
        while len(re.findall(r"failed to start: .*; retrying in (\d+) s", server.log_text())) < 3:
            assert time.monotonic() < deadline, server.log_text()[-2000:]
            assert server.poll() is None
            time.sleep(0.2)
        assert requests.get(f"{server.url}/ping", timeout=2).status_code == 503
        delays = [int(d) for d in re.findall(r"failed to start: .*; retrying in (\d+) s", server.log_text())]
        assert delays[:3] == [1, 2, 4], delays  # each failed start waits twice as long: no busy loop
        assert server.poll() is None
    finally:
        server.stop()


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(
    name=st.text(min_size=1, max_size=40),
    # The HTTP client itself refuses CR, LF and NUL in a header (an injection attempt never leaves it).
    target=st.text(max_size=40).map(lambda t: "".join(c for c in t if c not in "\r\n\0").strip()),
)
def test_fuzzed_model_names_and_target_headers_never_get_a_5xx(addsub_server, name, target):
    from urllib.parse import quote

    headers = {"X-Amzn-SageMaker-Target-Model": target.encode()}
    for method, path in (("POST", f"/models/{quote(name, safe='')}/invoke"), ("GET", f"/models/{quote(name)}")):
        r = requests.request(method, f"{addsub_server.url}{path}", data=b"{}", headers=headers, timeout=10)
        assert r.status_code < 500, (r.status_code, r.text[:200])
        assert r.headers["content-type"] in ("application/json", "text/plain; charset=utf-8") or r.status_code == 200


def test_oversized_headers_are_431(addsub_server):
    r = requests.post(f"{addsub_server.url}/invocations", data=b"{}", headers={"X-Big": "x" * 70_000}, timeout=10)
    assert r.status_code == 431
    assert "headers are larger" in r.json()["error"]
    assert requests.get(f"{addsub_server.url}/ping", timeout=5).status_code == 200


def test_triton_killed_again_while_it_comes_back_restarts_and_keeps_the_models(tmp_path):
    """Killed, then killed again while it starts and the models are being restored: every start that
    fails is retried with back-off, and no model is lost on the way."""
    root = tmp_path / "models"
    shutil.copytree(TEST_MODELS / "addsub", root / "kept" / "model")
    server = start_serve(tmp_path, None, None, args=["--multi-model", "--model-root", str(root)])
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
            ]
        }
    )
    try:
        load = {"model_name": "kept", "url": str(root / "kept" / "model")}
        assert requests.post(f"{server.url}/models", json=load, timeout=120).status_code == 200
        (first,) = triton_pids(server.marker)
        killed = [first]
        os.kill(first, signal.SIGKILL)
        for _ in range(2):  # then each Triton that comes back, as soon as it is restoring the model
            restores = server.log_text().count("loading: kept:1")  # Triton's line as it begins a load
            deadline = time.monotonic() + 60
            while not (pids := [p for p in triton_pids(server.marker) if p not in killed]):
                assert time.monotonic() < deadline, "no new Triton was started"
                time.sleep(0.02)
            assert wait_for(lambda restores=restores: server.log_text().count("loading: kept:1") > restores, 60)
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])
        server.wait_healthy(180)
        assert (
            server.log_text().count("tritonserver failed to start")
            + server.log_text().count("tritonserver exited unexpectedly")
            >= 3
        )
        r = requests.post(f"{server.url}/models/kept/invoke", data=body, timeout=60)
        assert r.status_code == 200, r.text
        assert [m["modelName"] for m in requests.get(f"{server.url}/models", timeout=5).json()["models"]] == ["kept"]
    finally:
        server.stop()
