"""Whether merging a model's requests pays, by Triton's own execution time per row of that model.

Merging saves Triton its cost per request (parse, schedule, answer: ~0.1 ms) and fills its batches. Where
a row takes long to execute (a ResNet on CPU: ~50 ms an image), Triton's dynamic batcher already forms
deep batches from the requests queued, and merging saves that 0.1 ms against tens of milliseconds of
work while holding requests back at the front and copying their bodies into one: image requests merged
answered 0.79 to 1.04 times what NVIDIA's front did, unmerged 1.07 to 1.25 times. So a model's requests
merge only while its time per row is below ``SMTRITON_MERGE_MAX_ROW_MS`` (:class:`Verdict`, one per model
a worker sends to).

The time is Triton's (``GET /v2/models/<name>/stats``: compute input, infer and output, per batch size
executed), never a round trip seen at the front: a round trip includes queueing, which grows with load
and would stop merging exactly when it pays. Over the interval between two readings, time per row =
Δ(compute ns of every batch size) / Δ(rows executed: batch size times executions), so that a change of load
or of the model is seen. The first reading only starts the count (what came before it says nothing of
now); an interval without executions keeps the verdict; counters that went back (Triton restarted, the
model was loaded again) started again within the interval, so their values are the interval's.

The same readings say how busy the model's instances are while this worker has requests of it with
Triton: the compute time over that time and the instances. Below half busy the instances are not what
bounds the requests' rate (the cores are, or the clients), and a worker keeps one request in flight per
instance rather than ``SMTRITON_MERGE_IN_FLIGHT``: what arrives meanwhile merges deeper, and Triton
parses and schedules fewer requests (the tiny benchmark on 2 cores: 1.06 times NVIDIA's front's rate against
0.97, Triton's CPU a request 0.070 → 0.042 ms). Busier, the instance would wait through the front's turn
between two requests (the text encoder on 2 cores, 94 % busy: 0.98 times against 1.21), so it keeps more.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

# A model's statistics are read again when it is used and its last reading began this long ago.
READ_EVERY_S = 5.0
# Under this share of the time busy, a model's instances are not what bounds its requests' rate.
HALF_BUSY = 0.5

# Triton's statistics of one model (the JSON of ``GET /v2/models/<name>/stats``).
Statistics = Callable[[str], Awaitable[Any]]

_COMPUTE = ("compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True, slots=True)
class Reading:
    """Triton's totals for a model since it was loaded: nanoseconds spent computing, rows executed."""

    ns: int
    rows: int


def reading(stats: Any) -> Reading:
    """The totals of one statistics answer, every version of the model summed; ValueError if it is none."""
    if not isinstance(stats, dict) or not isinstance(stats.get("model_stats"), list):
        raise ValueError("no model_stats in Triton's statistics")
    ns = rows = 0
    for version in stats["model_stats"]:
        batches = version.get("batch_stats") if isinstance(version, dict) else None
        for batch in batches if isinstance(batches, list) else []:
            if not isinstance(batch, dict):
                raise ValueError("a batch_stats entry is no object")
            size = _count(batch.get("batch_size"))
            for name in _COMPUTE:
                ns += _count(_field(batch, name, "ns"))
            rows += size * _count(_field(batch, "compute_infer", "count"))
    return Reading(ns, rows)


def _field(batch: dict[str, Any], name: str, field: str) -> Any:
    duration = batch.get(name)
    return duration.get(field, 0) if isinstance(duration, dict) else 0


def _count(value: Any) -> int:
    """A count of Triton's statistics (protobuf's JSON may write a 64-bit integer as text)."""
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    raise ValueError(f"{value!r} is no count")


def interval(before: Reading, after: Reading) -> Reading:
    """What Triton computed between two readings (counters that went back started again within it)."""
    spent = Reading(after.ns - before.ns, after.rows - before.rows)
    return after if spent.ns < 0 or spent.rows < 0 else spent


def ms_per_row(before: Reading | None, after: Reading) -> float | None:
    """Triton's execution time per row between two readings, in milliseconds; None when nothing tells
    it: no earlier reading, or no row executed in between."""
    if before is None:
        return None
    spent = interval(before, after)
    return spent.ns / spent.rows / 1e6 if spent.rows > 0 else None


class Verdict:
    """Whether one model's requests merge, by its time per row at the last readings (before any: they
    do); and the reading under way, if any (one at a time)."""

    __slots__ = ("_active", "_last", "busy", "ms", "pays", "read_at", "task")

    def __init__(self) -> None:
        self.pays = True
        self.ms: float | None = None  # the last time per row known
        self.busy: float | None = None  # how busy the instances were while requests were in flight
        self.read_at: float | None = None  # when the last reading began (the event loop's clock)
        self.task: asyncio.Task[None] | None = None
        self._last: Reading | None = None
        self._active = 0.0  # seconds the worker had requests of the model in flight, at the last reading

    def due(self, now: float) -> bool:
        """Whether a reading should begin now: none under way, and none begun in the last READ_EVERY_S."""
        return self.task is None and (self.read_at is None or now - self.read_at >= READ_EVERY_S)

    @property
    def one_each(self) -> bool:
        """Whether one request in flight per instance is enough: the instances were under half busy."""
        return self.busy is not None and self.busy < HALF_BUSY

    def take(self, stats: Any, max_row_ms: float, active_s: float = 0.0, instances: int = 1) -> bool:
        """Take a statistics answer as the latest reading, ``active_s`` the seconds the worker has had
        requests of the model in flight so far; whether the verdict changed. ValueError (and nothing
        changed) if it is no statistics answer."""
        after = reading(stats)
        before, self._last = self._last, after
        active, self._active = active_s - self._active, active_s
        ms = ms_per_row(before, after)
        if before is None or ms is None:
            return False
        if active > 0:
            self.busy = interval(before, after).ns / 1e9 / active / max(1, instances)
        self.ms = ms
        pays = ms < max_row_ms
        changed, self.pays = pays != self.pays, pays
        return changed
