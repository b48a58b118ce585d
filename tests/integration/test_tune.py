"""`smtriton tune` against the real serve and Triton: a short budgeted search on the addsub Python model
through the command line; every trial's raw figures kept, the winning config written through the
protobuf and differing from the baseline only in the knobs the search kept, the report naming the winner
and why, and a rerun that resumes without serving anything again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smtriton import model_config
from smtriton.serve.host.gpu import gpu_models
from smtriton.tune.knobs import apply, knobs_for
from tests.integration.conftest import TEST_MODELS

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
# Short steps keep the test quick on two cores; the budget is loose so every trial scores.
TUNE_ARGS = ["--p99-ms", "500", "--max-trials", "3", "--concurrency", "1,8", "--warmup", "0.5", "--duration", "1"]


def tune(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """The tune command as a user runs it, in a child bounded in time (run() kills it on timeout)."""
    code = "from smtriton.cli import main; main()"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SAGEMAKER_", "SMTRITON_"))}
    return subprocess.run(
        [sys.executable, "-c", code, "tune", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


def trials(work: Path) -> list[dict]:
    return [json.loads(line) for line in (work / "trials.jsonl").read_text().splitlines()]


def test_a_budgeted_search_writes_the_winner_and_resumes(test_repository: Path, tmp_path: Path):
    model = test_repository / "addsub"
    work, out = tmp_path / "work", tmp_path / "out"
    first = tune(str(model), "--work-dir", str(work), "--output", str(out), *TUNE_ARGS)
    assert first.returncode == 0, first.stderr
    print(first.stderr)  # the table and the winner, for the log

    records = trials(work)
    report = json.loads((work / "report.json").read_text())
    assert len(report["trials"]) == 3  # the budget: the baseline and two candidates
    assert records[0]["changes"] == {}  # the baseline first
    # a line per serve run (the re-measurements included when a change won the search, whether or not
    # its gain held when measured again: the baseline and the winner twice each), each with every step's
    # raw figures
    remeasured = report["confirmation"] is not None
    if remeasured:
        assert [len(scores) for scores in report["confirmation"]] == [3, 3]
    assert len(records) == 3 + (4 if remeasured else 0)
    if not remeasured or not report["confirmed"]:
        assert report["changes"] == {}  # no winner, or one whose gain did not hold: the baseline stays
    for record in records:
        assert record["error"] is None
        assert [s["load"] for s in record["steps"]] == [1, 8]
        for s in record["steps"]:
            assert s["ok"] > 0
            assert s["sent_total"] >= s["requests"] > 0
            assert 0 < s["latency_ms"]["p50"] <= s["latency_ms"]["p99"]
        assert model_config.parse(record["config"]).name == "addsub"

    # the written config parses, and is the baseline with exactly the winner's changes
    baseline = model_config.read(model)
    written = model_config.read(out)
    knobs = knobs_for(baseline, gpu=bool(gpu_models()))  # the knobs tune offered on this host
    assert written == apply(baseline, report["changes"], knobs)
    for knob in knobs:
        if knob.name not in report["changes"]:
            assert knob.read(written) == knob.read(baseline), knob.name
    assert list(written.input) == list(baseline.input)
    assert model_config.read(work) == written

    # the report names the winner and why: its throughput under the budget against the baseline's
    assert "winner: " in first.stderr
    assert "p99 <= 500 ms" in first.stderr
    assert report["summary"].startswith("winner: ")
    assert next(t["verdict"] for t in report["trials"]).startswith("baseline")
    assert all(t["verdict"] for t in report["trials"])
    assert (work / "chart.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "t0 c=" in (work / "chart.html").read_text()

    # a rerun measures nothing again and comes to the same answer
    again = tune(str(model), "--work-dir", str(work), *TUNE_ARGS)
    assert again.returncode == 0, again.stderr
    assert trials(work) == records
    assert "serving and measuring" not in again.stderr
    assert again.stderr.count("resumed from") == len(records)
    assert json.loads((work / "report.json").read_text())["changes"] == report["changes"]
    assert model_config.parse(again.stdout) == written  # without --output, the config is printed


def test_a_work_dir_refuses_a_run_under_another_load(test_repository: Path, tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "settings.json").write_text(json.dumps({"duration": 99}))
    result = tune(str(test_repository / "addsub"), "--work-dir", str(work), *TUNE_ARGS, timeout=60)
    assert result.returncode == 2
    assert "measured with other settings" in result.stderr


def test_a_model_triton_cannot_load_fails_its_trial_at_once_and_is_tried_again_on_resume(tmp_path: Path):
    """serve stays up answering /ping 503 when its model fails to load; the trial ends on Triton's own
    reason instead of waiting out the start timeout, and a rerun tries it again (it may be fixed)."""
    model = tmp_path / "models" / "addsub"
    shutil.copytree(TEST_MODELS / "addsub", model, ignore=shutil.ignore_patterns("__pycache__"))
    (model / "1" / "model.py").write_text(
        "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('broken weights file')\n"
    )
    work = tmp_path / "work"
    args = (str(model), "--work-dir", str(work), *TUNE_ARGS[:2], "--max-trials", "1")
    started = time.monotonic()
    first = tune(*args, timeout=120)
    assert time.monotonic() - started < 90  # the start timeout alone is 180 s
    assert first.returncode == 1, first.stderr
    assert "no trial had a step within the budget" in first.stderr
    [record] = trials(work)
    assert record["error"].startswith("Triton failed to load 'addsub' version 1:")
    assert "broken weights file" in record["error"]

    again = tune(*args, timeout=120)
    assert again.returncode == 1
    assert "failed before (Triton failed to load 'addsub'" in again.stderr
    assert len(trials(work)) == 2  # measured again, in a trial folder of its own
    assert sorted(p.name for p in (work / "trials").iterdir()) == ["0", "1"]
