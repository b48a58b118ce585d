"""Decoding captured bodies: every Triton data type in binary+json (tritonclient-made), capture files
under an S3 prefix (moto), and the ways a record can be broken, each named by its event id."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from smtriton.aws.capture import CaptureError, decode_body, decode_record, record_json
from smtriton.aws.invoke import encode_request
from smtriton.cli import app
from tests.unit.aws_stubs import moto_credentials


def captured(event: str, content_type: str, body: bytes, encoding: str = "BASE64") -> str:
    data = base64.b64encode(body).decode() if encoding == "BASE64" else body.decode()
    side = {"observedContentType": content_type, "mode": "INPUT", "data": data, "encoding": encoding}
    return json.dumps(
        {"captureData": {"endpointInput": side}, "eventMetadata": {"eventId": event}, "eventVersion": "0"}
    )


def test_binary_tensors_of_every_kind_come_back_as_sent():
    import ml_dtypes

    sent = {
        "text": np.array([["über", "ok"]], dtype=object),
        "half": np.array([[0.5, -2.0]], dtype=np.float16),
        "wide": np.array([[2**40, 3]], dtype=np.uint64),
        "flag": np.array([[True, False]]),
        "bf16": np.array([[1.5, -0.25]], dtype=ml_dtypes.bfloat16),
    }
    body, content_type = encode_request(sent, binary=True, outputs=["y"])
    decoded = decode_body(body, content_type)
    got = {t.name: t for t in decoded.tensors}
    assert [t.datatype for t in decoded.tensors] == ["BYTES", "FP16", "UINT64", "BOOL", "BF16"]
    assert got["text"].to_json()["data"] == [["über", "ok"]]
    np.testing.assert_array_equal(got["half"].array, sent["half"])
    np.testing.assert_array_equal(got["wide"].array, sent["wide"])
    np.testing.assert_array_equal(got["flag"].array, sent["flag"])
    np.testing.assert_array_equal(got["bf16"].array, sent["bf16"].astype(np.float32))
    assert decoded.to_json()["outputs"] == [{"name": "y", "parameters": {"binary_data": True}}]  # asked, not a tensor


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (captured("e1", "application/json", b"{not json", "JSON"), "event e1: input: application/json: not a KServe"),
        (
            captured("e2", "application/vnd.sagemaker-triton.binary+json", b"{}"),
            "event e2: input: .* no json-header-size",
        ),
        (
            captured("e6", "application/vnd.sagemaker-triton.binary+json;json-header-size=-2", b"{}"),
            "event e6: input: .* json-header-size '-2' is not a size in bytes",
        ),
        (
            json.dumps(
                {
                    "captureData": {"endpointInput": {"data": "%%%", "encoding": "BASE64"}},
                    "eventMetadata": {"eventId": "e3"},
                }
            ),
            "event e3: input: data is not valid base64",
        ),
        (
            captured(
                "e4",
                "application/json",
                b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1, 2]}]}',
                "JSON",
            ),
            "event e4: input: tensor 'x'",
        ),
        (
            captured(
                "e5",
                "application/json",
                b'{"inputs": [{"name": "x", "datatype": "FP99", "shape": [1], "data": [1]}]}',
                "JSON",
            ),
            "'FP99' is not a Triton data type",
        ),
        ('{"not": "a capture"}', "not a SageMaker capture record"),
    ],
)
def test_a_broken_record_is_named(line, message):
    with pytest.raises(CaptureError, match=message):
        decode_record(line)


def test_capture_files_under_an_s3_prefix(tmp_path, monkeypatch):
    import boto3
    import moto

    moto_credentials(monkeypatch)
    body, content_type = encode_request({"x": np.arange(3, dtype=np.int64).reshape(1, 3)}, binary=True)
    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="capture")
        for hour, event in (("00", "a"), ("01", "b")):
            key = f"demo/AllTraffic/2026/01/01/{hour}/part.jsonl"
            s3.put_object(Bucket="capture", Key=key, Body=captured(event, content_type, body) + "\n")
        s3.put_object(Bucket="capture", Key="demo/AllTraffic/notes.txt", Body=b"not capture data")
        result = CliRunner().invoke(app, ["capture", "decode", "s3://capture/demo/", "--region", "us-east-1"])
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["eventId"] for r in records] == ["a", "b"]
    assert records[0]["input"]["tensors"] == [{"name": "x", "datatype": "INT64", "shape": [1, 3], "data": [[0, 1, 2]]}]
    assert "2 records decoded" in result.stderr


def test_tensor_files_are_plain_npy_even_for_strings(tmp_path):
    body, content_type = encode_request({"text/in": np.array([["a", "bc"]], dtype=object)}, binary=True)
    record = decode_record(captured("ev:1", content_type, body))
    (tensor,) = record_json(record, tmp_path)["input"]["tensors"]
    assert tensor == {"name": "text/in", "datatype": "BYTES", "shape": [1, 2], "file": "ev_1/input/text_in.npy"}
    np.testing.assert_array_equal(np.load(tmp_path / tensor["file"], allow_pickle=False), [[b"a", b"bc"]])


def test_a_missing_file_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(app, ["capture", "decode", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 2
    assert "does not exist" in result.stderr
