"""Statistics of one load step, and the open loop's arrival schedule: pure functions, unit-tested."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)
# Above this share of one core the client itself is the likely limit (its event loop is one thread).
CLIENT_SATURATED = 0.85
# An open-loop request sent this long after its scheduled start counts as late.
LATE_S = 0.002
# An open-loop step whose achieved rate is below the offered one by more than this share (and two
# requests, the edges of the window) fell short: the server could not keep up.
SHORTFALL = 0.05


def percentile_key(q: float) -> str:
    """``p50``, ``p99``, ``p99.9``: the name a percentile has in the JSON, CSV and table."""
    return f"p{q:g}"


def percentiles_ms(latencies_s: Sequence[float], qs: Iterable[float] = PERCENTILES) -> dict[str, float | None]:
    """Latency percentiles in milliseconds (linear interpolation); None for a step with no sample."""
    qs = tuple(qs)
    if len(latencies_s) == 0:
        return {percentile_key(q): None for q in qs}
    values = np.percentile(np.asarray(latencies_s, dtype=np.float64), qs) * 1000.0
    return {percentile_key(q): float(v) for q, v in zip(qs, values, strict=True)}


@dataclass
class StepResult:
    """What one step measured; ``mode`` is ``concurrency`` (closed loop) or ``rate`` (open loop)."""

    mode: str
    load: float
    duration_s: float
    requests: int
    ok: int
    throughput_rps: float
    latency_ms: dict[str, float | None]
    mean_ms: float | None
    errors: dict[str, int]
    client_cpu: float
    client_saturated: bool
    sent_total: int  # every request this step completed, warm-up included (what the server counted)
    late: int = 0
    max_lag_ms: float = 0.0
    offered_rps: float | None = None  # open loop: requests due in the window, per second
    short: bool = False  # open loop: the server achieved less than the offered rate
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"c={self.load:g}" if self.mode == "concurrency" else f"{self.load:g}/s"

    @property
    def series(self) -> str:
        """The steps a chart joins with a line: one sweep (concurrency or rate)."""
        return self.mode

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(
    mode: str,
    load: float,
    wall_s: float,
    latencies_s: Sequence[float],
    statuses: Counter[int],
    cpu_s: float,
    sent_total: int,
    lags_s: Sequence[float] = (),
    *,
    achieved: int | None = None,
    offered: int | None = None,
) -> StepResult:
    """One step's result from its raw record.

    ``latencies_s`` holds the successful (2xx) requests only, so an error that fails fast cannot make
    the latency look better; ``statuses`` counts every measured request by HTTP status (0: no answer,
    the connection failed; -1: no answer in time). ``lags_s`` is, per open-loop request, how late it
    left against its schedule. ``achieved``: the successful answers that arrived in the window (the
    throughput; default: the successful measured requests); ``offered``: the open-loop requests due in
    it.
    A step where no request succeeded flags nothing about the client: requests refused at once keep
    its core busy and its schedule late, and the errors, not the client, are what limited it.
    """
    requests = sum(statuses.values())
    ok = sum(n for status, n in statuses.items() if 200 <= status < 300)
    named = {0: "connection", -1: "timeout"}
    errors = {named.get(s, str(s)): n for s, n in sorted(statuses.items()) if not 200 <= s < 300}
    done = ok if achieved is None else achieved
    cpu = cpu_s / wall_s if wall_s > 0 else 0.0
    late = sum(1 for lag in lags_s if lag > LATE_S)
    result = StepResult(
        mode=mode,
        load=load,
        duration_s=wall_s,
        requests=requests,
        ok=ok,
        throughput_rps=done / wall_s if wall_s > 0 else 0.0,
        latency_ms=percentiles_ms(latencies_s),
        mean_ms=float(np.mean(latencies_s)) * 1000.0 if len(latencies_s) else None,
        errors=errors,
        client_cpu=cpu,
        client_saturated=cpu >= CLIENT_SATURATED and ok > 0,
        sent_total=sent_total,
        late=late,
        max_lag_ms=max(lags_s, default=0.0) * 1000.0,
        offered_rps=offered / wall_s if offered is not None and wall_s > 0 else None,
        short=offered is not None and done < offered - max(SHORTFALL * offered, 2),
    )
    if result.client_saturated:
        result.notes.append(f"client CPU {cpu:.0%} of a core: the client may be the limit, not the server")
    if result.short and result.offered_rps is not None:
        result.notes.append(
            f"the server fell short of the offered rate: {result.throughput_rps:,.1f}/s answered of "
            f"{result.offered_rps:,.1f}/s offered; requests queued, and the latencies include the queue"
        )
    if ok and late > 0.01 * max(len(lags_s), 1):
        result.notes.append(
            f"client fell behind its schedule: {late} of {len(lags_s)} requests left over {LATE_S * 1000:g} ms late"
            f" (at most {result.max_lag_ms:.1f} ms)"
        )
    return result


def schedule(rate: float, duration_s: float, arrival: str, rng: np.random.Generator | None = None) -> np.ndarray:
    """Scheduled start times (seconds from the step's start) of an open loop at ``rate`` requests/s.

    ``fixed``: one request every 1/rate s. ``poisson``: exponential gaps of mean 1/rate (a Poisson
    process, how independent users arrive). Only starts before ``duration_s`` are kept.
    """
    if rate <= 0:
        raise ValueError("rate must be positive")
    count = int(rate * duration_s * 1.5) + 16
    if arrival == "fixed":
        times = np.arange(count, dtype=np.float64) / rate
    elif arrival == "poisson":
        rng = rng or np.random.default_rng()
        times = np.cumsum(rng.exponential(1.0 / rate, size=count))
        while times[-1] < duration_s:  # very unlikely; extend rather than cut the step short
            times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(1.0 / rate, size=count))])
    else:
        raise ValueError(f"arrival must be fixed or poisson, not {arrival!r}")
    return times[times < duration_s]
