"""`smtriton tune`'s statistics and decisions, with made-up measurements: the score under a budget, the
store that makes a run resumable, and coordinate descent's keep-or-not rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from smtriton.errors import ToolUsageError
from smtriton.model_config import parse
from smtriton.tune.knobs import key, knobs_for
from smtriton.tune.search import TrialStore, confirm, coordinate_descent, record_key, score

ONNX = """
name: "m" platform: "onnxruntime_onnx" max_batch_size: 8
input { name: "x" data_type: TYPE_FP32 dims: 4 }
output { name: "y" data_type: TYPE_FP32 dims: 4 }
instance_group { count: 1 kind: KIND_CPU }
"""


def step(load: int, rps: float, p99: float | None, errors: dict[str, int] | None = None) -> dict[str, Any]:
    """A step as perf's StepResult.to_dict writes it (only the fields the score reads matter)."""
    return {"mode": "concurrency", "load": load, "throughput_rps": rps, "ok": int(rps), "errors": errors or {},
            "latency_ms": {"p50": p99, "p90": p99, "p99": p99, "p99.9": p99}}  # fmt: skip


def test_the_score_is_the_best_throughput_within_the_budget():
    steps = [step(1, 100, 2.0), step(8, 400, 9.0), step(16, 500, 30.0)]
    value, best = score(steps, p99_ms=10.0)
    assert value == 400
    assert best is not None
    assert best["load"] == 8
    assert score(steps, p99_ms=None)[0] == 500  # no budget: the best throughput
    assert score(steps, p99_ms=1.0) == (0.0, None)  # nothing within the budget is worth nothing


def test_a_step_with_errors_or_no_answer_never_scores():
    steps = [step(1, 100, 2.0), step(8, 900, 3.0, errors={"500": 1}), step(16, 0, None)]
    assert score(steps, p99_ms=10.0)[0] == 100
    assert score([step(4, 0, None)], p99_ms=None) == (0.0, None)


def fake_measure(table: dict[str, float], calls: list[dict[str, Any]]):
    """A measure that answers each candidate with one step of the throughput ``table`` gives its key."""

    def measure(changes: dict[str, Any], repeat: int) -> tuple[dict[str, Any], bool]:
        calls.append(changes)
        rps = table.get(record_key(changes, repeat), table.get(key(changes), 100.0))
        return {"key": record_key(changes, repeat), "changes": changes, "steps": [step(8, rps, 5.0)]}, False

    return measure


def test_descent_keeps_a_change_only_beyond_the_margin_and_builds_on_it():
    config = parse(ONNX)
    knobs = knobs_for(config)
    table = {
        key({"instance_count": 2}): 104.0,  # +4 %: within the 5 % margin, not kept
        key({"dynamic_batching": 100}): 150.0,  # the best batching value: kept
        key({"dynamic_batching": 0}): 120.0,
        key({"dynamic_batching": 100, "max_batch_size": 16}): 190.0,  # builds on the kept change
    }
    calls: list[dict[str, Any]] = []
    search = coordinate_descent(config, knobs, fake_measure(table, calls), p99_ms=10, max_trials=30, min_gain=0.05)
    assert calls[0] == {}  # the baseline is trial 0
    assert search.winner is not None
    assert search.winner.changes == {"dynamic_batching": 100, "max_batch_size": 16}
    verdicts = {key(o.changes): o.verdict for o in search.outcomes}
    assert "within the 5% margin" in verdicts[key({"instance_count": 2})]
    assert verdicts[key({"dynamic_batching": 100})].startswith("kept: +50 %")
    assert verdicts[key({"dynamic_batching": 0})] == "not kept: +20 % over trial 0, but trial 3 did better"
    # every later knob is tried on top of the kept batching change, and never the baseline's own value
    later = calls[calls.index({"dynamic_batching": 100, "max_batch_size": 16}) :]
    assert all(c.get("dynamic_batching") == 100 for c in later)
    assert {"instance_count": 1} not in calls


def test_descent_stops_at_the_trial_budget():
    config = parse(ONNX)
    calls: list[dict[str, Any]] = []
    search = coordinate_descent(config, knobs_for(config), fake_measure({}, calls), p99_ms=None, max_trials=3,
                                min_gain=0.05)  # fmt: skip
    assert len(calls) == len(search.outcomes) == 3
    assert search.stopped_by_budget
    assert search.winner is search.baseline
    assert all(o.verdict for o in search.outcomes)


def test_a_candidate_serve_refused_scores_nothing_and_says_why():
    config = parse(ONNX)

    def measure(changes: dict[str, Any], repeat: int) -> tuple[dict[str, Any], bool]:
        error = "serve exited with 1:\nbad config" if changes else None
        return {"key": key(changes), "changes": changes, "steps": [step(8, 100, 1.0)], "error": error}, False

    search = coordinate_descent(config, knobs_for(config), measure, p99_ms=None, max_trials=2, min_gain=0.05)
    assert search.outcomes[1].score == 0
    assert search.outcomes[1].verdict == "failed: serve exited with 1:"
    assert search.winner is search.baseline


def test_the_store_appends_a_line_per_trial_and_resumes(tmp_path: Path):
    settings = {"concurrency": [1, 8], "duration": 1.0}
    store = TrialStore(tmp_path, settings)
    store.add({"key": key({}), "changes": {}, "steps": [step(1, 10, 1.0)], "error": None})
    store.add({"key": key({"instance_count": 2}), "changes": {"instance_count": 2}, "steps": [], "error": None})
    lines = (tmp_path / "trials.jsonl").read_text().splitlines()
    assert [json.loads(line)["changes"] for line in lines] == [{}, {"instance_count": 2}]
    again = TrialStore(tmp_path, settings)
    found = again.get({"instance_count": 2})
    assert found is not None
    assert found["changes"] == {"instance_count": 2}
    assert again.get({"instance_count": 3}) is None
    assert again.measured == 2


def test_a_trial_measured_again_after_a_failure_resumes_as_its_last_record(tmp_path: Path):
    store = TrialStore(tmp_path, {"duration": 1.0})
    store.add({"key": key({}), "changes": {}, "steps": [], "error": "serve exited with 1:"})
    store.add({"key": key({}), "changes": {}, "steps": [step(1, 10, 1.0)], "error": None})
    again = TrialStore(tmp_path, {"duration": 1.0})
    found = again.get({})
    assert found is not None
    assert found["error"] is None
    assert again.measured == 2  # both serve runs kept: each had its own trial folder


def test_the_store_refuses_trials_measured_under_another_load(tmp_path: Path):
    TrialStore(tmp_path, {"concurrency": [1, 8], "duration": 1.0})
    with pytest.raises(ToolUsageError, match="duration"):
        TrialStore(tmp_path, {"concurrency": [1, 8], "duration": 3.0})


def test_a_winner_is_measured_again_and_kept_only_if_its_gain_holds():
    config = parse(ONNX)
    knobs = knobs_for(config)
    lucky = {key({"instance_count": 2}): 130.0, record_key({"instance_count": 2}, 1): 95.0}
    search = coordinate_descent(config, knobs, fake_measure(lucky, []), p99_ms=None, max_trials=2, min_gain=0.05)
    assert search.winner is not None
    assert search.winner.changes == {"instance_count": 2}
    confirm(search, fake_measure(lucky, []), p99_ms=None, min_gain=0.05, repeats=1)
    assert search.confirmation == ([100.0, 100.0], [130.0, 95.0])  # mean 112.5: +12.5 %, held
    assert search.confirmed
    assert search.winner.changes == {"instance_count": 2}

    luckier = {key({"instance_count": 2}): 130.0, record_key({"instance_count": 2}, 1): 80.0}
    search = coordinate_descent(config, knobs, fake_measure(luckier, []), p99_ms=None, max_trials=2, min_gain=0.05)
    confirm(search, fake_measure(luckier, []), p99_ms=None, min_gain=0.05, repeats=1)
    assert not search.confirmed  # mean 105: within the margin, so the baseline stays
    assert search.winner is search.baseline
    assert "not confirmed" in search.outcomes[1].verdict


def test_confirmation_measures_each_in_turns_and_compares_the_means():
    config = parse(ONNX)
    knobs = knobs_for(config)
    table = {key({"instance_count": 2}): 150.0, record_key({"instance_count": 2}, 1): 90.0,
             record_key({"instance_count": 2}, 2): 120.0, record_key({}, 2): 110.0}  # fmt: skip
    search = coordinate_descent(config, knobs, fake_measure(table, []), p99_ms=None, max_trials=2, min_gain=0.05)
    calls: list[dict[str, Any]] = []
    confirm(search, fake_measure(table, calls), p99_ms=None, min_gain=0.05, repeats=2)
    assert calls == [{}, {"instance_count": 2}, {}, {"instance_count": 2}]  # baseline, winner, in turns
    assert search.confirmation == ([100.0, 100.0, 110.0], [150.0, 90.0, 120.0])
    assert search.confirmed  # means 120 against 103.3: +16 %
    assert search.winner is not None
    assert search.winner.changes == {"instance_count": 2}
