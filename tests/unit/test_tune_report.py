"""tune's report: the sentence naming the winner and why, the table, and perf's chart with a point per trial."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from smtriton.tune.report import point, summary, table, write_chart
from smtriton.tune.search import Outcome, Search


def step(load: int, rps: float, p99: float) -> dict[str, Any]:
    """A step as perf's StepResult.to_dict writes it."""
    return {"mode": "concurrency", "load": load, "duration_s": 1.0, "requests": int(rps), "ok": int(rps),
            "throughput_rps": rps, "latency_ms": {"p50": p99 / 2, "p90": p99, "p99": p99, "p99.9": p99},
            "mean_ms": p99 / 2, "errors": {}, "client_cpu": 0.1, "client_saturated": False, "sent_total": int(rps),
            "late": 0, "max_lag_ms": 0.0, "notes": []}  # fmt: skip


def search() -> Search:
    base = Outcome(0, {}, {}, 1000.0, step(8, 1000.0, 7.5), False, "baseline")
    win = Outcome(1, {"instance_count": 2}, {}, 1400.0, step(8, 1400.0, 5.0), True, "kept: +40 % over trial 0")
    none = Outcome(2, {"instance_count": 2, "dynamic_batching": "off"}, {}, 0.0, None, False,
                   "no step within the budget")  # fmt: skip
    return Search(outcomes=[base, win, none], winner=win)


def test_the_summary_names_the_winner_its_knobs_and_its_gain_under_the_budget():
    line = summary(search(), p99_ms=10.0)
    assert line == (
        "winner: trial 1 (instance_count=2): 1,400 req/s (best step c=8, p99 5.00 ms)"
        " against the baseline's 1,000 req/s (+40 %; p99 <= 10 ms)"
    )
    confirmed = search()
    confirmed.confirmation = ([1000.0, 1100.0], [1400.0, 1300.0])
    assert "1,350 req/s" in summary(confirmed, 10.0)
    assert "+29 %" in summary(confirmed, 10.0)
    assert "means of 2 measurements each" in summary(confirmed, 10.0)
    baseline_wins = search()
    baseline_wins.winner = baseline_wins.baseline
    assert summary(baseline_wins, None).startswith("winner: the baseline (1,000 req/s, no latency budget)")


def test_the_table_shows_every_trial_and_marks_the_winner():
    console = Console(width=200, record=True)
    console.print(table(search(), "tune"))
    text = console.export_text()
    assert "kept: +40 % over trial 0 (winner) (resumed)" in text
    assert "no step within the budget" in text
    assert "instance_count=2 dynamic_batching=off" in text


def test_the_chart_has_a_point_per_scored_trial_labelled_with_it(tmp_path: Path):
    outcomes = search().outcomes
    first = point(outcomes[1])
    assert first is not None
    assert first.label == "t1 c=8"
    assert point(outcomes[2]) is None  # nothing within the budget: no point
    png, page = write_chart(search(), tmp_path / "chart", "tune")
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    html = page.read_text()
    assert "t0 c=8" in html
    assert "t1 c=8" in html
    assert "t2 " not in html
    assert 'stroke="#1f77b4" stroke-width="2"' not in html  # trials are points, no line joins them
