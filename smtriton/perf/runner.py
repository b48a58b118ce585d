"""The load loops: closed loop (N workers, each sends its next request when the last one answers) and
open loop (requests start on a schedule, whatever the answers; latency counts from the scheduled start).

Each step runs a warm-up, then the measured window, then waits for what is in flight. The latencies
and errors are those of the requests that *started* in the window (for the open loop: were scheduled
in it), each waited for after the window closes, so a server that falls behind shows its whole queue
in the tail instead of dropping its slowest requests; one still unanswered :data:`DRAIN_TIMEOUT_S`
after the step is a ``timeout`` error. The throughput is what the server achieved: the successful
answers that arrived inside the window. An open-loop step whose achieved rate falls below the rate it
offered is flagged ``short``. Every completed request counts in ``sent_total`` (what the server saw).
The client's CPU time over the window says whether the client was the limit.

A server that stops answering (killed, or stopped with Ctrl-C) ends the run: once every request for
:data:`GONE_AFTER_S` got no answer at all, the step stops and :class:`ServerGone` says so, carrying the
steps finished before.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from smtriton.errors import ToolError
from smtriton.perf.stats import StepResult, schedule, summarize
from smtriton.perf.targets import Channel, Target
from smtriton.serve import eventloop

DRAIN_TIMEOUT_S = 30.0
FIRST_ANSWER_LIMIT_S = 120.0
TICK_S = 0.25
TIMED_OUT = -1  # the status of a request still unanswered DRAIN_TIMEOUT_S after its step
NO_ANSWER = 0  # a channel's status when the server did not answer (refused, reset, closed unanswered)
GONE_AFTER_S = 3.0  # this long with requests and not one answer: the server is gone

Progress = Callable[[str, str, float, int], None]  # (step label, phase, seconds into the step, completed)


@dataclass(frozen=True)
class StepPlan:
    mode: str  # concurrency | rate
    load: float
    warmup_s: float
    duration_s: float
    arrival: str = "fixed"
    connections: int = 64  # open loop: most requests in flight at once

    @property
    def label(self) -> str:
        return f"c={self.load:g}" if self.mode == "concurrency" else f"{self.load:g}/s"


class ServerGone(ToolError):
    """The server stopped answering during a step; ``results`` are the steps finished before it."""

    def __init__(self, message: str, results: list[StepResult] | None = None) -> None:
        super().__init__(message)
        self.results = results or []


class _Record:
    """Raw per-request record, appended to in the hot loop (three list appends per request)."""

    def __init__(self) -> None:
        self.began: list[float] = []  # when it started, or for the open loop when it was due
        self.done_at: list[float] = []
        self.status: list[int] = []
        self.answered_at = time.perf_counter()  # the last answer of any status (or the record's start)
        self.unanswered = 0  # requests in a row that got no answer at all

    def add(self, began: float, done_at: float, status: int) -> None:
        self.began.append(began)
        self.done_at.append(done_at)
        self.status.append(status)
        if status == NO_ANSWER:
            self.unanswered += 1
        elif status != TIMED_OUT:
            self.unanswered = 0
            self.answered_at = done_at

    def gone(self, now: float) -> str | None:
        """Why the server is taken for gone (requests, and no answer for GONE_AFTER_S); None while it answers."""
        silent = now - self.answered_at
        if self.unanswered == 0 or silent < GONE_AFTER_S:
            return None
        return f"{self.unanswered} requests in a row got no answer (refused or cut off) over {silent:.1f} s"

    def started_in(self, start: float, end: float) -> tuple[list[float], Counter[int]]:
        """Of the requests that started (were due) in [start, end): the latencies of the 2xx answers and
        every status count."""
        began = np.asarray(self.began)
        status = np.asarray(self.status, dtype=np.int64)
        inside = (began >= start) & (began < end)
        counts = Counter({int(s): int(n) for s, n in zip(*np.unique(status[inside], return_counts=True), strict=True)})
        latency = np.asarray(self.done_at) - began
        return latency[inside & (status >= 200) & (status < 300)].tolist(), counts

    def succeeded_in(self, start: float, end: float) -> int:
        """How many 2xx answers arrived in [start, end]: what the server achieved."""
        done = np.asarray(self.done_at)
        status = np.asarray(self.status, dtype=np.int64)
        return int(np.count_nonzero((status >= 200) & (status < 300) & (done >= start) & (done <= end)))


async def _window(
    plan: StepPlan, start: float, record: _Record, progress: Progress | None, first_answers: int = 0
) -> tuple[float, float]:
    """Wait through warm-up and the measured window (ticking the progress); CPU seconds and wall seconds used.

    The warm-up also lasts until ``first_answers`` requests have been answered (at most
    :data:`FIRST_ANSWER_LIMIT_S`): a multi-model endpoint loads a model on its first request, and a
    window that opens before the load ends measures the load, not the model."""
    begin = start + plan.warmup_s
    end = begin + plan.duration_s
    cpu0 = 0.0
    measuring = False
    while True:
        now = time.perf_counter()
        answered = len(record.status) >= first_answers or now - start >= FIRST_ANSWER_LIMIT_S
        if not measuring and now >= begin and answered:
            cpu0, begin, measuring = time.process_time(), now, True
            end = begin + plan.duration_s
        if measuring and now >= end:
            return time.process_time() - cpu0, now - begin
        if progress is not None:
            progress(plan.label, "measure" if measuring else "warm-up", now - start, len(record.status))
        gone = record.gone(now)
        if gone is not None:
            raise ServerGone(f"the server stopped answering during {plan.label}: {gone}; the run stops here")
        await asyncio.sleep(min(TICK_S, max((begin if not measuring else end) - now, 0.01)))


async def _drain(tasks: list[asyncio.Task[None]]) -> None:
    """Wait for in-flight requests; cancel those still out after the timeout (each records its request as
    :data:`TIMED_OUT`)."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT_S)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    for task in tasks:  # a bug in the client must stop the run, not read as a slow server
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


async def closed_loop(target: Target, plan: StepPlan, progress: Progress | None = None) -> StepResult:
    """``plan.load`` workers, each on its own connection, sending back to back."""
    record = _Record()
    running = True
    channels: list[Channel] = [await target.channel() for _ in range(int(plan.load))]

    async def worker(ch: Channel, first: int) -> None:
        index = first
        clock = time.perf_counter
        add = record.add
        while running:
            t0 = clock()
            try:
                status = await ch.send(index)
            except asyncio.CancelledError:  # abandoned after the step: counted, not dropped
                add(t0, clock(), TIMED_OUT)
                return
            add(t0, clock(), status)
            index += 1

    start = time.perf_counter()
    tasks = [asyncio.create_task(worker(ch, i)) for i, ch in enumerate(channels)]
    try:
        cpu_s, wall_s = await _window(plan, start, record, progress, first_answers=len(channels))
        end = time.perf_counter()
    finally:
        running = False
        await _drain(tasks)
        for ch in channels:
            ch.close()
    latencies, statuses = record.started_in(end - wall_s, end)
    achieved = record.succeeded_in(end - wall_s, end)
    return summarize(plan.mode, plan.load, wall_s, latencies, statuses, cpu_s, _answered(record), achieved=achieved)


async def open_loop(target: Target, plan: StepPlan, progress: Progress | None = None) -> StepResult:
    """Requests start at ``plan.load`` per second on a fixed or Poisson schedule, over at most
    ``plan.connections`` connections; latency runs from the scheduled start, so waiting shows."""
    record = _Record()
    idle: asyncio.Queue[Channel] = asyncio.Queue()
    channels: list[Channel] = [await target.channel() for _ in range(plan.connections)]
    for ch in channels:
        idle.put_nowait(ch)
    times = schedule(plan.load, plan.warmup_s + plan.duration_s, plan.arrival)
    lags: list[float] = []
    clock = time.perf_counter

    async def one(at: float, index: int) -> None:
        try:
            ch = await idle.get()
            try:
                status = await ch.send(index)
            finally:
                idle.put_nowait(ch)
        except asyncio.CancelledError:  # abandoned after the step: a timeout of the request it was due
            status = TIMED_OUT
        record.add(at, clock(), status)

    start = clock() + 0.01
    window = asyncio.create_task(_window(plan, start, record, progress))
    tasks: list[asyncio.Task[None]] = []
    measured_from = start + plan.warmup_s
    behind = 0
    try:
        for index, offset in enumerate(times.tolist()):
            if window.done():  # the server is gone: schedule nothing more
                break
            at = start + offset
            delay = at - clock()
            if delay > 0:
                behind = 0
                await asyncio.sleep(delay)
            else:
                behind += 1
                if behind % 16 == 0:  # far behind: still let the answers in
                    await asyncio.sleep(0)
            if at >= measured_from:
                lags.append(clock() - at)
            tasks.append(asyncio.create_task(one(at, index)))
        cpu_s, wall_s = await window
        end = clock()
    finally:
        window.cancel()
        await _drain(tasks)
        for ch in channels:
            ch.close()
    # The requests due in the measured stretch of the schedule; the answers that arrived in the window.
    due_from, due_until = measured_from, measured_from + plan.duration_s
    offered = sum(1 for offset in times.tolist() if due_from <= start + offset < due_until)
    latencies, statuses = record.started_in(due_from, due_until)
    achieved = record.succeeded_in(end - wall_s, end)
    return summarize(plan.mode, plan.load, wall_s, latencies, statuses, cpu_s, _answered(record), lags,
                     achieved=achieved, offered=offered)  # fmt: skip


def _answered(record: _Record) -> int:
    """Requests the server answered (what it counted), every step phase included."""
    return sum(1 for status in record.status if status != TIMED_OUT)


async def run_steps(target: Target, plans: list[StepPlan], progress: Progress | None = None) -> list[StepResult]:
    results: list[StepResult] = []
    try:
        for plan in plans:
            step = closed_loop if plan.mode == "concurrency" else open_loop
            results.append(await step(target, plan, progress))
    except ServerGone as exc:
        raise ServerGone(str(exc), results) from None
    finally:
        target.close()
    return results


def run(target: Target, plans: list[StepPlan], progress: Progress | None = None) -> list[StepResult]:
    """Run the steps on uvloop where it is installed (it halves the client's cost per request)."""
    return eventloop.run(run_steps(target, plans, progress))
