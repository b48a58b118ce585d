"""The statistics of a perf step and the open loop's schedule."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from smtriton.perf.stats import CLIENT_SATURATED, percentiles_ms, schedule, summarize


def test_percentiles_are_those_of_the_samples_in_milliseconds():
    latencies = [i / 1000 for i in range(1, 1001)]  # 1 ms .. 1000 ms
    p = percentiles_ms(latencies)
    assert p["p50"] == pytest.approx(500.5)
    assert p["p90"] == pytest.approx(900.1)
    assert p["p99"] == pytest.approx(990.01)
    assert p["p99.9"] == pytest.approx(999.001)


def test_a_step_without_samples_has_no_percentiles():
    assert percentiles_ms([]) == {"p50": None, "p90": None, "p99": None, "p99.9": None}
    r = summarize("concurrency", 4, 2.0, [], Counter({503: 10}), 0.1, 10)
    assert r.throughput_rps == 0
    assert r.mean_ms is None
    assert r.errors == {"503": 10}


def test_throughput_counts_successes_and_errors_are_by_status():
    statuses = Counter({200: 900, 503: 80, 0: 20})
    r = summarize("concurrency", 8, 2.0, [0.001] * 900, statuses, 0.5, 1200)
    assert r.requests == 1000
    assert r.ok == 900
    assert r.throughput_rps == pytest.approx(450.0)
    assert r.errors == {"connection": 20, "503": 80}
    assert r.sent_total == 1200
    assert r.mean_ms == pytest.approx(1.0)


def test_a_busy_client_is_flagged_as_the_possible_limit():
    busy = summarize("concurrency", 16, 2.0, [0.001], Counter({200: 1}), CLIENT_SATURATED * 2.0, 1)
    idle = summarize("concurrency", 16, 2.0, [0.001], Counter({200: 1}), 0.2, 1)
    assert busy.client_saturated
    assert busy.client_cpu == pytest.approx(CLIENT_SATURATED)
    assert any("client" in n for n in busy.notes)
    assert not idle.client_saturated
    assert idle.notes == []


def test_an_open_loop_that_fell_behind_says_so():
    lags = [0.0] * 90 + [0.05] * 10
    r = summarize("rate", 500, 2.0, [0.001] * 100, Counter({200: 100}), 0.3, 100, lags)
    assert r.late == 10
    assert r.max_lag_ms == pytest.approx(50.0)
    assert any("behind its schedule" in n for n in r.notes)
    on_time = summarize("rate", 500, 2.0, [0.001] * 100, Counter({200: 100}), 0.3, 100, [0.0001] * 100)
    assert on_time.late == 0
    assert on_time.notes == []


def test_a_step_where_nothing_succeeded_blames_nothing_on_the_client():
    """Refused at once, requests keep the client's core busy and its schedule late: neither is a hint
    worth giving when no request succeeded (the errors by status are the story)."""
    busy = CLIENT_SATURATED * 2.0
    closed = summarize("concurrency", 16, 2.0, [], Counter({0: 5000}), busy, 5000)
    opened = summarize("rate", 500, 2.0, [], Counter({503: 1000}), busy, 1000, [0.05] * 1000)
    for r in (closed, opened):
        assert r.client_cpu == pytest.approx(CLIENT_SATURATED)  # still measured and reported
        assert not r.client_saturated
        assert r.notes == []
    assert opened.late == 1000


def test_a_fixed_schedule_is_evenly_spaced_and_stops_at_the_duration():
    times = schedule(100, 2.0, "fixed")
    assert len(times) == 200
    assert times[0] == 0
    assert np.allclose(np.diff(times), 0.01)
    assert times[-1] < 2.0


def test_a_poisson_schedule_has_the_rate_on_average_and_random_gaps():
    times = schedule(1000, 20.0, "poisson", np.random.default_rng(1))
    gaps = np.diff(times)
    assert len(times) == pytest.approx(20_000, rel=0.03)
    assert gaps.mean() == pytest.approx(0.001, rel=0.03)
    assert gaps.std() == pytest.approx(0.001, rel=0.05)  # exponential: std equals mean
    assert (gaps > 0).all()
    assert times[-1] < 20.0


def test_a_schedule_needs_a_positive_rate_and_a_known_arrival():
    with pytest.raises(ValueError, match="positive"):
        schedule(0, 1.0, "fixed")
    with pytest.raises(ValueError, match="poisson"):
        schedule(10, 1.0, "burst")


def test_an_open_loop_step_that_answered_less_than_it_offered_is_short():
    lags = [0.0] * 1000
    short = summarize("rate", 500, 2.0, [1.5] * 1000, Counter({200: 1000}), 0.3, 1000, lags, achieved=600, offered=1000)
    assert short.short
    assert (short.throughput_rps, short.offered_rps) == (300.0, 500.0)
    assert any("fell short of the offered rate: 300.0/s answered of 500.0/s offered" in n for n in short.notes)
    # the window's edges: a few requests still in flight at its end are no shortfall
    kept_up = summarize("rate", 500, 2.0, [0.01] * 1000, Counter({200: 1000}), 0.3, 1000, lags, achieved=990,
                        offered=1000)  # fmt: skip
    assert not kept_up.short
    closed = summarize("concurrency", 8, 2.0, [0.01] * 100, Counter({200: 100}), 0.3, 100)
    assert (closed.short, closed.offered_rps) == (False, None)


def test_requests_that_never_came_back_are_timeout_errors():
    r = summarize("rate", 10, 2.0, [0.01] * 15, Counter({200: 15, -1: 5}), 0.1, 15, offered=20, achieved=15)
    assert r.errors == {"timeout": 5}
    assert (r.requests, r.ok) == (20, 15)
