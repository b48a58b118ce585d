"""`smtriton capture decode` on capture files made here from real bodies: requests of all three kinds a
SageMaker client sends (JSON, JSON as application/octet-stream, binary+json made with tritonclient)
sent to the real serve + Triton (the addsub model), and its answers, written into SageMaker's capture
format as data capture writes them (JSON text for application/json, base64 for the rest), plus a
corrupt record."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import requests
from typer.testing import CliRunner

from smtriton.aws.invoke import encode_request
from smtriton.cli import app
from tests.integration.conftest import start_serve

pytestmark = pytest.mark.integration

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 7, dtype=np.int32)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, test_repository: Path):
    proc = start_serve(tmp_path_factory.mktemp("capture"), test_repository, "addsub")
    yield proc
    proc.stop()


def side(mode: str, content_type: str, body: bytes) -> dict[str, str]:
    """One side of a record as SageMaker's data capture writes it (JSON types as text, else base64)."""
    if content_type == "application/json":
        return {"observedContentType": content_type, "mode": mode, "data": body.decode(), "encoding": "JSON"}
    return {"observedContentType": content_type, "mode": mode, "data": base64.b64encode(body).decode(),
            "encoding": "BASE64"}  # fmt: skip


def record(event: str, request: tuple[str, bytes], response: tuple[str, bytes]) -> str:
    return json.dumps({
        "captureData": {"endpointInput": side("INPUT", *request), "endpointOutput": side("OUTPUT", *response)},
        "eventMetadata": {"eventId": event, "inferenceTime": "2026-01-01T00:00:00Z"},
        "eventVersion": "0",
    })  # fmt: skip


def invoked(server, content_type: str, body: bytes) -> tuple[str, bytes]:
    answer = requests.post(f"{server.url}/invocations", data=body, headers={"Content-Type": content_type}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.headers["Content-Type"], answer.content


def test_every_kind_of_captured_body_is_decoded_and_a_corrupt_record_named(server, tmp_path: Path):
    json_body, json_type = encode_request({"INPUT0": A, "INPUT1": B}, binary=False)
    binary_body, binary_type = encode_request({"INPUT0": A, "INPUT1": B}, binary=True)
    assert binary_type.startswith("application/vnd.sagemaker-triton.binary+json;json-header-size=")
    kinds = {
        "json": (json_type, json_body),
        "octet-stream": ("application/octet-stream", json_body),
        "binary": (binary_type, binary_body),
    }
    lines = [record(event, request, invoked(server, *request)) for event, request in kinds.items()]
    binary_answer = invoked(server, binary_type, binary_body)
    assert binary_answer[0].startswith("application/vnd.sagemaker-triton.binary+json")  # captured as base64 too
    cut = (binary_answer[0], binary_answer[1][:-8])  # the last 8 bytes of OUTPUT1 lost
    lines.insert(1, record("corrupt", (binary_type, binary_body), cut))
    capture = tmp_path / "capture" / "2026" / "01" / "01" / "00"
    capture.mkdir(parents=True)
    (capture / "part-0.jsonl").write_text("\n".join(lines) + "\n")

    out = tmp_path / "tensors"
    result = CliRunner().invoke(app, ["capture", "decode", str(tmp_path / "capture"), "--output", str(out)])
    assert result.exit_code == 1
    assert "event corrupt: output: the binary part holds 120 bytes, the header describes 128" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "error: 1 of 4 records could not be decoded (named above)"
    decoded = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["eventId"] for r in decoded] == ["json", "octet-stream", "binary"]  # the rest went on
    for r in decoded:
        assert r["inferenceTime"] == "2026-01-01T00:00:00Z"
        assert r["output"]["model_name"] == "addsub"
        tensors = {t["name"]: t for side in ("input", "output") for t in r[side]["tensors"]}
        assert {n: (t["datatype"], t["shape"]) for n, t in tensors.items()} == dict.fromkeys(
            ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1"), ("INT32", [1, 16])
        )
        folder = out / r["eventId"]
        np.testing.assert_array_equal(np.load(folder / "input" / "INPUT0.npy"), A)
        np.testing.assert_array_equal(np.load(folder / "input" / "INPUT1.npy"), B)
        np.testing.assert_array_equal(np.load(folder / "output" / "OUTPUT0.npy"), A + B)
        np.testing.assert_array_equal(np.load(folder / "output" / "OUTPUT1.npy"), A - B)
        assert tensors["OUTPUT0"]["file"] == f"{r['eventId']}/output/OUTPUT0.npy"
    assert decoded[2]["input"]["content_type"] == binary_type

    inline = CliRunner().invoke(app, ["capture", "decode", str(capture / "part-0.jsonl")])
    first = json.loads(inline.stdout.splitlines()[0])
    (output0,) = [t for t in first["output"]["tensors"] if t["name"] == "OUTPUT0"]
    assert output0["data"] == (A + B).tolist()
