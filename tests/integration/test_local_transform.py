"""`smtriton local-transform` against the real serve and Triton: a job with no BatchStrategy (the
container's MULTI_RECORD answer), one with MultiRecord and one with SingleRecord give the same output, a
line per input line, on records that differ in length (not all can merge) and on records that all can;
CSV rows too; a job that starts its own serve from a model repository; and one against a serve writing
error lines, whose report counts them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from smtriton.cli import app
from tests.integration.conftest import start_serve

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def container(tmp_path_factory, test_repository):
    server = start_serve(tmp_path_factory.mktemp("container"), test_repository, "rows", env={"SAGEMAKER_BATCH": "true"})
    yield server
    server.stop()


def row(values: list[float]) -> dict:
    return {"name": "INPUT0", "shape": [1, len(values)], "datatype": "FP32", "data": values}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """A job's input prefix: JSON Lines of rows of differing lengths, of equal lengths, in a sub-folder."""
    folder = tmp_path_factory.mktemp("in")
    rng = np.random.default_rng(3)
    for name, sizes in (("mixed.jsonl", rng.integers(1, 7, 300)), ("sub/equal.jsonl", np.full(200, 5))):
        lines = [json.dumps({"inputs": [row(rng.normal(size=int(n)).round(4).tolist())]}) for n in sizes]
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


LINES = ("--content-type", "application/jsonlines", "--split-type", "Line")  # not the defaults: SageMaker's None


def transform(*args: object) -> str:
    result = CliRunner().invoke(app, ["local-transform", *map(str, args), *LINES])
    assert result.exit_code == 0, result.output
    return result.stderr


def outputs(folder: Path) -> dict[str, list[dict]]:
    return {
        str(path.relative_to(folder)): [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted(folder.rglob("*.out"))
    }


def test_multi_record_single_record_and_the_containers_default_give_the_same_lines(container, inputs, tmp_path):
    said = transform(inputs, tmp_path / "default", "--endpoint-url", container.url)
    assert "MultiRecord, MaxPayloadInMB 6 MB, MaxConcurrentTransforms 1" in said  # the container's answer
    assert "500 records in 2 requests" in said
    transform(inputs, tmp_path / "multi", "--endpoint-url", container.url, "--batch-strategy", "MultiRecord",
              "--max-payload-mb", "1", "--max-concurrent", "2")  # fmt: skip
    said = transform(inputs, tmp_path / "single", "--endpoint-url", container.url, "--batch-strategy", "SingleRecord",
                     "--max-concurrent", "4")  # fmt: skip
    assert "500 records in 500 requests" in said
    single = outputs(tmp_path / "single")
    assert list(single) == ["mixed.jsonl.out", "sub/equal.jsonl.out"]
    assert [len(lines) for lines in single.values()] == [300, 200]
    assert outputs(tmp_path / "default") == single
    assert outputs(tmp_path / "multi") == single
    first_in = json.loads((inputs / "mixed.jsonl").read_text().splitlines()[0])["inputs"][0]["data"]
    assert single["mixed.jsonl.out"][0]["outputs"][0]["data"] == pytest.approx([2 * v for v in first_in])


def test_csv_rows_through_a_job(container, tmp_path):
    rows = np.arange(90, dtype=np.float32).reshape(30, 3)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "rows.csv").write_text("".join(",".join(f"{v:g}" for v in row) + "\n" for row in rows))
    args = ["local-transform", str(tmp_path / "in"), str(tmp_path / "out"), "--endpoint-url", container.url,
            "--content-type", "text/csv", "--split-type", "Line"]  # fmt: skip
    assert CliRunner().invoke(app, args).exit_code == 0
    got = np.loadtxt(tmp_path / "out" / "rows.csv.out", delimiter=",", ndmin=2)
    np.testing.assert_allclose(got, np.concatenate([rows * 2, rows.sum(axis=1, keepdims=True)], axis=1))


def test_a_job_that_starts_its_own_serve_and_one_that_fails_a_record(test_repository, inputs, tmp_path):
    said = transform(inputs / "sub", tmp_path / "out", "--model-data", test_repository, "--default-model", "rows",
                     "--batch-strategy", "MultiRecord")  # fmt: skip
    assert "200 records in 1 requests" in said
    assert len((tmp_path / "out" / "equal.jsonl.out").read_text().splitlines()) == 200
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "a.jsonl").write_text((inputs / "sub" / "equal.jsonl").read_text() + '{"inputs": []}\n')
    args = ["local-transform", str(tmp_path / "bad"), str(tmp_path / "bad-out"), "--model-data", str(test_repository),
            "--default-model", "rows", *LINES]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    assert "failed: a.jsonl: line 201 (its request: lines 1-201): 400 " in result.stderr
    assert "error: 201 of 201 records failed, in 1 of 1 files" in result.stderr
    assert not (tmp_path / "bad-out" / "a.jsonl.out").exists()


def test_error_lines_and_a_body_serve_cannot_parse_in_the_report(test_repository, inputs, tmp_path):
    """serve writing error lines (SMTRITON_FAILED_RECORD=error-line): the job's output keeps them, and
    the report counts them as failed records, each named by its line in the file; a JSON body serve
    cannot parse is said without the list of every body serve takes."""
    env = {"SAGEMAKER_BATCH": "true", "SMTRITON_FAILED_RECORD": "error-line"}
    (tmp_path / "serve").mkdir()
    server = start_serve(tmp_path / "serve", test_repository, "rows", env=env)
    try:
        lines = (inputs / "sub" / "equal.jsonl").read_text().splitlines()
        lines[150] = '{"inputs": []}'
        (tmp_path / "in").mkdir()
        (tmp_path / "in" / "a.jsonl").write_text("\n".join(lines) + "\n")
        result = CliRunner().invoke(app, ["local-transform", str(tmp_path / "in"), str(tmp_path / "out"),
                                          "--endpoint-url", server.url, *LINES])  # fmt: skip
        assert result.exit_code == 1
        assert "failed: a.jsonl: line 151: error line: " in result.stderr
        assert "; 1 failed (1 answered with an error line)" in result.stderr
        assert len((tmp_path / "out" / "a.jsonl.out").read_text().splitlines()) == 200
        (tmp_path / "json").mkdir()
        (tmp_path / "json" / "a.json").write_text("{broken")
        result = CliRunner().invoke(app, ["local-transform", str(tmp_path / "json"), str(tmp_path / "json-out"),
                                          "--endpoint-url", server.url])  # fmt: skip
        assert result.exit_code == 1
        assert "failed: a.json: line 1: 400 failed to parse the request JSON buffer" in result.stderr
        assert "(sent as application/json)" in result.stderr
        assert "serve takes" not in result.stderr
    finally:
        server.stop()
